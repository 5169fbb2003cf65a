"""Where does an eager training step's GPU time go, and does ``--memory-ops eager`` account for it? Trains one
micro-batch (forward + backward) of transformers' model (random weights, SDPA attention) under torch's profiler and
sums its kernels' device time in three classes: GEMM, attention, and the rest (elementwise, reductions, copies: the
memory-bound operators). It sets the rest beside what ``opbench project --memory-ops eager`` projects for them at
this GPU's copy rate (a 1 GiB device-to-device copy, bytes read + written, median of 10). Their ratio is what
``EAGER_MEMORY_EFFICIENCY`` in opbench/project/rates.py should be scaled by (docs/project.md, "A step").

GPU only. Usage:
    python bench/eager_kernel_classes.py [--model Qwen3_0.6B] [--seqlen 4096] [--mbs 2]
Exit status: 0, or 2 when it cannot run here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter

ATTENTION_WORDS = ("flash", "fmha", "attention", "cudnn", "sdpa")
GEMM_WORDS = ("gemm", "cutlass", "xmma", "nvjet", "cublas", "splitk", "sm90_")


def kernel_class(name: str) -> str:
    low = name.lower()
    if any(w in low for w in ATTENTION_WORDS):
        return "attention"
    return "gemm" if any(w in low for w in GEMM_WORDS) else "memory-bound"


def copy_rate_gbs() -> float:
    """A 1 GiB device-to-device copy: bytes read + written per second, median of 10 (CUDA events)."""
    import torch

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * src.numel() / statistics.median(times) / 1e9


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="Qwen3_0.6B", help="a built-in model (opbench gemm --help lists them)")
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--mbs", type=int, default=2)
    args = p.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("eager_kernel_classes: needs a GPU (torch's profiler reads the kernels' device time)", file=sys.stderr)
        return 2
    from opbench.core.peaks import lookup_peak
    from opbench.models import load_model_configs, select_models
    from opbench.models.hf import build_model
    from opbench.project.plan import Plan
    from opbench.project.rates import Assumptions, Rates
    from opbench.project.step import Projector
    from opbench.project.workload import MEMORY

    (cfg,) = select_models(load_model_configs(None), args.model)
    experts = "grouped_mm" if cfg.is_moe else "eager"
    model = build_model(cfg, "cuda", torch.bfloat16, attn_implementation="sdpa", experts_implementation=experts)
    batch = torch.randint(0, cfg.vocab_size, (args.mbs, args.seqlen), device="cuda")

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=batch, labels=batch).loss.backward()

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], acc_events=True) as prof:
        step()
        torch.cuda.synchronize()
    seconds: Counter[str] = Counter()
    kernels: Counter[str] = Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            seconds[kernel_class(event.name)] += event.device_time / 1e6
            kernels[kernel_class(event.name)] += 1

    copy_gbs = copy_rate_gbs()
    device = torch.cuda.get_device_name(0)
    # the GEMM and attention items need a peak to be estimated from; only the memory-bound ones are read here
    peak_name = device if lookup_peak(device) else "H100"
    rates = Rates([], peak_name, "bf16", Assumptions(memory_ops="eager", memory_bandwidth_gbs=copy_gbs), 8)
    plan = Plan(world=1, seqlen=args.seqlen, global_batch=args.mbs, mbs=args.mbs, dtype="bf16")
    work = Projector(cfg, rates, profile="eager").stage_work(plan)[0]
    projected = sum(i.timed.seconds for w in work for i in (*w.fwd, *w.bwd) if i.category == MEMORY)

    print(f"{device}, torch {torch.__version__}: {cfg.name}, one micro-batch of {args.mbs} x {args.seqlen}, bf16")
    for name in ("gemm", "attention", "memory-bound"):
        print(f"  {name:13s} {seconds[name] * 1e3:9.2f} ms in {kernels[name]:5d} kernels")
    print(f"  copy rate     {copy_gbs:9.0f} GB/s (read + write)")
    measured = seconds["memory-bound"]
    print(
        f"memory-bound kernels: projected (--memory-ops eager) {projected * 1e3:.2f} ms, measured {measured * 1e3:.2f}"
        f" ms, projected/measured {projected / measured:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
