"""Attention FLOPs, FlashAttention / tritonbench convention (docs/conventions.md, "Attention FLOPs"). The formula lives here only."""

from __future__ import annotations

from .shapes import AttentionShape

# Backward recomputes q·kᵀ and does four more matmuls of the same size: 2.5 × forward by convention.
PASS_MULTIPLIER = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}


def visible_kv(seqlen_q: int, seqlen_kv: int, causal: bool) -> float:
    """Average keys one query row attends to. Causal is aligned bottom-right (flash-attn): the convention's
    (max(0, seqlen_kv − seqlen_q) + seqlen_kv) / 2, i.e. the mean of the first and last row's visible keys, for
    seqlen_q ≤ seqlen_kv. With more queries than keys the first seqlen_q − seqlen_kv rows see none and the rest
    form a triangle: seqlen_kv² / 2 keys over seqlen_q rows (equal to the above at seqlen_q = seqlen_kv)."""
    if not causal:
        return float(seqlen_kv)
    if seqlen_q > seqlen_kv:
        return seqlen_kv * seqlen_kv / (2 * seqlen_q)
    return (seqlen_kv - seqlen_q + seqlen_kv) / 2


def attention_flops(shape: AttentionShape, batch_size: int, pass_: str = "fwd") -> float:
    """2 · batch · heads_q · seqlen_q · visible_kv · (head_dim_qk + head_dim_v) for the forward (q·kᵀ plus P·v);
    bwd = 2.5×, fwdbwd = 3.5×. KV heads (GQA) change bytes, not FLOPs."""
    fwd = (
        2
        * batch_size
        * shape.num_head_q
        * shape.seqlen_q
        * visible_kv(shape.seqlen_q, shape.seqlen_kv, shape.causal)
        * (shape.head_dim_qk + shape.head_dim_v)
    )
    return fwd * PASS_MULTIPLIER[pass_]
