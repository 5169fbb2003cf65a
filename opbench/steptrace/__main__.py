"""``opbench step`` / ``python -m opbench.steptrace``: a real training step's profiler trace, every kernel put in its
place, set beside the projection (docs/step.md).

    opbench step rank0.json.gz [rank1.json.gz …] [--project "FLAGS of opbench project"] [--calibrate FILE]
                 [--memory-mib N]

Reading lives in ``reader`` (streaming, bounded memory), the classes in ``rules``, the per-step cut in
``attribute``, the tables in ``summary``, the projection in ``compare``. No torch import.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from opbench.core import cli, outputs
from opbench.core.errors import UsageError, run_cli
from opbench.core.results import CsvReport, environment, summary_table
from opbench.core.units import counted, one_line

from .schema import ITEMS, KERNELS, TIMELINE

ITEMS_CSV = "step_items.csv"
KERNELS_CSV = "step_kernels.csv"
TIMELINE_CSV = "step_timeline.csv"
MEMORY_MIB = 1024  # --memory-mib's default


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser(
        "opbench step",
        "Attribute every kernel of a profiled training step (torch.profiler / Kineto JSON, one per rank) to GEMMs, "
        "attention, memory-bound, collectives, optimizer; set the step beside opbench project's projection.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE", help="Kineto trace files (.json or .json.gz), one per rank")
    p.add_argument(
        "--project",
        metavar="FLAGS",
        default=None,
        help="opbench project's flags for the model and layout the trace ran, in one quoted string, e.g. "
        '"--model Qwen3_0.6B --world-size 8 --mbs 2 --seqlen 4096 --results out/": each line item of that '
        "projection is set beside the trace's",
    )
    p.add_argument(
        "--calibrate",
        metavar="FILE",
        type=cli.path_text,
        default=None,
        help="with --project: write measured/projected per class (GEMM, attention, memory-bound) as JSON for "
        "opbench project --calibration FILE",
    )
    p.add_argument(
        "--memory-mib",
        metavar="N",
        type=cli.size_mib,
        default=MEMORY_MIB,
        help="memory budget per trace (default %(default)s): a trace whose kept events would need more (an "
        "estimate) is read again by step, as many consecutive steps per pass as fit, time one read per pass",
    )
    cli.add_top_arg(p, 15)
    cli.add_output_args(
        p,
        dir_default=cli.tool_dir("step"),
        dir_help=f"write DIR/{ITEMS_CSV}, DIR/{KERNELS_CSV} and DIR/{TIMELINE_CSV} (the median step's pieces, "
        "for opbench report's timeline picture) with their .meta.json sidecars",
    )
    cli.add_earlier_args(p)
    return p


def _fmt_ms(value: Any) -> Any:
    return None if value is None else round(value * 1e3, 4)


def main(argv: Sequence[str] | None = None) -> int:
    from . import compare, summary

    args = build_parser().parse_args(argv)
    if args.calibrate and not args.project:
        raise UsageError("--calibrate needs --project: the factors are measured over projected", field="--calibrate")
    paths = []
    if args.report_dir_path:
        paths = [os.path.join(args.report_dir_path, name) for name in (ITEMS_CSV, KERNELS_CSV, TIMELINE_CSV)]
        outputs.protect(list(args.traces))
    with outputs.claimed(*paths):
        projected: dict[str, float] = {}
        projection_meta: dict[str, Any] = {}
        rates = None
        if args.project:  # a bad flag is one line before a large trace is read
            projected, projection_meta, rates = compare.projected_items(args.project)
        ranks = summary.analyse(
            list(args.traces), args.memory_mib, lambda line: print(f"opbench step: {one_line(line)}", file=sys.stderr)
        )
        for r in ranks:
            for w in r.warnings:
                print(f"warning: {one_line(r.path)}: {w}", file=sys.stderr)
            if not r.steps:
                raise UsageError("no kernels, operators or steps to attribute", source=r.path)
        item_rows: list[dict[str, Any]] = []
        kernel_rows: list[dict[str, Any]] = []
        for r in ranks:
            rows = summary.item_rows(r)
            if projected:
                _add_projection(rows, projected, r)
            item_rows += rows
            kernels = summary.kernel_rows(r)
            if rates is not None:
                compare.kernel_rates(kernels, rates)
            kernel_rows += kernels
        _print(ranks, item_rows, kernel_rows, args.top)
        meta = environment(
            None,
            {
                "traces": [r.path for r in ranks],
                "ranks": {r.name: r.rank for r in ranks},
                "on_gpu": any(r.on_gpu for r in ranks),
                "events": {r.name: r.events for r in ranks},
                "memory_mib": args.memory_mib,
                "reading": {r.name: r.reading for r in ranks},  # whole, or by step (passes, steps per pass)
                "projection": projection_meta,
            },
        )
        lag = summary.straggler(ranks, args.top or 5)
        if lag is not None:
            print(_straggler_text(lag))
            meta["straggler"] = {"rank": lag.rank, "compute_s": lag.compute_s, "others_compute_s": lag.median_compute_s}
        if args.calibrate:
            measured = compare.measured_totals([summary.items(r) for r in ranks])
            fac = compare.factors(measured, projected)
            compare.write_calibration(args.calibrate, fac, {"traces": [r.path for r in ranks], **projection_meta})
            shown = ", ".join(f"{k} × {v:.3g}" for k, v in fac.items())
            print(f"wrote {one_line(args.calibrate)} ({shown}): opbench project --calibration {args.calibrate} …")
        if paths:
            timeline = [row for r in ranks for row in summary.timeline_rows(r)]
            dropped = {  # a capped timeline: how many pieces were left out, and up to when the step is drawn
                r.name: {"pieces": r.timeline.dropped, "drawn_until_s": (r.timeline.cut_us - r.timeline.start_us) / 1e6}
                for r in ranks
                if r.timeline is not None and r.timeline.dropped
            }
            pieces = {"timeline_steps": {r.name: r.timeline_step for r in ranks}, "timeline_dropped": dropped}
            for path, schema, rows, extra in (
                (paths[0], ITEMS, item_rows, {}),
                (paths[1], KERNELS, kernel_rows, {}),
                (paths[2], TIMELINE, timeline, pieces),
            ):
                with CsvReport(path, schema, meta={**meta, **extra}, earlier=cli.earlier_policy(args)) as report:
                    report.extend(rows)
                print(f"wrote {one_line(path)} ({counted(len(rows), 'row')})")
    return 0


def _add_projection(rows: list[dict[str, Any]], projected: dict[str, float], r: Any) -> None:
    """The projection's figure beside each measured line item of one rank; its items the trace has no name for
    (bubble, comm per parallel dimension, comm in total) as rows with no measured figure."""
    by_item = {row["item"]: row for row in rows}
    comm = sum(row["measured_s"] for row in rows if str(row["item"]).startswith("comm:"))
    for item, seconds in projected.items():
        row = by_item.get(item)
        if row is None:
            measured = comm if item == "comm" else None
            row = {"trace": r.name, "rank": r.rank, "steps": len(r.steps), "item": item, "measured_s": measured}
            if item == "bubble":
                row["note"] = "no pipeline p2p in this trace: no bubble measured"
            rows.insert(len(rows) - 1, row)  # before the step row
        row["projected_s"] = seconds
        if row.get("measured_s") is not None and seconds > 0:
            row["measured_over_projected"] = row["measured_s"] / seconds


def _print(
    ranks: list[Any], item_rows: list[dict[str, Any]], kernel_rows: list[dict[str, Any]], top: int | None
) -> None:
    for r in ranks:
        kind = "GPU kernels" if r.on_gpu else "CPU operators (no GPU kernels in the trace)"
        print(
            f"{one_line(r.name)}: rank {r.rank}, {counted(len(r.steps), 'step')}, median {r.step_s * 1e3:.4g} ms, "
            f"{r.events:,} events; {kind}"
        )
        rows = [
            {
                "item": x["item"],
                "measured_ms": _fmt_ms(x.get("measured_s")),
                "share": None if x.get("share") is None else f"{x['share']:.1%}",
                "exposed_ms": _fmt_ms(x.get("exposed_s")),
                "overlapped_ms": _fmt_ms(x.get("overlapped_s")),
                "projected_ms": _fmt_ms(x.get("projected_s")),
                "measured/projected": x.get("measured_over_projected"),
            }
            for x in item_rows
            if x["rank"] == r.rank and x["trace"] == r.name
        ]
        columns = ["item", "measured_ms", "share", "exposed_ms", "overlapped_ms"]
        if any(x["projected_ms"] is not None for x in rows):
            columns += ["projected_ms", "measured/projected"]
        print(summary_table(rows, columns))
        mine = [x for x in kernel_rows if x["rank"] == r.rank and x["trace"] == r.name]
        shown = [
            {
                **{c: x[c] for c in ("class", "kind", "m", "n", "k", "dtype", "calls")},
                "name": one_line(x["name"])[:60],
                "ms": _fmt_ms(x["time_s"]),
                "share": f"{x['share']:.1%}",
                "projected_ms": _fmt_ms(x.get("projected_s")),
                "measured/projected": x.get("measured_over_projected"),
            }
            for x in mine
        ]
        columns = ["class", "kind", "name", "m", "n", "k", "dtype", "calls", "ms", "share"]
        if any(x["projected_ms"] is not None for x in shown):
            columns += ["projected_ms", "measured/projected"]
        print(f"\nkernels of {one_line(r.name)}, most time first (per step):")
        print(summary_table(shown, columns, max_rows=top))
        print()


def _straggler_text(lag: Any) -> str:
    lines = [
        f"slowest rank: {lag.rank}, computing {lag.compute_s * 1e3:.4g} ms per step against the others' "
        f"{lag.median_compute_s * 1e3:.4g} ms (median)"
    ]
    for name, extra in lag.kernels:
        lines.append(f"  +{extra * 1e3:.4g} ms per step in {one_line(name)[:90]}")
    for rank, kind, more in lag.waits:
        lines.append(f"  rank {rank} waited {more * 1e3:.4g} ms per step longer in exposed {kind}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.steptrace"))
