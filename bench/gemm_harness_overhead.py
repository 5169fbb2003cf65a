"""Does opbench's harness add overhead? Compares, in one process and interleaved round by round:

  bare      a plain ``torch.mm`` loop: N calls, one synchronisation, total / N
  graph     (GPU only) N ``torch.mm`` calls captured in one CUDA graph, replayed and timed with events: the
            kernels back to back with no host launch cost, the reference on GPU. A bare loop of small GEMMs is
            bounded by the host's launch time (about 20 µs per call on an H100 host), not by the GPU.
  harness   ``opbench.core.timing.measure`` on the same operands (warm cache, like the bare loop)
  harness+  the full GEMM runner (cold-cache operand rotation, out= buffers) as ``opbench gemm`` runs it
  tub       ``torch.utils.benchmark.Timer.adaptive_autorange`` median

Target: harness GFLOPS within 3 % of the reference (graph on GPU, bare on CPU). Usage: python bench/gemm_harness_overhead.py [--size 2048] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.utils.benchmark as tub

from opbench.core.device import default_dtype_name, device_info, synchronize, torch_dtype, use_device
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


def graph_loop(a: torch.Tensor, b: torch.Tensor, device: torch.device, seconds: float, calls: int = 50) -> float:
    """Seconds per GEMM of ``calls`` GEMMs replayed from one CUDA graph."""
    c = torch.mm(a, b)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        torch.mm(a, b, out=c)  # warm the library on the capture stream
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            torch.mm(a, b, out=c)
    graph.replay()
    synchronize(device)
    t0 = time.perf_counter()
    graph.replay()
    synchronize(device)
    replays = max(3, int(seconds / max(time.perf_counter() - t0, 1e-6)))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / (replays * calls)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, nargs="+", default=[2048])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default=None)
    p.add_argument("--json", help="write each size's median seconds per GEMM by method here (gpu_acceptance.py)")
    args = p.parse_args()
    medians: dict[int, dict[str, float]] = {}
    device = use_device(args.device)
    info = device_info(device)
    dtype = args.dtype or default_dtype_name(device)
    print(f"device: {info.name}  dtype: {dtype}  torch {torch.__version__}  threads {torch.get_num_threads()}")
    cfg = TimingConfig(warmup_iters=2, min_iters=5, max_iters=100_000, rel_tol=0.0, budget_s=args.seconds)
    for n in args.size:
        flops = 2 * n**3
        a = torch.randn(n, n, device=device, dtype=torch_dtype(dtype))
        b = torch.randn(n, n, device=device, dtype=torch_dtype(dtype))
        shape = GemmShape("bench", "square", "fwd", 1, n, n, n, 1, False, False)
        res: dict[str, list[float]] = {"bare": [], "harness": [], "harness+": [], "tub": []}
        ref = "bare"
        if device.type == "cuda":
            res = {"graph": [], **res}
            ref = "graph"
        for _ in range(args.rounds):
            if device.type == "cuda":
                res["graph"].append(graph_loop(a, b, device, args.seconds))
            res["bare"].append(bare_loop(a, b, device, args.seconds))
            res["harness"].append(measure(lambda: torch.mm(a, b), device, cfg).median)
            res["harness+"].append(run_case(GemmCase(shape, "torch", dtype), info, cfg, cold=True)["time_s"])
            t = tub.Timer(
                "torch.mm(a, b)", globals={"torch": torch, "a": a, "b": b}, num_threads=torch.get_num_threads()
            )  # Timer defaults to 1 thread
            res["tub"].append(t.adaptive_autorange(min_run_time=args.seconds).median)
        medians[n] = {k: statistics.median(v) for k, v in res.items()}
        gf = {k: flops / statistics.median(v) / 1e9 for k, v in res.items()}
        print(f"\nGEMM {n}x{n}x{n}: median over {args.rounds} interleaved rounds")
        for k in res:
            print(
                f"  {k:<9} {statistics.median(res[k]) * 1e3:9.3f} ms  {gf[k]:9.1f} GFLOPS  "
                f"{100 * gf[k] / gf[ref]:6.1f} % of {ref}"
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"device": info.name, "dtype": dtype, "sizes": medians}, fh, indent=2)


if __name__ == "__main__":
    main()
