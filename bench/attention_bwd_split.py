"""Does the backward-only measurement add up? For a few shapes, compare bwd timed alone (retained graph) with
fwdbwd − fwd, the subtraction Primus' scripts use, and report fwd + bwd against fwdbwd.

    python bench/attention_bwd_split.py [--device cpu] [--backends sdpa,math] [--seqlen 256] [--budget 1.0]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch
from tabulate import tabulate

from opbench.attention.backends import BACKENDS, to_layout
from opbench.attention.runner import time_passes
from opbench.attention.shapes import AttentionShape
from opbench.core.device import default_dtype_name, device_info, torch_dtype, use_device
from opbench.core.sweep import Unsupported
from opbench.core.timing import TimingConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto")
    p.add_argument("--backends", default="sdpa,math")
    p.add_argument("--seqlen", type=int, default=256)
    p.add_argument("--budget", type=float, default=1.0)
    args = p.parse_args()
    device = use_device(args.device)
    dtype = default_dtype_name(device)
    config = replace(TimingConfig(), budget_s=args.budget)
    s = args.seqlen
    shapes = [
        AttentionShape("llama-gqa", s, s, 32, 8, 128, 128, True),
        AttentionShape("mla", s, s, 16, 16, 192, 128, True),
        AttentionShape("cp-tail", s // 4, s, 32, 8, 128, 128, True),
    ]
    rows = []
    for shape in shapes:
        for name in args.backends.split(","):
            backend = BACKENDS[name]
            try:
                prepared = backend.build(shape, device, dtype)
            except Unsupported as exc:
                print(f"{shape.model} {name}: not run ({exc})")
                continue
            if prepared.untimed_reason:
                print(f"{shape.model} {name}: not run ({prepared.untimed_reason})")
                continue
            # random inputs as the runner makes them (bshd, then the backend's layout); no oracle: nothing is checked
            sizes = [
                (shape.seqlen_q, shape.num_head_q, shape.head_dim_qk),
                (shape.seqlen_kv, shape.num_head_kv, shape.head_dim_qk),
            ]
            sizes.append((shape.seqlen_kv, shape.num_head_kv, shape.head_dim_v))
            inputs = tuple(
                to_layout(torch.randn(1, *n, device=device, dtype=torch_dtype(dtype)), backend.layout) for n in sizes
            )
            with (
                torch.no_grad()
            ):  # what the kernel is handed, as the runner does (K/V expanded for kernels without GQA)
                inputs = prepared.adapt_inputs(inputs) if prepared.adapt_inputs else inputs
            inputs = tuple(t.detach().requires_grad_() for t in inputs)
            st = time_passes(prepared.fn, inputs, ["fwd", "bwd", "fwdbwd"], device, config)
            fwd, bwd, both = st["fwd"].median, st["bwd"].median, st["fwdbwd"].median
            rows.append(
                [
                    shape.model,
                    f"{shape.seqlen_q}x{shape.seqlen_kv}",
                    name,
                    fwd * 1e3,
                    bwd * 1e3,
                    both * 1e3,
                    (both - fwd) * 1e3,
                    (fwd + bwd) / both,
                    st["bwd"].iters,
                ]
            )
    print(f"{device_info(device).name}, {dtype}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        tabulate(
            rows,
            headers=[
                "shape",
                "sq x skv",
                "backend",
                "fwd ms",
                "bwd ms (alone)",
                "fwdbwd ms",
                "fwdbwd-fwd ms",
                "(fwd+bwd)/fwdbwd",
                "bwd iters",
            ],
            floatfmt=".3g",
        )
    )


if __name__ == "__main__":
    main()
