"""``opbench comm`` / ``torchrun -m opbench.comm``: collective sweeps with nccl-tests semantics.

Under torchrun (or srun) every process runs this; launched plainly, ``--nproc-per-node N`` (or ``--nnodes``)
starts torchrun for this machine, and without them a one-rank world runs in this process.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

from opbench.core import cli, dist, outputs
from opbench.core.cli import csv_list, parse_bytes, positive_int
from opbench.core.errors import UsageError, run_cli
from opbench.core.faults import Faults
from opbench.core.redact import redact_text
from opbench.core.units import note, one_line

from . import flags
from .flags import add_refused
from .sizes import RUNNABLE, CommCase, CommGroups, cases_for_sizes, model_cases, sweep_bytes, trace_cases
from .splits import DEFAULT_HIDDEN, DEFAULT_TOP_K, EXPERTS_PER_RANK, SplitSpec, parse_routings

EXAMPLES = """\
examples:
  opbench comm --nproc-per-node 2 -b 1K -e 1M -f 4 --check         # launches torchrun on this machine
  torchrun --nproc-per-node 8 -m opbench.comm -b 8 -e 8G -f 2 --collectives all_reduce,all_gather
  torchrun --nnodes 2 --node-rank $NODE_RANK --master-addr $MASTER_ADDR --master-port 29500 \\
      --nproc-per-node 8 -m opbench.comm --model Llama3.1_70B --tp 8 --pp 2
  srun --ntasks-per-node 8 python -m opbench.comm ...   # needs MASTER_ADDR exported by the job script
  opbench comm --nproc-per-node 8 --sizes-from-trace nccl.log   # replay the sizes an NCCL_DEBUG log saw
  opbench comm --nproc-per-node 8 -b 8 -e 1G -f 2 -d bfloat16 -z 1 -a 3   # nccl-tests' flags, their meanings
  opbench comm --nproc-per-node 8 --collectives all_to_all_v --model Mixtral_8x7B --routing balanced,zipf:1.2
      # MoE dispatch/combine with uneven splits (nccl-tests' alltoallv_perf sizes; docs/comm.md)

A world of one rank has no link to measure: opbench comm refuses it (start 2 or more ranks).
"""

ONE_RANK = (
    "a world of 1 rank has no link to measure (a collective on one rank copies locally or does nothing); "
    "start 2 or more ranks: --nproc-per-node 2, or torchrun/srun with several GPUs or nodes"
)


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser(
        "opbench comm",
        epilog=EXAMPLES,
        description="Time collectives under torchrun with nccl-tests semantics: -b/-e are total buffer bytes "
        "per rank (max of send and receive), count is the per-rank NCCL count, busbw uses "
        "nccl-tests' factors. Rank 0 writes <report-dir>/<collective>_benchmark.csv.",
    )
    g = p.add_argument_group("launch (ignored when already under torchrun/srun)")
    cli.add_launch_args(g)
    cli.add_timeout_arg(g, flags.DEFAULT_TIMEOUT_S)
    g.add_argument(
        "-T", dest="timeout", type=flags.timeout_seconds, default=argparse.SUPPRESS, help="nccl-tests' --timeout"
    )
    p.add_argument(
        "--device", type=cli.device_spec, default="auto", help="auto (GPU if present, else CPU), cpu, cuda, cuda:N"
    )
    p.add_argument(
        "-d",
        "--dtype",
        "--datatype",
        type=flags.comm_dtype,
        default=None,
        metavar="TYPE",
        help="element type: opbench's name or nccl-tests' (bf16|bfloat16, fp16|half, fp32|float, fp64|double, "
        "fp8|f8e4m3, fp8_e5m2|f8e5m2, int8, uint8, int32, int64; default: bf16 on GPU, fp32 on CPU)",
    )

    g = p.add_argument_group("what to run")
    g.add_argument(
        "--collectives",
        type=csv_list(str),
        default=list(RUNNABLE),
        help=f"comma-separated subset of {','.join(RUNNABLE)} (default: all)",
    )
    g.add_argument(
        "-o",
        "--op",
        default="sum",
        type=flags.redop,
        help=f"reduction of all_reduce / reduce_scatter: {', '.join(flags.REDOPS)}",
    )
    g.add_argument("-r", "--root", type=cli.integer, default=0, help="broadcast root, a rank within the group")
    g.add_argument(
        "--p2p-mode",
        choices=["ring", "pingpong"],
        default="ring",
        help="send_recv: ring (rank→rank+1 while receiving from rank-1, batch_isend_irecv) or pingpong "
        "(pairs 0↔1, 2↔3…; time = half the round trip)",
    )

    g = p.add_argument_group("sizes (nccl-tests semantics; K/M/G = 1024 powers)")
    g.add_argument("-b", "--minbytes", type=parse_bytes, default=None, help="smallest size (default: 32M)")
    g.add_argument("-e", "--maxbytes", type=parse_bytes, default=None, help="largest size (default: minbytes)")
    g.add_argument("-i", "--stepbytes", type=parse_bytes, default=1 << 20, help="additive step (default: 1M)")
    g.add_argument("-f", "--stepfactor", type=int, default=1, help="multiplicative step, used when > 1")
    g.add_argument(
        "--sizes",
        type=csv_list(parse_bytes),
        default=None,
        metavar="B1,B2,…",
        help="explicit list of sizes (each an nccl-tests -b value)",
    )
    g.add_argument(
        "--source-label",
        default=None,
        help="value of the CSV 'source' column for --sizes / sweep rows (default: 'sizes' / 'sweep')",
    )
    cli.add_model_args(g)
    g.add_argument("--tp", type=positive_int, default=None, help="tensor-parallel size (default: world size)")
    g.add_argument("--ep", type=positive_int, default=None, help="expert-parallel size (default: world size)")
    g.add_argument("--pp", type=positive_int, default=None, help="pipeline-parallel size (default: world size)")
    cli.add_mbs_arg(g, help="micro-batch sizes for model-derived sizes, e.g. 1,2,4,8")
    g.add_argument("--seqlen", type=cli.sequence_length, default=None, help="sequence length (default: the model's)")
    g.add_argument(
        "--sizes-from-trace",
        type=flags.trace_paths,
        action="extend",
        default=None,
        metavar="LOG[,LOG]",
        help="replay the (collective, count, dtype, nranks) an NCCL_DEBUG=INFO log recorded; repeat the flag for "
        "several logs (an existing file is one log even with a comma in its name)",
    )

    g = p.add_argument_group(
        "all_to_all_v splits (docs/comm.md, all-to-all-v): a -b size is what each rank dispatches, T·top_k·hidden·elt"
    )
    g.add_argument(
        "--routing",
        default="balanced",
        metavar="R[,R…]",
        help="routing distribution(s) of the uneven splits, as opbench moe's: balanced, zipf:S, max-mean:R, "
        "histogram:FILE (default: balanced)",
    )
    g.add_argument(
        "--experts",
        type=positive_int,
        default=None,
        help=f"experts over the group, placed on its ranks contiguously (default: {EXPERTS_PER_RANK} per rank; "
        "--model: the model's)",
    )
    g.add_argument("--top-k", type=positive_int, default=DEFAULT_TOP_K, help="experts per token (--model: the model's)")
    g.add_argument(
        "--hidden", type=positive_int, default=DEFAULT_HIDDEN, help="elements per token copy (--model: hidden_size)"
    )

    g = p.add_argument_group("measurement")
    g.add_argument("-w", "--warmup-iters", "--warmup_iters", type=int, default=5, help="warm-up calls per size")
    g.add_argument("-n", "--iters", type=positive_int, default=20, help="timed back-to-back calls per trial")
    g.add_argument(
        "--trials",
        type=positive_int,
        default=3,
        help="timed loops per size; the CSV has the median and the min/max over trials",
    )
    g.add_argument(
        "-m",
        "--agg-iters",
        "--agg_iters",
        type=flags.agg_iters,
        default=1,
        metavar="N",
        help="calls per timed iteration; the time is per call (nccl-tests -m; here issued back to back, not fused "
        "in one NCCL group)",
    )
    g.add_argument(
        "-z",
        "--blocking",
        type=flags.blocking,
        nargs="?",
        const=1,
        default=0,
        metavar="0-3",
        help="nccl-tests' -z: 1 wait and barrier after each call (-z alone), 2 wait after each call, 3 wait and "
        "barrier after each iteration of -m calls with the barrier not timed",
    )
    g.add_argument(
        "-a",
        "--average",
        type=flags.average,
        default=1,
        metavar="0-3",
        help="time reported per trial: 0 rank 0's, 1 the rank average, 2 the fastest rank, 3 the slowest",
    )
    g.add_argument(
        "-N",
        "--run-cycles",
        "--run_cycles",
        type=flags.run_cycles,
        default=1,
        metavar="N",
        help="run the whole plan N times, each cycle printed and written (CSV column 'cycle')",
    )
    g.add_argument(
        "-c",
        "--check",
        type=flags.check_count,
        nargs="?",
        const=1,
        default=0,
        metavar="N",
        help="fill rank-dependent values and count wrong elements over N checked calls (-c alone: 1)",
    )
    g.add_argument(
        "--per-rank",
        action="store_true",
        help="keep every call's time on every rank: the CSV adds the slowest rank's p50/p95 per call, the rank "
        "slowest most often, and the spread between ranks (docs/cluster.md, per-rank statistics)",
    )
    cli.add_earlier_args(p)
    add_refused(p.add_argument_group("nccl-tests flags not offered (each stops the run with its reason; docs/comm.md)"))
    g = p.add_argument_group("output")
    cli.add_output_args(g, dir_default=cli.tool_dir("comm"), dir_help="where <collective>_benchmark.csv go")
    cli.add_dry_run_arg(
        g,
        "print every planned case and the matching nccl-tests / rccl-tests command lines "
        "(no torch, no ranks; world size = --nproc-per-node × --nnodes)",
    )
    return p


def _validate(args: argparse.Namespace) -> None:
    unknown = [c for c in args.collectives if c not in RUNNABLE]
    if unknown:
        raise UsageError(f"unknown collective(s) {unknown}; choose from {', '.join(RUNNABLE)}", field="--collectives")
    for value, flag in ((args.warmup_iters, "--warmup-iters"), (args.root, "--root")):
        if value < 0:
            raise UsageError(f"must not be negative, got {value}", field=flag)
    if not args.timeout > 0:
        raise UsageError(f"must be positive, got {args.timeout}", field="--timeout")
    if args.sizes is not None and any(s < 1 for s in args.sizes):
        raise UsageError("sizes must be at least 1 byte", field="--sizes")
    from opbench.models.config import check_config_path

    check_config_path(args.model_config_path)
    for path in args.sizes_from_trace or []:
        if path != "-" and not os.path.isfile(path):
            raise UsageError("no such file", source=path, field="--sizes-from-trace")
    Faults.from_env()  # a malformed OPBENCH_FAULTS fails here, once, before any rank starts
    _sweep(args)


def _sweep(args: argparse.Namespace) -> list[int]:
    lo = args.minbytes if args.minbytes is not None else 32 << 20
    hi = args.maxbytes if args.maxbytes is not None else lo
    return sweep_bytes(lo, hi, args.stepbytes, args.stepfactor)


def build_cases(args: argparse.Namespace, world_size: int, dtype: str) -> tuple[list[CommCase], list[str]]:
    """Every case this run times, collective by collective; within one: sweep, explicit sizes, model-derived,
    then trace-derived."""
    cases: list[CommCase] = []
    notes: list[str] = []
    modelled = bool(args.model_config_path or args.model)
    explicit = args.sizes is not None
    routings = parse_routings(args.routing) if "all_to_all_v" in args.collectives else []
    patterns = [SplitSpec(r, 0, args.top_k, args.hidden, args.experts) for r in routings]
    sweep = (
        args.minbytes is not None or args.maxbytes is not None or not (explicit or modelled or args.sizes_from_trace)
    )
    if sweep or explicit:  # the patterns run here: a bad one is one line before any rank runs (model cases: ep_v_cases)
        for p in patterns:
            p.check(world_size)
    if sweep:
        source = args.source_label or "sweep"
        cases += cases_for_sizes(args.collectives, _sweep(args), dtype, source, args.op, patterns)
    if explicit:
        source = args.source_label or "sizes"
        cases += cases_for_sizes(args.collectives, args.sizes, dtype, source, args.op, patterns)
    if modelled:
        from opbench.models import load_model_configs, select_models

        par = CommGroups.resolve(world_size, args.tp, args.ep, args.pp)
        models = select_models(load_model_configs(args.model_config_path, args.model_name), args.model)
        for model in models:
            found = [
                c
                for mbs in args.mbs
                for c in model_cases(model, args.collectives, world_size, par, mbs, args.seqlen, dtype, routings)
            ]
            cases += found
            if not found:
                notes.append(
                    f"{model.name}: no traffic for {','.join(args.collectives)} at tp={par.tp} "
                    f"ep={par.ep} pp={par.pp} (dimensions of 1 have none; all_to_all needs a MoE model)"
                )
    if args.sizes_from_trace:
        from opbench.trace.analyze import trace_sizes  # lazy: the log parser is only needed here

        label = "trace:" + ",".join(os.path.basename(p) for p in args.sizes_from_trace)
        found, skipped = trace_cases(trace_sizes(list(args.sizes_from_trace)), args.collectives, world_size, label)
        cases += found
        notes += skipped
    alone = [c for c in cases if c.group_size == 1]
    if alone and world_size > 1:  # a call logged on one rank: nothing crosses a link
        cases = [c for c in cases if c.group_size != 1]
        notes.append(f"{len(alone)} case(s) on groups of 1 rank left out: one rank has no link to measure")
    cases.sort(key=lambda c: RUNNABLE.index(c.collective))  # stable: one table (and CSV run) per collective
    return cases, [one_line(n) for n in notes]  # notes name models and log files: printed, never a new line


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    _validate(args)

    dist_env = dist.detect()
    if args.dry_run:
        return dry_run(args, dist_env)
    if dist_env is None:
        launched = dist.self_launch(args, argv, "opbench.comm", "opbench comm")
        if launched is not None:
            return launched
        dist_env = dist.single()
    return run(args, dist_env)


def check_plan(args: argparse.Namespace, cases: Sequence[CommCase], world: int) -> None:
    """What the flags ask of every case, checked before anything runs rather than found as a row per size:
    --root names a rank inside every broadcast group; --p2p-mode pingpong needs groups of an even size."""
    groups = [c.group_size or world for c in cases if c.collective == "broadcast"]
    if groups and args.root >= min(groups):
        raise UsageError(f"rank {args.root} is outside a broadcast group of {min(groups)} rank(s)", field="--root")
    odd = sorted({n for c in cases if c.collective == "send_recv" and (n := c.group_size or world) % 2})
    if args.p2p_mode == "pingpong" and odd:
        raise UsageError(f"ping-pong pairs ranks, and a send_recv group of {odd[0]} is odd", field="--p2p-mode")


def dry_run(args: argparse.Namespace, dist_env: dist.DistEnv | None) -> int:
    """The plan without torch or ranks: every case, and the nccl-tests / rccl-tests line for each."""
    from opbench.core.collectives import COLLECTIVES, TESTS_REDOP, nccl_tests_command
    from opbench.core.dtypes import element_size

    from .sizes import actual_size, count_for

    per_node = args.nproc_per_node or 1
    world = dist_env.world_size if dist_env else per_node * args.nnodes
    if dist_env:
        per_node = max(1, world // dist_env.nnodes)
    Faults.validate(world)  # as a real run would: a fault for a rank this world lacks is refused here too
    dtype = args.dtype or "bf16"
    cases, notes = build_cases(args, world, dtype)
    check_plan(args, cases, world)
    if world == 1:
        raise UsageError(ONE_RANK, field="--nproc-per-node")
    print(
        f"# plan: world size {world} ({world // per_node} node(s) × {per_node}), dtype {dtype}"
        + ("" if args.dtype else " (the GPU default; CPU runs use fp32)")
        + f", -n {args.iters} -w {args.warmup_iters}, {args.trials} trial(s)"
    )
    for text in notes:
        print(note(text, lead="# note: ", indent="#   "))
    if not cases:
        raise UsageError("nothing to run: no sizes for the chosen collectives", field="--collectives")
    rows: list[str] = []
    commands: dict[str, list[str]] = {"nccl": [], "rccl": []}
    matrices: list[tuple[str, list[list[int]]]] = []  # all_to_all_v: nccl-tests' matrix files (bytes, row = sender)
    for case in cases:
        nranks = case.group_size or world
        coll = COLLECTIVES[case.collective]
        size, count = actual_size(case, nranks), count_for(case, nranks)
        # a case's own dtype: a logged call replays in the datatype it was logged with (--sizes-from-trace)
        rows.append(
            f"{case.collective:<15} {size:>12} {count:>12} {case.dtype:>6} {nranks:>6}  {one_line(case.source)}"
        )
        if count == 0:
            continue
        redop = TESTS_REDOP[case.redop] if coll.has_redop else None
        nodes = -(-nranks // per_node)
        extra = flags.tests_flags(args, coll.has_root)
        prefix = ""
        if case.splits is not None:  # alltoallv_perf reads uneven splits from a matrix file of bytes, -b = -e
            matrix = [[v * element_size(case.dtype) for v in row] for row in case.splits.matrix(nranks)]
            name = f"alltoallv_matrix_{len(matrices) + 1}.txt"
            matrices.append((name, matrix))
            prefix = f"NCCL_TESTS_ALLTOALLV_MATRIX_FILE={name} "
        for flavour, lines in commands.items():
            line = nccl_tests_command(
                case.collective,
                size,
                nranks,
                case.dtype,
                flavour=flavour,
                launcher="single" if nodes == 1 else "mpi",
                nnodes=nodes,
                redop=redop,
                iters=args.iters,
                warmup=args.warmup_iters,
            )
            lines.append(prefix + flags.with_flags(line, extra))
    print(f"# {'collective':<13} {'size (B)':>12} {'count':>12} {'dtype':>6} {'nranks':>6}  source")
    print("\n".join(rows))
    same = commands["nccl"] == commands["rccl"]
    for flavour, lines in commands.items():
        if flavour == "rccl" and same:
            break
        print(
            f"\n# {'nccl-tests and rccl-tests (same flags)' if same else flavour + '-tests'}, from the build directory:"
        )
        print(redact_text("\n".join(dict.fromkeys(lines))))
    for name, matrix in matrices:
        print(f"\n# {name} (bytes rank i sends rank j; nccl-tests rounds each down to 16 B):")
        print("\n".join(" ".join(str(v) for v in row) for row in matrix))
    return 0


def splits_meta(cases: Sequence[CommCase], world: int) -> dict[str, list[dict]]:
    """The sidecar's record of every all_to_all_v case: its pattern's parameters, per-rank send/receive bytes and
    (groups up to 64 ranks) the split matrix in elements."""
    from opbench.core.dtypes import element_size

    found = [
        {"source": c.source, **c.splits.describe(c.group_size or world, element_size(c.dtype))}
        for c in cases
        if c.splits is not None
    ]
    return {"all_to_all_v": found} if found else {}


def run(args: argparse.Namespace, dist_env: dist.DistEnv) -> int:
    """This rank's part of the job: join, build the cases, time them, write (rank 0) and leave."""
    from opbench.core.device import default_dtype_name

    from .bench import Bench, CommFailure, Output, RunConfig, run_meta

    ranks = dist.Ranks.join(dist_env, args.device, args.timeout, args.backend)
    dtype = args.dtype or default_dtype_name(ranks.device)
    try:
        ranks.same_arguments(args)
        cases, notes = build_cases(args, ranks.world_size, dtype)
        check_plan(args, cases, ranks.world_size)
        if ranks.world_size == 1:
            raise UsageError(ONE_RANK, field="--nproc-per-node")
        if ranks.is_main:
            for text in notes:
                print(note(text, lead="# note: ", indent="#   "), file=sys.stderr)
        if not cases:
            raise UsageError("nothing to run: no sizes for the chosen collectives", field="--collectives")
        cfg = RunConfig(
            iters=args.iters,
            warmup=args.warmup_iters,
            trials=args.trials,
            blocking=args.blocking,
            check=args.check,
            average=args.average,
            agg=args.agg_iters,
            cycles=args.run_cycles,
            root=args.root,
            p2p_mode=args.p2p_mode,
            timeout_s=args.timeout,
            faults=Faults.from_env().for_world(ranks.world_size),
            per_rank=args.per_rank,
        )
        meta = run_meta(
            ranks.device,
            {
                "world_size": ranks.world_size,
                "nnodes": dist_env.nnodes,
                "launcher": dist_env.launcher,
                "backend": ranks.backend,
                "dtype": dtype,
                "iters": cfg.iters,
                "warmup_iters": cfg.warmup,
                "trials": cfg.trials,
                "blocking": cfg.blocking,
                "average": cfg.average,
                "agg_iters": cfg.agg,
                "run_cycles": cfg.cycles,
                "check": cfg.check,
                "per_rank": cfg.per_rank,
                "timeout_s": cfg.timeout_s,
                **splits_meta(cases, ranks.world_size),
            },
        )
        output = Output(ranks, args.report_dir_path, meta, earlier=cli.earlier_policy(args))
        with contextlib.ExitStack() as claims:
            claims.callback(output.close)  # last in, first out: the CSVs close before the claims are given back

            def claim() -> None:
                """Rank 0 takes the writer lock of every CSV this job will write before the first call, so a
                second job into the same folder stops at once (docs/conventions.md "Earlier results")."""
                if ranks.is_main:
                    collectives = dict.fromkeys(case.collective for case in cases)
                    claims.enter_context(outputs.claimed(*(output.path(c) for c in collectives)))

            try:
                ranks.agree(claim, describe=lambda exc: ("error", str(exc)))
            except dist.RankFailure as exc:
                if ranks.is_main:
                    raise UsageError(str(exc).removeprefix("rank 0: ")) from None
                return 2  # rank 0 says why
            Bench(cfg, ranks).run(cases, output)
    except CommFailure as exc:
        dist.fail_job("opbench comm", str(exc))
    finally:
        ranks.stop()
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.comm"))
