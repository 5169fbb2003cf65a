"""Compile opbench's Triton attention kernels ahead of time for GPUs this machine does not have, and report
each configuration's shared memory against the part's limit. No GPU needed: triton's bundled ptxas
(NVIDIA) and AMD backend do the work. It proves the kernels compile for the target and the tiles fit; it
says nothing about speed.

    python bench/attention_triton_compile.py [--targets cuda:90,hip:gfx942] [--dtypes bf16,fp16,fp32]
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch  # noqa: E402
import triton  # noqa: E402
from tabulate import tabulate  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from opbench.attention import triton_kernels as K  # noqa: E402
from opbench.attention.triton_attention import _pad_dim, block_config  # noqa: E402

# Shared memory a kernel may use per block: H100/H200 opt-in maximum; MI300X/MI325X LDS per workgroup.
SHARED_LIMIT = {"cuda:90": 227 * 1024, "hip:gfx942": 64 * 1024}
HEAD_DIMS = ((64, 64), (128, 128), (192, 128))  # (head_dim_qk, head_dim_v); 192/128 is DeepSeek MLA
TRITON_TYPE = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
# kernel name -> (function, pointer arguments of the input dtype, fp32 pointers)
KERNELS = {"fwd": (K.attn_fwd, {"Q", "K", "V", "O"}, {"LSE"}),
           "dkdv": (K.attn_bwd_dkdv, {"Q", "K", "V", "DO", "DK", "DV"}, {"LSE", "DELTA"}),
           "dq": (K.attn_bwd_dq, {"Q", "K", "V", "DO", "DQ"}, {"LSE", "DELTA"})}


def signature(fn, dtype: str, ptrs: set[str], fp32_ptrs: set[str], constexprs: dict) -> dict[str, str]:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in ptrs:
            sig[name] = f"*{TRITON_TYPE[dtype]}"
        elif name in fp32_ptrs:
            sig[name] = "*fp32"
        elif name in ("qk_scale", "sm_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default="cuda:90,hip:gfx942")
    p.add_argument("--dtypes", default="bf16,fp16,fp32")
    p.add_argument("--causal", default="true,false", help="mask variants to compile")
    args = p.parse_args()
    rows, failures = [], 0
    for target_name in args.targets.split(","):
        backend, arch = target_name.split(":")
        target = GPUTarget(backend, int(arch) if backend == "cuda" else arch, 32 if backend == "cuda" else 64)
        causals = [c.strip() == "true" for c in args.causal.split(",")]
        for dtype, (d_qk, d_v), causal, kind in itertools.product(args.dtypes.split(","), HEAD_DIMS, causals, KERNELS):
            fn, ptrs, fp32_ptrs = KERNELS[kind]
            cfg = block_config(_pad_dim(d_qk), _pad_dim(d_v), kind, torch.device("cuda"),
                               itemsize=ITEMSIZE[dtype], rocm=backend == "hip")
            constexprs = {"D_QK": d_qk, "D_V": d_v, "BD_QK": _pad_dim(d_qk), "BD_V": _pad_dim(d_v),
                          "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "CAUSAL": causal}
            src = ASTSource(fn=fn, signature=signature(fn, dtype, ptrs, fp32_ptrs, constexprs),
                            constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
            t0 = time.perf_counter()
            try:
                compiled = triton.compile(src, target=target, options={
                    "num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})
                shared = compiled.metadata.shared
                verdict = "fits" if shared <= SHARED_LIMIT[target_name] else "TOO BIG"
            except Exception as exc:  # noqa: BLE001 - report every configuration
                shared, verdict = None, f"FAILED {type(exc).__name__}: {str(exc)[:120]}"
            failures += verdict != "fits"
            rows.append([target_name, dtype, f"{d_qk}/{d_v}", causal, kind, cfg["BLOCK_M"], cfg["BLOCK_N"],
                         cfg["num_warps"], cfg["num_stages"], shared, verdict, f"{time.perf_counter() - t0:.1f}"])
    print(f"triton {triton.__version__}")
    print(tabulate(rows, headers=["target", "dtype", "dqk/dv", "causal", "kernel", "BM", "BN", "warps", "stages",
                                  "shared B", "", "compile s"]))
    print(f"{failures} configuration(s) failed or do not fit")


if __name__ == "__main__":
    main()
