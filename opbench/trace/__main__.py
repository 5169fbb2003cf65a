"""``opbench trace`` / ``python -m opbench.trace``: what did a real job send? NCCL/RCCL debug-log analysis.

Run a job with ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL`` (add ``INIT`` to get ranks and commIds), then::

    opbench trace job.log[.gz] [--report-csv-path sizes.csv] [--per-rank] [--per-comm] [--commands] [--replay]
                                [--compare-fsdp CFG --model NAME]

Parsing lives in ``parse`` (streaming, constant memory), all-to-all recognition in ``p2p``, tallies in
``summary``, the optional actions in ``actions``. No torch import on this path.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from opbench.core import cli, outputs
from opbench.core.errors import run_cli

CSV_NAME = "trace_summary.csv"


def build_parser() -> argparse.ArgumentParser:
    from .actions import add_action_args

    p = cli.parser(
        "opbench trace", "Summarise the collectives in NCCL/RCCL debug logs (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL)."
    )
    p.add_argument("logs", nargs="+", metavar="LOG", help="log files (plain or .gz); '-' reads stdin")
    cli.add_output_args(
        p,
        dir_help=f"write DIR/{CSV_NAME} (and its _per_rank / _per_comm / _fsdp siblings)",
        csv_help="summary CSV: one row per distinct (op, count, datatype, redop, nranks); the "
        "breakdowns go beside it as <stem>_per_rank.csv, … (default: no CSV)",
        csv_aliases=("--csv",),
    )
    p.add_argument("--per-rank", action="store_true", help="calls and bytes per rank and op (CSV: <stem>_per_rank.csv)")
    p.add_argument(
        "--per-comm", action="store_true", help="calls and bytes per communicator (CSV: <stem>_per_comm.csv)"
    )
    cli.add_top_arg(p, 15)
    p.add_argument(
        "--raw-p2p",
        action="store_true",
        help="keep Send/Recv lines as logged instead of merging grouped ones into AlltoAll",
    )
    p.add_argument(
        "--jobs",
        type=jobs_count,
        default=1,
        metavar="N",
        help="read the logs in N processes (a plain log of 16 MB or more is cut into 8 MiB pieces at line starts, "
        "a .gz or a smaller log is one piece); the output is the same as with 1",
    )
    add_action_args(p)
    cli.add_earlier_args(p)
    return p


MAX_JOBS = 256


def jobs_count(text: str) -> int:
    value = cli.positive_int(text)
    if value > MAX_JOBS:
        raise argparse.ArgumentTypeError(f"{value} processes is more than {MAX_JOBS}; is that a typo?")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    from . import actions
    from .analyze import analyze, check_paths

    args = build_parser().parse_args(argv)
    args.csv = cli.output_csv(args, CSV_NAME)
    if args.csv:  # a CSV over one of the logs is refused (claimed, below) before the logs are read
        outputs.protect(check_paths(args.logs))
    if args.compare_fsdp:
        args.fsdp_config = actions.fsdp_config(args)  # a wrong model is one line before the log is read
    with outputs.claimed(*actions.csv_paths(args)):  # a bad or busy CSV path stops now, not after a long parse
        summary, parser = analyze(args.logs, raw_p2p=args.raw_p2p, jobs=args.jobs)
        return actions.run(args, summary, parser)


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.trace"))
