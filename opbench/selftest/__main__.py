"""``opbench selftest`` / ``python -m opbench.selftest``: is this machine's install right?

Runs every backend opbench has on a tiny case and checks it against the reference its tool uses: each GEMM
backend (torch, torch_grouped, fp8, triton), each attention backend (the SDPA kernels, flash_attn, triton,
math; forward and backward), every collective on a 2-rank group (NCCL/RCCL with 2 GPUs, else gloo on CPU),
and a checkpoint round trip per method. One table: backend, available (or why not), correct (max error vs
tolerance), a rough TFLOPS or GB/s. Exit 1 when an available backend gives a wrong answer or crashes, else 0.
Run it after installing on a new node, and first whenever a GPU is at hand. About 20 s on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opbench.core import cli
from opbench.core.errors import UsageError, run_cli
from opbench.core.units import counted, one_line

from .schema import SCHEMA

CSV_NAME = "selftest.csv"
AREAS = ("gemm", "attention", "comm", "ckpt")
SHOWN = ("area", "backend", "device", "dtype", "available", "correct", "max_error", "tolerance", "tflops", "gbs")


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("opbench selftest", __doc__.split("\n\n")[1].replace("\n", " ") if __doc__ else None)
    cli.add_device_args(p)
    p.add_argument(
        "--areas",
        type=cli.csv_list(),
        default=list(AREAS),
        metavar="A,B",
        help=f"what to check, a subset of {','.join(AREAS)} (default: all)",
    )
    cli.add_output_args(p, dir_help=f"write DIR/{CSV_NAME}", csv_help="write the table here (default: no CSV)")
    cli.add_earlier_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    unknown = [a for a in args.areas if a not in AREAS]
    if unknown:
        raise UsageError(f"unknown area(s) {unknown}; choose from {','.join(AREAS)}", field="--areas")
    from opbench.core.faults import Faults

    Faults.from_env()  # a bad OPBENCH_FAULTS is the user's mistake, not a broken backend in the table

    from opbench.core.device import default_dtype_name, use_device
    from opbench.core.results import CsvReport, environment, summary_table
    from opbench.core.timing import TimingConfig

    from . import checks

    device = use_device(args.device)
    dtype = args.dtype or default_dtype_name(device)
    timing = TimingConfig.quick()
    path = cli.output_csv(args, CSV_NAME)
    report = CsvReport(path, SCHEMA, meta=environment(device), earlier=cli.earlier_policy(args)) if path else None
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="opbench-selftest-") as tmp:
        work = Path(tmp)
        runs = {
            "gemm": lambda: checks.gemm_rows(device, dtype, timing),
            "attention": lambda: checks.attention_rows(device, dtype, timing),
            "comm": lambda: checks.comm_rows(device, work),
            "ckpt": lambda: checks.ckpt_rows(device, work),
        }
        for area in args.areas:
            for row in runs[area]():
                rows.append(row)
                if report is not None:
                    report.append(row)  # as each check completes
                print(_line(row), flush=True)
    if report is not None:
        report.close()
    print()
    print(summary_table(rows, SHOWN, floatfmt=".3g"))
    wrong = [r for r in rows if r["status"] == "error"]
    missing = [r for r in rows if not r.get("available")]
    print(
        f"\n{len(rows) - len(missing)} of {len(rows)} backends available here; "
        + (
            f"{len(wrong)} WRONG: " + ", ".join(f"{r['area']} {r['backend']}" for r in wrong)
            if wrong
            else "all correct"
        )
    )
    if path:
        print(f"wrote {one_line(str(path))} ({counted(len(rows), 'row')})")
    return 1 if wrong else 0


def _line(row: dict[str, Any]) -> str:
    """One progress line per check: what it was and its verdict."""
    verdict = {"ok": "ok", "unsupported": "not available", "error": "WRONG"}.get(row["status"], row["status"])
    why = f" ({row['error']})" if row.get("error") and row["status"] != "ok" else ""
    return f"{row['area']:<9} {row['backend']:<22} {verdict}{why}"


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.selftest"))
