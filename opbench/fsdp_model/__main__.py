"""``python -m opbench.fsdp_model`` / ``opbench fsdp``: the exact collectives of one FSDP training step.

For each model: every unit's AllGather / ReduceScatter (and HSDP AllReduce) per-rank count, dtype, calls per
step and nccl-tests ``-b`` size, the per-step bytes moved and busbw-equivalent volume; optionally the
rccl-tests / nccl-tests lines for the unique sizes (``--commands``) and a timed run of the same sizes with
opbench's torchrun comm benchmark (``--run``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from opbench.core import cli
from opbench.core.cli import positive_int, world_size
from opbench.core.dtypes import FLOAT_DTYPES
from opbench.core.errors import UsageError, run_cli
from opbench.core.units import human_bytes, one_line
from opbench.models import ModelConfig, load_model_configs, select_models

from .approx import approx_collectives, compare, compare_totals
from .commands import commands_text, run_comm
from .model import FsdpCollective, fsdp_collectives, grouped, step_totals
from .schema import SCHEMA

TABLE = [
    "unit",
    "units",
    "collective",
    "count",
    "dtype",
    "nranks",
    "calls_per_step",
    "bytes_per_rank",
    "nccl_tests_bytes",
    "bytes_per_step",
]

CSV_NAME = "fsdp_collectives.csv"
ONE_RANK = (
    "a world of 1 rank shards nothing and has no FSDP collectives; give the world size of the job to model "
    "(e.g. 8 for one 8-GPU node)"
)
EXAMPLES = """\
examples:
  opbench fsdp --model Llama3.1_70B --world-size 8 --commands
  opbench fsdp --model-config-path config.json --world-size 16 --nnodes 2 --replicate 2 --csv fsdp.csv
  opbench fsdp --model Llama3.1_70B --world-size 8 --mode approx          # Primus' formula vs exact
  opbench fsdp --model-config-path config.json --world-size 8 --run       # time the sizes (torchrun)
"""


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("opbench fsdp", __doc__, EXAMPLES)
    g = p.add_argument_group("model")
    cli.add_model_args(g, model_help="model name(s) from the configs, comma-separated, or 'all' (default: all)")
    g = p.add_argument_group("FSDP")
    g.add_argument(
        "--world-size",
        type=world_size,
        required=True,
        help="ranks of the job to model (2 or more: one rank has no FSDP collectives), not the ranks this runs on",
    )
    g.add_argument("--nnodes", type=positive_int, default=1, help="nodes the ranks are spread over")
    g.add_argument(
        "--replicate",
        type=positive_int,
        default=1,
        help="HSDP: shard within world_size/N contiguous ranks, all-reduce across N replicas",
    )
    g.add_argument(
        "--fsdp-version",
        type=cli.integer,
        choices=[1, 2],
        default=2,
        help="2: fully_shard, per-parameter padding; 1: FlatParameter padding",
    )
    g.add_argument(
        "--param-dtype", choices=FLOAT_DTYPES, default="bf16", help="all-gather dtype, MixedPrecisionPolicy.param_dtype"
    )
    g.add_argument(
        "--reduce-dtype",
        choices=FLOAT_DTYPES,
        default=None,
        help="reduce-scatter / all-reduce dtype, MixedPrecisionPolicy.reduce_dtype (default: the --param-dtype, as "
        "FSDP2 with reduce_dtype unset; torchtitan reduces in fp32)",
    )
    g.add_argument(
        "--reshard-after-forward",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="layers all-gather again in backward (the root never does; default: on)",
    )
    g.add_argument(
        "--use-orig-params",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="FSDP1 only: 16-byte alignment padding between parameters (default: on)",
    )
    g.add_argument(
        "--mode",
        choices=["exact", "approx"],
        default="exact",
        help="approx: Primus' layer weights / n (no norms, no root), with the difference to exact",
    )
    g = p.add_argument_group("output")
    cli.add_output_args(
        g,
        dir_help=f"write DIR/{CSV_NAME}; with --run also the comm CSVs (default: no CSV; "
        "--run writes to out/fsdp_comm)",
        csv_help="the CSV itself: one row per (model, unit, collective)",
        csv_aliases=("--csv",),
    )
    g.add_argument(
        "--commands",
        action="store_true",
        help="print rccl-tests / nccl-tests and opbench comm lines for the unique sizes",
    )
    g.add_argument(
        "--run", action="store_true", help="time the unique sizes with opbench comm (torchrun on this machine)"
    )
    cli.add_earlier_args(p)
    return p


def model_rows(cfg: ModelConfig, args: argparse.Namespace) -> tuple[list[FsdpCollective], list[FsdpCollective]]:
    """(rows of the chosen mode, exact rows)."""
    opts = dict(
        param_dtype=args.param_dtype,
        reduce_dtype=args.reduce_dtype,
        replicate=args.replicate,
        reshard_after_forward=args.reshard_after_forward,
        nnodes=args.nnodes,
    )
    exact = fsdp_collectives(
        cfg, args.world_size, version=args.fsdp_version, use_orig_params=args.use_orig_params, **opts
    )
    return (approx_collectives(cfg, args.world_size, **opts) if args.mode == "approx" else exact), exact


def csv_row(cfg: ModelConfig, args: argparse.Namespace, c: FsdpCollective, exact_count: int | None) -> dict[str, Any]:
    row = {k: v for k, v in c.to_row().items() if k in SCHEMA.columns}
    return {
        **row,
        "model": cfg.name,
        "mode": args.mode,
        "fsdp_version": args.fsdp_version,
        "world_size": args.world_size,
        "replicate": args.replicate,
        "exact_count": exact_count,
    }


def totals_table(rows: Sequence[FsdpCollective]) -> list[dict[str, Any]]:
    return [
        {
            "collective": t["collective"],
            "calls_per_step": t["calls_per_step"],
            "size_per_step": human_bytes(t["bytes_per_step"]),  # IEC units, as every size shown (core.units)
            "busbw_size_per_step": human_bytes(t["busbw_bytes_per_step"]),
        }
        for t in step_totals(rows)
    ]


def header(cfg: ModelConfig, args: argparse.Namespace) -> str:
    shard = args.world_size // args.replicate
    hsdp = f", HSDP {args.replicate} replicas × {shard}" if args.replicate > 1 else ""
    v1 = f", use_orig_params={args.use_orig_params}" if args.fsdp_version == 1 else ""
    mode = "approx (Primus: layer weights / n, no root)" if args.mode == "approx" else "exact"
    return (
        f"== {one_line(cfg.name)}: FSDP{args.fsdp_version} {mode}, world size {args.world_size} on {args.nnodes} "
        f"node(s){hsdp}; all_gather {args.param_dtype}, reduce_scatter {args.reduce_dtype or args.param_dtype}, "
        f"reshard_after_forward={args.reshard_after_forward}{v1}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.world_size == 1:
        raise UsageError(ONE_RANK, field="--world-size")
    configs = select_models(load_model_configs(args.model_config_path, args.model_name), args.model)
    results = [(cfg, *model_rows(cfg, args)) for cfg in configs]  # all errors surface before any output
    from opbench.core.results import CsvReport, environment, summary_table  # imports torch: after validation

    report = None
    csv_path = cli.output_csv(args, CSV_NAME)
    run_dir = args.report_dir_path or "out/fsdp_comm"
    if csv_path:
        report = CsvReport(
            csv_path,
            SCHEMA,
            meta=environment(None, extra={k: v for k, v in vars(args).items()}),
            earlier=cli.earlier_policy(args),
        )
    worst = 0
    comm_written: set[str] = set()  # collectives --run has written into run_dir (later runs append to them)
    for cfg, rows, exact in results:
        print(header(cfg, args))
        print(summary_table(grouped(rows), TABLE))
        print("per step:")
        print(
            summary_table(totals_table(rows), ["collective", "calls_per_step", "size_per_step", "busbw_size_per_step"])
        )
        if args.mode == "approx":
            print("approx vs exact (missing = what the approximation leaves out):")
            print(
                summary_table(
                    compare(exact, rows),
                    ["unit", "units", "collective", "exact_count", "approx_count", "missing_elements", "missing_pct"],
                    floatfmt=".4f",
                )
            )
            print(
                summary_table(
                    compare_totals(exact, rows),
                    ["collective", "exact_bytes_per_step", "approx_bytes_per_step", "missing_pct"],
                    floatfmt=".3f",
                )
            )
        exact_counts = {(c.unit, c.collective): c.count for c in exact}
        if report:
            report.extend(csv_row(cfg, args, c, exact_counts.get((c.unit, c.collective))) for c in rows)
        if args.commands:
            print()
            print(commands_text(rows, run_dir))
        if args.run:
            if any(c.nnodes > 1 for c in rows):
                raise UsageError(
                    "--run launches on this machine only; a process group spans nodes: run the "
                    "'opbench comm' lines from --commands on every node",
                    field="--run",
                )
            policy = ["--overwrite"] if args.overwrite else ["--append"] if args.append else []
            worst = max(worst, run_comm(rows, run_dir, earlier=policy, written=comm_written))
        print()
    if report:
        report.close()
        print(f"wrote {one_line(csv_path)}")
    return worst


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.fsdp_model"))
