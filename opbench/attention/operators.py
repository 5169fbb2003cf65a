"""Attention operators that are not softmax attention: gated DeltaNet (Qwen3-Next's linear attention) and
DeepSeek-V3.2's lightning indexer, each with an independent reference (docs/models.md, "Attention kinds").

Inputs are (batch, seq, heads, dim) like flash-attn's. Gated DeltaNet (Yang, Kautz, Hatamizadeh, ICLR 2025)
keeps one (d_k × d_v) state per value head: S_t = α_t·S_{t−1}·(I − β_t·k_t·k_tᵀ) + β_t·k_t·v_tᵀ (written with
S as keys × values), o_t = S_tᵀ·q_t, with α_t = exp(g_t), q and k L2-normalised and q scaled by d_k^−½, query/key
heads shared by groups of value heads. ``chunked_gated_delta_rule`` computes it chunk by chunk as the chunkwise
kernels do (flops.gated_deltanet_flops counts exactly these matmuls); ``recurrent_gated_delta_rule`` steps
through time, the definition itself, and is the oracle.

The indexer scores every visible key for each query: I[i, j] = Σ_h w[i, h] · ReLU(q[i, h] · k[j]) · d^−½ (one
shared key head), then keeps the top-k keys per query for the sparse attention that follows.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-normalised q (scaled by d_k^−½) and k, their heads repeated to the value heads (grouped values)."""
    rep = v.shape[2] // k.shape[2]
    q = F.normalize(q, dim=-1, eps=1e-6) * q.shape[-1] ** -0.5
    k = F.normalize(k, dim=-1, eps=1e-6)
    if rep > 1:
        q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    return q, k


def chunked_gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, chunk: int = 64
) -> torch.Tensor:
    """Gated delta rule over chunks of ``chunk`` tokens, computed in fp32 (as the chunk kernels accumulate).

    Within a chunk, with γ the cumulative log-decay from the chunk's start and Γ[i, j] = exp(γ_i − γ_j) for
    i ≥ j (0 above the diagonal): A = strict-lower(diag(β)·K·Kᵀ ∘ Γ); the WY form gives U = (I + A)⁻¹·diag(β)·V
    (the chunk's corrected values) and W = (I + A)⁻¹·diag(β·e^γ)·K (how they read the incoming state). Across
    chunks, with S the state entering the chunk: V_new = U − W·S; O = (Q ∘ e^γ)·S + lower(Q·Kᵀ ∘ Γ)·V_new;
    S ← e^{γ_C}·S + (K ∘ e^{γ_C − γ})ᵀ·V_new. Differentiable through autograd."""
    dtype = v.dtype
    q, k = _prepare(q, k, v)
    b, s, h, dk = k.shape
    dv = v.shape[-1]
    n = math.ceil(s / chunk)
    pad = n * chunk - s

    def blocks(t: torch.Tensor) -> torch.Tensor:  # (b, s, h, …) -> (b, h, n, chunk, …) in fp32, zero-padded
        t = t.float().transpose(1, 2)
        if pad:
            t = F.pad(t, (0, 0, 0, pad) if t.dim() == 4 else (0, pad))
        return t.reshape(b, h, n, chunk, *t.shape[3:])

    qc, kc, vc, gc, bc = blocks(q), blocks(k), blocks(v), blocks(g), blocks(beta)
    gamma = gc.cumsum(-1)  # (b, h, n, chunk)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = torch.exp((gamma[..., :, None] - gamma[..., None, :]).masked_fill(~lower, float("-inf")))
    kb = kc * bc[..., None]
    a = (kb @ kc.transpose(-1, -2)) * decay  # the solve below reads its strict lower part only
    u = torch.linalg.solve_triangular(a, vc * bc[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(a, kb * gamma.exp()[..., None], upper=False, unitriangular=True)
    intra = (qc @ kc.transpose(-1, -2)) * decay
    q_decayed = qc * gamma.exp()[..., None]
    k_to_end = kc * (gamma[..., -1:] - gamma).exp()[..., None]
    state = q.new_zeros(b, h, dk, dv, dtype=torch.float32)
    outs = []
    for c in range(n):
        v_new = u[:, :, c] - w[:, :, c] @ state
        outs.append(q_decayed[:, :, c] @ state + intra[:, :, c] @ v_new)
        state = state * gamma[:, :, c, -1].exp()[..., None, None] + k_to_end[:, :, c].transpose(-1, -2) @ v_new
    out = torch.stack(outs, 2).reshape(b, h, n * chunk, dv)[:, :, :s]
    return out.transpose(1, 2).to(dtype)


def recurrent_gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """The gated delta rule one token at a time, in the inputs' dtype: the oracle (slow, plainly correct)."""
    q, k = _prepare(q, k, v)
    b, s, h, dk = k.shape
    state = q.new_zeros(b, h, dk, v.shape[-1])
    outs = []
    for t in range(s):
        state = state * g[:, t].exp()[..., None, None]
        predicted = torch.einsum("bhk,bhkv->bhv", k[:, t], state)
        state = state + torch.einsum("bhk,bhv->bhkv", k[:, t], beta[:, t, :, None] * (v[:, t] - predicted))
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outs, 1)


def indexer_scores(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, top_k: int = 0, heads_per_step: int = 8
) -> torch.Tensor:
    """(batch, seqlen_q, seqlen_kv) causal index scores (0 where a key is not visible), summed over the index
    heads ``heads_per_step`` at a time so the per-head scores never all sit in memory; with ``top_k`` the
    per-query top-k keys are selected too, as the layer does before its sparse attention."""
    b, sq, heads, d = q.shape
    skv = k.shape[1]
    key = k[:, :, 0].float()
    scores = q.new_zeros(b, sq, skv, dtype=torch.float32)
    for h0 in range(0, heads, heads_per_step):
        hs = slice(h0, h0 + heads_per_step)
        logits = torch.einsum("bihd,bjd->bhij", q[:, :, hs].float(), key).relu()
        scores = scores + torch.einsum("bhij,bih->bij", logits, w[:, :, hs].float())
    visible = torch.arange(skv, device=q.device)[None, :] <= torch.arange(sq, device=q.device)[:, None] + (skv - sq)
    scores = scores.masked_fill(~visible, 0.0) * d**-0.5
    if top_k:
        scores.masked_fill(~visible, float("-inf")).topk(min(top_k, skv), dim=-1)
    return scores.to(q.dtype)


def indexer_reference(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The indexer's scores in one einsum over all heads, in the inputs' dtype: the oracle."""
    sq, skv, d = q.shape[1], k.shape[1], q.shape[-1]
    logits = torch.einsum("bihd,bjd->bhij", q, k[:, :, 0]).relu()
    scores = torch.einsum("bhij,bih->bij", logits, w)
    visible = torch.arange(skv, device=q.device)[None, :] <= torch.arange(sq, device=q.device)[:, None] + (skv - sq)
    return scores.masked_fill(~visible, 0.0) * d**-0.5
