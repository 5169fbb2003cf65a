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


def _index_visible(sq: int, skv: int, device: torch.device, compress: int, seqlen_kv: int | None) -> torch.Tensor:
    """(sq, skv) bool: causal over the keys; DeepSeek-V4's keys pooled ``compress``:1 from ``seqlen_kv`` tokens
    are visible once their window has closed (``pooled_visible``)."""
    if compress > 1:
        return pooled_visible(sq, skv, compress, device, (seqlen_kv or skv * compress) - sq)
    return torch.arange(skv, device=device)[None, :] <= torch.arange(sq, device=device)[:, None] + (skv - sq)


def indexer_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    top_k: int = 0,
    heads_per_step: int = 8,
    compress: int = 1,
    seqlen_kv: int | None = None,
) -> torch.Tensor:
    """(batch, seqlen_q, seqlen_kv) causal index scores (0 where a key is not visible), summed over the index
    heads ``heads_per_step`` at a time so the per-head scores never all sit in memory; with ``top_k`` the
    per-query top-k keys are selected too, as the layer does before its sparse attention. DeepSeek-V4's indexer
    scores keys pooled ``compress``:1 from ``seqlen_kv`` tokens (``k`` has one row per closed window)."""
    b, sq, heads, d = q.shape
    skv = k.shape[1]
    key = k[:, :, 0].float()
    scores = q.new_zeros(b, sq, skv, dtype=torch.float32)
    for h0 in range(0, heads, heads_per_step):
        hs = slice(h0, h0 + heads_per_step)
        logits = torch.einsum("bihd,bjd->bhij", q[:, :, hs].float(), key).relu()
        scores = scores + torch.einsum("bhij,bih->bij", logits, w[:, :, hs].float())
    visible = _index_visible(sq, skv, q.device, compress, seqlen_kv)
    scores = scores.masked_fill(~visible, 0.0) * d**-0.5
    if top_k:
        scores.masked_fill(~visible, float("-inf")).topk(min(top_k, skv), dim=-1)
    return scores.to(q.dtype)


def indexer_reference(
    q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, compress: int = 1, seqlen_kv: int | None = None
) -> torch.Tensor:
    """The indexer's scores in one einsum over all heads, in the inputs' dtype: the oracle."""
    sq, skv, d = q.shape[1], k.shape[1], q.shape[-1]
    logits = torch.einsum("bihd,bjd->bhij", q, k[:, :, 0]).relu()
    scores = torch.einsum("bhij,bih->bij", logits, w)
    visible = _index_visible(sq, skv, q.device, compress, seqlen_kv)
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


# --- Kimi Delta Attention (KDA): the gated delta rule with a per-channel decay --------------------------------
#
# KDA (Kimi Team, "Kimi Linear", arXiv:2510.26692, 2025) keeps one (d_k × d_v) state per head, like the gated
# DeltaNet, but its forget gate decays each key channel on its own: S_t = diag(exp(g_t))·S_{t−1}, then the delta
# update S_t ← S_t + β_t·k_t·(v_t − S_tᵀ·k_t)ᵀ, o_t = S_tᵀ·q_t; g (batch, seq, heads, d_k) is a log-decay ≤ 0, β
# (batch, seq, heads) in (0, 1); q and k are L2-normalised as flash-linear-attention's kernels do it
# (x / sqrt(Σx² + 1e-6)) and q scaled by d_k^−½. Every head has its own q and k.


def _kda_l2norm(x: torch.Tensor) -> torch.Tensor:
    """flash-linear-attention's L2 norm (x / sqrt(Σx² + ε), not F.normalize's max(‖x‖, ε)), in the input's dtype."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


KDA_SUBCHUNK = 16  # flash-linear-attention's chunk_kda builds a chunk's C×C matrices from blocks of 16 tokens


def _kda_intra(
    lhs: tuple[torch.Tensor, ...], b: torch.Tensor, gamma: torch.Tensor, sub: int
) -> tuple[torch.Tensor, ...]:
    """For each ``a`` in ``lhs``, the chunk's C×C matrix Σ_c a_i[c]·b_j[c]·e^{γ_i[c] − γ_j[c]} for j ≤ i, 0 above,
    built as fla builds it so that no exponent is positive: a block of rows I against the earlier tokens is one
    matmul with the decay taken from the block's first position r, (a ∘ e^{γ − γ_r})·(b ∘ e^{γ_r − γ})ᵀ, both
    factors ≤ 1; the diagonal blocks (``sub`` × ``sub``) take e^{γ_i − γ_j} channel by channel, once for every
    ``a``. a, b, γ: (…, C, d)."""
    c = b.shape[-2]
    lower = torch.ones(sub, sub, dtype=torch.bool, device=b.device).tril()
    rows: list[list[torch.Tensor]] = [[] for _ in lhs]
    for i in range(0, c, sub):
        ref, here = gamma[..., i : i + 1, :], slice(i, i + sub)
        diff = gamma[..., here, None, :] - gamma[..., None, here, :]
        decay = diff.masked_fill(~lower[..., None], float("-inf")).exp() * b[..., None, here, :]
        before = b[..., :i, :] * (ref - gamma[..., :i, :]).exp()
        for out, a in zip(rows, lhs):
            parts = [(a[..., here, None, :] * decay).sum(-1)]
            if i:
                parts.insert(0, (a[..., here, :] * (gamma[..., here, :] - ref).exp()) @ before.transpose(-1, -2))
            if i + sub < c:
                parts.append(a.new_zeros(*a.shape[:-2], sub, c - i - sub))
            out.append(torch.cat(parts, -1))
    return tuple(torch.cat(r, -2) for r in rows)


def chunked_kda(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, chunk: int = 64
) -> torch.Tensor:
    """KDA over chunks of ``chunk`` tokens in fp32, as flash-linear-attention's ``chunk_kda`` splits it
    (flops.kda_flops counts these matmuls). With γ the per-channel cumulative log-decay from the chunk's start:
    A = strict-lower(K_β·Kᵀ ∘ Γ) and P = lower(Q·Kᵀ ∘ Γ), Γ the decay between two positions channel by channel
    (``_kda_intra``); U = (I + A)⁻¹·V_β, W = (I + A)⁻¹·(K_β ∘ e^γ); across chunks, with S the state entering:
    V_new = U − W·S, O = (Q ∘ e^γ)·S + P·V_new, S ← diag(e^{γ_C})·S + (K ∘ e^{γ_C − γ})ᵀ·V_new. No exponent is
    positive, so a steep decay underflows to 0 instead of overflowing. Differentiable through autograd."""
    dtype = v.dtype
    q = _kda_l2norm(q.float()) * q.shape[-1] ** -0.5
    k = _kda_l2norm(k.float())
    b, s, h, dk = k.shape
    dv = v.shape[-1]
    n = math.ceil(s / chunk)
    pad = n * chunk - s
    sub = KDA_SUBCHUNK if chunk % KDA_SUBCHUNK == 0 else chunk

    def blocks(t: torch.Tensor) -> torch.Tensor:  # (b, s, h, …) -> (b, h, n, chunk, …) in fp32, zero-padded
        t = t.float().transpose(1, 2)
        if pad:
            t = F.pad(t, (0, 0, 0, pad) if t.dim() == 4 else (0, pad))
        return t.reshape(b, h, n, chunk, *t.shape[3:])

    qc, kc, vc, gc, bc = blocks(q), blocks(k), blocks(v), blocks(g), blocks(beta)
    gamma = gc.cumsum(-2)  # (b, h, n, chunk, dk)
    kb = kc * bc[..., None]
    a, intra = _kda_intra((kb, qc), kc, gamma, sub)  # the solves read a's strict lower part only
    u = torch.linalg.solve_triangular(a, vc * bc[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(a, kb * gamma.exp(), upper=False, unitriangular=True)
    q_decayed = qc * gamma.exp()
    k_to_end = kc * (gamma[..., -1:, :] - gamma).exp()
    state = q.new_zeros(b, h, dk, dv, dtype=torch.float32)
    outs = []
    for c in range(n):
        v_new = u[:, :, c] - w[:, :, c] @ state
        outs.append(q_decayed[:, :, c] @ state + intra[:, :, c] @ v_new)
        state = state * gamma[:, :, c, -1].exp()[..., None] + k_to_end[:, :, c].transpose(-1, -2) @ v_new
    out = torch.stack(outs, 2).reshape(b, h, n * chunk, dv)[:, :, :s]
    return out.transpose(1, 2).to(dtype)


def recurrent_kda(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """KDA one token at a time, in the inputs' dtype: the oracle (slow, plainly correct)."""
    q = _kda_l2norm(q) * q.shape[-1] ** -0.5
    k = _kda_l2norm(k)
    b, s, h, dk = k.shape
    state = q.new_zeros(b, h, dk, v.shape[-1])
    outs = []
    for t in range(s):
        state = state * g[:, t].exp()[..., None]
        predicted = torch.einsum("bhk,bhkv->bhv", k[:, t], state)
        state = state + torch.einsum("bhk,bhv->bhkv", k[:, t], beta[:, t, :, None] * (v[:, t] - predicted))
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outs, 1)


# --- DeepSeek-V4: compressed attention (csa, hca) and hyper-connections (hc) -----------------------------------
#
# DeepSeek-V4 (transformers' modeling_deepseek_v4.py; docs/models.md, "DeepSeek-V4"). Every attention layer is
# multi-query with one shared KV head of d dims, read as both key and value, and a learned sink logit per head.
# A csa (rate m = 4) or hca (m = 128) layer adds pooled keys: a compressor projects each token to kv and gate
# (``compress_kv`` GEMM row), and each closed window of m tokens becomes one key, the softmax-gated sum of its
# tokens; csa pools two overlapping series (window w's second with w − 1's first: 2m slots, stride m) and keeps
# only the indexer's top-k pooled keys per query; hca keeps every pooled key the query has passed. Queries see
# the last ``window`` raw keys and pooled key w once (position + 1) // m > w.


def compress_kv(kv: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, rate: int, overlap: bool) -> torch.Tensor:
    """The compressor's pooling: kv and gate (batch, seq, c·d), c = 2 with ``overlap`` (csa's two series) else 1,
    ``bias`` (rate, c·d) added to the gate. Returns (batch, seq // rate, d), one pooled entry per closed window
    (a trailing partial window is left out, as transformers does without a cache); the gate's softmax over a
    window's slots in fp32. Before the layer's RMS norm and RoPE of the pooled keys (elementwise, per entry)."""
    b, s, cd = kv.shape
    n = s // rate
    d = cd // 2 if overlap else cd
    kv = kv[:, : n * rate].reshape(b, n, rate, cd)
    gate = gate[:, : n * rate].reshape(b, n, rate, cd) + bias.to(gate.dtype)
    if overlap:  # entry w: window w − 1's first series (none for w = 0: weight 0), then window w's second
        prev_kv = F.pad(kv[:, :-1, :, :d], (0, 0, 0, 0, 1, 0))
        prev_gate = F.pad(gate[:, :-1, :, :d], (0, 0, 0, 0, 1, 0), value=float("-inf"))
        kv = torch.cat([prev_kv, kv[..., d:]], dim=2)
        gate = torch.cat([prev_gate, gate[..., d:]], dim=2)
    return (kv * gate.softmax(dim=2, dtype=torch.float32).to(kv.dtype)).sum(dim=2)


def pooled_visible(
    seqlen: int, pooled: int, rate: int, device: torch.device | str | None = None, offset: int = 0
) -> torch.Tensor:
    """(seqlen, pooled) bool: the query at position t = row + ``offset`` sees pooled key w iff w < (t + 1) // rate
    (its window has closed)."""
    t = torch.arange(seqlen, device=device)[:, None] + offset
    return torch.arange(pooled, device=device)[None, :] < torch.div(t + 1, rate, rounding_mode="floor")


def stand_in_topk(
    seqlen: int, pooled: int, rate: int, topk: int, device: torch.device | str | None = None, offset: int = 0
) -> torch.Tensor:
    """(seqlen, topk) long: csa's pooled keys per query picked by a fixed pseudo-random score among the visible ones
    (−1 where fewer are visible), the stand-in for the indexer's choice (timed as its own operator): which keys
    are picked does not change the work."""
    from .reference import _pseudo_scores

    visible = pooled_visible(seqlen, pooled, rate, device, offset)
    t = torch.arange(seqlen, device=device)[:, None] + offset
    w = torch.arange(pooled, device=device)[None, :]
    scores = torch.where(visible, _pseudo_scores(t, w), -1)
    top = scores.topk(min(topk, pooled), dim=1)
    return torch.where(top.values >= 0, top.indices, -1)


def compressed_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    pooled: torch.Tensor,
    sinks: torch.Tensor,
    window: int,
    rate: int,
    topk_idx: torch.Tensor | None = None,
    heads_per_step: int = 8,
) -> torch.Tensor:
    """csa / hca attention: q (batch, seq_q, heads, d), the raw shared key/value kv (batch, seq_kv, 1, d), the
    pooled keys (batch, n, d), one sink logit per head; query row i sits at position i + seq_kv − seq_q. Each
    query's softmax (with its sink) runs over its last ``window`` raw keys and its visible pooled keys, for csa
    only those in ``topk_idx`` (batch, seq_q, k; −1 = none). Scale d^−½, fp32 softmax, ``heads_per_step`` heads
    at a time; out (batch, seq_q, heads, d)."""
    b, s, heads, d = q.shape
    skv, n = kv.shape[1], pooled.shape[1]
    t = torch.arange(s, device=q.device)[:, None] + (skv - s)
    j = torch.arange(skv, device=q.device)[None, :]
    raw = (j <= t) & (j > t - window)  # (s, skv)
    seen = pooled_visible(s, n, rate, q.device, skv - s).expand(b, s, n)
    if topk_idx is not None:
        picked = torch.zeros(b, s, n + 1, dtype=torch.bool, device=q.device)
        picked.scatter_(-1, torch.where(topk_idx < 0, n, topk_idx), True)
        seen = seen & picked[..., :n]
    mask = torch.cat([raw.expand(b, s, skv), seen], dim=-1)[:, None]  # (b, 1, s, skv + n)
    keys = torch.cat([kv[:, :, 0], pooled.to(kv.dtype)], dim=1)  # (b, skv + n, d)
    outs = []
    for h0 in range(0, heads, heads_per_step):
        qh = q[:, :, h0 : h0 + heads_per_step]
        logits = torch.einsum("bihd,bjd->bhij", qh, keys).float() * d**-0.5
        logits = logits.masked_fill(~mask, float("-inf"))
        sink = sinks[h0 : h0 + heads_per_step].float().view(1, -1, 1, 1).expand(b, -1, s, 1)
        probs = torch.cat([logits, sink], dim=-1).softmax(dim=-1)[..., :-1]
        outs.append(torch.einsum("bhij,bjd->bihd", probs.to(q.dtype), keys))
    return torch.cat(outs, dim=2)


def compressed_attention_op(
    q: torch.Tensor,
    kv: torch.Tensor,
    ckv: torch.Tensor,
    cgate: torch.Tensor,
    bias: torch.Tensor,
    sinks: torch.Tensor,
    window: int,
    rate: int,
    topk: int = 0,
) -> torch.Tensor:
    """The csa (``topk`` > 0: the compressor's two overlapping series and the stand-in top-k) or hca operator as
    timed: the compressor's pooling of (ckv, cgate), then the attention over raw and pooled keys."""
    pooled = compress_kv(ckv, cgate, bias, rate, overlap=topk > 0)
    idx = None
    if topk:
        sq, offset = q.shape[1], kv.shape[1] - q.shape[1]
        idx = stand_in_topk(sq, pooled.shape[1], rate, topk, q.device, offset).expand(q.shape[0], -1, -1)
    return compressed_attention(q, kv, pooled, sinks, window, rate, idx)


def hyper_connection(
    streams: torch.Tensor,
    mixes: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    block_out: torch.Tensor,
    iters: int,
    eps: float = 1e-6,
) -> torch.Tensor:
    """One manifold-constrained hyper-connection site (Xie et al. 2026; transformers' DeepseekV4HyperConnection
    and its decoder layer's mixing): n streams (batch, seq, n, h), the mixing logits ``mixes`` (batch, seq,
    (2+n)·n) that the ``hc_attn``/``hc_ffn`` GEMM computed from the RMS-normed flattened streams, ``base`` and the
    three ``scale`` factors. pre = σ(·) + ε collapses the streams into the block's input; post = 2σ(·) expands
    the block's output ``block_out`` (batch, seq, h); comb = softmax(·) + ε, made doubly stochastic by ``iters``
    Sinkhorn steps (columns, then rows and columns), mixes the streams: new = post·y + combᵀ·X. Returns the
    collapsed input and the n new streams stacked, (batch, seq, n + 1, h). Weights in fp32, as transformers."""
    n = streams.shape[2]
    m = mixes.float()
    pre_w, post_w, comb_w = m.split([n, n, n * n], dim=-1)
    pre_b, post_b, comb_b = base.float().split([n, n, n * n])
    s = scale.float()
    pre = torch.sigmoid(pre_w * s[0] + pre_b) + eps
    post = 2 * torch.sigmoid(post_w * s[1] + post_b)
    comb = torch.softmax(comb_w.unflatten(-1, (n, n)) * s[2] + comb_b.view(n, n), dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    dtype = streams.dtype
    collapsed = (pre.unsqueeze(-1) * streams).sum(dim=2).to(dtype)
    new = post.to(dtype).unsqueeze(-1) * block_out.unsqueeze(-2) + torch.matmul(
        comb.to(dtype).transpose(-1, -2), streams
    )
    return torch.cat([collapsed.unsqueeze(2), new], dim=2)
