"""opbench's own fused attention in Triton: FlashAttention-2 style forward and backward.

Layout (batch, seq, heads, dim) like flash-attn, any strides with a unit last dim. Supports GQA/MQA (KV head =
query head // group), head_dim_qk ≠ head_dim_v (DeepSeek MLA 192/128; dims are padded to a power of two
inside the kernel and masked), seqlen_q ≠ seqlen_kv, and causal masks aligned bottom-right. A query row that
sees no key outputs zeros.

Forward: one program per (query block, batch·head) streams KV blocks with an online softmax (exp2 with the
scale folded in) and stores the output and the row log-sum-exp. Backward: delta = rowsum(dO ∘ O); one kernel
per KV block accumulates dk/dv over every query block of every query head in its group (no atomics); one
kernel per query block accumulates dq. Block sizes are a fixed heuristic per head dim (not autotuned).

Triton is imported only when a kernel is built, so importing this module never needs a GPU or triton. On a
CPU the kernels run only under ``TRITON_INTERPRET=1`` (numpy; for correctness tests, never for timing).
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

import torch

LOG2E = 1.4426950408889634


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@cache
def _kernels() -> dict[str, Any]:
    """Import the kernels on first use (needs triton; the decorators read TRITON_INTERPRET then)."""
    import triton

    from . import triton_kernels as k

    return {"fwd": k.attn_fwd, "dkdv": k.attn_bwd_dkdv, "dq": k.attn_bwd_dq, "cdiv": triton.cdiv}


def _pad_dim(d: int) -> int:
    """tl.arange and tl.dot want power-of-two extents of at least 16."""
    return max(16, 1 << (d - 1).bit_length())


# (BLOCK_M, BLOCK_N, num_warps) per kernel for padded head dims ≤ 64, ≤ 128 and ≤ 256 (MLA's 192), 2-byte types.
TILES = {
    "fwd": ((128, 64, 4), (128, 64, 8), (64, 32, 4)),
    "dkdv": ((32, 64, 4), (32, 64, 4), (16, 32, 4)),
    "dq": ((64, 32, 4), (64, 32, 4), (32, 16, 4)),
}


def block_config(
    bd_qk: int,
    bd_v: int,
    kind: str,
    device: torch.device,
    blocks: tuple[int, int] | None = None,
    itemsize: int = 2,
    rocm: bool | None = None,
) -> dict[str, int]:
    """Heuristic tile sizes (not autotuned): big tiles for small head dims, smaller for MLA's padded 256 and
    for 4-byte types; software pipelining on NVIDIA, none on ROCm (64 KiB LDS on MI300). Tiny tiles under the
    interpreter (its speed is numpy's; it is only for correctness). ``blocks`` = (BLOCK_M, BLOCK_N) overrides
    the heuristic (tests use it to exercise uneven tiles). Shared-memory use of every entry was checked by
    compiling for sm90 and gfx942 (bench/attention_triton_compile.py)."""
    if blocks is not None:
        return {"BLOCK_M": blocks[0], "BLOCK_N": blocks[1], "num_warps": 4, "num_stages": 1}
    if interpreter_enabled() or device.type != "cuda":
        return {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1}
    rocm = bool(getattr(torch.version, "hip", None)) if rocm is None else rocm
    widest = max(bd_qk, bd_v)
    size_class = 0 if widest <= 64 else 1 if widest <= 128 else 2
    block_m, block_n, warps = TILES[kind][size_class]
    if itemsize >= 4 and kind == "fwd":
        block_m //= 2  # fp32 tiles take twice the shared memory
    stages = 1 if rocm or (size_class == 2 and kind != "fwd") else 2 if size_class == 2 or itemsize >= 4 else 3
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages}


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    if t.stride(-1) != 1:
        raise ValueError("the last (head_dim) dimension must be contiguous")
    return t.stride(0), t.stride(1), t.stride(2)


def _dims(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, Any]:
    batch, sq, heads, d_qk = q.shape
    _, skv, kv_heads, d_v = v.shape
    if k.shape[:3] != v.shape[:3] or k.shape[3] != d_qk or k.shape[0] != batch or heads % kv_heads:
        raise ValueError(f"incompatible q/k/v shapes {tuple(q.shape)} {tuple(k.shape)} {tuple(v.shape)}")
    return {
        "batch": batch,
        "sq": sq,
        "skv": skv,
        "heads": heads,
        "kv_heads": kv_heads,
        "group": heads // kv_heads,
        "D_QK": d_qk,
        "D_V": d_v,
        "BD_QK": _pad_dim(d_qk),
        "BD_V": _pad_dim(d_v),
    }


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    sm_scale: float,
    blocks: tuple[int, int] | None = None,
    window: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) with lse in log2 units, shape (batch·heads, seqlen_q), fp32. ``window`` > 0: a causal sliding
    window of that many keys (the query's own included)."""
    kern = _kernels()
    n = _dims(q, k, v)
    out = torch.empty(n["batch"], n["sq"], n["heads"], n["D_V"], dtype=q.dtype, device=q.device)
    lse = torch.empty(n["batch"] * n["heads"], n["sq"], dtype=torch.float32, device=q.device)
    cfg = block_config(n["BD_QK"], n["BD_V"], "fwd", q.device, blocks, q.element_size())
    grid = (kern["cdiv"](n["sq"], cfg["BLOCK_M"]), n["batch"] * n["heads"])
    kern["fwd"][grid](
        q,
        k,
        v,
        out,
        lse,
        sm_scale * LOG2E,
        *_strides(q),
        *_strides(k),
        *_strides(v),
        *_strides(out),
        n["heads"],
        n["group"],
        n["sq"],
        n["skv"],
        n["D_QK"],
        n["D_V"],
        n["BD_QK"],
        n["BD_V"],
        CAUSAL=causal,
        WINDOW=window,
        **cfg,
    )
    return out, lse


def attention_backward(
    q, k, v, out, lse, grad_out, causal: bool, sm_scale: float, blocks: tuple[int, int] | None = None, window: int = 0
):
    """(dq, dk, dv) for the forward that produced ``out`` and ``lse``."""
    kern = _kernels()
    n = _dims(q, k, v)
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    # delta_i = Σ_d dO·O: a row reduction, left to torch (a tiny fraction of the backward's work).
    delta = (grad_out.float() * out.float()).sum(-1).permute(0, 2, 1).reshape(n["batch"] * n["heads"], n["sq"])
    delta = delta.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    common = (n["D_QK"], n["D_V"], n["BD_QK"], n["BD_V"])
    cfg = block_config(n["BD_QK"], n["BD_V"], "dkdv", q.device, blocks, q.element_size())
    grid = (kern["cdiv"](n["skv"], cfg["BLOCK_N"]), n["batch"] * n["kv_heads"])
    kern["dkdv"][grid](
        q,
        k,
        v,
        grad_out,
        lse,
        delta,
        dk,
        dv,
        sm_scale * LOG2E,
        sm_scale,
        *_strides(q),
        *_strides(k),
        *_strides(v),
        *_strides(grad_out),
        *_strides(dk),
        *_strides(dv),
        n["heads"],
        n["kv_heads"],
        n["group"],
        n["sq"],
        n["skv"],
        *common,
        CAUSAL=causal,
        WINDOW=window,
        **cfg,
    )
    cfg = block_config(n["BD_QK"], n["BD_V"], "dq", q.device, blocks, q.element_size())
    grid = (kern["cdiv"](n["sq"], cfg["BLOCK_M"]), n["batch"] * n["heads"])
    kern["dq"][grid](
        q,
        k,
        v,
        grad_out,
        lse,
        delta,
        dq,
        sm_scale * LOG2E,
        sm_scale,
        *_strides(q),
        *_strides(k),
        *_strides(v),
        *_strides(grad_out),
        *_strides(dq),
        n["heads"],
        n["group"],
        n["sq"],
        n["skv"],
        *common,
        CAUSAL=causal,
        WINDOW=window,
        **cfg,
    )
    return dq, dk, dv


class _TritonAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, blocks, window):
        out, lse = attention_forward(q, k, v, causal, sm_scale, blocks, window)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.sm_scale, ctx.blocks, ctx.window = causal, sm_scale, blocks, window
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = attention_backward(q, k, v, out, lse, grad_out, ctx.causal, ctx.sm_scale, ctx.blocks, ctx.window)
        return dq, dk, dv, None, None, None, None


def triton_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    blocks: tuple[int, int] | None = None,
    window: int = 0,
) -> torch.Tensor:
    """Fused attention, (batch, seq, heads, dim) in and out, differentiable; ``window`` > 0 slides (causal only)."""
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    return _TritonAttention.apply(q, k, v, causal, scale, blocks, window)
