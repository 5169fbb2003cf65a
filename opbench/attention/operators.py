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


# --- Mamba-2: the chunked state-space scan (SSD) ---------------------------------------------------------------
#
# Mamba-2 (Dao & Gu, "Transformers are SSMs", ICML 2024) keeps one (d_head × d_state) state per head:
# S_t = exp(Δ_t·A)·S_{t−1} + Δ_t·x_t·B_tᵀ, y_t = S_t·C_t + D·x_t, with Δ_t > 0 the (softplus'd) step, A < 0 a
# scalar per head, B and C (d_state) shared by the heads of a group (``n_groups``). Inputs are (batch, seq, heads,
# d_head) for x, (batch, seq, heads) for Δ, (heads,) for A and D, (batch, seq, groups, d_state) for B and C.


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The depthwise causal convolution Mamba-2 and gated DeltaNet run before their scans, then SiLU: x (batch, seq,
    channels), weight (channels, kernel). A memory-bound part of the layer, not of the scan operator: its
    2·(seq + kernel − 1)·channels·kernel FLOPs (torch's conv1d with kernel − 1 padding, cut to seq) are a
    rounding error beside the scan's (docs/models.md, "Attention kinds")."""
    channels, kernel = weight.shape
    out = F.conv1d(x.transpose(1, 2), weight[:, None], bias, padding=kernel - 1, groups=channels)
    return F.silu(out[..., : x.shape[1]]).transpose(1, 2)


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """B or C (…, groups, d_state) repeated to every head of its group (head h reads group h // (heads/groups))."""
    return t.repeat_interleave(heads // t.shape[-2], dim=-2)


def chunked_ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    d: torch.Tensor | None = None,
    chunk: int = 128,
) -> torch.Tensor:
    """Mamba-2's scan over chunks of ``chunk`` tokens, in fp32, as mamba_ssm's ``ssd_combined`` kernels split it
    (flops.mamba2_flops counts exactly these matmuls, and the state passing). With γ the cumulative log-decay Δ·A
    from the chunk's start and L[i, j] = exp(γ_i − γ_j) for i ≥ j (0 above the diagonal):
    1. intra-chunk scores C·Bᵀ, once per group (C × C), 2. Y_diag = (L ∘ C·Bᵀ)·(Δ·X) per head,
    3. the chunk's own state Σ_j exp(γ_C − γ_j)·Δ_j·x_j·B_jᵀ, 4. state passing S ← exp(γ_C)·S + that state,
    5. Y_off = exp(γ)·(C·S_in) from the state entering the chunk; y = Y_diag + Y_off + D·x.
    Differentiable through autograd."""
    dtype = x.dtype
    bs, s, h, p = x.shape
    g, n = b.shape[2], b.shape[3]
    nc = math.ceil(s / chunk)
    pad = nc * chunk - s

    def blocks(t: torch.Tensor) -> torch.Tensor:  # (bs, s, …) -> (bs, nc, chunk, …), fp32, zero-padded
        t = t.float()
        if pad:
            t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
        return t.reshape(bs, nc, chunk, *t.shape[2:])

    xd = blocks(x * dt[..., None].to(x.dtype))  # Δ·x: (bs, nc, l, h, p)
    gamma = blocks(dt.float() * a.float()).permute(0, 3, 1, 2).cumsum(-1)  # (bs, h, nc, l)
    bc, cc = blocks(b), blocks(c)  # (bs, nc, l, g, n)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()
    decay = torch.exp((gamma[..., :, None] - gamma[..., None, :]).masked_fill(~lower, float("-inf")))
    scores = torch.einsum("bclgn,bcsgn->bcgls", cc, bc)  # 1. per group
    scores = scores.repeat_interleave(h // g, dim=2) * decay.transpose(1, 2)  # (bs, nc, h, l, s), masked
    y = torch.einsum("bchls,bcshp->bclhp", scores, xd)  # 2.
    to_end = torch.exp(gamma[..., -1:] - gamma).permute(0, 2, 3, 1)[..., None]  # (bs, nc, l, h, 1)
    own = torch.einsum("bclhn,bclhp->bchpn", _heads(bc, h) * to_end, xd)  # 3. (bs, nc, h, p, n)
    chunk_decay = gamma[..., -1].exp()  # (bs, h, nc)
    state = x.new_zeros(bs, h, p, n, dtype=torch.float32)
    entering = []
    for k in range(nc):  # 4. elementwise, sequential over the chunks
        entering.append(state)
        state = state * chunk_decay[:, :, k, None, None] + own[:, k]
    states = torch.stack(entering, 1)  # (bs, nc, h, p, n)
    y_off = torch.einsum("bclhn,bchpn->bclhp", _heads(cc, h), states)  # 5.
    y = y + y_off * gamma.exp().permute(0, 2, 3, 1)[..., None]
    y = y.reshape(bs, nc * chunk, h, p)[:, :s]
    if d is not None:
        y = y + d.float()[:, None] * x.float()
    return y.to(dtype)


def ssd_reference(
    x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor | None = None
) -> torch.Tensor:
    """Mamba-2 as the whole semiseparable matrix (the SSD paper's "attention" form, §3–4): y = (L ∘ C·Bᵀ)·(Δ·x)
    + D·x with L[i, j] = exp(Σ_{j<t≤i} Δ_t·A) over the whole sequence, in the inputs' dtype: the oracle (no chunks,
    no state; O(seq²) memory per head)."""
    h = x.shape[2]
    gamma = (dt * a).cumsum(1).transpose(1, 2)  # (bs, h, s)
    s = x.shape[1]
    lower = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
    decay = torch.exp((gamma[..., :, None] - gamma[..., None, :]).masked_fill(~lower, float("-inf")))
    scores = torch.einsum("bihn,bjhn->bhij", _heads(c, h), _heads(b, h)) * decay
    y = torch.einsum("bhij,bjhp->bihp", scores, x * dt[..., None])
    return y + d[:, None] * x if d is not None else y


def recurrent_ssd(
    x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor | None = None
) -> torch.Tensor:
    """Mamba-2 one token at a time, the recurrence itself (tests only: it keeps a state per token)."""
    h = x.shape[2]
    bh, ch = _heads(b, h), _heads(c, h)
    state = x.new_zeros(x.shape[0], h, x.shape[3], b.shape[3])
    outs = []
    for t in range(x.shape[1]):
        state = state * (dt[:, t] * a).exp()[..., None, None]
        state = state + torch.einsum("bhp,bhn->bhpn", x[:, t] * dt[:, t, :, None], bh[:, t])
        outs.append(torch.einsum("bhpn,bhn->bhp", state, ch[:, t]))
    y = torch.stack(outs, 1)
    return y + d[:, None] * x if d is not None else y
