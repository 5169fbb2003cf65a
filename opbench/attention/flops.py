"""Attention FLOPs by kind (docs/conventions.md, "Attention FLOPs"; docs/models.md, "Attention kinds"). The
formulas live here only.

Softmax kinds (full, sliding, chunked, sparse top-k, the DSA indexer) follow the FlashAttention / tritonbench
convention: 2 · batch · heads_q · Σ_rows visible keys · (head_dim_qk + head_dim_v), counting only the keys each
query row sees under its mask. Linear attention (gated DeltaNet) and Mamba-2's scan count the matmuls of their
chunkwise algorithms.
"""

from __future__ import annotations

import math

from opbench.models.layout import CHUNKED, CSA, HC, INDEXER, KDA, LINEAR, LINEAR_CHUNK, MAMBA2, SLIDING, SPARSE

from .shapes import AttentionShape

# Softmax attention's backward recomputes q·kᵀ and does four more matmuls of the same size: 2.5 × forward by
# convention. Linear attention and the indexer: the two input gradients of each forward matmul, 2 × forward.
PASS_MULTIPLIER = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}
MATMUL_PASS_MULTIPLIER = {"fwd": 1.0, "bwd": 2.0, "fwdbwd": 3.0}


def _sum_min(cap: int, lo: int, hi: int) -> int:
    """Σ_{x=lo}^{hi} min(cap, x) for integers 0 ≤ lo, hi (0 when hi < lo)."""
    if hi < lo:
        return 0
    below_hi = min(hi, cap)
    total = (lo + below_hi) * (below_hi - lo + 1) // 2 if below_hi >= lo else 0
    start = max(lo, cap + 1)
    return total + (hi - start + 1) * cap if hi >= start else total


def _sum_chunk_positions(chunk: int, n: int) -> int:
    """Σ_{p=0}^{n-1} ((p mod chunk) + 1): keys a causal query at position p sees inside its chunk."""
    full, rest = divmod(n, chunk)
    return full * chunk * (chunk + 1) // 2 + rest * (rest + 1) // 2


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


def visible_keys(shape: AttentionShape) -> float:
    """Keys one query row of ``shape`` attends to, averaged over the rows. Full attention: ``visible_kv`` (the
    triangle's continuous count, as FlashAttention's and tritonbench's benchmarks count causal). Windowed kinds
    count each row's keys exactly, as FlashAttention's benchmark counts a window: row i sits at position
    p = i + seqlen_kv − seqlen_q and sees keys j ≤ p; a sliding window keeps the last ``window`` of them (the
    query's own included), a sparse top-k layer at most ``window`` of them, a chunked layer those in p's block
    of ``window`` positions."""
    sq, skv = shape.seqlen_q, shape.seqlen_kv
    if shape.compress and shape.causal:
        return compressed_keys(shape) / sq
    if not shape.causal or shape.attn_kind not in (SLIDING, SPARSE, CHUNKED):
        return visible_kv(sq, skv, shape.causal)
    first = max(1, skv - sq + 1)  # keys seen by the first row that sees any: p + 1 at p = max(0, skv − sq)
    if shape.attn_kind == CHUNKED:
        return (_sum_chunk_positions(shape.window, skv) - _sum_chunk_positions(shape.window, first - 1)) / sq
    return _sum_min(shape.window, first, skv) / sq


def _sum_pooled(m: int, cap: int, lo: int, hi: int) -> int:
    """Σ_{x=lo}^{hi} min(cap, ⌊x/m⌋) for 0 ≤ lo (0 when hi < lo; cap 0: no cap): the pooled keys a causal query at
    position x − 1 sees, one per closed window of m tokens (transformers' ``(position + 1) // compress_rate``)."""

    def upto(b: int) -> int:  # Σ_{x=0}^{b} ⌊x/m⌋
        q, r = divmod(b + 1, m)
        return m * q * (q - 1) // 2 + q * r if b >= 0 else 0

    if hi < lo:
        return 0
    if not cap:
        return upto(hi) - upto(lo - 1)
    edge = cap * m  # from x = cap·m on, the cap binds
    below = upto(min(hi, edge - 1)) - upto(lo - 1) if lo <= edge - 1 else 0
    return below + cap * max(0, hi - max(lo, edge) + 1)


def compressed_keys(shape: AttentionShape) -> int:
    """Keys all query rows of a DeepSeek-V4 shape see together: row i at position p = i + seqlen_kv − seqlen_q sees
    the last ``window`` raw keys (its own included) and the ⌊(p+1)/m⌋ pooled keys of the windows closed before it,
    at most ``topk`` of them for csa (the indexer's pick); the compressed indexer scores the pooled keys alone."""
    sq, skv, m = shape.seqlen_q, shape.seqlen_kv, shape.compress
    first = max(1, skv - sq + 1)  # p + 1 of the first row
    pooled = _sum_pooled(m, shape.topk if shape.attn_kind == CSA else 0, first, skv)
    return pooled if shape.attn_kind == INDEXER else pooled + _sum_min(shape.window, first, skv)


def hc_flops(shape: AttentionShape, batch_size: int) -> float:
    """Forward FLOPs of one hyper-connection site (Xie et al., "mHC: Manifold-Constrained Hyper-Connections",
    2026; DeepSeek-V4 §2.2), its n = ``num_head_q`` streams of h = ``head_dim_qk``: the residual mix comb·X, an
    n×n by n×h matmul per token, 2·n²·h. The collapse (pre), the expansion (post), the RMS scale and the Sinkhorn
    iterations on n×n are elementwise, counted in bytes only (``hc_bytes``); the n·h → (2+n)·n projection is the
    ``hc_attn``/``hc_ffn`` GEMM row."""
    n, h = shape.num_head_q, shape.head_dim_qk
    return float(batch_size * shape.seqlen_q * 2 * n * n * h)


def hc_bytes(shape: AttentionShape, batch_size: int, element_size: int) -> float:
    """Forward bytes of one hyper-connection site at minimum traffic, the figure a memory-bound op is timed
    against: the n streams read for the collapse and again for the mix, the block output read and the n new streams
    written (3·n·h + h elements per token), plus the fp32 (2+n)·n mixing logits read (and pre, post, comb written
    back, another (2+n)·n) per token; the Sinkhorn iterations stay in registers."""
    n, h = shape.num_head_q, shape.head_dim_qk
    per_token = (3 * n * h + h) * element_size + 2 * (2 + n) * n * 4
    return float(batch_size * shape.seqlen_q * per_token)


def compressed_attention_bytes(shape: AttentionShape, batch_size: int, element_size: int) -> float:
    """Forward bytes of DeepSeek-V4's csa/hca at minimum traffic: q read and the output written (heads × d each
    per query), the one shared KV head (key and value are one tensor) read once, raw and pooled; the compressor's
    pooling reads its kv and gate projections (2·d per token for hca, 4·d for csa's two overlapping series) and the
    top-k indices (int32) of csa are read once per query."""
    sq, skv, m, d = shape.seqlen_q, shape.seqlen_kv, max(1, shape.compress), shape.head_dim_qk
    series = 2 if shape.attn_kind == CSA else 1
    elems = sq * shape.num_head_q * (d + shape.head_dim_v) + (skv + skv // m) * d + skv * 2 * series * d
    return float(batch_size * (elems * element_size + (sq * shape.topk * 4 if shape.attn_kind == CSA else 0)))


def gated_deltanet_flops(shape: AttentionShape, batch_size: int, with_solve: bool = True) -> float:
    """Forward FLOPs of the chunkwise gated delta rule (Yang, Kautz, Hatamizadeh, "Gated Delta Networks", ICLR 2025,
    §3.3; the chunk form of Yang et al., "Parallelizing Linear Transformers with the Delta Rule over Sequence
    Length", NeurIPS 2024), as flash-linear-attention's and transformers' chunk kernels compute it.

    Per value head and chunk of C tokens (d_k key, d_v value dims; the sequence padded to whole chunks): the two
    C×C matrices K_β·Kᵀ and Q·Kᵀ (2·2·C²·d_k), the intra-chunk output P·V_new (2·C²·d_v), reading the state twice
    (K_cumdecay·S and Q·S) and updating it (Kᵀ·V_new): 3 · 2·C·d_k·d_v; and two unit-triangular solves with d_v
    and d_k right-hand sides, C²·(d_k + d_v) (``with_solve=False`` leaves them out: torch's FLOP counter does not
    count triangular solves)."""
    # a linear shape without a chunk size (window 0) is chunked as the kernels chunk: never a division by zero
    chunk = shape.window if shape.window > 0 else LINEAR_CHUNK
    dk, dv = shape.head_dim_qk, shape.head_dim_v
    chunks = math.ceil(shape.seqlen_q / chunk)
    per_chunk = 4 * chunk * chunk * dk + 2 * chunk * chunk * dv + 6 * chunk * dk * dv
    if with_solve:
        per_chunk += chunk * chunk * (dk + dv)
    return float(batch_size * shape.num_head_q * chunks * per_chunk)


def kda_flops(shape: AttentionShape, batch_size: int, with_solve: bool = True) -> float:
    """Forward FLOPs of Kimi Delta Attention (Kimi Team, "Kimi Linear: An Expressive, Efficient Attention
    Architecture", arXiv:2510.26692, 2025, §3; flash-linear-attention's ``chunk_kda``): the gated delta rule with a
    decay per channel instead of per head. The decay multiplies q and k elementwise inside a chunk (Q ∘ e^γ,
    K ∘ e^−γ), so the matmuls are the gated DeltaNet's chunk form, counted by ``gated_deltanet_flops`` (one formula):
    per head and chunk of C tokens 4·C²·d_k + 2·C²·d_v + 6·C·d_k·d_v, and the two triangular solves
    C²·(d_k + d_v). Every head has its own q and k (``num_head_q`` = ``num_head_kv``)."""
    return gated_deltanet_flops(shape, batch_size, with_solve)


def kda_bytes(shape: AttentionShape, batch_size: int, element_size: int) -> float:
    """Forward bytes of KDA at minimum traffic: q, k, the per-channel log-decay g (d_k each), v, β (one per head)
    read once and the output (d_v) written once per token and head, in ``element_size`` bytes; plus the state
    entering every chunk, (d_k × d_v) fp32 per head, which the chunk kernels write for the backward (fla's
    ``chunk_kda`` forward, as its gated DeltaNet's). With d = 128: 641 elements per token and head, and 64 KiB of
    state per head and chunk of 64 tokens."""
    dk, dv, heads, t = shape.head_dim_qk, shape.head_dim_v, shape.num_head_q, shape.seqlen_q
    chunk = shape.window if shape.window > 0 else LINEAR_CHUNK
    per_token = heads * (3 * dk + 2 * dv + 1) * element_size
    states = math.ceil(t / chunk) * heads * dk * dv * 4
    return float(batch_size * (t * per_token + states))


def scan_bytes(shape: AttentionShape, batch_size: int, element_size: int) -> float:
    """Forward bytes of a chunked scan at minimum traffic (the memory half of its time in ``opbench project``):
    KDA's ``kda_bytes``; the gated DeltaNet's the same less its per-channel decay (one decay per head); Mamba-2's
    x and the output (P per head), Δ (one per head), B and C (N per group) read or written once per token, and
    the fp32 N×P state entering every chunk per head, which mamba_ssm's ``_state_passing_fwd`` writes."""
    if shape.attn_kind == KDA:
        return kda_bytes(shape, batch_size, element_size)
    t, heads = shape.seqlen_q, shape.num_head_q
    if shape.attn_kind == MAMBA2:
        chunk = shape.window if shape.window > 0 else 128
        per_token = (heads * (2 * shape.head_dim_v + 1) + 2 * shape.num_head_kv * shape.head_dim_qk) * element_size
        states = math.ceil(t / chunk) * heads * shape.head_dim_qk * shape.head_dim_v * 4
        return float(batch_size * (t * per_token + states))
    gate = heads * (shape.head_dim_qk - 1) * element_size  # KDA's per-channel decay, one per head here
    return kda_bytes(shape, batch_size, element_size) - batch_size * t * gate


def mamba2_flops(shape: AttentionShape, batch_size: int) -> float:
    """Forward FLOPs of Mamba-2's chunked scan (Dao & Gu, "Transformers are SSMs: Generalized Models and Efficient
    Algorithms Through Structured State Space Duality", ICML 2024, §6 "the SSD algorithm"; as mamba_ssm's
    ``ssd_combined`` kernels compute it: ``_bmm_chunk_fwd``, ``_chunk_scan_fwd``, ``_chunk_state_fwd``,
    ``_state_passing_fwd``). The shape's ``num_head_q`` is the heads H, ``num_head_kv`` the groups G sharing B and C,
    ``head_dim_qk`` the state size N, ``head_dim_v`` the head dim P, ``window`` the chunk size C (the sequence is
    padded to whole chunks). Per chunk: the scores C·Bᵀ once per group, 2·C²·N·G; per head the masked product
    with Δ·X, 2·C²·P, the chunk's state Bᵀ·(Δ·X), 2·C·N·P, passing the state on (S ← e^{γ_C}·S + state, a
    multiply and an add per element), 2·N·P, and the output from the entering state C·S, 2·C·N·P. The decays
    (cumsum, exp), the D·x skip and the mask itself are elementwise and not counted."""
    chunk = shape.window if shape.window > 0 else 128
    n, p, heads, groups = shape.head_dim_qk, shape.head_dim_v, shape.num_head_q, shape.num_head_kv
    chunks = math.ceil(shape.seqlen_q / chunk)
    per_chunk = 2 * chunk * chunk * n * groups + heads * (2 * chunk * chunk * p + 4 * chunk * n * p + 2 * n * p)
    return float(batch_size * chunks * per_chunk)


def attention_flops(shape: AttentionShape, batch_size: int, pass_: str = "fwd") -> float:
    """Softmax kinds: 2 · batch · heads_q · seqlen_q · visible_keys · (head_dim_qk + head_dim_v) forward (q·kᵀ plus
    P·v; the indexer's head_dim_v is 1, its per-head weight), bwd = 2.5×, fwdbwd = 3.5×. Linear attention and
    Mamba-2: their chunkwise matmuls, bwd = 2×, fwdbwd = 3×. KV heads (GQA) change bytes, not FLOPs."""
    if shape.attn_kind == LINEAR:
        return gated_deltanet_flops(shape, batch_size) * MATMUL_PASS_MULTIPLIER[pass_]
    if shape.attn_kind == MAMBA2:
        return mamba2_flops(shape, batch_size) * MATMUL_PASS_MULTIPLIER[pass_]
    if shape.attn_kind == KDA:
        return kda_flops(shape, batch_size) * MATMUL_PASS_MULTIPLIER[pass_]
    if shape.attn_kind == HC:
        return hc_flops(shape, batch_size) * MATMUL_PASS_MULTIPLIER[pass_]
    fwd = (
        2
        * batch_size
        * shape.num_head_q
        * shape.seqlen_q
        * visible_keys(shape)
        * (shape.head_dim_qk + shape.head_dim_v)
    )
    multiplier = MATMUL_PASS_MULTIPLIER if shape.attn_kind == INDEXER else PASS_MULTIPLIER
    return fwd * multiplier[pass_]
