"""Command-line plumbing shared by every benchmark, and the ``opbench`` dispatcher.

Each benchmark module exposes ``main(argv) -> int``; ``opbench <sub>`` imports it lazily, so a missing
optional dependency of one benchmark never breaks another.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from typing import Callable, Sequence, TypeVar

from .errors import UsageError, run_cli

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
}


def csv_list(kind: Callable[[str], T] = str) -> Callable[[str], list[T]]:
    """argparse type for '1,2,4' style options."""

    def parse(text: str) -> list[T]:
        items = [p.strip() for p in text.split(",") if p.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        try:
            return [kind(p) for p in items]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """nccl-tests size syntax: 8, 1K, 64M, 1G (powers of 1024, as nccl-tests' parsesize)."""
    m = _SIZE.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (examples: 8, 1K, 64M, 1G)")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * mult)


def add_device_args(parser: argparse.ArgumentParser, dtypes: Sequence[str] = ("bf16", "fp16", "fp32")) -> None:
    parser.add_argument("--device", default="auto", help="auto (GPU if present, else CPU), cpu, cuda, cuda:N")
    parser.add_argument("--dtype", choices=list(dtypes), default=None,
                        help="element type (default: bf16 on GPU, fp32 on CPU)")


def add_timing_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("timing")
    g.add_argument("--warmup", type=int, default=None, help="minimum warm-up calls per shape")
    g.add_argument("--min-iters", type=int, default=None, help="minimum timed calls per shape")
    g.add_argument("--max-iters", type=int, default=None, help="maximum timed calls per shape")
    g.add_argument("--rel-tol", type=float, default=None, help="stop when the median is stable to this fraction")
    g.add_argument("--budget", type=float, default=None, help="seconds of timed calls per shape")
    g.add_argument("--quick", action="store_true", help="few calls per shape (smoke runs)")


def timing_config(args: argparse.Namespace):
    from dataclasses import replace

    from .timing import TimingConfig

    cfg = TimingConfig.quick() if getattr(args, "quick", False) else TimingConfig()
    overrides = {
        "warmup_iters": args.warmup, "min_iters": args.min_iters, "max_iters": args.max_iters,
        "rel_tol": args.rel_tol, "budget_s": args.budget,
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
        print(f"opbench: error: unknown subcommand '{name}' (choose from {', '.join(SUBCOMMANDS)})", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return run_cli(module.main, rest, prog=f"opbench {name}")


def console_main() -> None:
    sys.exit(main())
