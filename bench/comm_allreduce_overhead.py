"""How much does opbench's harness add to an all_reduce? Its reported time vs a bare torch.distributed loop.

Run under torchrun (or let it start torchrun: ``python bench/comm_allreduce_overhead.py --nproc-per-node 2``).
For each size, rounds alternate between opbench's measurement (``Bench.run_variant``, the code path that
writes the CSV row: warm-up, barrier, timed loop, cross-rank average) and a hand-written loop of the same
number of ``dist.all_reduce`` calls on a tensor of the same size, timed the same way (perf_counter on CPU,
events on GPU) and averaged across ranks. Alternating rounds spreads machine noise over both; the figure
is the ratio of the medians over rounds, with each side's spread (p10–p90 over rounds), and the ratio of
the p10s (the least-disturbed rounds), which is the steadier figure on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def bare_all_reduce_us(numel: int, dtype: torch.dtype, device: torch.device, iters: int, warmup: int) -> float:
    x = torch.zeros(numel, dtype=dtype, device=device)
    for _ in range(warmup):
        dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(x)
        end.record()
        end.synchronize()
        per_iter = start.elapsed_time(end) / 1e3 / iters
    else:
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        per_iter = (time.perf_counter() - t0) / iters
    avg = torch.tensor([per_iter], dtype=torch.float64, device=device)
    dist.all_reduce(avg)
    return float(avg) / dist.get_world_size() * 1e6


def deciles(values: list[float]) -> list[float]:
    return statistics.quantiles(values, n=10) if len(values) > 1 else [values[0]] * 9


def p10(values: list[float]) -> float:
    return deciles(values)[0]


def spread(values: list[float]) -> str:
    q = deciles(values)
    return f"{statistics.median(values):9.1f} [{q[0]:.1f}–{q[-1]:.1f}]"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc-per-node", type=int, default=2)
    p.add_argument("--sizes", default="4K,64K,1M,8M", help="nccl-tests sizes (bytes, K/M/G)")
    p.add_argument("--dtype", default=None)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()

    from opbench.core import dist as opdist

    env = opdist.detect()
    if env is None:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={args.nproc_per_node}",
            "--standalone",
            os.path.abspath(__file__),
            *sys.argv[1:],
        ]
        return opdist.relaunch(cmd)

    from opbench.comm.bench import Bench, RunConfig, dtype_of
    from opbench.comm.ops import OPS
    from opbench.comm.sizes import CommCase, count_for
    from opbench.core.cli import parse_bytes
    from opbench.core.device import default_dtype_name

    ranks = opdist.Ranks.join(env, "auto", 300)
    device, backend = ranks.device, ranks.backend
    dtype_name = args.dtype or default_dtype_name(device)
    cfg = RunConfig(iters=args.iters, warmup=args.warmup, trials=1)
    bench = Bench(cfg, ranks)
    world = dist.get_world_size()
    if dist.get_rank() == 0:
        print(
            f"# all_reduce, {backend}, world {world}, {dtype_name}, {args.iters} iters x {args.rounds} rounds, "
            f"device {device}"
        )
        print(
            f"# {'size (B)':>10} {'opbench us [p10–p90]':>26} {'bare loop us [p10–p90]':>26} {'ratio':>7} "
            f"{'p10 ratio':>9}"
        )
    for text in args.sizes.split(","):
        case = CommCase("all_reduce", parse_bytes(text), dtype_name, "overhead")
        numel = count_for(case, world)
        ours, bare = [], []
        for _ in range(args.rounds):
            row = bench.run_variant(case, OPS["all_reduce"], True)
            if row.get("status", "ok") != "ok" or row.get("time_us") is None:  # every rank has the same row
                print(f"comm_allreduce_overhead: {text}: {row.get('status')}: {row.get('error')}", file=sys.stderr)
                dist.destroy_process_group()
                return 1
            ours.append(float(row["time_us"]))
            bare.append(bare_all_reduce_us(numel, dtype_of(dtype_name), device, args.iters, args.warmup))
        if dist.get_rank() == 0:
            ratio = statistics.median(ours) / statistics.median(bare)
            low = p10(ours) / p10(bare)  # the least-disturbed rounds: robust on a shared machine
            print(f"  {case.size_bytes:>10} {spread(ours):>26} {spread(bare):>26} {ratio:7.3f} {low:9.3f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
