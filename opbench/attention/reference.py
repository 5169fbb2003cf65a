"""Eager attention (the ``math`` backend) and the correctness oracle built from the same pieces.

Conventions shared by every backend: scale 1/sqrt(head_dim_qk); causal aligned bottom-right (query row i sees
key j iff j ≤ i + seqlen_kv − seqlen_q, as flash-attn); a row that sees no key (causal with seqlen_q >
seqlen_kv) outputs zeros, as flash-attn and torch's SDPA do.
"""

from __future__ import annotations

import math

import torch


def causal_mask(seqlen_q: int, seqlen_kv: int, device: torch.device | str | None = None, row_start: int = 0,
                rows: int | None = None) -> torch.Tensor:
    """Boolean (rows, seqlen_kv) mask, True = visible, for query rows [row_start, row_start + rows)."""
    rows = seqlen_q - row_start if rows is None else rows
    i = torch.arange(row_start, row_start + rows, device=device)[:, None]
    j = torch.arange(seqlen_kv, device=device)[None, :]
    return j <= i + (seqlen_kv - seqlen_q)


def has_empty_rows(seqlen_q: int, seqlen_kv: int, causal: bool) -> bool:
    """Bottom-right causal with more queries than keys leaves the first rows with nothing to attend to."""
    return causal and seqlen_q > seqlen_kv


def attention_probs(scores: torch.Tensor, mask: torch.Tensor | None, empty_rows: bool = False) -> torch.Tensor:
    """Softmax over keys in fp32 or wider; masked keys get probability 0, and so do rows with no visible key."""
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    if mask is not None and empty_rows:
        probs = probs.masked_fill(~mask, 0.0)  # softmax of an all -inf row is NaN; flash-attn outputs 0
    return probs


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                    scale: float | None = None) -> torch.Tensor:
    """Plain matmul + softmax + matmul in (batch, heads, seq, dim) layout, GQA by repeating KV heads.
    This is what a model without a fused kernel runs; it materialises the (seqlen_q, seqlen_kv) scores."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    sq, skv = q.shape[2], k.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    mask = causal_mask(sq, skv, q.device) if causal else None
    probs = attention_probs(scores, mask, has_empty_rows(sq, skv, causal))
    return torch.matmul(probs.to(v.dtype), v)


def reference_precision(device: torch.device) -> torch.dtype:
    """fp64 on the host (cheap there, exact enough to judge fp32); fp32 (no TF32) on GPUs."""
    return torch.float64 if device.type == "cpu" else torch.float32


@torch.no_grad()
def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                        grad_out: torch.Tensor | None = None, dtype: torch.dtype | None = None,
                        chunk_bytes: int = 256 << 20):
    """The oracle: output (and dq, dk, dv for ``grad_out``) in flash-attn layout (batch, seq, heads, dim).

    Computed in ``dtype`` (default: ``reference_precision``) one KV head group and one block of query rows
    at a time, so the score matrix never exceeds ~``chunk_bytes`` even for long sequences on a GPU. The
    backward is the analytic softmax-attention gradient: dP = dO·vᵀ, dS = P ∘ (dP − rowsum(dO ∘ O)),
    dq = s·dS·k, dk = s·dSᵀ·q, dv = Pᵀ·dO, with GQA gradients summed over each KV head's query group.
    """
    dtype = dtype or reference_precision(q.device)
    q, k, v = (t.detach().to(dtype) for t in (q, k, v))
    batch, sq, heads, d_qk = q.shape
    skv, kv_heads, d_v = k.shape[1], k.shape[2], v.shape[3]
    group = heads // kv_heads
    scale = d_qk ** -0.5
    empty = has_empty_rows(sq, skv, causal)
    out = torch.empty(batch, sq, heads, d_v, dtype=dtype, device=q.device)
    grads = None
    if grad_out is not None:
        grad_out = grad_out.detach().to(dtype)
        grads = (torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v))
    itemsize = torch.empty((), dtype=dtype).element_size()
    rows_per_chunk = max(1, min(sq, chunk_bytes // max(1, 4 * group * skv * itemsize)))
    for b in range(batch):
        for hk in range(kv_heads):
            heads_sl = slice(hk * group, (hk + 1) * group)
            kh, vh = k[b, :, hk], v[b, :, hk]                               # (skv, d)
            for r0 in range(0, sq, rows_per_chunk):
                rows = slice(r0, min(sq, r0 + rows_per_chunk))
                qh = q[b, rows, heads_sl].transpose(0, 1)                   # (group, r, d_qk)
                mask = causal_mask(sq, skv, q.device, r0, qh.shape[1]) if causal else None
                probs = attention_probs(torch.matmul(qh, kh.T) * scale, mask, empty)
                oh = torch.matmul(probs, vh)                                # (group, r, d_v)
                out[b, rows, heads_sl] = oh.transpose(0, 1)
                if grads is None:
                    continue
                doh = grad_out[b, rows, heads_sl].transpose(0, 1)           # (group, r, d_v)
                delta = (doh * oh).sum(-1, keepdim=True)
                ds = probs * (torch.matmul(doh, vh.T) - delta)
                grads[0][b, rows, heads_sl] = (torch.matmul(ds, kh) * scale).transpose(0, 1)
                grads[1][b, :, hk] += torch.matmul(ds.transpose(-1, -2), qh).sum(0) * scale
                grads[2][b, :, hk] += torch.matmul(probs.transpose(-1, -2), doh).sum(0)
    return out if grads is None else (out, *grads)


def max_errors(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max |got − ref|, that divided by max |ref|). The relative figure is norm-wise, not per element:
    per-element ratios blow up on outputs near zero and say nothing about the kernel. NaN/inf in ``got``
    gives inf (a CSV cell that cannot be mistaken for a small error)."""
    diff = (got.detach().to(ref.dtype) - ref).abs().max().item()
    if not math.isfinite(diff):
        return math.inf, math.inf
    scale = ref.abs().max().item()
    return diff, diff / scale if scale > 0 else diff
