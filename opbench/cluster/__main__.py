"""``opbench cluster`` / ``torchrun -m opbench.cluster`` / ``srun python -m opbench.cluster``: is this cluster
within spec, and which GPU, node or link is not?

Exit code 0 when every check passes, 1 when one fails or an outlier is named, 2 for usage errors.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from opbench.core import cli, dist
from opbench.core.cli import add_device_args, csv_list, positive_bytes, positive_int
from opbench.core.errors import UsageError, run_cli
from opbench.core.faults import Faults
from opbench.core.units import one_line, wrapped

from .links import parse_override
from .plan import CHECKS, PAIRS_PHASE, Sizes, simulate

EXAMPLES = """\
examples:
  opbench cluster --nproc-per-node 8                     # one node: compute, memory, intra (+ GPU pairs)
  torchrun --nnodes 16 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $HEAD:29500 \\
      -m opbench.cluster --model Llama3.1_70B --expect expect.json --baseline runs/last-month
  srun --ntasks-per-node 8 python -m opbench.cluster     # needs MASTER_ADDR exported by the job script
  opbench cluster --plan 2,16,128,1024 --nproc-per-node 8   # the schedule and its estimated time
"""


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser(
        "opbench cluster",
        epilog=EXAMPLES,
        description="Measure every GPU (GEMM TFLOPS, memory bandwidth, clocks and throttling), every node's "
        "intra-node collectives, the network across nodes and every node pair, in one job; name the members "
        "below their peers, check --expect thresholds and a --baseline run. Exit 0 = pass, 1 = fail.",
    )
    g = p.add_argument_group("launch (ignored when already under torchrun/srun)")
    cli.add_launch_args(g)
    cli.add_timeout_arg(g, 300.0)
    add_device_args(p, ("bf16", "fp16", "fp32"))

    g = p.add_argument_group("what to run")
    g.add_argument(
        "--checks",
        type=csv_list(str),
        default=list(CHECKS),
        help=f"comma-separated subset of {','.join(CHECKS)} (default: all that apply)",
    )
    g.add_argument("--gpu-pairs", action="store_true", help="also every GPU pair inside each node (pairs check)")
    g.add_argument("--quick", action="store_true", help="smaller sizes and fewer iterations (a smoke run)")
    g.add_argument(
        "--gemm-size",
        type=positive_int,
        default=None,
        help="square GEMM edge M=N=K (default: 8192 on GPU, 4096 --quick; 512 / 192 on CPU)",
    )
    cli.add_model_args(g, model_help="add this model's three heaviest dense GEMMs to the compute check")
    g.add_argument(
        "--seqlen", type=cli.sequence_length, default=None, help="sequence length for --model (default: the model's)"
    )
    g.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel size for --model's GEMMs")
    g.add_argument(
        "--memory-size",
        type=positive_bytes,
        default=None,
        help="bytes per buffer of the memory kernels (default: 1G on GPU, 256M --quick; 256M / 64M on CPU)",
    )
    g.add_argument(
        "--sizes",
        type=csv_list(positive_bytes),
        default=None,
        metavar="B1,B2",
        help="intra/inter/world collective sizes (default: 64M,1G on GPU, 64M --quick; 1M,16M / 256K on CPU)",
    )
    g.add_argument(
        "--pair-size",
        type=positive_bytes,
        default=None,
        help="bytes per GPU per direction in the pairs check (default: 256M on GPU, 64M --quick; 16M on CPU)",
    )
    g.add_argument(
        "-n",
        "--iters",
        type=positive_int,
        default=None,
        help="timed iterations per collective / pair (default: 20 on GPU, 10 --quick; 10 / 5 on CPU)",
    )

    g = p.add_argument_group("verdict")
    g.add_argument(
        "--outlier-fraction",
        type=cli.finite_float,
        default=0.10,
        help="name members this fraction below their peers' median …",
    )
    g.add_argument(
        "--outlier-mad", type=cli.finite_float, default=3.0, help="… and this many scaled MADs of the peers' ratios"
    )
    g.add_argument(
        "--expect", default=None, metavar="FILE", help="JSON minimums per check and metric (docs/cluster.md)"
    )
    g.add_argument("--baseline", default=None, metavar="DIR", help="an earlier cluster run's report folder")
    g.add_argument(
        "--tolerance", type=cli.finite_float, default=0.10, help="allowed drop of a case's median against --baseline"
    )
    g.add_argument(
        "--link-peak-gbs",
        type=parse_override,
        default=None,
        metavar="intra=G,pair=G,inter=G",
        help="link peaks per GPU per direction, GB/s (default: the link table and /sys/class/infiniband)",
    )

    g = p.add_argument_group("output")
    cli.add_output_args(g, dir_default="out/cluster", dir_help="where cluster_*.csv and cluster_summary.md go")
    cli.add_earlier_args(p)
    g.add_argument(
        "--plan",
        type=csv_list(positive_int),
        nargs="?",
        const=[],
        default=None,
        metavar="N[,N…]",
        help="print the schedule and its simulated wall time for these node counts (default: --nnodes) × "
        "--nproc-per-node (default 8), without torch or ranks",
    )
    return p


def _validate(args: argparse.Namespace) -> None:
    unknown = [c for c in args.checks if c not in CHECKS]
    if unknown:
        raise UsageError(f"unknown check(s) {unknown}; choose from {', '.join(CHECKS)}", field="--checks")
    if not args.timeout > 0 or args.timeout == float("inf"):
        raise UsageError(f"must be a positive number of seconds, got {args.timeout}", field="--timeout")
    for name in ("outlier_fraction", "tolerance"):
        value = getattr(args, name)
        if not 0 <= value < 1:
            raise UsageError(f"must be in [0, 1), got {value}", field="--" + name.replace("_", "-"))
    if not args.outlier_mad >= 0:
        raise UsageError(f"must not be negative, got {args.outlier_mad}", field="--outlier-mad")
    from opbench.models.config import check_config_path

    check_config_path(args.model_config_path)
    if args.expect:
        from .verdict import load_expect

        load_expect(args.expect)
    if args.baseline:
        from .verdict import load_baseline

        load_baseline(args.baseline)
    Faults.validate()


def sizes_for(args: argparse.Namespace, gpu: bool) -> Sizes:
    s = Sizes.default(gpu, args.quick)
    return Sizes(
        gemm_n=args.gemm_size or s.gemm_n,
        memory_bytes=args.memory_size or s.memory_bytes,
        comm_bytes=tuple(args.sizes) if args.sizes else s.comm_bytes,
        pair_bytes=args.pair_size or s.pair_bytes,
        iters=args.iters or s.iters,
        warmup=s.warmup,
        budget_s=s.budget_s,
    )


def plan(args: argparse.Namespace) -> int:
    """The schedule and its simulated wall time, for each --nnodes (an estimate from stated assumptions)."""
    from tabulate import tabulate

    from .plan import Assumptions

    gpus = args.nproc_per_node or 8
    gpu = args.device != "cpu"
    sizes = sizes_for(args, gpu)
    if args.model or args.model_config_path:  # the checks a real run makes: a bad config or name is refused here too
        from opbench.models import load_model_configs, select_models

        select_models(load_model_configs(args.model_config_path, args.model_name), args.model)
    # a fault for a rank no planned job has is refused here, as a real run would refuse it
    Faults.validate(max(args.plan or [args.nnodes]) * gpus)
    gemm_count = 1 + (3 if args.model else 0)
    a = Assumptions()
    print(
        wrapped(
            f"# simulated, not measured: {gpus} GPU(s) per node, {'quick' if args.quick else 'default'} sizes "
            f"(GEMM {sizes.gemm_n}³, memory {sizes.memory_bytes >> 20} MiB, collectives "
            f"{','.join(str(b >> 20) + 'M' for b in sizes.comm_bytes)}, pairs {sizes.pair_bytes >> 20} MiB, "
            f"{sizes.iters}+{sizes.warmup} iterations)",
            indent="#   ",
        )
    )
    print(
        wrapped(
            f"# assumed: {a.intra_gbs:g} GB/s intra-node and {a.nic_gbs:g} GB/s network per GPU, latency "
            f"{a.intra_latency_s * 1e6:g}/{a.inter_latency_s * 1e6:g} µs per step, {a.gemm_tflops:g} TFLOP/s, "
            f"{a.hbm_gbs:g} GB/s memory, {a.launch_s:g} s launch, group setup {a.group_setup_s:g} s + "
            f"{a.group_setup_per_node_s * 1e3:g} ms per node",
            indent="#   ",
        )
    )
    rows = []
    for n in args.plan or [args.nnodes]:
        est = simulate(n, gpus, sizes, args.checks, args.gpu_pairs, gemm_count, a)
        phases = {p.name: p for p in est.phases}
        rows.append(
            [n, n * gpus, est.rounds]
            + [f"{phases[k].seconds:.1f}" if k in phases else "" for k in _PLAN_COLUMNS]
            + [f"{est.seconds:.0f}"]
        )
    print(tabulate(rows, headers=["nodes", "GPUs", "rounds", *_PLAN_HEADERS, "total (s)"], disable_numparse=True))
    return 0


_PLAN_COLUMNS = (
    "compute (all GPUs at once)",
    "memory (all GPUs at once)",
    "intra (every node at once)",
    "inter (every rail at once)",
    "inter (world)",
    PAIRS_PHASE,
    "process-group setup",
)
_PLAN_HEADERS = ("compute", "memory", "intra", "inter rails", "world", "pairs", "group setup")


CHECK_TITLES = {"compute": "compute", "memory": "memory", "intra": "intra", "inter": "inter", "pairs": "pairs",
                "gpu_pairs": "GPU pairs"}  # fmt: skip


def check_lines(cfg: Any, got: Any) -> list[str]:
    """One line per check: what it measured, or why it did not run (not asked for, or nothing to measure here)."""
    lines = []
    for check, title in CHECK_TITLES.items():
        if check == "gpu_pairs" and not cfg.gpu_pairs:
            continue  # not asked for (--gpu-pairs)
        asked = ("pairs" if check == "gpu_pairs" else check) in cfg.checks
        if check in got.ran:
            lines.append(f"{title}: {got.ran[check]}")
        else:
            why = got.not_run.get(check) if asked else "not in --checks"
            lines.append(f"{title}: not run ({why or 'nothing measured'})")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    _validate(args)
    if args.plan is not None:
        return plan(args)
    dist_env = dist.detect()
    if dist_env is None:
        launched = dist.self_launch(args, argv, "opbench.cluster", "opbench cluster", verdict_exit=1)
        if launched is not None:
            return launched
        dist_env = dist.single()
    return run(args, dist_env)


def _model_gemms(args: argparse.Namespace) -> list[Any]:
    """The three heaviest dense GEMMs of each --model's training step (one rank's share under --tp)."""
    from opbench.gemm.shapes import ModelParallel, gemm_shapes
    from opbench.models import load_model_configs, select_models

    from .checks import GemmSpec

    out: list[GemmSpec] = []
    for model in select_models(load_model_configs(args.model_config_path, args.model_name), args.model):
        shapes = [s for s in gemm_shapes(model, [1], args.seqlen, ModelParallel(tp=args.tp)) if s.groups == 1]
        seen: set[tuple[int, int, int]] = set()
        for s in sorted(shapes, key=lambda s: -s.flops):
            if (s.m, s.n, s.k) in seen:
                continue
            seen.add((s.m, s.n, s.k))
            out.append(GemmSpec(f"{model.name}:{s.layer}:{s.pass_}", s.m, s.n, s.k))
            if len(seen) == 3:
                break
    return out


def _verdict_exit(failed: str | None) -> int:
    """Exit 1 when the check failed (``failed`` says why), leaving the reason where torchrun reports a failed
    rank, so a plain torchrun on another node says why its ranks ended with 1; else 0."""
    if failed is None:
        return 0
    dist.record_error(failed)
    return 1


def run(args: argparse.Namespace, dist_env: dist.DistEnv) -> int:
    """This rank's part: join, run the checks in schedule order, judge (rank 0), leave."""
    from opbench.core.device import default_dtype_name, device_info
    from opbench.core.results import CsvReport, environment

    from .checks import Cluster, ClusterFailure, Config, GemmSpec
    from .links import link_peaks
    from .schema import PAIRS, SCHEMAS, file_name
    from .summary import write_summary
    from .verdict import case_medians, compare_baseline, load_baseline, load_expect

    started = time.monotonic()
    ranks = dist.Ranks.join(dist_env, args.device, args.timeout, args.backend)
    reports: dict[str, Any] = {}
    try:
        ranks.same_arguments(args, ignore=("baseline", "expect"))  # read by rank 0 only
        gpu = ranks.device.type == "cuda"
        dtype = args.dtype or default_dtype_name(ranks.device)
        sizes = sizes_for(args, gpu)
        gemms = [GemmSpec(f"square_{sizes.gemm_n}", sizes.gemm_n, sizes.gemm_n, sizes.gemm_n)]
        if args.model:
            gemms += _model_gemms(args)
        cfg = Config(
            checks=tuple(args.checks),
            sizes=sizes,
            dtype=dtype,
            gemms=gemms,
            fraction=args.outlier_fraction,
            mad_k=args.outlier_mad,
            timeout_s=args.timeout,
            gpu_pairs=args.gpu_pairs,
            expect=load_expect(args.expect) if args.expect else {},
            faults=Faults.from_env().for_world(ranks.world_size),
        )
        info = device_info(ranks.device)
        meta = environment(
            ranks.device,
            {
                "world_size": ranks.world_size,
                "nnodes": dist_env.nnodes,
                "launcher": dist_env.launcher,
                "dtype": dtype,
                "quick": args.quick,
                "checks": list(args.checks),
            },
        )

        def out(kind: str) -> Any:
            if kind not in reports:
                path = os.path.join(args.report_dir_path, file_name(kind))
                reports[kind] = ranks.open_report(path, SCHEMAS[kind], meta, earlier=cli.earlier_policy(args))
            return reports[kind]

        def say(text: str) -> None:
            if ranks.is_main:
                print(text, flush=True)

        cluster = Cluster(ranks, cfg, out, say)
        per_node = max(len(g) for g in cluster.node_ranks)
        cfg.links = link_peaks(info.name, per_node, args.link_peak_gbs)
        say(
            f"# opbench cluster: {len(cluster.nodes)} node(s) × {per_node} rank(s) = world {ranks.world_size}, "
            f"{info.name} ({ranks.device.type}), {dtype}, backend {ranks.backend}"
            + (", quick" if args.quick else "")
            + ("; CPU ranks take turns in the compute and memory checks (3 rounds, median kept)" if not gpu else "")
        )
        for check in CHECKS:
            if check in cfg.checks:
                getattr(cluster, check)()
        if not ranks.is_main:
            # every rank ends with the verdict, so torchrun and srun report what rank 0 decided
            return _verdict_exit(ranks.broadcast(None))
        got = cluster.got
        if got.pair_rows:  # now with the verdict columns the last round made possible
            reports.pop("pairs").close()
            with CsvReport(os.path.join(args.report_dir_path, file_name("pairs")), PAIRS, meta) as fresh:
                fresh.extend(got.pair_rows)
        baseline_rows: list[dict[str, Any]] = []
        if args.baseline:
            base = load_baseline(args.baseline)
            for kind, rows in (
                ("compute", got.compute),
                ("memory", got.memory),
                ("comm", got.comm),
                ("pairs", got.pair_rows),
            ):
                table, found = compare_baseline(kind, case_medians(kind, rows), base, args.tolerance)
                baseline_rows += table
                got.findings += found
        passed = not got.findings
        elapsed = time.monotonic() - started
        header = [
            f"{len(cluster.nodes)} node(s) × {per_node} {'GPU' if gpu else 'rank'}(s) = {ranks.world_size} rank(s); "
            f"{info.name}; {dtype}; "
            f"backend {ranks.backend}; {'quick' if args.quick else 'default'} sizes; checks took {elapsed:.0f} s after the rendezvous",
            "checks:\n" + "\n".join(f"  - {line}" for line in check_lines(cfg, got)),
            f"outlier rule: more than {100 * cfg.fraction:g} % and {cfg.mad_k:g} scaled MADs of its peers below the "
            "median of its peers (the other members of its kind)",
            f"link peaks: {cfg.links.source or 'unknown (pass --link-peak-gbs)'}",
        ]
        if args.expect:
            header.append(f"thresholds: {args.expect}")
        if args.baseline:
            header.append(f"baseline: {args.baseline} (tolerance {100 * args.tolerance:g} %)")
        summary_path = os.path.join(args.report_dir_path, "cluster_summary.md")
        head = write_summary(summary_path, passed, header, got.findings, got, baseline_rows, got.notes)
        print("\n" + head.rstrip())
        for f in got.findings[:20]:
            print(f"  {f.kind}: {f.check} {f.case}: {f.member}: {f.detail}")
        if len(got.findings) > 20:
            print(f"  … {len(got.findings) - 20} more in the summary")
        print(f"wrote {one_line(summary_path)} and cluster_*.csv", flush=True)
        failed = None
        if not passed:
            first = got.findings[0]
            failed = (
                f"opbench cluster: the check failed with {len(got.findings)} finding(s), first {first.kind}: "
                f"{first.check} {first.case}: {first.member}: {first.detail} (all in {one_line(summary_path)})"
            )
        return _verdict_exit(ranks.broadcast(failed))
    except ClusterFailure as exc:
        dist.fail_job("opbench cluster", str(exc))
        return 1
    finally:
        for report in reports.values():
            report.close()
        ranks.stop()


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.cluster"))
