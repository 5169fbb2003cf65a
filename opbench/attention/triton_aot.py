"""Compile the Triton attention kernels ahead of time for a GPU this machine need not have.

Triton's bundled ptxas (NVIDIA) and AMD backend do the work without a device, so a CPU-only CI catches
kernels that the interpreter accepts but the compiler rejects (the interpreter does no type checking), and
tiles that overflow shared memory. Used by ``bench/attention_triton_compile.py`` and the tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the runtime default; silences triton 3.9's notice

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import triton_kernels as K
from .triton_attention import _pad_dim, block_config

# Shared memory a kernel may use per block: H100/H200 opt-in maximum; MI300X/MI325X LDS per workgroup.
SHARED_LIMIT = {"cuda:90": 227 * 1024, "hip:gfx942": 64 * 1024}
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
# kernel name -> (function, pointer arguments of the input dtype, fp32 pointers)
KERNELS = {
    "fwd": (K.attn_fwd, {"Q", "K", "V", "O"}, {"LSE"}),
    "dkdv": (K.attn_bwd_dkdv, {"Q", "K", "V", "DO", "DK", "DV"}, {"LSE", "DELTA"}),
    "dq": (K.attn_bwd_dq, {"Q", "K", "V", "DO", "DQ"}, {"LSE", "DELTA"}),
}


@dataclass(frozen=True)
class Compiled:
    """One kernel configuration compiled for a target: its tiles and the shared memory it needs."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    shared_bytes: int

    def fits(self, target_name: str) -> bool:
        return self.shared_bytes <= SHARED_LIMIT[target_name]


def _signature(fn, dtype: str, ptrs: set[str], fp32_ptrs: set[str], constexprs: dict) -> dict[str, str]:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in ptrs:
            sig[name] = f"*{dtype}"
        elif name in fp32_ptrs:
            sig[name] = "*fp32"
        elif name in ("qk_scale", "sm_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def compile_kernel(
    target_name: str, kind: str, dtype: str, d_qk: int, d_v: int, causal: bool, window: int = 0
) -> Compiled:
    """Compile one kernel (``fwd``, ``dkdv`` or ``dq``) with the tiles opbench would pick on that target, for a
    sliding window of ``window`` keys (0: none). Raises triton's CompilationError when the kernel does not compile."""
    backend, arch = target_name.split(":")
    target = GPUTarget(backend, int(arch) if backend == "cuda" else arch, 32 if backend == "cuda" else 64)
    fn, ptrs, fp32_ptrs = KERNELS[kind]
    cfg = block_config(
        _pad_dim(d_qk), _pad_dim(d_v), kind, torch.device("cuda"), itemsize=ITEMSIZE[dtype], rocm=backend == "hip"
    )
    constexprs = {
        "D_QK": d_qk,
        "D_V": d_v,
        "BD_QK": _pad_dim(d_qk),
        "BD_V": _pad_dim(d_v),
        "BLOCK_M": cfg["BLOCK_M"],
        "BLOCK_N": cfg["BLOCK_N"],
        "CAUSAL": causal,
        "WINDOW": window,  # a constexpr as at run time: each value is its own kernel
    }
    src = ASTSource(
        fn=fn,
        signature=_signature(fn, dtype, ptrs, fp32_ptrs, constexprs),
        constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()},
    )
    compiled = triton.compile(
        src, target=target, options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    )
    return Compiled(cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"], int(compiled.metadata.shared))
