"""Does opbench's attention timing agree with an independent reference? For each shape, the same SDPA call is timed
by opbench's harness (``opbench.attention.runner.time_passes``, as ``opbench attention`` times it) and by
``triton.testing.do_bench`` (its median), in interleaved rounds; the ratio opbench / do_bench of each pass is the
median over the rounds. ``bench/gpu_session.sh`` requires every ratio within ±5 % (``--tolerance``). do_bench
clears the L2 cache before every call and opbench times calls back to back, so where the operands fit in L2 opbench
may read a little faster (a ratio below 1); at 4k tokens Llama-3.1-8B's q, k and v (48 MiB) about fill an H100's 50 MB L2.

GPU only (do_bench times with CUDA events). Usage:
    python bench/attention_vs_dobench.py [--seqlen 4096] [--rounds 3] [--json out.json]
Exit status: 0 when every ratio is inside the tolerance, 1 when one is not, 2 when it cannot run here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

# (name, heads_q, heads_kv, head_dim): Llama-3.1-8B's and -70B's attention (GQA 4:1 and 8:1), and an MHA case.
SHAPES = [("llama3.1-8b", 32, 8, 128), ("llama3.1-70b-tp8", 8, 1, 128), ("mha-64", 16, 16, 64)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budget", type=float, default=0.5, help="opbench's timing budget per pass, seconds")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--tolerance", type=float, default=0.05, help="allowed |ratio - 1|")
    p.add_argument("--json", help="write the ratios here")
    args = p.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("attention_vs_dobench: needs a GPU (do_bench times with CUDA events)", file=sys.stderr)
        return 2
    try:
        from triton.testing import do_bench
    except ImportError as exc:
        print(f"attention_vs_dobench: triton is needed for do_bench: {exc}", file=sys.stderr)
        return 2

    from opbench.attention.backends import BACKENDS
    from opbench.attention.runner import time_passes
    from opbench.attention.shapes import AttentionShape
    from opbench.core.device import torch_dtype
    from opbench.core.timing import TimingConfig

    device = torch.device("cuda", torch.cuda.current_device())
    dtype = torch_dtype(args.dtype)
    config = TimingConfig(budget_s=args.budget)
    print(f"device: {torch.cuda.get_device_name(device)}  torch {torch.__version__}  dtype {args.dtype}")
    results = []
    for name, hq, hkv, dim in SHAPES:
        shape = AttentionShape(name, args.seqlen, args.seqlen, hq, hkv, dim, dim, True)
        prepared = BACKENDS["sdpa"].build(shape, device, args.dtype)
        q, k, v = (
            torch.randn(args.batch, h, args.seqlen, dim, device=device, dtype=dtype, requires_grad=True)
            for h in (hq, hkv, hkv)
        )
        inputs = (q, k, v)
        with torch.no_grad():  # the output's own strides, as opbench's randn_like(out) has them
            grad = torch.randn_like(prepared.fn(*inputs))
        reference = {
            "fwd": lambda: prepared.fn(*inputs),
            "fwdbwd": lambda: torch.autograd.grad(prepared.fn(*inputs), inputs, grad),
        }
        ratios: dict[str, list[float]] = {"fwd": [], "fwdbwd": []}
        for _ in range(args.rounds):
            ours = time_passes(prepared.fn, inputs, ["fwd", "fwdbwd"], device, config)
            for pass_, call in reference.items():
                theirs_ms = do_bench(call, warmup=100, rep=int(args.budget * 1000), return_mode="median")
                ratios[pass_].append(ours[pass_].median / (theirs_ms * 1e-3))
        for pass_, values in ratios.items():
            ratio = statistics.median(values)
            ok = abs(ratio - 1) <= args.tolerance
            results.append(
                {"shape": name, "pass": pass_, "ratio": ratio, "min": min(values), "max": max(values), "ok": ok}
            )
            print(
                f"  {name:<18} {pass_:<7} opbench/do_bench {ratio:.3f} (rounds {min(values):.3f}-{max(values):.3f})"
                f"  {'ok' if ok else 'OUTSIDE ±' + format(args.tolerance, '.0%')}"
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"tolerance": args.tolerance, "results": results}, fh, indent=2)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
