"""Command-line plumbing shared by every tool, and the ``opbench`` dispatcher.

Each tool's module exposes ``main(argv) -> int``; ``opbench <sub>`` imports it lazily, so a missing optional
dependency of one tool never breaks another. The argument groups here give every flag one meaning across
tools: where output goes (``--report-dir-path`` / ``--report-csv-path``), which model (``--model``,
``--model-config-path``), ``--mbs`` (always a list), ``--dry-run`` (plan only: write the planned rows or print
the planned commands, time nothing), ``--top`` (console rows), ``--timeout``; and one help style
(``HelpFormatter``: each true default once, lists comma-joined). Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from . import clock
from .errors import UsageError, run_cli
from .launch import LAUNCH_COMMAND_ENV  # noqa: F401 - its home was here
from .limits import MAX_LAYERS, MAX_MIB, MAX_SEQLEN, MAX_WORLD

T = TypeVar("T")

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "gemm": ("opbench.gemm.__main__", "GEMM shapes of a model's training step, timed"),
    "attention": ("opbench.attention.__main__", "attention forward/backward on model-derived shapes"),
    "comm": ("opbench.comm.__main__", "collective sweeps under torchrun (nccl-tests semantics)"),
    "fsdp": ("opbench.fsdp_model.__main__", "exact FSDP collective sizes and nccl-tests commands"),
    "trace": ("opbench.trace.__main__", "NCCL/RCCL debug-log analysis"),
    "nccl-tests": ("opbench.trace.nccl_tests", "parse nccl-tests / rccl-tests output"),
    "ckpt": ("opbench.ckpt.__main__", "checkpoint save/load benchmark"),
    "report": ("opbench.report.__main__", "turn a results folder into a summary with plots"),
    "selftest": ("opbench.selftest.__main__", "every backend on a tiny case, checked: is this install right?"),
    "cluster": ("opbench.cluster.__main__", "every GPU, node and link of a cluster measured, the slow ones named"),
    "project": ("opbench.project.__main__", "a training step's time and memory per GPU, and the best layout"),
    "moe": ("opbench.moe.__main__", "an MoE block (router, experts, combine) forward/backward, by phase"),
    "step": ("opbench.steptrace.__main__", "a profiled training step's kernels attributed, beside the projection"),
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; every option's default shown once, as the user would type it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default in (None, False, argparse.SUPPRESS)
            or action.option_strings == []
            or isinstance(action, (argparse._HelpAction, argparse._VersionAction))
        ):
            return text
        if isinstance(default, (list, tuple)):
            if not default:
                return text
            shown = ",".join(str(v) for v in default)
        elif isinstance(default, float):
            shown = f"{default:g}"
        else:
            shown = str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class ArgumentParser(argparse.ArgumentParser):
    """argparse with opbench's error contract: a bad flag is ONE line naming it, exit code 2 (via run_cli),
    not argparse's usage block."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        clock.kind()  # a bad OPBENCH_CLOCK or OPBENCH_FIRST_CPU_WARMUP_S: one line before anything runs
        clock.first_cpu_warmup_s(0.0)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:  # raises where argparse would exit
        m = re.match(r"argument ([^:]+): (.*)", message, re.DOTALL)
        if m:
            names = m.group(1).split("/")
            flag = next((n for n in names if n.startswith("--")), names[0])
            raise UsageError(" ".join(m.group(2).split()) + _choice_hint(m.group(2)), field=flag)
        unknown = re.match(r"unrecognized arguments: (.*)", message, re.DOTALL)
        hint = self._flag_hint(unknown.group(1).split()) if unknown else ""
        raise UsageError(f"{' '.join(message.split())}{hint} (see --help)")

    def _flag_hint(self, words: Sequence[str]) -> str:
        """'; did you mean --seqlen?' for the unrecognized words that are close to one of this parser's long flags
        (``--seq-len``, ``--seq_len``; a bare ``seqlen`` too), empty when none is."""
        flags = [o for o in self._option_string_actions if o.startswith("--")]
        guesses = []
        for word in words:
            typed = word.split("=", 1)[0]
            if typed.startswith("-"):
                found = did_you_mean(typed, flags, cutoff=0.7)  # 0.6 would offer --node-rank for --dry-run
            else:  # a flag's name without its dashes ('seqlen 512'); a value (512, a model name) matches nothing
                found = did_you_mean(typed, [f[2:] for f in flags], cutoff=0.8)
                found = f"--{found}" if found else None
            if found and found not in guesses:
                guesses.append(found)
        return f"; did you mean {' or '.join(guesses)}?" if guesses else ""


def did_you_mean(typed: str, choices: Sequence[str], cutoff: float = 0.6) -> str | None:
    """The choice closest to what was typed (difflib, case aside: 'nt' means NT), or None when none is close: the
    hint of a one-line error."""
    by_lower = {c.lower(): c for c in choices}
    found = difflib.get_close_matches(typed.lower(), list(by_lower), n=1, cutoff=cutoff)
    return by_lower[found[0]] if found else None


def _choice_hint(text: str) -> str:
    """The hint "; did you mean 'cold'?" for argparse's "invalid choice: 'cld' (choose from 'cold', 'warm')", which
    lists the choices but leaves the user to spot the one meant; empty for any other message."""
    m = re.match(r"invalid choice: (.+?) \(choose from (.*)\)\s*$", text, re.DOTALL)
    if not m:
        return ""
    unquote = lambda s: s.strip().strip("'\"")  # noqa: E731 - 3.11 quotes each choice (repr), 3.12.8+ does not
    found = did_you_mean(unquote(m.group(1)), [unquote(c) for c in m.group(2).split(",")])
    return f"; did you mean '{found}'?" if found else ""


def parser(prog: str, description: str | None, epilog: str | None = None) -> ArgumentParser:
    """An ArgumentParser in the one opbench help style and error contract."""
    return ArgumentParser(prog=prog, description=description, epilog=epilog, formatter_class=HelpFormatter)


def csv_list(kind: Callable[[str], T] = str) -> Callable[[str], list[T]]:  # type: ignore[assignment]
    """argparse type for '1,2,4' style options."""

    def parse(text: str) -> list[T]:
        items = [p.strip() for p in text.split(",")]
        if not any(items):
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        if not all(items):  # '1,,2' or '1,2,': a value left out by mistake, not to be skipped in silence
            raise argparse.ArgumentTypeError(f"'{text}' has an empty item")
        try:
            return [kind(p) for p in items]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _plain_number(text: str, what: str) -> str:
    """The text of a number as people type it: ASCII digits only. int() and float() also take other scripts'
    digits ('٨', '８') and underscores ('1_6'), which no one means on a command line (docs/conventions.md)."""
    if not str(text).isascii() or "_" in str(text):
        raise argparse.ArgumentTypeError(f"'{text}' is not {what} (ASCII digits only)")
    return str(text)


def integer(text: str) -> int:
    """Any integer, in ASCII digits (``type=int`` takes '٨' and '1_6')."""
    try:
        return int(_plain_number(text, "an integer"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None


def positive_int(text: str) -> int:
    try:
        value = int(_plain_number(text, "an integer"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def finite_float(text: str) -> float:
    """A number that can be compared and slept on: 'nan' would pass every check (nan < 0 is false) and 'inf'
    would wait forever."""
    try:
        value = float(_plain_number(text, "a number"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(_plain_number(text, "an integer"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _positive_finite(text: str, unit: str) -> float:
    """A positive, finite number of ``unit``; the message names the unit."""
    try:
        value = float(_plain_number(text, f"a number of {unit}"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of {unit}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive, finite number of {unit}, got {text}")
    return value


def size_mib(text: str) -> float:
    """A size in MiB: finite, positive, at most 1 PiB (1e12 MiB would make a state no machine can hold)."""
    value = _positive_finite(text, "MiB")
    if value > MAX_MIB:
        raise argparse.ArgumentTypeError(f"{text} MiB is more than 1 PiB; is that a typo?")
    return value


def at_most(high: int, unit: str) -> Callable[[str], int]:
    """A positive count of ``unit`` no larger than ``high``: beyond it a typo, and minutes of work or memory."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"{value} {unit} is more than {high:,}; is that a typo?")
        return value

    return parse


def within(low: float, high: float, unit: str = "") -> Callable[[str], float]:
    """A finite figure from ``low`` to ``high`` (a share, a rate, a latency, a size: beyond them a model's
    arithmetic divides by zero, overflows into inf or rounds to nothing)."""

    def parse(text: str) -> float:
        value = finite_float(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"must be between {low:g} and {high:g}{' ' + unit if unit else ''}, got {text}"
            )
        return value

    return parse


layer_count = at_most(MAX_LAYERS, "layers")  # --num-layers; a config's num_hidden_layers meets the same bound
sequence_length = at_most(MAX_SEQLEN, "tokens")
world_size = at_most(MAX_WORLD, "ranks")


def model_selection(text: str) -> str:
    """--model: 'all' or comma-separated names; a selection that names nothing ('', ',,') is an error, not 'all'."""
    if text.strip().lower() != "all" and not [name for name in text.split(",") if name.strip()]:
        raise argparse.ArgumentTypeError(f"{text!r} names no model (give names, comma-separated, or 'all')")
    return text


def path_text(text: str) -> str:
    """A file or folder path given on the command line: an empty one would silently write nothing."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a path")
    return text


def positive_seconds(text: str) -> float:
    """A finite, positive number of seconds (``inf`` would turn a hang back into a hang)."""
    return _positive_finite(text, "seconds")


def port_number(text: str) -> int:
    try:
        value = int(_plain_number(text, "a port number"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 1-65535, got {value}")
    return value


# torch.distributed backends; "cpu:gloo,cuda:nccl" style device maps are checked part by part.
BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")


def backend_name(text: str) -> str:
    parts = [p.split(":", 1)[-1] for p in text.split(",")]
    bad = [p for p in parts if p not in BACKENDS]
    if bad or not text:
        raise argparse.ArgumentTypeError(
            f"unknown backend {text!r}; choose from {', '.join(BACKENDS)} (or a map like cpu:gloo,cuda:nccl)"
        )
    return text


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(i?B?)\s*$", re.IGNORECASE | re.ASCII)


def parse_bytes(text: str) -> int:
    """nccl-tests size syntax: 8, 1K, 64M, 1G (powers of 1024, as nccl-tests' parsesize)."""
    m = _SIZE.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (examples: 8, 1K, 64M, 1G)")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * mult)


def positive_bytes(text: str) -> int:
    """A size that holds at least one byte (``0`` would be a case with nothing to move)."""
    value = parse_bytes(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is less than one byte")
    return value


def device_spec(text: str) -> str:
    """auto, cpu, cuda or cuda:N, checked without torch so dry runs and usage errors stay fast; whether the GPU
    exists is core.device.resolve_device's check, when the tool runs."""
    if text in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:[0-9]{1,4}", text):
        return text
    raise argparse.ArgumentTypeError(f"'{text}' is not a device (auto, cpu, cuda or cuda:N)")


def add_device_args(parser: argparse.ArgumentParser, dtypes: Sequence[str] = ("bf16", "fp16", "fp32")) -> None:
    parser.add_argument(
        "--device", type=device_spec, default="auto", help="auto (GPU if present, else CPU), cpu, cuda, cuda:N"
    )
    parser.add_argument(
        "--dtype", choices=list(dtypes), default=None, help="element type (default: bf16 on GPU, fp32 on CPU)"
    )


def add_timing_args(parser: argparse.ArgumentParser, note: str = "") -> None:
    """The harness' knobs; help shows TimingConfig's real values (the flags themselves default to None, so a
    tool can tell 'not given' from 'given the default')."""
    from .timing import TimingConfig

    d, q = TimingConfig(), TimingConfig.quick()
    g = parser.add_argument_group("timing", note or None)
    g.add_argument(
        "--warmup", type=integer, default=None, help=f"minimum warm-up calls per shape (default: {d.warmup_iters})"
    )
    g.add_argument(
        "--min-iters", type=integer, default=None, help=f"minimum timed calls per shape (default: {d.min_iters})"
    )
    g.add_argument(
        "--max-iters", type=integer, default=None, help=f"maximum timed calls per shape (default: {d.max_iters})"
    )
    g.add_argument(
        "--rel-tol",
        type=finite_float,
        default=None,
        help=f"stop when the median is stable to this fraction (default: {d.rel_tol:g})",
    )
    g.add_argument(
        "--max-spread",
        type=finite_float,
        default=None,
        help="... and the interquartile range is at most this fraction of the median; rows that end wider "
        f"are marked noisy (default: {d.max_spread:g})",
    )
    g.add_argument(
        "--budget", type=finite_float, default=None, help=f"seconds of timed calls per shape (default: {d.budget_s:g})"
    )
    g.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke runs: {q.min_iters}-{q.max_iters} calls, {q.budget_s:g} s per shape",
    )


def add_model_args(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    model_default: str | None = None,
    model_help: str = "model name(s) from the configs, comma-separated, or 'all'",
    config_help: str = "",
    with_name: bool = True,
) -> None:
    """--model-config-path / --model (/ --model-name): the same flags, the same meaning, in every tool."""
    parser.add_argument(
        "--model-config-path",
        default=None,
        metavar="PATH",
        help=config_help
        or "Primus model_configs.json list, one object, or a Hugging Face "
        "config.json (default: the built-in configs; 'builtin' names them explicitly)",
    )
    parser.add_argument("--model", type=model_selection, default=model_default, help=model_help)
    if with_name:
        parser.add_argument(
            "--model-name",
            default=None,
            help="name for an HF config.json (default: its folder's name for a config.json, else the file's stem)",
        )


def add_mbs_arg(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *aliases: str,
    dest: str = "mbs",
    help: str = "micro-batch sizes, e.g. 1,2,4,8",
) -> None:
    """--mbs is always a list."""
    parser.add_argument(
        "--mbs", *aliases, dest=dest, type=csv_list(positive_int), default=[1], metavar="N[,N...]", help=help
    )


def add_output_args(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    dir_default: str | None = None,
    dir_help: str = "folder the CSVs (and their .meta.json sidecars) go to",
    csv_help: str | None = None,
    csv_default: str | None = None,
    csv_aliases: Sequence[str] = (),
) -> None:
    """Where output goes, in every tool: ``--report-dir-path DIR`` (the tool's standard file names inside), and
    for single-CSV tools ``--report-csv-path FILE`` to name the file itself (it wins over the folder)."""
    parser.add_argument("--report-dir-path", type=path_text, default=dir_default, metavar="DIR", help=dir_help)
    if csv_help is not None:
        parser.add_argument(
            "--report-csv-path",
            *csv_aliases,
            dest="report_csv_path",
            type=path_text,
            default=csv_default,
            metavar="FILE",
            help=csv_help,
        )


OUT = "out"  # the folder every tool's default output folder is inside


def tool_dir(name: str) -> str:
    """A tool's default --report-dir-path, ``out/<name>``: one folder per kind of job, so one tool's run never
    moves another job's CSV aside under ``earlier/`` (docs/conventions.md, "Earlier results"), and ``opbench
    report out/`` reads every job's latest CSVs side by side."""
    return f"{OUT}/{name}"


PLAN_SUFFIX = ".plan.csv"  # core.outputs.PLAN_SUFFIX, here without importing the output layer into every parser


def output_csv(args: argparse.Namespace, file_name: str) -> str | None:
    """The CSV a single-CSV tool writes: --report-csv-path if given, else DIR/file_name, else None (console only).
    A real run's CSV may not be named like a dry run's plan: ``opbench report`` skips those files."""
    if getattr(args, "report_csv_path", None):
        path = str(args.report_csv_path)
        if path.endswith(PLAN_SUFFIX) and not getattr(args, "dry_run", False):
            raise UsageError(
                f"a name ending in {PLAN_SUFFIX} is a dry run's plan, which opbench report skips: name this run's "
                "CSV otherwise",
                field="--report-csv-path",
            )
        return path
    if args.report_dir_path:
        return os.path.join(args.report_dir_path, file_name)
    return None


def _top_rows(text: str) -> int | None:
    """--top N: a row limit; 0 means no limit (None), as in every tool."""
    return non_negative_int(text) or None


def add_top_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, default: int | None, *aliases: str) -> None:
    parser.add_argument(
        "--top",
        *aliases,
        dest="top",
        type=_top_rows,
        default=default,
        metavar="N",
        help="rows shown in each console table, 0 = all" + (" (default: all)" if default is None else ""),
    )


def add_dry_run_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str) -> None:
    parser.add_argument("--dry-run", action="store_true", help=f"plan only, time nothing: {what}")


EARLIER_HELP = """\
A CSV already at the output path that holds measured rows is kept: moved with its sidecar to
earlier/<UTC time>/ beside it (a results folder of its own), and the run says so. A dry run writes
<name>.plan.csv and never touches a measured CSV. A second run writing the same CSV while another
does stops at once, naming the other."""


def add_earlier_args(parser: argparse.ArgumentParser) -> None:
    """--overwrite / --append: what a run does with an earlier CSV at its output path (core.outputs); without
    either it is kept aside, never lost."""
    g = parser.add_argument_group("earlier results", EARLIER_HELP)
    both = g.add_mutually_exclusive_group()
    both.add_argument("--overwrite", action="store_true", help="replace an earlier CSV instead of keeping it")
    both.add_argument("--append", action="store_true", help="add rows to an earlier CSV (same columns)")


def earlier_policy(args: argparse.Namespace) -> str:
    """core.outputs' policy from --overwrite / --append (keep when neither, or the tool has no such flags)."""
    from .outputs import APPEND, KEEP, OVERWRITE

    if getattr(args, "append", False):
        return APPEND
    if getattr(args, "overwrite", False):
        return OVERWRITE
    return KEEP


def add_launch_args(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, nnodes_help: str = "nodes in the job"
) -> None:
    """The self-launch flags of every multi-rank tool (ignored under torchrun/srun); ``core.dist.self_launch``
    reads them."""
    parser.add_argument(
        "--nproc-per-node",
        type=positive_int,
        default=None,
        help="start torchrun with this many ranks here (default: one per GPU, 1 on CPU)",
    )
    parser.add_argument("--nnodes", type=positive_int, default=1, help=nnodes_help)
    parser.add_argument(
        "--node-rank",
        type=non_negative_int,
        default=os.environ.get("NODE_RANK", "0"),  # a string default goes through the type check too
        help="this node's index (default: $NODE_RANK or 0)",
    )
    parser.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR"), help="rendezvous host ($MASTER_ADDR)")
    parser.add_argument(
        "--master-port",
        type=port_number,
        default=None,
        help="rendezvous port (default: $MASTER_PORT, else a free port on one node, 29500 on several)",
    )
    parser.add_argument(
        "--backend",
        type=backend_name,
        default=None,
        help="torch.distributed backend (default: nccl on GPU — RCCL on ROCm — and gloo on CPU)",
    )


def add_timeout_arg(parser: argparse.ArgumentParser | argparse._ArgumentGroup, default: float) -> None:
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=default,
        metavar="SECONDS",
        help="seconds the rendezvous or any collective may take before the job fails with one "
        "clear error (a dead or hung rank)",
    )


def timing_config(args: argparse.Namespace):
    from dataclasses import replace

    from .timing import TimingConfig

    cfg = TimingConfig.quick() if getattr(args, "quick", False) else TimingConfig()
    overrides = {
        "warmup_iters": args.warmup,
        "min_iters": args.min_iters,
        "max_iters": args.max_iters,
        "rel_tol": args.rel_tol,
        "max_spread": args.max_spread,
        "budget_s": args.budget,
    }
    for key, value in overrides.items():
        if value is not None and value < 0:
            raise UsageError(f"must not be negative, got {value}", field="--" + key.replace("_", "-"))
    cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    if cfg.max_iters < 1:
        raise UsageError(f"must be at least 1, got {cfg.max_iters}", field="--max-iters")
    if cfg.min_iters > cfg.max_iters:
        raise UsageError(f"--min-iters {cfg.min_iters} exceeds --max-iters {cfg.max_iters}", field="--min-iters")
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        lines = ["usage: opbench <subcommand> [options]", "", "subcommands:"]
        lines += [f"  {name:<11} {desc}" for name, (_, desc) in SUBCOMMANDS.items()]
        lines += ["", "`opbench <subcommand> --help` shows a subcommand's options."]
        print("\n".join(lines))
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        import opbench

        print(opbench.__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        close = did_you_mean(name, list(SUBCOMMANDS))
        hint = f"; did you mean {close}?" if close else ""
        choose = ", ".join(SUBCOMMANDS)
        print(f"opbench: error: unknown subcommand '{name}'{hint} (choose from {choose})", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])

    return run_cli(module.main, rest, prog=f"opbench {name}")


def console_main() -> None:
    try:
        code = main()
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's shutdown
    except BrokenPipeError:  # `opbench --help | head`: the subcommands' run_cli does the same
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)
