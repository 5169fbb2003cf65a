"""nccl-tests / rccl-tests lines and opbench comm runs that reproduce an FSDP step's collectives.

The ``-b`` value is nccl-tests' size (total gathered / scattered bytes per rank; docs/conventions.md,
"Collectives: sizes, counts and bus bandwidth") as computed by ``opbench.core.collectives`` — not the per-rank
shard that Primus' generator passed, which moved 1/n of the data.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from opbench.core.collectives import nccl_tests_command
from opbench.core.redact import redact_text
from opbench.core.units import one_line

from .model import FsdpCollective, unique_sizes

FLAVOURS = {"rccl": "rccl-tests (ROCm)", "nccl": "nccl-tests (CUDA)"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def shell_word(arg: str) -> str:
    """``arg`` quoted for bash on one line: shlex's quoting, or ANSI-C ``$'…'`` with escapes when it holds control
    characters (a newline in a path would otherwise start a printed line of its own, inside shlex's quotes)."""
    if not _CONTROL.search(arg):
        return shlex.quote(arg)
    return "$'" + "".join(_ansi_c(c) for c in arg) + "'"


def _ansi_c(c: str) -> str:
    if c in "\\'":
        return "\\" + c
    if not _CONTROL.match(c):
        return c
    return f"\\x{ord(c):02x}" if ord(c) < 0x80 else f"\\u{ord(c):04x}"


def shell_line(argv: Sequence[str]) -> str:
    """A printed command: every word quoted on one line, credentials masked (core.redact)."""
    return redact_text(" ".join(shell_word(a) for a in argv))


def describe(c: FsdpCollective) -> str:
    return one_line(
        f"{c.collective} {c.unit}: count {c.count} {c.dtype}, {c.nranks} ranks, -b {c.nccl_tests_bytes}, "
        f"{c.calls_per_step}/step"
    )


def tests_lines(c: FsdpCollective, flavour: str) -> list[str]:
    """Single-process (-g N, when the group fits one node) and MPI (-g 1) lines for one size."""
    launchers = (["single"] if c.nnodes == 1 else []) + ["mpi"]
    return [
        nccl_tests_command(
            c.collective,
            c.nccl_tests_bytes,
            c.nranks,
            c.dtype,
            flavour=flavour,
            redop=c.redop,
            launcher=launcher,
            nnodes=c.nnodes,
        )
        for launcher in launchers
    ]


@dataclass(frozen=True)
class CommRun:
    """One ``opbench comm`` invocation: the collectives sharing a dtype, group size and reduction."""

    collectives: tuple[str, ...]
    sizes: tuple[int, ...]
    dtype: str
    nranks: int
    nnodes: int
    redop: str | None

    def argv(self, report_dir: str) -> list[str]:
        args = [
            "--nproc-per-node",
            str(self.nranks // self.nnodes),
            "--collectives",
            ",".join(self.collectives),
            "--sizes",
            ",".join(str(s) for s in self.sizes),
            "--dtype",
            self.dtype,
            "--report-dir-path",
            report_dir,
            "--source-label",
            "fsdp",
        ]
        if self.nnodes > 1:
            args[2:2] = ["--nnodes", str(self.nnodes)]
        if self.redop:
            args += ["-o", self.redop]
        return args

    def command(self, report_dir: str) -> str:
        return shell_line(["opbench", "comm", *self.argv(report_dir)])  # paste-safe, one line: every argument quoted


def comm_runs(collectives: Sequence[FsdpCollective]) -> list[CommRun]:
    """Group the unique sizes by (dtype, group size, nodes) so each group is one torchrun launch."""
    groups: dict[tuple[str, int, int], tuple[list[str], list[int], list[str]]] = {}
    for c in unique_sizes(collectives):
        names, sizes, redops = groups.setdefault((c.dtype, c.nranks, c.nnodes), ([], [], []))
        if c.collective not in names:
            names.append(c.collective)
        if c.nccl_tests_bytes not in sizes:
            sizes.append(c.nccl_tests_bytes)
        if c.redop is not None and c.redop not in redops:
            redops.append(c.redop)
    return [
        CommRun(tuple(names), tuple(sizes), dtype, nranks, nnodes, redops[0] if redops else None)
        for (dtype, nranks, nnodes), (names, sizes, redops) in groups.items()
    ]


def commands_text(collectives: Sequence[FsdpCollective], report_dir: str = "out/fsdp_comm") -> str:
    """What ``--commands`` prints: per flavour, one comment and the lines per unique size, then opbench comm."""
    sizes = unique_sizes(collectives)
    blocks: dict[tuple[str, ...], list[str]] = {}
    for flavour in FLAVOURS:
        body = tuple(line for c in sizes for line in ["# " + describe(c), *tests_lines(c, flavour)])
        blocks.setdefault(body, []).append(FLAVOURS[flavour])
    out: list[str] = []
    for body, names in blocks.items():
        out.append(f"# {' and '.join(names)}{' (same flags)' if len(names) > 1 else ''}, from the build directory:")
        out.extend(body)
        out.append("")
    out.append("# opbench's own torchrun benchmark, same sizes (run on every node when a group spans nodes):")
    out.extend(r.command(report_dir) for r in comm_runs(collectives))
    return "\n".join(out)


def run_comm(
    collectives: Sequence[FsdpCollective],
    report_dir: str,
    extra: Sequence[str] = (),
    earlier: Sequence[str] = (),
    written: set[str] | None = None,
) -> int:
    """Time the sizes with ``python -m opbench.comm`` (it launches torchrun itself); returns the worst exit code.
    ``earlier`` (--overwrite / --append, or nothing) goes to each run; a run that writes a collective's CSV an
    earlier run wrote (``written``: the collectives written so far, shared across the models of one command)
    appends to it instead, so one command's runs never set each other's rows aside."""
    import subprocess

    worst = 0
    written = set() if written is None else written
    for run in comm_runs(collectives):
        policy = ["--append"] if written.intersection(run.collectives) else list(earlier)
        written.update(run.collectives)
        args = [*run.argv(report_dir), *policy, *extra]
        print("+ " + shell_line(["opbench", "comm", *args]), flush=True)
        worst = max(worst, subprocess.run([sys.executable, "-m", "opbench.comm", *args]).returncode)
    return worst
