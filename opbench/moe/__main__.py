"""``python -m opbench.moe`` / ``opbench moe``: one MoE block of a model, forward and backward, timed as a whole and
phase by phase (router, top-k, permutation, the routed experts' grouped GEMMs, shared experts, combine), under the
routing distributions users see. One rank; with --ep N, the block over N ranks under torchrun (ep.py): tokens
dispatched to their experts' ranks and combined back with all-to-all-v, forward and backward.

Rows are written to benchmark_moe_<model>.csv as they finish; the tokens each expert got are in the CSV's
sidecar (.meta.json). docs/moe.md says what each phase includes and how FLOPs are counted.
"""

# Help and usage errors come back before torch loads: the block, the runner and the backends import torch.

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opbench.core import cli, outputs
from opbench.core.cli import add_device_args, add_timing_args, csv_list, positive_int, timing_config
from opbench.core.errors import UsageError, run_cli
from opbench.core.progress import STATUS, Field, column, figure, time_text
from opbench.core.results import CsvReport, environment, summary_table
from opbench.core.sweep import STATUS_OK, run_sweep
from opbench.core.timing import noisy_advice
from opbench.core.units import counted, one_line
from opbench.models import load_model_configs, select_models
from opbench.models.fields import ModelConfig

from .routing import SYNTAX, Routing, load, parse_routing, target_counts
from .schema import BACKEND_NAMES, BACKEND_PHASES, COMMON_BACKEND, PASSES, PHASES, SCHEMA
from .spec import BlockSpec, block_spec

if TYPE_CHECKING:
    from .runner import MoeCase

LINE_FIELDS = [
    column("routing", 14, left=True),
    column("backend", 10, left=True),
    column("phase", 17, left=True),
    column("pass", 4, left=True),
    Field("time", 9, lambda r: time_text(r.get("time_s"))),
    Field("TFLOP/s", 8, lambda r: figure(r.get("tflops"))),
    STATUS,
]
# The console table: one line per (routing, backend, phase), forward and backward side by side.
TABLE = [
    "routing",
    "backend",
    "phase",
    "fwd_ms",
    "bwd_ms",
    "fwd_tflops",
    "bwd_tflops",
    "tok_min",
    "tok_mean",
    "tok_max",
    "max/mean",
    "dropped",
    "status",
]


def routing_arg(text: str) -> Routing:
    try:
        return parse_routing(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def capacity_factor(text: str) -> float:
    value = cli.finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("opbench moe", __doc__)
    cli.add_model_args(p, model_help="MoE model name(s) from the configs, comma-separated (a dense one is refused)")
    cli.add_output_args(p, dir_default=cli.tool_dir("moe"), dir_help="where benchmark_moe_<model>.csv files go")
    p.add_argument(
        "--seqlen", type=cli.sequence_length, default=None, help="sequence length (default: the model's, else 4096)"
    )
    p.add_argument("--mbs", type=positive_int, default=1, help="micro-batch size; tokens = mbs · seqlen")
    p.add_argument(
        "--routing",
        type=csv_list(routing_arg),
        default="balanced",  # a string default goes through `type`, and --help shows it as typed
        metavar="R[,R…]",
        help=f"token distributions over the experts: {SYNTAX} (docs/moe.md)",
    )
    p.add_argument(
        "--backends",
        type=csv_list(),
        default=list(BACKEND_NAMES),
        help=f"expert grouped-GEMM backends: any of {','.join(BACKEND_NAMES)}",
    )
    p.add_argument("--passes", type=csv_list(), default=list(PASSES), help="fwd, bwd or both")
    p.add_argument("--phases", type=csv_list(), default=None, help=f"subset of {','.join(PHASES)} (default: all)")
    p.add_argument(
        "--capacity-factor",
        type=capacity_factor,
        default=None,
        help="drop copies past ceil(T·k/E · factor) per expert, the later tokens first (default: none, no drops)",
    )
    p.add_argument("--seed", type=cli.non_negative_int, default=0, help="seed of the weights, tokens and routing")
    p.add_argument(
        "--ep",
        type=positive_int,
        default=1,
        help="expert-parallel ranks: N > 1 runs the block over N ranks (torchrun with N ranks here when not already "
        "under torchrun; gloo on CPU): dispatch, experts, combine and block rows (dispatch, combine and block also backward; docs/moe.md)",
    )
    cli.add_dry_run_arg(p, "write the planned rows (status=planned) to benchmark_moe_<model>.plan.csv")
    cli.add_top_arg(p, None)
    add_device_args(p)
    add_timing_args(p)
    cli.add_earlier_args(p)
    return p


def report_path(report_dir: str, model: str) -> Path:
    return Path(report_dir) / f"benchmark_moe_{re.sub(r'[^A-Za-z0-9._-]+', '_', model)}.csv"


def plan_cases(
    spec: BlockSpec, routings: Sequence[Routing], backends: Sequence[str], passes: Sequence[str], phases: Sequence[str]
) -> list[MoeCase]:
    from .runner import MoeCase  # a dataclass; runner imports torch, so only here

    cases: list[MoeCase] = []
    for r in routings:
        for phase in PHASES:
            if phase not in phases or (phase == "shared" and not spec.shared_intermediate):
                continue
            for backend in backends if phase in BACKEND_PHASES else [COMMON_BACKEND]:
                cases.extend(MoeCase(r, backend, phase, p) for p in PASSES if p in passes)
    return cases


def check_args(args: argparse.Namespace) -> None:
    for flag, given, known in (
        ("--backends", args.backends, BACKEND_NAMES),
        ("--passes", args.passes, PASSES),
        ("--phases", args.phases or [], PHASES),
    ):
        bad = [x for x in given if x not in known]
        if bad:
            raise UsageError(f"unknown {bad}; choose from {','.join(known)}", field=flag)
    if not args.model and not args.model_config_path:
        raise UsageError(
            "name an MoE model (--model NAME, or --model-config-path with an MoE config.json)", field="--model"
        )


def chosen_models(args: argparse.Namespace) -> list[ModelConfig]:
    configs = load_model_configs(args.model_config_path, args.model_name)
    if args.model is None and len(configs) > 1:
        moe = [c for c in configs if c.is_moe]
        if not moe:
            raise UsageError("none of these models is an MoE model", source=args.model_config_path, field="--model")
        configs = moe
    return select_models(configs, args.model)


Plan = tuple[ModelConfig, BlockSpec, int]  # the model, its block, seqlen


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    check_args(args)
    args.routing = [load(r) for r in args.routing]
    labels = [r.label for r in args.routing]
    if len(set(labels)) != len(labels):
        raise UsageError(f"a routing is named twice: {', '.join(labels)}", field="--routing")
    plans: list[Plan] = []
    for cfg in chosen_models(args):
        spec = block_spec(cfg)
        seqlen = args.seqlen or cfg.seqlen or 4096
        for r in args.routing:  # every synthetic routing's counts are checked before torch loads
            if r.kind != "model":
                target_counts(r, args.mbs * seqlen, spec.top_k, spec.experts)
        plans.append((cfg, spec, seqlen))
    if args.ep > 1:
        return expert_parallel(args, argv, plans)
    paths = [report_path(args.report_dir_path, cfg.name) for cfg, *_ in plans]
    if args.dry_run:
        paths = [outputs.plan_path(p) for p in paths]
    with outputs.claimed(*paths):
        for plan, path in zip(plans, paths, strict=True):
            sweep(args, plan, path)
    return 0


def expert_parallel(args: argparse.Namespace, argv: Sequence[str], plans: Sequence[Plan]) -> int:
    """--ep N: under torchrun (or started here with N ranks), every rank runs ep.ep_sweep; rank 0 writes
    benchmark_moe_<model>_ep<N>.csv."""
    from opbench.core import dist

    if args.capacity_factor is not None:
        raise UsageError("is not offered with --ep yet (no token drops across ranks)", field="--capacity-factor")
    if args.dry_run:
        raise UsageError("plans one rank's rows; run --ep without --dry-run", field="--dry-run")
    if args.phases:
        raise UsageError(
            "--ep times its own phases (dispatch, experts, combine, block); drop --phases", field="--phases"
        )
    for cfg, spec, _ in plans:
        if spec.experts % args.ep:
            raise UsageError(f"{cfg.name}'s {spec.experts} experts do not split over {args.ep} ranks", field="--ep")
    dist_env = dist.detect()
    if dist_env is None:
        return dist.relaunch(dist.torchrun_command(argv, args.ep, "opbench.moe"), "opbench moe")
    if dist_env.world_size != args.ep:
        raise UsageError(f"the job has {dist_env.world_size} ranks; --ep {args.ep} needs as many", field="--ep")
    from .ep import ep_sweep

    ranks = dist.Ranks.join(dist_env, args.device, 300.0)
    try:
        ranks.same_arguments(args)
        for cfg, spec, seqlen in plans:
            path = report_path(args.report_dir_path, f"{cfg.name}_ep{args.ep}")
            with contextlib.ExitStack() as claims:

                def claim() -> None:
                    """Rank 0 takes the CSV's writer lock before any collective; a refusal stops every rank."""
                    if ranks.is_main:
                        claims.enter_context(outputs.claimed(path))

                try:
                    ranks.agree(claim, describe=lambda exc: ("error", str(exc)))
                except dist.RankFailure as exc:
                    if ranks.is_main:
                        raise UsageError(str(exc).removeprefix("rank 0: ")) from None
                    return 2  # rank 0 says why
                ep_sweep(args, (cfg, spec, seqlen), str(path), ranks)
    finally:
        ranks.stop()
    return 0


def sweep(args: argparse.Namespace, plan: Plan, path: Path) -> None:
    from opbench.core.device import default_dtype_name, device_info, use_device

    from .runner import MoeRun, Setup, unsupported_backends

    cfg, spec, seqlen = plan
    device = use_device(args.device)
    info = device_info(device)
    dtype = args.dtype or default_dtype_name(device)
    timing = timing_config(args)
    tokens = args.mbs * seqlen
    cases = plan_cases(spec, args.routing, args.backends, args.passes, args.phases or PHASES)
    if not args.dry_run:
        cases = collapse_unsupported(cases, unsupported_backends(args.backends, device, dtype))
    meta: dict[str, Any] = {
        "model": cfg.name,
        "model_config": cfg.to_dict(),
        "block": spec.as_meta(),
        "tokens": tokens,
        "seed": args.seed,
        "capacity_factor": args.capacity_factor,
        "expert_parallel": "one rank (ep=1): no dispatch/combine all-to-all is timed",
        "timing": vars(timing),
        "routings": {},
    }
    meta = environment(device, meta)
    extra = {"model": cfg.name, "mbs": args.mbs, "seqlen": seqlen, "device": info.name}
    title = f"{cfg.name} MoE block on {info.name} ({dtype}, {tokens} tokens, {spec.experts} experts, top-{spec.top_k})"
    with CsvReport(path, SCHEMA, meta, earlier=cli.earlier_policy(args)) as report:

        def recorded(setup: Setup) -> None:
            meta["routings"][setup.routing.label] = setup.meta()
            report.write_meta(meta)

        run = MoeRun(spec, tokens, dtype, info, timing, args.seed, args.capacity_factor, on_setup=recorded)

        def failed(case: MoeCase, status: str, message: str) -> dict[str, Any]:
            return {**run.base_row(case), **extra, "status": status, "error": message}

        rows = run_sweep(
            cases,
            lambda c: {**run.measure(c), **extra},
            failed,
            report,
            desc=f"moe {title}",
            dry_run=args.dry_run,
            fields=LINE_FIELDS,
            table=["routing", "backend", "phase", "pass", "time_s", "tflops", "status"],
        )
    print(f"\n{title}")
    # on a GPU the host's issue time of each call beside the device's (on a CPU the host is the device: the same)
    table = TABLE if device.type == "cpu" else [*TABLE[:5], "fwd_host_ms", "bwd_host_ms", *TABLE[5:]]
    print(summary_table(console_rows(rows), table, max_rows=args.top))
    advice = noisy_advice(rows)
    if advice:
        print(advice)
    print(f"wrote {one_line(path)} ({counted(len(rows), 'planned row' if args.dry_run else 'row')})")


def collapse_unsupported(cases: list[MoeCase], skip: Mapping[str, str]) -> list[MoeCase]:
    """A backend that cannot run here gets one row per routing saying why (its ``experts`` forward where planned),
    not one per phase and pass."""
    keep: dict[tuple[str, str], MoeCase] = {}
    for c in cases:
        key = (c.backend, c.routing.text)
        if c.backend in skip and (key not in keep or (c.phase == "experts" and keep[key].phase != "experts")):
            keep[key] = c
    return [c for c in cases if c.backend not in skip or keep[(c.backend, c.routing.text)] is c]


def console_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One line per (routing, backend, phase): forward and backward side by side, times in ms."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["routing"], r["backend"], r["phase"])
        line = out.setdefault(
            key,
            {
                "routing": r["routing"],
                "backend": r["backend"],
                "phase": r["phase"],
                "tok_min": r.get("tokens_min"),
                "tok_mean": r.get("tokens_mean"),
                "tok_max": r.get("tokens_max"),
                "max/mean": r.get("imbalance"),
                "dropped": r.get("tokens_dropped"),
                "status": r.get("status"),
            },
        )
        p = r["pass"]
        if r.get("time_s") is not None:
            line[f"{p}_ms"] = r["time_s"] * 1e3
        if r.get("host_s") is not None:
            line[f"{p}_host_ms"] = r["host_s"] * 1e3
        if r.get("tflops") is not None:
            line[f"{p}_tflops"] = r["tflops"]
        if r.get("status") != STATUS_OK:
            line["status"] = f"{r.get('status')}: {r.get('error') or ''}"[:90].rstrip(": ")
        elif str(r.get("note") or "").startswith("noisy") or "; noisy" in str(r.get("note") or ""):
            line["status"] = "ok, noisy"
    return list(out.values())


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.moe"))
