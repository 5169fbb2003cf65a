"""``python -m opbench.gemm`` / ``opbench gemm``: time the GEMMs of a model's training step.

Without --model (and without --model-config-path or --mnk) it is a quick look, not the whole catalogue:
Qwen3_0.6B's GEMMs, at seqlen 128 on a CPU (about half a minute) and at the model's own 4096 on a GPU; the
console says so. --model NAME[,NAME…] or --model all times others (all 15 built-in models at full length is
hours on a CPU).

On a terminal a bar shows progress; in a batch log or a pipe each GEMM prints one line as it finishes.
"""

# Help and usage errors must come back in well under a second, so torch (the device layer, the backends, the
# runner) is imported only once the arguments and shapes are known to be good.

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opbench.core import cli, outputs
from opbench.core.cli import add_device_args, add_timing_args, csv_list, positive_int, timing_config
from opbench.core.dtypes import GEMM_DTYPES
from opbench.core.errors import UsageError, run_cli
from opbench.core.progress import STATUS, Field, Workload, column, figure, number, percent, time_text
from opbench.core.results import CsvReport, environment, summary_table
from opbench.core.sweep import run_sweep
from opbench.core.timing import expected_seconds, noisy_advice
from opbench.core.units import counted, note, one_line
from opbench.models import load_model_configs, select_models

from .schema import BACKEND_NAMES, SCHEMA
from .shapes import ALL_LAYERS, LAYOUTS, PASSES, RAW, GemmShape, ModelParallel, gemm_shapes, parse_mnk, raw_shapes

if TYPE_CHECKING:
    from opbench.core.device import DeviceInfo
    from opbench.core.timing import TimingConfig

    from .runner import GemmCase

SUMMARY = [
    "layer",
    "pass",
    "mbs",
    "m",
    "n",
    "k",
    "groups",
    "layer_count",
    "backend",
    "time_s",
    "time_iqr_rel",
    "tflops",
    "pct_of_peak",
    "status",
    "note",
]
# One line per finished GEMM in a batch log (core.progress): what it was, and how fast.
LINE_FIELDS = [
    column("layer", 12, left=True),
    column("pass", 5, left=True),
    Field("m x n x k", 22, lambda r: "x".join(str(r.get(c)) for c in ("m", "n", "k")) + groups_text(r), left=True),
    column("backend", 13, left=True),
    Field("time", 9, lambda r: time_text(r.get("time_s"))),
    Field("TFLOP/s", 8, lambda r: figure(r.get("tflops"))),
    Field("IQR", 4, lambda r: percent(r.get("time_iqr_rel"))),
    STATUS,
]
# A bare `opbench gemm`: one small model, short on a CPU (module docstring).
QUICK_MODEL = "Qwen3_0.6B"
QUICK_CPU_SEQLEN = 128
# ... into a folder of its own: the quick look is another job than `--model Qwen3_0.6B`, whose CSV has the same
# name and would be moved aside under earlier/ by it (docs/conventions.md, "Earlier results").
QUICK_DIR = "gemm-quick"


def groups_text(row: Mapping[str, Any]) -> str:
    groups = row.get("groups")
    return f" ({groups} groups)" if groups not in (None, "", 1, "1") else ""


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("opbench gemm", __doc__)
    cli.add_model_args(
        p,
        model_help="model name(s) from the configs, comma-separated, or 'all' (default: all the models of "
        f"--model-config-path; with no config either, a quick look: {QUICK_MODEL} at seqlen {QUICK_CPU_SEQLEN} on a "
        "CPU, at its own on a GPU)",
    )
    cli.add_output_args(
        p,
        dir_help=f"where benchmark_gemm_<model>.csv files go (default: {cli.tool_dir('gemm')}; the quick look of a "
        f"bare `opbench gemm`: {cli.tool_dir(QUICK_DIR)})",
    )
    p.add_argument("--seqlen", type=cli.sequence_length, default=None, help="sequence length (default: the model's)")
    cli.add_mbs_arg(p)
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size")
    p.add_argument("--ep", type=positive_int, default=1, help="expert-parallel size")
    p.add_argument("--cp", type=positive_int, default=1, help="context-parallel size (divides the token count)")
    p.add_argument(
        "--etp",
        type=positive_int,
        default=None,
        help="expert tensor-parallel size (default: --tp, as Megatron-Core; 1 = experts not TP-split)",
    )
    p.add_argument("--passes", type=csv_list(), default=list(PASSES), help="any of fwd,dgrad,wgrad")
    p.add_argument("--layers", type=csv_list(), default=None, help=f"subset of {','.join(ALL_LAYERS)} (default: all)")
    p.add_argument(
        "--backends",
        type=csv_list(),
        default=["auto"],
        help=f"auto (torch, and torch_grouped for expert GEMMs) or any of {','.join(BACKEND_NAMES)}",
    )
    p.add_argument(
        "--cache",
        choices=["cold", "warm"],
        default="cold",
        help="cold: rotate operand sets larger than the last-level cache between calls",
    )
    raw = p.add_argument_group("raw shapes (no model; Primus' --M --N --K --trans_a --trans_b)")
    raw.add_argument(
        "--mnk",
        type=parse_mnk_arg,
        default=None,
        metavar="MxNxK[,…]",
        help="time these GEMMs instead of a model's: rows with layer=raw in benchmark_gemm_raw.csv",
    )
    raw.add_argument(
        "--layout",
        choices=list(LAYOUTS),
        default="NT",
        help="A and B stored as-is (N) or transposed (T); NT is a linear layer's forward",
    )
    cli.add_dry_run_arg(p, "write the planned rows (status=planned) to benchmark_gemm_<model>.plan.csv")
    cli.add_top_arg(p, None)
    add_device_args(p, dtypes=GEMM_DTYPES)
    add_timing_args(p)
    cli.add_earlier_args(p)
    return p


def parse_mnk_arg(text: str) -> list[tuple[int, int, int]]:
    try:
        return parse_mnk(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def report_path(report_dir: str, model: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model)
    return Path(report_dir) / f"benchmark_gemm_{safe}.csv"


def expand_cases(shapes: Sequence[GemmShape], backends: Sequence[str], dtype: str) -> list[GemmCase]:
    from .runner import GemmCase

    cases: list[GemmCase] = []
    for s in shapes:
        if backends == ["auto"]:
            names = ["fp8"] if dtype == "fp8" else ["torch_grouped" if s.groups > 1 else "torch"]
        else:
            names = list(backends)
        cases.extend(GemmCase(s, b, dtype) for b in names)
    return cases


def workload(cases: Sequence[GemmCase], timing: TimingConfig) -> Workload:
    """Each GEMM's FLOPs, for the bar's time left (core.progress.Workload): one timed call per row, after one
    untimed call for the reference check (runner.run_case)."""
    return Workload(
        work=[[c.shape.flops] for c in cases],
        measured=lambda row: [number(row.get("time_s"))],
        wall=partial(expected_seconds, config=timing, extra_calls=1),
    )


Plan = tuple[str, dict[str, Any], "int | None", list[GemmShape]]  # model, its config, seqlen, its GEMMs


def derive_plans(args: argparse.Namespace, par: ModelParallel, seqlen: int | None) -> list[Plan]:
    """Each model's (or the raw shapes') GEMMs; every input error surfaces here."""
    if args.mnk:
        if args.model or args.model_config_path:
            raise UsageError("raw shapes take no model: leave out --model / --model-config-path", field="--mnk")
        return [(RAW, {"mnk": args.mnk, "layout": args.layout}, None, raw_shapes(args.mnk, args.layout))]
    configs = select_models(load_model_configs(args.model_config_path, args.model_name), args.model)
    return [
        (
            cfg.name,
            cfg.to_dict(),
            seqlen or cfg.seqlen,
            gemm_shapes(cfg, args.mbs, seqlen, par, args.layers, args.passes),
        )
        for cfg in configs
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    unknown = [b for b in args.backends if b != "auto" and b not in BACKEND_NAMES]
    if unknown:
        raise UsageError(
            f"unknown backend(s) {unknown}; choose from auto,{','.join(BACKEND_NAMES)}", field="--backends"
        )
    bad_layers = [x for x in (args.layers or []) if x not in ALL_LAYERS]
    if bad_layers:
        raise UsageError(f"unknown layer(s) {bad_layers}; choose from {','.join(ALL_LAYERS)}", field="--layers")
    bad_passes = [x for x in args.passes if x not in PASSES]
    if bad_passes:
        raise UsageError(f"unknown pass(es) {bad_passes}; choose from {','.join(PASSES)}", field="--passes")
    par = ModelParallel(tp=args.tp, ep=args.ep, cp=args.cp, etp=args.etp)
    quick = not (args.mnk or args.model or args.model_config_path)
    if quick:
        args.model = QUICK_MODEL
    # Derive every model's shapes first: bad input fails before torch is loaded or anything is written.
    plans = derive_plans(args, par, args.seqlen or (QUICK_CPU_SEQLEN if quick else None))
    folder = args.report_dir_path or cli.tool_dir(QUICK_DIR if quick else "gemm")
    paths = [report_path(folder, name) for name, *_ in plans]
    if args.dry_run:
        paths = [outputs.plan_path(path) for path in paths]
    with outputs.claimed(*paths):  # a second run into these files stops now, before torch loads, not at one
        return run_plans(args, par, plans, paths, quick)


def run_plans(args: argparse.Namespace, par: ModelParallel, plans: list[Plan], paths: list[Path], quick: bool) -> int:
    """Time each model's GEMMs into its CSV (the CSVs' writer locks are held)."""
    from opbench.core.device import default_dtype_name, device_info, use_device

    device = use_device(args.device)
    if quick:
        if device.type != "cpu" and not args.seqlen:
            plans = derive_plans(args, par, None)  # a GPU takes the model's own length in seconds
        names = ", ".join(c.name for c in load_model_configs(None, None))
        print(
            note(
                f"no --model: a quick look at {QUICK_MODEL} at seqlen {plans[0][2]}"
                f"{' (CPU)' if device.type == 'cpu' else ''}, into {one_line(paths[0].parent)}/; --model "
                f"NAME[,NAME…] or all for others: {names}"
            ),
            file=sys.stderr,
        )
    info = device_info(device)
    gemm_run = GemmRun(args, par, info, args.dtype or default_dtype_name(device), timing_config(args))
    for plan, path in zip(plans, paths, strict=True):
        gemm_run.sweep(plan, path)
    return 0


@dataclass(frozen=True)
class GemmRun:
    """What every model's sweep of one invocation shares."""

    args: argparse.Namespace
    par: ModelParallel
    info: DeviceInfo
    dtype: str
    timing: TimingConfig

    def sweep(self, plan: Plan, path: Path) -> None:
        """One model's sweep into its CSV, then its console summary."""
        from .runner import run_case

        args, par, info, timing = self.args, self.par, self.info, self.timing
        name, model_config, seqlen, shapes = plan
        cases = expand_cases(shapes, args.backends, self.dtype)
        extra_cols: dict[str, Any] = {"seqlen": seqlen, "tp": par.tp, "ep": par.ep, "cp": par.cp}
        extra_cols.update(etp=par.expert_tp, device=info.name)
        meta = environment(
            info.device,
            {
                "model": name,
                "model_config": model_config,
                "parallel": vars(par),
                "timing": vars(timing),
                "cache": args.cache,
            },
        )
        where = f"layout {args.layout}" if name == RAW else f"tp={par.tp} ep={par.ep} cp={par.cp}, seqlen={seqlen}"
        title = f"{name} on {info.name} ({self.dtype}, {where})"
        with CsvReport(path, SCHEMA, meta, earlier=cli.earlier_policy(args)) as report:

            def failed(case: GemmCase, status: str, message: str) -> dict[str, Any]:
                return {
                    **case.shape.as_row(),
                    "dtype": case.effective_dtype,
                    "backend": case.backend,
                    "status": status,
                    "error": message,
                    **extra_cols,
                }

            rows = run_sweep(
                cases,
                lambda c: {**run_case(c, info, timing, cold=args.cache == "cold"), **extra_cols},
                failed,
                report,
                desc=f"gemm {title}",
                dry_run=args.dry_run,
                fields=LINE_FIELDS,
                table=SUMMARY,
                workload=workload(cases, timing),
            )
        print(f"\n{title}")
        print(summary_table(rows, SUMMARY, max_rows=args.top, schema=SCHEMA))
        advice = noisy_advice(rows)
        if advice:
            print(advice)
        print(f"wrote {one_line(path)} ({counted(len(rows), 'planned row' if args.dry_run else 'row')})")


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.gemm"))
