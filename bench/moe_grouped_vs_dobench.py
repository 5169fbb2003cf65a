"""Does opbench's grouped-GEMM timing (``opbench moe``'s ``grouped_mm`` backend) agree with an independent reference?
For each MoE shape and routing, the same ``torch._grouped_mm`` call (``opbench.moe.backends.grouped_mm``, rows per
expert as the routing gives them) is timed by opbench's harness (``opbench.core.timing.measure``) and by
``triton.testing.do_bench`` (its median), in interleaved rounds; the ratio opbench / do_bench of each pass is the
median over the rounds, with the rounds' range. Passes: ``fwd`` and ``bwd`` as ``opbench moe`` times them (the
backward alone, on one forward's output kept with ``retain_graph``: ``opbench.moe.runner``), and ``fwdbwd``. Issue 43's GPU check: Qwen3-30B-A3B's experts
(16 local experts of 128, EP 8's share of 4,096 tokens × top-8) and gpt-oss-20b's (32 experts, top-4, 4,096 tokens),
balanced and skewed (Zipf 1.2 over the experts), gate/up and down, forward and forward+backward.

do_bench clears the L2 cache before every call and opbench times calls back to back (CUDA-graph replays below its
GRAPH_BELOW_S), so where the operands fit in L2 opbench may read a little faster (a ratio below 1).

GPU only (do_bench times with CUDA events). Usage:
    python bench/moe_grouped_vs_dobench.py [--tokens 4096] [--rounds 3] [--json out.json]
Exit status: 0 when every ratio is inside the tolerance, 1 when one is not, 2 when it cannot run here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

# (name, hidden, expert ffn, experts on this GPU, experts in the model, top-k, EP ranks whose tokens arrive here)
SHAPES = [("qwen3-30b-a3b-ep8", 2048, 768, 16, 128, 8, 8), ("gpt-oss-20b", 2880, 2880, 32, 32, 4, 1)]
ROUTINGS = ("balanced", "zipf:1.2")


def _fwdbwd(fn: Callable[..., Any], x: Any, w: Any, routed: Any, grad: Any) -> Any:
    """Forward and backward of one grouped GEMM: the gradients of its input and weights."""
    import torch

    return torch.autograd.grad(fn(x, w, routed), (x, w), grad)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=4096, help="tokens per rank (mbs · seqlen)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budget", type=float, default=0.5, help="opbench's timing budget per pass, seconds")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--tolerance", type=float, default=0.05, help="allowed |ratio - 1|")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the ratios here")
    args = p.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("moe_grouped_vs_dobench: needs a GPU (do_bench times with CUDA events)", file=sys.stderr)
        return 2
    try:
        from triton.testing import do_bench
    except ImportError as exc:
        print(f"moe_grouped_vs_dobench: triton is needed for do_bench: {exc}", file=sys.stderr)
        return 2

    from opbench.core.device import torch_dtype
    from opbench.core.timing import TimingConfig, measure
    from opbench.moe.backends import grouped_mm, grouped_mm_reason
    from opbench.moe.block import plan_rows
    from opbench.moe.routing import parse_routing, target_counts

    device = torch.device("cuda", torch.cuda.current_device())
    dtype = torch_dtype(args.dtype)
    reason = grouped_mm_reason(device, dtype)
    if reason:
        print(f"moe_grouped_vs_dobench: {reason}", file=sys.stderr)
        return 2
    config = TimingConfig(budget_s=args.budget)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    print(f"device: {torch.cuda.get_device_name(device)}  torch {torch.__version__}  dtype {args.dtype}")
    results = []
    for name, hidden, ffn, local, experts, top_k, ep in SHAPES:
        for text in ROUTINGS:
            # the model's experts get copies by the routing; this GPU holds the first `local` of them and receives
            # their copies from all `ep` ranks (the busiest experts under Zipf: the skewed rank)
            counts, _ = target_counts(parse_routing(text), args.tokens, top_k, experts)
            local_counts = [c * ep for c in counts[:local]]
            idx = torch.repeat_interleave(torch.arange(local), torch.tensor(local_counts)).to(device)
            routed = plan_rows(idx[:, None], local, None)
            rows = routed.rows
            for gemm, (n, k) in (("gate_up", (2 * ffn, hidden)), ("down", (hidden, ffn))):
                x = torch.randn(rows, k, generator=gen).to(device, dtype).requires_grad_()
                w = (torch.randn(local, n, k, generator=gen) * k**-0.5).to(device, dtype).requires_grad_()
                with torch.no_grad():
                    grad = torch.randn_like(grouped_mm(x, w, routed))
                out = grouped_mm(x, w, routed)  # the forward the bwd pass differentiates again and again
                calls: dict[str, Callable[[], Any]] = {
                    "fwd": partial(grouped_mm, x, w, routed),
                    "bwd": partial(torch.autograd.grad, out, (x, w), grad, retain_graph=True),
                    "fwdbwd": partial(_fwdbwd, grouped_mm, x, w, routed, grad),
                }
                ratios: dict[str, list[float]] = {pass_: [] for pass_ in calls}
                ours_s: dict[str, list[float]] = {pass_: [] for pass_ in calls}
                for _ in range(args.rounds):
                    for pass_, call in calls.items():
                        ours = measure(call, device, config).median
                        theirs_ms = do_bench(call, warmup=50, rep=int(args.budget * 1000), return_mode="median")
                        ratios[pass_].append(ours / (theirs_ms * 1e-3))
                        ours_s[pass_].append(ours)
                flops = 2 * rows * n * k
                for pass_, values in ratios.items():
                    ratio = statistics.median(values)
                    ok = abs(ratio - 1) <= args.tolerance
                    seconds = statistics.median(ours_s[pass_])
                    tflops = flops * {"fwd": 1, "bwd": 2, "fwdbwd": 3}[pass_] / seconds / 1e12
                    results.append({
                        "shape": name, "routing": text, "gemm": gemm, "pass": pass_, "rows": rows,
                        "rows_max": max(local_counts), "rows_min": min(local_counts), "seconds": seconds,
                        "tflops": tflops, "ratio": ratio, "min": min(values), "max": max(values), "ok": ok,
                    })  # fmt: skip
                    print(
                        f"  {name:<18} {text:<9} {gemm:<8} {pass_:<7} rows {rows:>6} (per expert "
                        f"{min(local_counts)}-{max(local_counts)})  {seconds * 1e3:8.3f} ms {tflops:7.1f} TFLOP/s  "
                        f"opbench/do_bench {ratio:.3f} ({min(values):.3f}-{max(values):.3f})  "
                        f"{'ok' if ok else 'OUTSIDE ±' + format(args.tolerance, '.0%')}"
                    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"tolerance": args.tolerance, "results": results}, fh, indent=2)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
