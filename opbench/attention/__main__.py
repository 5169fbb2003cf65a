"""``python -m opbench.attention`` / ``opbench attention``: attention forward and backward on model shapes.

Shapes come from a Primus attention-shapes list (``--shapes-json-path``, default: the shipped
shapes/attention_shapes.json) or are derived from model configs (``--model-config-path``) with tensor and
context parallelism applied. Every (shape, batch size, backend) becomes one CSV row, written as it finishes.
Help and usage errors come back without importing torch: the device layer and backends load after the checks.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from opbench.core import cli, outputs
from opbench.core.cli import add_device_args, add_timing_args, csv_list, positive_int, timing_config
from opbench.core.dtypes import FLOAT_DTYPES
from opbench.core.errors import UsageError, run_cli
from opbench.core.progress import STATUS, Field, Workload, column, figure, number, time_text
from opbench.core.results import CsvReport, environment, summary_table
from opbench.core.sweep import run_sweep
from opbench.core.timing import TimingConfig, expected_seconds, noisy_advice
from opbench.core.units import counted, note, one_line
from opbench.models import load_model_configs, select_models

from .schema import BACKEND_NAMES, PASSES, SCHEMA, SHAPE_COLUMNS, backends_for
from .shapes import AttentionShape, cap_seqlen, load_attention_shapes, model_attention_shapes, select_shapes

SUMMARY = [
    "model",
    "batch_size",
    "seqlen_q",
    "seqlen_kv",
    "num_head_q",
    "num_head_kv",
    "head_dim_qk",
    "head_dim_v",
    "attn_kind",
    "window",
    "backend",
    "fwd_time",
    "fwd_tflops",
    "bwd_time",
    "bwd_tflops",
    "fwdbwd_time",
    "max_abs_err",
    "status",
    "note",
]


def shape_text(row: Mapping[str, Any]) -> str:
    """1 x 128/128 x 32/8 x 128: batch, query/key lengths, query/KV heads, head dim (qk, or qk/v when they differ)."""
    dims = f"{row.get('head_dim_qk')}" + (
        f"/{row.get('head_dim_v')}" if row.get("head_dim_v") not in (None, row.get("head_dim_qk")) else ""
    )
    return (
        f"{row.get('batch_size')} x {row.get('seqlen_q')}/{row.get('seqlen_kv')} x "
        f"{row.get('num_head_q')}/{row.get('num_head_kv')} x {dims}"
    )


def pass_fields(pass_: str) -> tuple[Field, Field]:
    """A pass' time (unit in the cell) and TFLOP/s on a progress line."""
    return (
        Field(f"{pass_} time", 9, lambda r: time_text(r.get(f"{pass_}_time"))),
        Field(f"{pass_} TFLOP/s", 11, lambda r: figure(r.get(f"{pass_}_tflops"))),
    )


def line_fields(passes: Sequence[str]) -> list[Field]:
    """One line per finished case in a batch log (core.progress): the shape, then the time and TFLOP/s of the
    forward and backward passes that run (fwdbwd's only when neither does; the CSV and the table have it)."""
    shown = [p for p in passes if p != "fwdbwd"] or ["fwdbwd"]
    return [
        column("model", 14, left=True),
        Field("b x sq/skv x hq/hkv x d", 26, shape_text, left=True),
        column("attn_kind", 9, "kind", left=True),
        column("backend", 14, left=True),
        *(field for p in shown for field in pass_fields(p)),
        STATUS,
    ]


PLAN_SUMMARY = [*SHAPE_COLUMNS[:8], "attn_kind", "window", "layer_count", "backend", "fwd_flops", "status"]
CSV_NAME = "attention_benchmark.csv"
CPU_MAX_SEQLEN = 128  # CPU attention at 4k-8k tokens takes minutes per case; GPUs run the real lengths
CPU_BUDGET_S = 0.2  # per pass on CPU unless a timing flag is given: the default sweep ends in minutes
TIMING_FLAGS = ("warmup", "min_iters", "max_iters", "rel_tol", "budget", "quick")


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("opbench attention", __doc__)
    src = p.add_argument_group("shapes")
    src.add_argument(
        "--shapes-json-path",
        default=None,
        help="Primus attention shapes: a list of {model, seqlen_q, seqlen_kv, num_head_q, num_head_kv, "
        "head_dim_qk, head_dim_v, causal} (default: shapes/attention_shapes.json)",
    )
    cli.add_model_args(
        src,
        model_default="all",
        config_help="derive shapes from model configs instead (Primus model_configs.json, one object "
        "or an HF config.json; 'builtin' = the built-in configs)",
    )
    src.add_argument(
        "--seqlen",
        type=positive_int,
        default=None,
        help="sequence length (model configs only; default: each config's seqlen)",
    )
    src.add_argument("--tp", type=positive_int, default=1, help="tensor parallel: divides query and KV heads")
    src.add_argument(
        "--cp",
        type=positive_int,
        default=1,
        help="context parallel: each ring step attends seqlen/cp queries to seqlen/cp keys",
    )
    src.add_argument(
        "--max-seqlen",
        type=cli.integer,
        default=None,
        help=f"scale seqlen_q and seqlen_kv down together so neither exceeds this; 0 = no cap "
        f"(default: {CPU_MAX_SEQLEN} on CPU, no cap on GPU)",
    )
    run = p.add_argument_group("run")
    cli.add_mbs_arg(run, "--batch-sizes", dest="batch_sizes", help="micro-batch sizes, e.g. 1,2,4 (CSV: batch_size)")
    run.add_argument(
        "--backends",
        type=csv_list(),
        default=list(BACKEND_NAMES),
        help=f"any of {','.join(BACKEND_NAMES)} (default: all)",
    )
    run.add_argument("--passes", type=csv_list(), default=list(PASSES), help="any of fwd,bwd,fwdbwd")
    cli.add_output_args(
        run,
        dir_help=f"write DIR/{CSV_NAME} (default: {cli.tool_dir('attention')}/{CSV_NAME})",
        csv_help="the CSV itself, written row by row (wins over --report-dir-path)",
    )
    cli.add_dry_run_arg(run, "write the planned rows (status=planned) to <csv name>.plan.csv")
    cli.add_top_arg(run, None)
    run.add_argument("--list-backends", action="store_true", help="print the backends and exit")
    add_device_args(p, dtypes=FLOAT_DTYPES)
    add_timing_args(p, f"on CPU, without any of these flags: {CPU_BUDGET_S:g} s of quick timing per pass")
    cli.add_earlier_args(p)
    return p


def resolve_shapes(args: argparse.Namespace) -> list[AttentionShape]:
    """Shapes from the chosen source; every input error surfaces here, before anything runs. --seqlen, --tp or
    --cp without a source derive the shapes from the built-in model configs (as ``opbench gemm --model`` does):
    the shipped shapes file lists per-rank shapes that these flags cannot change."""
    if args.shapes_json_path and args.model_config_path:
        raise UsageError("give --shapes-json-path or --model-config-path, not both", field="--model-config-path")
    if not args.shapes_json_path and not args.model_config_path and (args.seqlen, args.tp, args.cp) != (None, 1, 1):
        args.model_config_path = "builtin"
    if args.model_config_path:
        configs = select_models(load_model_configs(args.model_config_path, args.model_name), args.model)
        return [s for c in configs for s in model_attention_shapes(c, args.seqlen, args.tp, args.cp)]
    for flag, value, default in (("--seqlen", args.seqlen, None), ("--tp", args.tp, 1), ("--cp", args.cp, 1)):
        if value != default:
            raise UsageError(
                "applies to shapes derived with --model-config-path; a shapes JSON lists per-rank shapes already",
                field=flag,
            )
    return select_shapes(load_attention_shapes(args.shapes_json_path), args.model)


def builtin_shapes(args: argparse.Namespace) -> bool:
    """True when the shapes are opbench's defaults (the shipped shapes file, or the built-in model configs at
    their own seqlen): only those are scaled down on a CPU. A user's file or --seqlen is measured as given."""
    if args.shapes_json_path:
        return False
    if args.model_config_path:
        return args.model_config_path == "builtin" and args.seqlen is None
    return True


def workload(cases: Sequence[Any], passes: Sequence[str], timing: TimingConfig) -> Workload:
    """Each case's FLOPs per timed pass (runner.time_passes times each pass on its own), for the bar's time left
    (core.progress.Workload)."""
    from .flops import attention_flops

    timed = [p for p in PASSES if p in passes]  # the order time_passes runs them in
    return Workload(
        work=[[attention_flops(c.shape, c.batch_size, p) for p in timed] for c in cases],
        measured=lambda row: [number(row.get(f"{p}_time")) for p in timed],
        wall=partial(expected_seconds, config=timing),
    )


def check_choices(values: Sequence[str], allowed: Sequence[str], flag: str) -> None:
    bad = [v for v in values if v not in allowed]
    if bad:
        raise UsageError(f"unknown {bad}; choose from {','.join(allowed)}", field=flag)


def unsupported_reasons(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per distinct (backend, reason) among rows that did not run, for the console."""
    seen = dict.fromkeys((r["backend"], r["status"], r.get("error")) for r in rows if r.get("status") != "ok")
    return [f"  {b}: {s}: {e}" for b, s, e in seen if e]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list_backends:
        from .backends import BACKENDS

        for b in BACKENDS.values():
            print(f"{b.name:<15} {b.layout}  {b.description}")
        return 0
    check_choices(args.backends, BACKEND_NAMES, "--backends")
    check_choices(args.passes, PASSES, "--passes")
    if args.max_seqlen is not None and args.max_seqlen < 0:
        raise UsageError(f"must not be negative, got {args.max_seqlen}", field="--max-seqlen")
    shapes = resolve_shapes(args)
    from opbench.core.device import default_dtype_name, device_info, use_device

    from .runner import AttentionCase, ProblemCache, run_case

    device = use_device(args.device)
    info = device_info(device)
    dtype = args.dtype or default_dtype_name(device)
    timing = timing_config(args)
    max_seqlen = args.max_seqlen
    if device.type == "cpu":  # a dry run plans what the run would measure: the same lengths
        if max_seqlen is None and builtin_shapes(args):
            max_seqlen = CPU_MAX_SEQLEN
            print(
                note(
                    f"CPU run: the built-in shapes' seqlens scaled down to at most {CPU_MAX_SEQLEN} "
                    "(--max-seqlen 0 for the real lengths; shapes you give are measured as given)"
                ),
                file=sys.stderr,
            )
    if device.type == "cpu" and not args.dry_run:
        if not any(getattr(args, f) not in (None, False) for f in TIMING_FLAGS):
            timing = replace(TimingConfig.quick(), budget_s=CPU_BUDGET_S)
            print(
                note(
                    f"CPU run: quick timing ({CPU_BUDGET_S}s of calls per pass, at least "
                    f"{timing.min_iters}); pass any timing flag to change"
                ),
                file=sys.stderr,
            )
    shapes = [cap_seqlen(s, max_seqlen) for s in shapes]
    # each shape runs on the chosen backends that implement its kind's operator
    cases = [
        AttentionCase(s, b, name, dtype)
        for s in shapes
        for b in args.batch_sizes
        for name in args.backends
        if name in backends_for(s.attn_kind)
    ]
    for kind in dict.fromkeys(s.attn_kind for s in shapes):
        if not set(args.backends) & set(backends_for(kind)):
            print(
                note(f"no backend chosen for the '{kind}' layers (their backends: {','.join(backends_for(kind))})"),
                file=sys.stderr,
            )

    par = {"tp": args.tp, "cp": args.cp} if args.model_config_path else {}
    extra = {**par, "device": info.name}
    meta = environment(
        device,
        {
            "shapes_source": args.model_config_path or args.shapes_json_path or "builtin shapes/attention_shapes.json",
            "passes": args.passes,
            "max_seqlen": max_seqlen,
            "timing": vars(timing),
        },
    )
    cache = ProblemCache()
    csv_path = cli.output_csv(args, CSV_NAME) or f"{cli.tool_dir('attention')}/{CSV_NAME}"
    if args.dry_run:
        csv_path = str(outputs.plan_path(csv_path))
    with CsvReport(csv_path, SCHEMA, meta, earlier=cli.earlier_policy(args)) as report:

        def failed(case: AttentionCase, status: str, message: str) -> dict[str, Any]:
            return {**case.as_row(), "status": status, "error": message or None, **extra}

        rows = run_sweep(
            cases,
            lambda c: {**run_case(c, device, args.passes, timing, cache), **extra},
            failed,
            report,
            desc=f"attention on {info.name} ({dtype}, passes {','.join(args.passes)})",
            dry_run=args.dry_run,
            fields=line_fields(args.passes),
            table=SUMMARY,
            workload=workload(cases, args.passes, timing),
        )
    print(f"attention on {info.name} ({dtype}, passes {','.join(args.passes)})")
    print(summary_table(rows, PLAN_SUMMARY if args.dry_run else SUMMARY, max_rows=args.top, schema=SCHEMA))
    advice = noisy_advice(rows)
    if advice:
        print(advice)
    reasons = unsupported_reasons(rows)
    if reasons:
        print("not run:\n" + "\n".join(reasons))
    print(f"wrote {one_line(csv_path)} ({counted(len(rows), 'planned row' if args.dry_run else 'row')})")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.attention"))
