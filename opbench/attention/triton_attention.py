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
from functools import lru_cache
from typing import Any

import torch

LOG2E = 1.4426950408889634


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@lru_cache(maxsize=None)
def _kernels() -> dict[str, Any]:
    """Define the @triton.jit kernels on first use (needs triton; the decorator reads TRITON_INTERPRET)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _fwd(Q, K, V, O, LSE, qk_scale,
             sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh,
             H, GROUP, SQ, SKV,
             D_QK: tl.constexpr, D_V: tl.constexpr, BD_QK: tl.constexpr, BD_V: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        hk = h // GROUP
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        d_qk = tl.arange(0, BD_QK)
        d_v = tl.arange(0, BD_V)
        row_ok = offs_m < SQ
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqs + d_qk[None, :],
                    mask=row_ok[:, None] & (d_qk[None, :] < D_QK), other=0.0)
        k_base = K + b * skb + hk * skh
        v_base = V + b * svb + hk * svh
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BD_V], dtype=tl.float32)
        shift = SKV - SQ  # bottom-right alignment: row i sees key j iff j <= i + shift
        hi = SKV
        if CAUSAL:
            hi = tl.minimum(SKV, (pid_m + 1) * BLOCK_M + shift)
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            col_ok = cols < SKV
            kt = tl.load(k_base + cols[None, :] * sks + d_qk[:, None],
                         mask=col_ok[None, :] & (d_qk[:, None] < D_QK), other=0.0)
            s = tl.dot(q, kt) * qk_scale
            ok = col_ok[None, :]
            if CAUSAL:
                ok = ok & (cols[None, :] <= offs_m[:, None] + shift)
            s = tl.where(ok, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
            p = tl.math.exp2(s - m_safe[:, None])
            alpha = tl.math.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            vb = tl.load(v_base + cols[:, None] * svs + d_v[None, :],
                         mask=col_ok[:, None] & (d_v[None, :] < D_V), other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
            m_i = m_new
        empty = l_i == 0.0
        acc = acc / tl.where(empty, 1.0, l_i)[:, None]
        # log2-domain LSE; +inf for empty rows makes the backward's exp2(s - lse) zero there.
        lse = tl.where(empty, float("inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
        tl.store(LSE + pid_bh * SQ + offs_m, lse, mask=row_ok)
        tl.store(O + b * sob + h * soh + offs_m[:, None] * sos + d_v[None, :], acc.to(O.dtype.element_ty),
                 mask=row_ok[:, None] & (d_v[None, :] < D_V))

    @triton.jit
    def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale,
                  sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sdob, sdos, sdoh,
                  sdkb, sdks, sdkh, sdvb, sdvs, sdvh,
                  H, HKV, GROUP, SQ, SKV,
                  D_QK: tl.constexpr, D_V: tl.constexpr, BD_QK: tl.constexpr, BD_V: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_bhk = tl.program_id(1)
        b = pid_bhk // HKV
        hk = pid_bhk % HKV
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < SKV
        d_qk = tl.arange(0, BD_QK)
        d_v = tl.arange(0, BD_V)
        k = tl.load(K + b * skb + hk * skh + cols[:, None] * sks + d_qk[None, :],
                    mask=col_ok[:, None] & (d_qk[None, :] < D_QK), other=0.0)
        v = tl.load(V + b * svb + hk * svh + cols[:, None] * svs + d_v[None, :],
                    mask=col_ok[:, None] & (d_v[None, :] < D_V), other=0.0)
        dk = tl.zeros([BLOCK_N, BD_QK], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BD_V], dtype=tl.float32)
        shift = SKV - SQ
        lo = 0
        if CAUSAL:  # rows before (first key − shift) cannot see this block
            lo = tl.maximum(0, pid_n * BLOCK_N - shift)
            lo = (lo // BLOCK_M) * BLOCK_M
        for g in range(0, GROUP):
            h = hk * GROUP + g
            for start_m in range(lo, SQ, BLOCK_M):
                rows = start_m + tl.arange(0, BLOCK_M)
                row_ok = rows < SQ
                q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqs + d_qk[None, :],
                            mask=row_ok[:, None] & (d_qk[None, :] < D_QK), other=0.0)
                do = tl.load(DO + b * sdob + h * sdoh + rows[:, None] * sdos + d_v[None, :],
                             mask=row_ok[:, None] & (d_v[None, :] < D_V), other=0.0)
                lse = tl.load(LSE + (b * H + h) * SQ + rows, mask=row_ok, other=float("inf"))
                delta = tl.load(DELTA + (b * H + h) * SQ + rows, mask=row_ok, other=0.0)
                st = tl.dot(k, tl.trans(q)) * qk_scale                      # (BLOCK_N, BLOCK_M)
                pt = tl.math.exp2(st - lse[None, :])
                ok = col_ok[:, None] & row_ok[None, :]
                if CAUSAL:
                    ok = ok & (cols[:, None] <= rows[None, :] + shift)
                pt = tl.where(ok, pt, 0.0)
                dv += tl.dot(pt.to(do.dtype), do)
                dpt = tl.dot(v, tl.trans(do))
                dst = pt * (dpt - delta[None, :])
                dk += tl.dot(dst.to(q.dtype), q)
        dk = dk * sm_scale
        tl.store(DK + b * sdkb + hk * sdkh + cols[:, None] * sdks + d_qk[None, :], dk.to(DK.dtype.element_ty),
                 mask=col_ok[:, None] & (d_qk[None, :] < D_QK))
        tl.store(DV + b * sdvb + hk * sdvh + cols[:, None] * sdvs + d_v[None, :], dv.to(DV.dtype.element_ty),
                 mask=col_ok[:, None] & (d_v[None, :] < D_V))

    @triton.jit
    def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, qk_scale, sm_scale,
                sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sdob, sdos, sdoh, sdqb, sdqs, sdqh,
                H, GROUP, SQ, SKV,
                D_QK: tl.constexpr, D_V: tl.constexpr, BD_QK: tl.constexpr, BD_V: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        hk = h // GROUP
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < SQ
        d_qk = tl.arange(0, BD_QK)
        d_v = tl.arange(0, BD_V)
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqs + d_qk[None, :],
                    mask=row_ok[:, None] & (d_qk[None, :] < D_QK), other=0.0)
        do = tl.load(DO + b * sdob + h * sdoh + rows[:, None] * sdos + d_v[None, :],
                     mask=row_ok[:, None] & (d_v[None, :] < D_V), other=0.0)
        lse = tl.load(LSE + pid_bh * SQ + rows, mask=row_ok, other=float("inf"))
        delta = tl.load(DELTA + pid_bh * SQ + rows, mask=row_ok, other=0.0)
        dq = tl.zeros([BLOCK_M, BD_QK], dtype=tl.float32)
        shift = SKV - SQ
        hi = SKV
        if CAUSAL:
            hi = tl.minimum(SKV, (pid_m + 1) * BLOCK_M + shift)
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + tl.arange(0, BLOCK_N)
            col_ok = cols < SKV
            kt = tl.load(K + b * skb + hk * skh + cols[None, :] * sks + d_qk[:, None],
                         mask=col_ok[None, :] & (d_qk[:, None] < D_QK), other=0.0)
            vt = tl.load(V + b * svb + hk * svh + cols[None, :] * svs + d_v[:, None],
                         mask=col_ok[None, :] & (d_v[:, None] < D_V), other=0.0)
            s = tl.dot(q, kt) * qk_scale
            p = tl.math.exp2(s - lse[:, None])
            ok = row_ok[:, None] & col_ok[None, :]
            if CAUSAL:
                ok = ok & (cols[None, :] <= rows[:, None] + shift)
            p = tl.where(ok, p, 0.0)
            dp = tl.dot(do, vt)
            ds = p * (dp - delta[:, None])
            dq += tl.dot(ds.to(kt.dtype), tl.trans(kt))
        dq = dq * sm_scale
        tl.store(DQ + b * sdqb + h * sdqh + rows[:, None] * sdqs + d_qk[None, :], dq.to(DQ.dtype.element_ty),
                 mask=row_ok[:, None] & (d_qk[None, :] < D_QK))

    return {"fwd": _fwd, "dkdv": _bwd_dkdv, "dq": _bwd_dq, "cdiv": triton.cdiv,
            "next_pow2": triton.next_power_of_2}


def _pad_dim(d: int) -> int:
    """tl.arange and tl.dot want power-of-two extents of at least 16."""
    return max(16, 1 << (d - 1).bit_length())


def block_config(bd_qk: int, bd_v: int, kind: str, device: torch.device,
                 blocks: tuple[int, int] | None = None) -> dict[str, int]:
    """Heuristic tile sizes: big tiles for small head dims, smaller for MLA's padded 256; tiny under the
    interpreter (speed there is numpy's, and it is only for correctness). ``blocks`` = (BLOCK_M, BLOCK_N)
    overrides the heuristic (tests use it to exercise uneven tiles)."""
    if blocks is not None:
        return {"BLOCK_M": blocks[0], "BLOCK_N": blocks[1], "num_warps": 4, "num_stages": 1}
    if interpreter_enabled() or device.type != "cuda":
        return {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 1, "num_stages": 1}
    widest = max(bd_qk, bd_v)
    rocm = bool(getattr(torch.version, "hip", None))
    stages = 1 if rocm else (3 if widest <= 128 else 2)
    if kind == "fwd":
        if widest <= 64:
            return {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": stages}
        if widest <= 128:
            return {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": stages}
        return {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": stages}
    # backward: both kernels hold a (BLOCK_N or BLOCK_M) × head_dim fp32 accumulator per operand
    if widest <= 128:
        return {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": stages} if kind == "dkdv" else \
            {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": stages}
    return {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1} if kind == "dkdv" else \
        {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    if t.stride(-1) != 1:
        raise ValueError("the last (head_dim) dimension must be contiguous")
    return t.stride(0), t.stride(1), t.stride(2)


def _dims(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, Any]:
    batch, sq, heads, d_qk = q.shape
    _, skv, kv_heads, d_v = v.shape
    if k.shape[:3] != v.shape[:3] or k.shape[3] != d_qk or k.shape[0] != batch or heads % kv_heads:
        raise ValueError(f"incompatible q/k/v shapes {tuple(q.shape)} {tuple(k.shape)} {tuple(v.shape)}")
    return {"batch": batch, "sq": sq, "skv": skv, "heads": heads, "kv_heads": kv_heads, "group": heads // kv_heads,
            "D_QK": d_qk, "D_V": d_v, "BD_QK": _pad_dim(d_qk), "BD_V": _pad_dim(d_v)}


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float,
                      blocks: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) with lse in log2 units, shape (batch·heads, seqlen_q), fp32."""
    kern = _kernels()
    n = _dims(q, k, v)
    out = torch.empty(n["batch"], n["sq"], n["heads"], n["D_V"], dtype=q.dtype, device=q.device)
    lse = torch.empty(n["batch"] * n["heads"], n["sq"], dtype=torch.float32, device=q.device)
    cfg = block_config(n["BD_QK"], n["BD_V"], "fwd", q.device, blocks)
    grid = (kern["cdiv"](n["sq"], cfg["BLOCK_M"]), n["batch"] * n["heads"])
    kern["fwd"][grid](q, k, v, out, lse, sm_scale * LOG2E, *_strides(q), *_strides(k), *_strides(v), *_strides(out),
                      n["heads"], n["group"], n["sq"], n["skv"], n["D_QK"], n["D_V"], n["BD_QK"], n["BD_V"],
                      CAUSAL=causal, **cfg)
    return out, lse


def attention_backward(q, k, v, out, lse, grad_out, causal: bool, sm_scale: float,
                       blocks: tuple[int, int] | None = None):
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
    cfg = block_config(n["BD_QK"], n["BD_V"], "dkdv", q.device, blocks)
    grid = (kern["cdiv"](n["skv"], cfg["BLOCK_N"]), n["batch"] * n["kv_heads"])
    kern["dkdv"][grid](q, k, v, grad_out, lse, delta, dk, dv, sm_scale * LOG2E, sm_scale,
                       *_strides(q), *_strides(k), *_strides(v), *_strides(grad_out), *_strides(dk), *_strides(dv),
                       n["heads"], n["kv_heads"], n["group"], n["sq"], n["skv"], *common, CAUSAL=causal, **cfg)
    cfg = block_config(n["BD_QK"], n["BD_V"], "dq", q.device, blocks)
    grid = (kern["cdiv"](n["sq"], cfg["BLOCK_M"]), n["batch"] * n["heads"])
    kern["dq"][grid](q, k, v, grad_out, lse, delta, dq, sm_scale * LOG2E, sm_scale,
                     *_strides(q), *_strides(k), *_strides(v), *_strides(grad_out), *_strides(dq),
                     n["heads"], n["group"], n["sq"], n["skv"], *common, CAUSAL=causal, **cfg)
    return dq, dk, dv


class _TritonAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, blocks):  # type: ignore[override]
        out, lse = attention_forward(q, k, v, causal, sm_scale, blocks)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.sm_scale, ctx.blocks = causal, sm_scale, blocks
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = attention_backward(q, k, v, out, lse, grad_out, ctx.causal, ctx.sm_scale, ctx.blocks)
        return dq, dk, dv, None, None, None


def triton_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                     softmax_scale: float | None = None, blocks: tuple[int, int] | None = None) -> torch.Tensor:
    """Fused attention, (batch, seq, heads, dim) in and out, differentiable."""
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    return _TritonAttention.apply(q, k, v, causal, scale, blocks)
