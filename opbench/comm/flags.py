"""nccl-tests' command-line vocabulary in ``opbench comm``: the flags it honours with nccl-tests' meanings and
type names, the ones it refuses by name (each with the reason), and the flags a generated nccl-tests line keeps.

The meanings follow nccl-tests' README ("Arguments") and its option parser; docs/comm.md has the table. No torch.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Sequence
from typing import Any

from opbench.core.cli import integer
from opbench.core.dtypes import COMM_DTYPES, DTYPES, lookup
from opbench.core.errors import UsageError

# -a: how the ranks' times of one trial become the reported one (nccl-tests' <0=Rank0,1=Avg,2=Min,3=Max>).
AVERAGE = {0: "rank 0's time", 1: "the rank average", 2: "the fastest rank", 3: "the slowest rank"}
# -z: nccl-tests' blocking modes (README, "Test operation").
BLOCKING = {
    0: "",
    1: "wait and barrier after each call",
    2: "wait after each call",
    3: "wait and barrier after each iteration, barrier not timed",
}
REDOPS = ("sum", "prod", "max", "min", "avg")
DEFAULT_TIMEOUT_S = 300.0

# nccl-tests flags opbench comm does not offer: (short, long) -> why, and what to use instead.
REFUSED: dict[tuple[str, str], str] = {
    ("-t", "--nthreads"): "opbench comm runs one process per rank; give the ranks with --nproc-per-node / --nnodes",
    ("-g", "--ngpus"): "each rank drives one GPU (its LOCAL_RANK); give GPUs per node with --nproc-per-node",
    ("-p", "--parallel_init"): "each rank creates its own communicator in its own process; nothing to parallelise",
    ("-y", "--stream_null"): "torch.distributed issues collectives on its own streams; the stream cannot be chosen",
    ("-G", "--cudagraph"): "collectives are timed as eager torch.distributed calls; CUDA-graph replay is not offered",
    ("-C", "--report_cputime"): "opbench reports device time (CUDA events on GPUs), not the CPU's issue time",
    ("-R", "--local_register"): "buffers come from torch's caching allocator; NCCL buffer registration is not offered",
    ("-x", "--cta_policy"): "torch.distributed creates the communicator; its CTA policy cannot be set from here",
    ("-D", "--device_implementation"): "NCCL device-API kernels are nccl-tests' own code, not torch.distributed calls",
    ("-V", "--device_cta_count"): "goes with -D, which is not offered (NCCL device-API kernels)",
    ("-S", "--report_timestamps"): "console lines carry no timestamps; the .meta.json sidecar records the UTC time",
    ("-J", "--output_file"): "rows go to CSVs under --report-dir-path; 'opbench nccl-tests' reads nccl-tests' output",
    ("-M", "--memory"): "GPU memory use is not reported by opbench comm",
    ("-u", "--unalign"): "buffers are torch tensors at the allocator's alignment; misaligned buffers are not offered",
    ("-I", "--per_iter_timing"): "use --per-rank: every call's time on every rank, the slowest rank's p50/p95",
    ("-K", "--per_iter_skip"): "goes with -I, which is not offered; -w warm-up calls are never timed",
}


class Refused(argparse.Action):
    """An nccl-tests flag opbench comm does not offer: seen at all, it stops the run with one line and the reason
    (with or without its value, so ``-g`` alone is refused as clearly as ``-g 8``)."""

    def __init__(self, option_strings: Sequence[str], dest: str, reason: str = "", **kwargs: Any):
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, **kwargs)
        self.reason = reason

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        short, long = self.option_strings
        raise UsageError(f"nccl-tests' {short} ({long}) is not offered: {self.reason}", field=option_string)


def add_refused(group: argparse._ArgumentGroup) -> None:
    for (short, long), reason in REFUSED.items():
        group.add_argument(short, long, action=Refused, reason=reason, metavar="X", help=reason)


def _names() -> str:
    return ", ".join(
        "|".join(dict.fromkeys((d.name, d.nccl_tests, *d.aliases))) for d in DTYPES.values() if d.name in COMM_DTYPES
    )


def comm_dtype(text: str) -> str:
    """-d / --dtype: an opbench name (bf16), nccl-tests' (bfloat16, half, float, f8e4m3…) or NCCL's; the opbench name."""
    if text == "all":
        raise argparse.ArgumentTypeError("'all' (nccl-tests: every type in turn) is not offered; run once per type")
    found = lookup(text)
    if found is None or found.name not in COMM_DTYPES:
        raise argparse.ArgumentTypeError(f"'{text}' is not a type opbench comm times; choose from {_names()}")
    return found.name


def redop(text: str) -> str:
    """-o / --op: nccl-tests' reduction names that torch.distributed has."""
    if text in REDOPS:
        return text
    if text == "all":
        raise argparse.ArgumentTypeError("'all' (nccl-tests: every reduction in turn) is not offered; run once per op")
    if text == "mulsum":
        raise argparse.ArgumentTypeError("'mulsum' (NCCL's pre-multiplied sum) is not a torch.distributed ReduceOp")
    raise argparse.ArgumentTypeError(f"'{text}' is not a reduction; choose from {', '.join(REDOPS)}")


def _int_in(text: str, low: int, high: int | None, what: str) -> int:
    value = integer(text)
    if value < low or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"{what}, got {value}")
    return value


def blocking(text: str) -> int:
    return _int_in(text, 0, 3, "nccl-tests' blocking modes are 0, 1, 2 and 3")


def average(text: str) -> int:
    return _int_in(text, 0, 3, "0 = rank 0, 1 = average, 2 = min, 3 = max")


def check_count(text: str) -> int:
    return _int_in(text, 0, 1000, "checked calls per size are 0 to 1000")


def agg_iters(text: str) -> int:
    return _int_in(text, 1, 1 << 20, "calls aggregated per iteration are 1 to 1,048,576")


def run_cycles(text: str) -> int:
    if text.strip() == "0":
        raise argparse.ArgumentTypeError(
            "0 (nccl-tests: run until killed) is not offered: every cycle adds rows to the CSV; give a count"
        )
    return _int_in(text, 1, 1 << 20, "cycles are 1 to 1,048,576")


def timeout_seconds(text: str) -> float:
    """-T: nccl-tests' whole seconds; 0 there means no timeout, which would let a hung rank hold the job forever."""
    value = _int_in(text, 0, None, "must not be negative")
    if value == 0:
        raise argparse.ArgumentTypeError("0 (no timeout) is not offered: a hung rank would hold the job; give seconds")
    return float(value)


def trace_paths(text: str) -> list[str]:
    """--sizes-from-trace, which may be repeated: an existing file (or '-') is one log even with commas in its name
    (``a,b.log``); otherwise the value is a comma-separated list of logs."""
    if text == "-" or os.path.exists(text):
        return [text]
    items = [p.strip() for p in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"'{text}' has an empty item")
    return items


def tests_flags(args: argparse.Namespace, collective_has_root: bool) -> list[str]:
    """The nccl-tests flags of this run beyond size, type, op and -n/-w, as nccl-tests spells them, so a generated
    line runs what opbench runs (nccl-tests' own defaults are left out)."""
    out: list[str] = []
    if collective_has_root and args.root:
        out += ["-r", str(args.root)]
    if args.blocking:
        out += ["-z", str(args.blocking)]
    if args.average != 1:
        out += ["-a", str(args.average)]
    if args.agg_iters != 1:
        out += ["-m", str(args.agg_iters)]
    if args.run_cycles != 1:
        out += ["-N", str(args.run_cycles)]
    if args.check:
        out += ["-c", str(args.check)]
    if args.timeout != DEFAULT_TIMEOUT_S:
        out += ["-T", str(max(1, round(args.timeout)))]
    return out


def with_flags(line: str, flags: Sequence[str]) -> str:
    return f"{line} {shlex.join(flags)}" if flags else line
