"""opbench's tiled Triton matmul: C[g] = A[g] · B[g] for 2-D or batched (equal-size grouped) operands.

Any strides (so transposed views need no copy), fp32 accumulation, grouped tile ordering for L2 reuse, and
autotuned block sizes on GPU. Under ``TRITON_INTERPRET=1`` the same kernel runs on CPU tensors for
correctness tests (one fixed config: the interpreter is slow and autotuning there means nothing).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _configs() -> list[triton.Config]:
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 4}, num_warps=1)]
    out = []
    for bm, bn, bk, warps, stages in (
        (128, 256, 64, 8, 3),
        (256, 128, 64, 8, 3),
        (128, 128, 64, 4, 4),
        (128, 128, 32, 4, 4),
        (128, 64, 32, 4, 4),
        (64, 128, 32, 4, 4),
        (64, 64, 32, 4, 4),
        (32, 64, 32, 4, 5),
    ):
        out.append(
            triton.Config(
                {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=warps, num_stages=stages
            )
        )
    return out


@triton.autotune(configs=_configs(), key=["M", "N", "K"])
@triton.jit
def _matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_ag,
    stride_am,
    stride_ak,
    stride_bg,
    stride_bk,
    stride_bn,
    stride_cg,
    stride_cm,
    stride_cn,
    IEEE_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    g = tl.program_id(1).to(tl.int64)  # g·stride_bg passes 2**31 on e.g. DeepSeek-V3's 256 expert weights
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # Tiles of GROUP_M row-blocks are visited together so their B columns stay in L2.
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m

    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + g * stride_ag + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + g * stride_bg + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = (k0 + offs_k) < K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & k_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_mask[:, None] & (offs_n[None, :] < N), other=0.0)
        if IEEE_FP32:  # fp32 as torch.mm computes it; tl.dot's default for fp32 is TF32 on NVIDIA (not on AMD)
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + g * stride_cg + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A·B for [m,k]·[k,n] or [G,m,k]·[G,k,n]; output dtype follows A."""
    if a.dim() != b.dim() or a.dim() not in (2, 3):
        raise ValueError("matmul takes two 2-D or two 3-D tensors")
    batched = a.dim() == 3
    a3 = a if batched else a.unsqueeze(0)
    b3 = b if batched else b.unsqueeze(0)
    G, M, K = a3.shape
    if b3.shape[0] != G or b3.shape[1] != K:
        raise ValueError(f"shape mismatch {tuple(a.shape)} · {tuple(b.shape)}")
    N = b3.shape[2]
    if out is None:
        out = torch.empty((G, M, N) if batched else (M, N), dtype=a.dtype, device=a.device)
    c3 = out if batched else out.unsqueeze(0)

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]), G)

    _matmul_kernel[grid](
        a3,
        b3,
        c3,
        M,
        N,
        K,
        a3.stride(0),
        a3.stride(1),
        a3.stride(2),
        b3.stride(0),
        b3.stride(1),
        b3.stride(2),
        c3.stride(0),
        c3.stride(1),
        c3.stride(2),
        IEEE_FP32=a.dtype == torch.float32,
    )
    return out
