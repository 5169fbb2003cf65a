"""Eager attention (the ``math`` backend) and the correctness oracle built from the same pieces.

Conventions shared by every backend: scale 1/sqrt(head_dim_qk); causal aligned bottom-right (query row i sees
key j iff j ≤ i + seqlen_kv − seqlen_q, as flash-attn); a row that sees no key (causal with seqlen_q >
seqlen_kv) outputs zeros, as flash-attn and torch's SDPA do. Windowed kinds narrow the causal mask
(``visible_mask``): a sliding window keeps the last ``window`` keys, a chunked layer the keys in the query's
block of ``window``, a sparse layer ``window`` keys picked per query by a fixed pseudo-random score (a stand-in
for DeepSeek-V3.2's indexer: which keys it picks does not change the work a masked kernel does).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def causal_mask(
    seqlen_q: int, seqlen_kv: int, device: torch.device | str | None = None, row_start: int = 0, rows: int | None = None
) -> torch.Tensor:
    """Boolean (rows, seqlen_kv) mask, True = visible, for query rows [row_start, row_start + rows)."""
    return visible_mask(seqlen_q, seqlen_kv, device, row_start, rows)


def _pseudo_scores(pos: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """A fixed, well-mixed integer per (query position, key): the sparse kind's stand-in indexer score."""
    return ((pos * 0x9E3779B1) ^ (j * 0x85EBCA77) ^ ((pos * j) & 0xFFFF)) & 0x7FFFFFFF


def visible_mask(
    seqlen_q: int,
    seqlen_kv: int,
    device: torch.device | str | None = None,
    row_start: int = 0,
    rows: int | None = None,
    kind: str = "full",
    window: int = 0,
) -> torch.Tensor:
    """Boolean (rows, seqlen_kv) causal mask of ``kind`` (True = visible) for query rows [row_start, +rows)."""
    rows = seqlen_q - row_start if rows is None else rows
    pos = torch.arange(row_start, row_start + rows, device=device)[:, None] + (seqlen_kv - seqlen_q)
    j = torch.arange(seqlen_kv, device=device)[None, :]
    mask = j <= pos
    if kind == "sliding":
        mask &= j > pos - window
    elif kind == "chunked":
        mask &= torch.div(j, window, rounding_mode="floor") == torch.div(pos, window, rounding_mode="floor")
    elif kind == "sparse" and window < seqlen_kv:
        scores = torch.where(mask, _pseudo_scores(pos, j), -1)
        picked = torch.zeros_like(mask)
        picked.scatter_(1, scores.topk(window, dim=1).indices, True)
        mask &= picked
    return mask


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


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float | None = None,
    kind: str = "full",
    window: int = 0,
) -> torch.Tensor:
    """Plain matmul + softmax + matmul in (batch, heads, seq, dim) layout, GQA by repeating KV heads.
    This is what a model without a fused kernel runs; it materialises the (seqlen_q, seqlen_kv) scores."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    sq, skv = q.shape[2], k.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    mask = visible_mask(sq, skv, q.device, kind=kind, window=window) if causal else None
    probs = attention_probs(scores, mask, has_empty_rows(sq, skv, causal))
    return torch.matmul(probs.to(v.dtype), v)


def reference_precision(device: torch.device) -> torch.dtype:
    """fp64 on the host (cheap there, exact enough to judge fp32); fp32 (no TF32) on GPUs."""
    return torch.float64 if device.type == "cpu" else torch.float32


@torch.no_grad()
def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    grad_out: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
    chunk_bytes: int = 256 << 20,
    kind: str = "full",
    window: int = 0,
):
    """The oracle: output (and dq, dk, dv for ``grad_out``) in flash-attn layout (batch, seq, heads, dim).

    Computed in ``dtype`` (default: ``reference_precision``) for as many KV-head groups and query rows at once
    as keep the score matrix under ~``chunk_bytes``, so long sequences fit on a GPU and short ones run as a few
    large matmuls. The backward is the analytic softmax-attention gradient: dP = dO·vᵀ,
    dS = P ∘ (dP − rowsum(dO ∘ O)), dq = s·dS·k, dk = s·dSᵀ·q, dv = Pᵀ·dO, with GQA gradients summed over each
    KV head's query group.
    """
    dtype = dtype or reference_precision(q.device)
    batch, sq, heads, d_qk = q.shape
    skv, kv_heads, d_v = k.shape[1], k.shape[2], v.shape[3]
    group = heads // kv_heads
    scale = d_qk**-0.5
    empty = has_empty_rows(sq, skv, causal)
    # (batch, kv_heads, group, seq, dim): a KV head and its query group side by side, broadcast in matmul
    qg = q.detach().to(dtype).reshape(batch, sq, kv_heads, group, d_qk).permute(0, 2, 3, 1, 4)
    kg = k.detach().to(dtype).permute(0, 2, 1, 3).unsqueeze(2)
    vg = v.detach().to(dtype).permute(0, 2, 1, 3).unsqueeze(2)
    dog = (
        None
        if grad_out is None
        else grad_out.detach().to(dtype).reshape(batch, sq, kv_heads, group, d_v).permute(0, 2, 3, 1, 4)
    )
    out = torch.empty(batch, kv_heads, group, sq, d_v, dtype=dtype, device=q.device)
    if dog is not None:
        dq, dk, dv = torch.empty_like(qg), torch.zeros_like(kg), torch.zeros_like(vg)
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_row = 4 * group * skv * itemsize  # scores, probs and two gradient temporaries per query row and head
    heads_per_chunk = max(1, min(kv_heads, chunk_bytes // max(1, per_row * sq)))
    rows_per_chunk = sq if heads_per_chunk > 1 else max(1, min(sq, chunk_bytes // per_row))
    for b in range(batch):
        for h0 in range(0, kv_heads, heads_per_chunk):
            hs = slice(h0, h0 + heads_per_chunk)
            kh, vh = kg[b, hs], vg[b, hs]  # (h, 1, skv, d)
            for r0 in range(0, sq, rows_per_chunk):
                rows = slice(r0, min(sq, r0 + rows_per_chunk))
                qh = qg[b, hs, :, rows]  # (h, group, r, d_qk)
                mask = visible_mask(sq, skv, q.device, r0, qh.shape[-2], kind, window) if causal else None
                probs = attention_probs(torch.matmul(qh, kh.transpose(-1, -2)) * scale, mask, empty)
                oh = torch.matmul(probs, vh)
                out[b, hs, :, rows] = oh
                if dog is None:
                    continue
                doh = dog[b, hs, :, rows]
                ds = probs * (torch.matmul(doh, vh.transpose(-1, -2)) - (doh * oh).sum(-1, keepdim=True))
                dq[b, hs, :, rows] = torch.matmul(ds, kh) * scale
                dk[b, hs] += torch.matmul(ds.transpose(-1, -2), qh).sum(1, keepdim=True) * scale
                dv[b, hs] += torch.matmul(probs.transpose(-1, -2), doh).sum(1, keepdim=True)

    def q_layout(t: torch.Tensor) -> torch.Tensor:  # back to (batch, seq, heads, dim)
        return t.permute(0, 3, 1, 2, 4).reshape(batch, sq, heads, t.shape[-1])

    def kv_layout(t: torch.Tensor) -> torch.Tensor:
        return t.squeeze(2).permute(0, 2, 1, 3)

    if dog is None:
        return q_layout(out)
    return q_layout(out), q_layout(dq), kv_layout(dk), kv_layout(dv)


def max_errors(got: torch.Tensor, ref: torch.Tensor, floor: float = 0.0) -> tuple[float, float]:
    """(max |got − ref|, that divided by max(max |ref|, ``floor``)). The relative figure is norm-wise, not per
    element: per-element ratios blow up on outputs near zero and say nothing about the kernel. ``floor`` is the
    least scale an error is judged against (``grad_errors``). NaN/inf in ``got`` gives inf (a CSV cell that cannot
    be mistaken for a small error)."""
    diff = torch.linalg.vector_norm(got.detach().to(ref.dtype) - ref, ord=math.inf).item()
    if not math.isfinite(diff):
        return math.inf, math.inf
    scale = max(torch.linalg.vector_norm(ref, ord=math.inf).item(), floor)
    return diff, diff / scale if scale > 0 else diff


GRAD_FLOOR = 0.05  # a gradient is judged against at least this share of the largest gradient of the same call


def grad_errors(grads: Sequence[torch.Tensor], refs: Sequence[torch.Tensor]) -> list[tuple[float, float]]:
    """``max_errors`` of each input's gradient. A gradient that is zero in exact arithmetic (dQ at one key:
    the softmax of one score is 1 whatever the query) is rounding noise in any kernel; judged against its own
    scale it reads as a huge relative error. Each one is judged against at least GRAD_FLOOR × the largest
    reference gradient of the call, so such noise reads as the small error it is."""
    largest = max((torch.linalg.vector_norm(r, ord=math.inf).item() for r in refs), default=0.0)
    return [max_errors(g, r, GRAD_FLOOR * largest) for g, r in zip(grads, refs)]
