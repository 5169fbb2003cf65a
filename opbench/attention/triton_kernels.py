"""Triton kernels of opbench's fused attention (see triton_attention.py for the why and the host side).

This module imports triton at the top, so only import it when a kernel is about to run; the decorators read
TRITON_INTERPRET at that moment. Kernels and their @triton.jit helpers live at module level because triton
resolves helper calls through the kernel's globals.
"""

import triton
import triton.language as tl


@triton.jit
def _tile(ptr, rows, row_ok, stride_s, D: tl.constexpr, BD: tl.constexpr):
    """(rows, BD) block of a (seq, dim) slice; padding rows/columns read as 0."""
    d = tl.arange(0, BD)
    return tl.load(ptr + rows[:, None] * stride_s + d[None, :], mask=row_ok[:, None] & (d[None, :] < D), other=0.0)


@triton.jit
def _tile_t(ptr, cols, col_ok, stride_s, D: tl.constexpr, BD: tl.constexpr):
    """The same block transposed, (BD, cols), for q·kᵀ-style products."""
    d = tl.arange(0, BD)
    return tl.load(ptr + cols[None, :] * stride_s + d[:, None], mask=col_ok[None, :] & (d[:, None] < D), other=0.0)


@triton.jit
def _store_tile(ptr, rows, row_ok, stride_s, value, D: tl.constexpr, BD: tl.constexpr):
    d = tl.arange(0, BD)
    tl.store(
        ptr + rows[:, None] * stride_s + d[None, :],
        value.to(ptr.dtype.element_ty),
        mask=row_ok[:, None] & (d[None, :] < D),
    )


@triton.jit
def _visible(q_idx, k_idx, q_ok, k_ok, shift, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """Which (query, key) pairs count, for indices already broadcast to a 2-D tile in either orientation;
    causal aligned bottom-right: key j is visible to query i iff j <= i + (SKV - SQ), and with a sliding
    WINDOW (> 0) only the last WINDOW of those: j > i + (SKV - SQ) - WINDOW."""
    ok = q_ok & k_ok
    if CAUSAL:
        ok = ok & (k_idx <= q_idx + shift)
    if WINDOW > 0:
        ok = ok & (k_idx > q_idx + shift - WINDOW)
    return ok


@triton.jit
def _kv_start(pid_m, SQ, SKV, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WINDOW: tl.constexpr):
    """The first key block any row of query block pid_m can see: 0, or under a sliding window the block holding
    the first row's oldest visible key (whole blocks before it are skipped, which is what makes a window cheap)."""
    if WINDOW > 0:
        start = tl.maximum(0, pid_m * BLOCK_M + SKV - SQ - WINDOW + 1)
        start = (start // BLOCK_N) * BLOCK_N
    else:
        start = 0 * pid_m
    return start


@triton.jit
def _kv_end(pid_m, SQ, SKV, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """One past the last key any row of query block pid_m can see. One return, int64 on both branches: the
    compiler rejects a helper whose returns differ in type (a constexpr ``if`` still visits the code after it)."""
    if CAUSAL:
        end = tl.minimum(SKV, (pid_m + 1) * BLOCK_M + SKV - SQ)
    else:
        end = SKV + 0 * pid_m
    return end


@triton.jit
def attn_fwd(
    Q,
    K,
    V,
    O,
    LSE,
    qk_scale,
    sqb,
    sqs,
    sqh,
    skb,
    sks,
    skh,
    svb,
    svs,
    svh,
    sob,
    sos,
    soh,
    H,
    GROUP,
    SQ,
    SKV,
    D_QK: tl.constexpr,
    D_V: tl.constexpr,
    BD_QK: tl.constexpr,
    BD_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
):
    pid_m = tl.program_id(0).to(tl.int64)  # int64: offsets exceed 2**31 on large shapes
    pid_bh = tl.program_id(1).to(tl.int64)  # int64: offsets exceed 2**31 on large shapes
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < SQ
    q = _tile(Q + b * sqb + h * sqh, rows, row_ok, sqs, D_QK, BD_QK)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BD_V], dtype=tl.float32)
    for start_n in range(
        _kv_start(pid_m, SQ, SKV, BLOCK_M, BLOCK_N, WINDOW), _kv_end(pid_m, SQ, SKV, BLOCK_M, CAUSAL), BLOCK_N
    ):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < SKV
        s = tl.dot(q, _tile_t(k_base, cols, col_ok, sks, D_QK, BD_QK)) * qk_scale
        ok = _visible(rows[:, None], cols[None, :], row_ok[:, None], col_ok[None, :], SKV - SQ, CAUSAL, WINDOW)
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        vb = _tile(v_base, cols, col_ok, svs, D_V, BD_V)
        acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
        m_i = m_new
    empty = l_i == 0.0
    acc = acc / tl.where(empty, 1.0, l_i)[:, None]
    # log2-domain LSE; +inf for empty rows makes the backward's exp2(s - lse) zero there.
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
    tl.store(LSE + pid_bh * SQ + rows, lse, mask=row_ok)
    _store_tile(O + b * sob + h * soh, rows, row_ok, sos, acc, D_V, BD_V)


@triton.jit
def attn_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    qk_scale,
    sm_scale,
    sqb,
    sqs,
    sqh,
    skb,
    sks,
    skh,
    svb,
    svs,
    svh,
    sdob,
    sdos,
    sdoh,
    sdkb,
    sdks,
    sdkh,
    sdvb,
    sdvs,
    sdvh,
    H,
    HKV,
    GROUP,
    SQ,
    SKV,
    D_QK: tl.constexpr,
    D_V: tl.constexpr,
    BD_QK: tl.constexpr,
    BD_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
):
    pid_n = tl.program_id(0).to(tl.int64)  # int64: offsets exceed 2**31 on large shapes
    pid_bhk = tl.program_id(1).to(tl.int64)  # int64: offsets exceed 2**31 on large shapes
    b = pid_bhk // HKV
    hk = pid_bhk % HKV
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < SKV
    k = _tile(K + b * skb + hk * skh, cols, col_ok, sks, D_QK, BD_QK)
    v = _tile(V + b * svb + hk * svh, cols, col_ok, svs, D_V, BD_V)
    dk = tl.zeros([BLOCK_N, BD_QK], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BD_V], dtype=tl.float32)
    if CAUSAL:  # rows before (first key − shift) cannot see this block
        lo = tl.maximum(0, pid_n * BLOCK_N - (SKV - SQ))
        lo = (lo // BLOCK_M) * BLOCK_M
    else:
        lo = 0 * pid_n
    if WINDOW > 0:  # rows past (last key − shift + WINDOW − 1) have slid beyond this block
        hi = tl.minimum(SQ, (pid_n + 1) * BLOCK_N - (SKV - SQ) + WINDOW - 1)
    else:
        hi = SQ + 0 * pid_n
    for g in range(0, GROUP):
        h = hk * GROUP + g
        for start_m in range(lo, hi, BLOCK_M):
            rows = start_m + tl.arange(0, BLOCK_M)
            row_ok = rows < SQ
            q = _tile(Q + b * sqb + h * sqh, rows, row_ok, sqs, D_QK, BD_QK)
            do = _tile(DO + b * sdob + h * sdoh, rows, row_ok, sdos, D_V, BD_V)
            lse = tl.load(LSE + (b * H + h) * SQ + rows, mask=row_ok, other=float("inf"))
            delta = tl.load(DELTA + (b * H + h) * SQ + rows, mask=row_ok, other=0.0)
            # transposed scores/probabilities: (BLOCK_N keys, BLOCK_M queries)
            pt = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :])
            ok = _visible(rows[None, :], cols[:, None], row_ok[None, :], col_ok[:, None], SKV - SQ, CAUSAL, WINDOW)
            pt = tl.where(ok, pt, 0.0)
            dv += tl.dot(pt.to(do.dtype), do)
            dst = pt * (tl.dot(v, tl.trans(do)) - delta[None, :])
            dk += tl.dot(dst.to(q.dtype), q)
    _store_tile(DK + b * sdkb + hk * sdkh, cols, col_ok, sdks, dk * sm_scale, D_QK, BD_QK)
    _store_tile(DV + b * sdvb + hk * sdvh, cols, col_ok, sdvs, dv, D_V, BD_V)


@triton.jit
def attn_bwd_dq(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    qk_scale,
    sm_scale,
    sqb,
    sqs,
    sqh,
    skb,
    sks,
    skh,
    svb,
    svs,
    svh,
    sdob,
    sdos,
    sdoh,
    sdqb,
    sdqs,
    sdqh,
    H,
    GROUP,
    SQ,
    SKV,
    D_QK: tl.constexpr,
    D_V: tl.constexpr,
    BD_QK: tl.constexpr,
    BD_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
):
    pid_m = tl.program_id(0).to(tl.int64)  # int64: offsets exceed 2**31 on large shapes
    pid_bh = tl.program_id(1).to(tl.int64)  # int64: offsets exceed 2**31 on large shapes
    b = pid_bh // H
    hk = (pid_bh % H) // GROUP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < SQ
    q = _tile(Q + b * sqb + (pid_bh % H) * sqh, rows, row_ok, sqs, D_QK, BD_QK)
    do = _tile(DO + b * sdob + (pid_bh % H) * sdoh, rows, row_ok, sdos, D_V, BD_V)
    lse = tl.load(LSE + pid_bh * SQ + rows, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + pid_bh * SQ + rows, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BD_QK], dtype=tl.float32)
    for start_n in range(
        _kv_start(pid_m, SQ, SKV, BLOCK_M, BLOCK_N, WINDOW), _kv_end(pid_m, SQ, SKV, BLOCK_M, CAUSAL), BLOCK_N
    ):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < SKV
        kt = _tile_t(K + b * skb + hk * skh, cols, col_ok, sks, D_QK, BD_QK)
        vt = _tile_t(V + b * svb + hk * svh, cols, col_ok, svs, D_V, BD_V)
        p = tl.math.exp2(tl.dot(q, kt) * qk_scale - lse[:, None])
        ok = _visible(rows[:, None], cols[None, :], row_ok[:, None], col_ok[None, :], SKV - SQ, CAUSAL, WINDOW)
        p = tl.where(ok, p, 0.0)
        ds = p * (tl.dot(do, vt) - delta[:, None])
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt))
    _store_tile(DQ + b * sdqb + (pid_bh % H) * sdqh, rows, row_ok, sdqs, dq * sm_scale, D_QK, BD_QK)
