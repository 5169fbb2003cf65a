"""Does opbench's harness add overhead? Compares, in one process and interleaved round by round:

  bare      a plain ``torch.mm`` loop: N calls, one synchronisation, total / N
  harness   ``opbench.core.timing.measure`` on the same operands (warm cache, like the bare loop)
  harness+  the full GEMM runner (cold-cache operand rotation, out= buffers) as ``opbench gemm`` runs it
  tub       ``torch.utils.benchmark.Timer.adaptive_autorange`` median

Target: harness GFLOPS ≥ 97 % of bare. Usage: python bench/gemm_harness_overhead.py [--size 2048] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.utils.benchmark as tub

from opbench.core.device import default_dtype_name, device_info, resolve_device, synchronize, torch_dtype
from opbench.core.timing import TimingConfig, measure
from opbench.gemm.runner import GemmCase, run_case
from opbench.gemm.shapes import GemmShape


def bare_loop(a: torch.Tensor, b: torch.Tensor, device: torch.device, seconds: float) -> float:
    torch.mm(a, b)
    synchronize(device)
    t0 = time.perf_counter()
    torch.mm(a, b)
    synchronize(device)
    n = max(3, int(seconds / max(time.perf_counter() - t0, 1e-6)))
    t0 = time.perf_counter()
    for _ in range(n):
        torch.mm(a, b)
    synchronize(device)
    return (time.perf_counter() - t0) / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, nargs="+", default=[2048])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default=None)
    args = p.parse_args()
    device = resolve_device(args.device)
    info = device_info(device)
    dtype = args.dtype or default_dtype_name(device)
    print(f"device: {info.name}  dtype: {dtype}  torch {torch.__version__}  threads {torch.get_num_threads()}")
    cfg = TimingConfig(warmup_iters=2, min_iters=5, max_iters=100_000, rel_tol=0.0, budget_s=args.seconds)
    for n in args.size:
        flops = 2 * n ** 3
        a = torch.randn(n, n, device=device, dtype=torch_dtype(dtype))
        b = torch.randn(n, n, device=device, dtype=torch_dtype(dtype))
        shape = GemmShape("bench", "square", "fwd", 1, n, n, n, 1, False, False)
        res: dict[str, list[float]] = {"bare": [], "harness": [], "harness+": [], "tub": []}
        for _ in range(args.rounds):
            res["bare"].append(bare_loop(a, b, device, args.seconds))
            res["harness"].append(measure(lambda: torch.mm(a, b), device, cfg).median)
            res["harness+"].append(run_case(GemmCase(shape, "torch", dtype), info, cfg, cold=True)["time_s"])
            t = tub.Timer("torch.mm(a, b)", globals={"torch": torch, "a": a, "b": b},
                          num_threads=torch.get_num_threads())  # Timer defaults to 1 thread
            res["tub"].append(t.adaptive_autorange(min_run_time=args.seconds).median)
        gf = {k: flops / statistics.median(v) / 1e9 for k, v in res.items()}
        print(f"\nGEMM {n}x{n}x{n}: median over {args.rounds} interleaved rounds")
        for k in res:
            print(f"  {k:<9} {statistics.median(res[k]) * 1e3:9.3f} ms  {gf[k]:9.1f} GFLOPS  "
                  f"{100 * gf[k] / gf['bare']:6.1f} % of bare")


if __name__ == "__main__":
    main()
