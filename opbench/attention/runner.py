"""Runs one (shape, batch size, backend) case: check against the oracle once, then time fwd / bwd / fwdbwd.

Backward is timed alone: the forward runs once, untimed, keeping its graph, and each timed call is
``torch.autograd.grad(out, inputs, grad_out, retain_graph=True)``; the harness' untimed ``before`` hook
swaps in a different ``grad_out`` for every call. The forward is timed as in training (inputs require grad, so autograd
records and the kernel saves what backward needs). Inputs are (q, k, v) for softmax attention, (q, k, v, g, β)
for gated DeltaNet, (q, k, w) for the DSA indexer and (x, Δ, A, B, C, D) for Mamba-2's scan; DeepSeek-V4's csa/hca
take (q, kv, compressor kv, compressor gate, position bias, sinks) and its hyper-connection (streams, mixing
logits, base, scale, block output).
"""

from __future__ import annotations

import functools
import math
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from opbench.core.device import torch_dtype
from opbench.core.sweep import STATUS_ERROR, STATUS_OK, STATUS_UNSUPPORTED, Unsupported
from opbench.core.timing import Stats, TimingConfig, measure, timing_note
from opbench.models.layout import CHUNKED, CSA, FULL, HC, HCA, INDEXER, KDA, LINEAR, MAMBA2

from .backends import BACKENDS, from_layout, to_layout
from .flops import attention_flops
from .operators import (
    compressed_attention_op,
    hyper_connection,
    indexer_reference,
    recurrent_gated_delta_rule,
    recurrent_kda,
    ssd_reference,
)
from .reference import grad_errors, max_errors, reference_attention, reference_precision
from .schema import STAT_SUFFIXES
from .shapes import AttentionShape

# Norm-wise relative error (max|err| / max|ref|) above which a result is wrong, not rounding. fp32 leaves room
# for TF32 tensor-core math on GPUs; gradients get twice the output's allowance.
TOLERANCE = {"fp32": 5e-3, "fp16": 2e-2, "bf16": 5e-2}


@dataclass(frozen=True)
class AttentionCase:
    shape: AttentionShape
    batch_size: int
    backend: str
    dtype: str

    def as_row(self) -> dict[str, Any]:
        return {
            **self.shape.as_row(),
            "batch_size": self.batch_size,
            "dtype": self.dtype,
            "backend": self.backend,
            "fwd_flops": attention_flops(self.shape, self.batch_size, "fwd"),
        }


@dataclass
class Problem:
    """Inputs of one (kernel shape, batch) in bshd, and the oracle's answer, shared by every backend."""

    key: tuple
    inputs: tuple[torch.Tensor, ...]
    grad_out: torch.Tensor | None
    ref: tuple[torch.Tensor, ...]  # the output, then (with grad_out) the gradient of every input
    # The part of the output ``ref[0]`` covers, when the oracle ran on a prefix (``CHECK_PREFIX``); else None
    out_part: tuple[slice, ...] | None = None

    @property
    def note(self) -> str:
        if self.out_part is None:
            return ""
        n = self.out_part[1].stop
        return f"checked on the first {n} tokens (a causal operator: the full-length oracle would not fit)"


# Gated DeltaNet's token-by-token oracle keeps two (heads × dk × dv) states per token for autograd (16 GiB for
# Qwen3-Next at 4k), the indexer's all heads' (sq × skv) scores: beyond this length both are checked on a prefix.
# Both are causal, so the first N outputs, and every input's gradient when the output gradient is zero past N (the
# first N of them, and zero after), are exactly what the oracle gives on the first N tokens.
CHECK_PREFIX = 1024
MAMBA2_CHECK_PREFIX = 512  # Mamba-2's oracle is its whole semiseparable matrix: heads × 512² in fp64


def kernel_problem(shape: AttentionShape, batch: int) -> tuple[AttentionShape, int, str]:
    """What the backends run for a row: a chunked layer whose length is a whole number of chunks is causal
    attention over each chunk, so it runs as that (exact) with the chunks as the batch, on every backend; a
    chunk as long as the sequence is plain causal attention. Other rows run as they are."""
    if shape.attn_kind == CHUNKED and shape.seqlen_q == shape.seqlen_kv:
        s, c = shape.seqlen_q, shape.window
        if c >= s:
            return replace(shape, attn_kind=FULL, window=0), batch, f"chunked: one chunk of {c} ≥ seqlen, plain causal"
        if s % c == 0:
            kernel = replace(shape, seqlen_q=c, seqlen_kv=c, attn_kind=FULL, window=0)
            return kernel, batch * (s // c), f"chunked: timed as causal attention over {s // c} blocks of {c}"
    return shape, batch, ""


class ProblemCache:
    """Keeps the last problem: cases arrive grouped by shape, so the oracle runs once per shape."""

    def __init__(self) -> None:
        self._problem: Problem | None = None

    def get(self, shape: AttentionShape, batch: int, dtype: str, device: torch.device, with_grads: bool) -> Problem:
        key = (shape.key, batch, dtype, with_grads)
        if self._problem is None or self._problem.key != key:
            self._problem = None  # release the previous shape's tensors before allocating
            self._problem = make_problem(shape, batch, dtype, device, with_grads)
        return self._problem


def _autograd_reference(
    fn: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...], grad_out: torch.Tensor | None
) -> tuple[torch.Tensor, ...]:
    """An operator's oracle: its definition run in ``reference_precision`` (fp64 on the host), with autograd's
    gradients of every input."""
    wide = reference_precision(inputs[0].device)
    xs = tuple(t.detach().to(wide).requires_grad_(grad_out is not None) for t in inputs)
    out = fn(*xs)
    if grad_out is None:
        return (out.detach(),)
    return (out.detach(), *torch.autograd.grad(out, xs, grad_out.to(wide)))


def make_problem(s: AttentionShape, b: int, dtype: str, device: torch.device, with_grads: bool) -> Problem:
    gen = torch.Generator(device=device)
    gen.manual_seed(zlib.crc32(repr((s.key, b)).encode()))
    dt = torch_dtype(dtype)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(size, generator=gen, device=device, dtype=dt)

    out_shape: tuple[int, ...]
    if s.attn_kind == LINEAR:
        # g: log-decay ≤ 0 (decays 0.6–1 per token), β in (0, 1): the ranges a trained model's gates produce
        q, k = randn(b, s.seqlen_q, s.num_head_kv, s.head_dim_qk), randn(b, s.seqlen_kv, s.num_head_kv, s.head_dim_qk)
        v = randn(b, s.seqlen_kv, s.num_head_q, s.head_dim_v)
        g = -0.5 * torch.rand(b, s.seqlen_q, s.num_head_q, generator=gen, device=device, dtype=dt)
        beta = torch.sigmoid(randn(b, s.seqlen_q, s.num_head_q))
        inputs: tuple[torch.Tensor, ...] = (q, k, v, g, beta)
        oracle: Callable[..., tuple[torch.Tensor, ...]] = partial_reference(recurrent_gated_delta_rule)
        out_shape = (b, s.seqlen_q, s.num_head_q, s.head_dim_v)
    elif s.attn_kind == KDA:
        # every head its own q and k; g: a per-channel log-decay ≤ 0 (0.6–1 per token), β in (0, 1)
        h, t = s.num_head_q, s.seqlen_q
        q, k = randn(b, t, h, s.head_dim_qk), randn(b, t, h, s.head_dim_qk)
        g = -0.5 * torch.rand(b, t, h, s.head_dim_qk, generator=gen, device=device, dtype=dt)
        inputs = (q, k, randn(b, t, h, s.head_dim_v), g, torch.sigmoid(randn(b, t, h)))
        oracle = partial_reference(recurrent_kda)
        out_shape = (b, t, h, s.head_dim_v)
    elif s.attn_kind == MAMBA2:
        # heads_q = heads, heads_kv = B/C groups, head_dim_qk = state size, head_dim_v = head dim. Δ = softplus of
        # a normal shifted by −3 (≈ 0.002–0.5, Mamba's dt_min…dt_max range around its init), A in [−16, −1] (the
        # S4D-real init A_log = log 1…H), D ~ N(0, 1)
        h, t = s.num_head_q, s.seqlen_q
        x = randn(b, t, h, s.head_dim_v)
        step = torch.nn.functional.softplus(randn(b, t, h) - 3.0)
        a = -1.0 - 15.0 * torch.rand(h, generator=gen, device=device, dtype=dt)
        bc = randn(b, t, s.num_head_kv, s.head_dim_qk), randn(b, t, s.num_head_kv, s.head_dim_qk)
        inputs = (x, step, a, *bc, randn(h))
        oracle = partial_reference(ssd_reference)
        out_shape = (b, t, h, s.head_dim_v)
    elif s.attn_kind == INDEXER:
        keys = s.seqlen_kv // s.compress if s.compress else s.seqlen_kv  # DeepSeek-V4: one key per pooled window
        inputs = (randn(b, s.seqlen_q, s.num_head_q, s.head_dim_qk), randn(b, keys, 1, s.head_dim_qk))
        inputs += (randn(b, s.seqlen_q, s.num_head_q),)
        oracle = partial_reference(
            functools.partial(indexer_reference, compress=s.compress or 1, seqlen_kv=s.seqlen_kv)
        )
        out_shape = (b, s.seqlen_q, keys)
    elif s.attn_kind in (CSA, HCA):
        # DeepSeek-V4: q and the one shared key/value head (both normed and rotated already), the compressor's kv and
        # gate projections of every token (two series of d for csa, one for hca), its position bias, a sink per head
        width = (2 if s.attn_kind == CSA else 1) * s.head_dim_qk
        inputs = (randn(b, s.seqlen_q, s.num_head_q, s.head_dim_qk), randn(b, s.seqlen_kv, 1, s.head_dim_qk))
        inputs += (randn(b, s.seqlen_kv, width), randn(b, s.seqlen_kv, width), randn(s.compress, width))
        inputs += (randn(s.num_head_q),)
        topk = s.topk if s.attn_kind == CSA else 0
        oracle = partial_reference(
            functools.partial(compressed_attention_op, window=s.window, rate=s.compress, topk=topk)
        )
        out_shape = (b, s.seqlen_q, s.num_head_q, s.head_dim_v)
    elif s.attn_kind == HC:
        # n streams of h, the (2+n)·n mixing logits the hc GEMM produced, their bias and three scales, the block's
        # output that the site expands back into the streams
        n, h, t = s.num_head_q, s.head_dim_qk, s.seqlen_q
        inputs = (randn(b, t, n, h), randn(b, t, (2 + n) * n), randn((2 + n) * n), randn(3), randn(b, t, h))
        oracle = partial_reference(functools.partial(hyper_connection, iters=s.window))
        out_shape = (b, t, n + 1, h)
    else:
        inputs = (
            randn(b, s.seqlen_q, s.num_head_q, s.head_dim_qk),
            randn(b, s.seqlen_kv, s.num_head_kv, s.head_dim_qk),
            randn(b, s.seqlen_kv, s.num_head_kv, s.head_dim_v),
        )

        def oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor | None):
            ref = reference_attention(q, k, v, s.causal, grad, kind=s.attn_kind, window=s.window)
            return ref if grad is not None else (ref,)

        out_shape = (b, s.seqlen_q, s.num_head_q, s.head_dim_v)
    grad_out = randn(*out_shape) if with_grads else None
    key = (s.key, b, dtype, with_grads)
    n = CHECK_PREFIX
    if s.attn_kind == MAMBA2:  # its oracle holds every head's (seq × seq) matrix
        n = MAMBA2_CHECK_PREFIX
    if s.attn_kind not in (LINEAR, INDEXER, MAMBA2, KDA) or s.compress or s.seqlen_q != s.seqlen_kv or s.seqlen_q <= n:
        return Problem(key, inputs, grad_out, tuple(oracle(*inputs, grad_out)))
    part = (slice(None), slice(0, n)) + ((slice(0, n),) if s.attn_kind == INDEXER else ())
    if grad_out is not None:  # no gradient flows from past the prefix: the inputs' past it are zero
        kept = torch.zeros_like(grad_out)
        kept[part] = grad_out[part]
        grad_out = kept
    # per-token inputs are cut to the prefix; Mamba-2's per-head A and D are whole, and so are their gradients
    ref = oracle(*(t[:, :n] if t.dim() > 1 else t for t in inputs), grad_out[part] if grad_out is not None else None)
    pad = [
        torch.cat([g, g.new_zeros(t.shape[0], t.shape[1] - n, *t.shape[2:])], dim=1) if t.dim() > 1 else g
        for g, t in zip(ref[1:], inputs)
    ]
    return Problem(key, inputs, grad_out, (ref[0], *pad), part)


def partial_reference(definition: Callable[..., torch.Tensor]) -> Callable[..., tuple[torch.Tensor, ...]]:
    def oracle(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        *inputs, grad_out = args
        return _autograd_reference(definition, tuple(inputs), grad_out)

    return oracle


def _stats_columns(pass_: str, stats: Stats, flops: float) -> dict[str, Any]:
    row = {f"{pass_}_{col}": getattr(stats, field) for col, field in STAT_SUFFIXES.items()}
    row[f"{pass_}_tflops"] = flops / stats.median / 1e12 if stats.median > 0 else None
    return row


def check(fn, layout: str, problem: Problem, adapt: Callable[..., tuple[torch.Tensor, ...]] | None = None) -> dict:
    """Run the backend once on the problem; errors of the output (and of every input's gradient) against the oracle.
    ``adapt`` (Prepared.adapt_inputs) runs inside the graph here, so gradients reach the problem's own inputs."""
    xs = tuple(to_layout(t, layout).detach().requires_grad_(problem.grad_out is not None) for t in problem.inputs)
    out = fn(*(adapt(xs) if adapt else xs))
    row: dict[str, Any] = {}
    got = from_layout(out, layout)
    row["max_abs_err"], row["max_rel_err"] = max_errors(
        got[problem.out_part] if problem.out_part else got, problem.ref[0]
    )
    if problem.grad_out is not None:
        grads = torch.autograd.grad(out, xs, to_layout(problem.grad_out, layout))
        errs = grad_errors([from_layout(g, layout) for g in grads], problem.ref[1:])
        row["grad_max_abs_err"] = max(e[0] for e in errs)
        row["grad_max_rel_err"] = max(e[1] for e in errs)
    return row


def time_passes(
    fn,
    inputs: tuple[torch.Tensor, ...],
    passes: Sequence[str],
    device: torch.device,
    config: TimingConfig,
) -> dict[str, Stats]:
    stats: dict[str, Stats] = {}
    if "fwd" in passes:
        stats["fwd"] = measure(lambda: fn(*inputs), device, config)
    if "bwd" in passes or "fwdbwd" in passes:
        out = fn(*inputs)
        # Untimed, before each call: the next of two different output gradients, so no call repeats the
        # previous one's input (drawing a new one per call costs more than the CPU backward itself).
        pool = [torch.randn_like(out), torch.randn_like(out)]
        current = [0]  # which of the pool the next call uses

        def fresh_grad() -> None:
            current[0] ^= 1

        if "bwd" in passes:
            # Never as a CUDA graph: autograd runs a backward on the stream its forward ran on, which is not the
            # capture's, so a capture would miss kernels or fail; small calls are timed in event groups instead.
            stats["bwd"] = measure(
                lambda: torch.autograd.grad(out, inputs, pool[current[0]], retain_graph=True),
                device,
                replace(config, cuda_graph=False),
                before=fresh_grad,
            )
        del out  # free the retained graph before fwdbwd builds its own
        if "fwdbwd" in passes:
            stats["fwdbwd"] = measure(
                lambda: torch.autograd.grad(fn(*inputs), inputs, pool[current[0]]), device, config, before=fresh_grad
            )
    return stats


def inconsistent_passes(row: dict[str, Any]) -> str | None:
    """A noisy note when fwd+bwd came out faster than bwd alone: it contains bwd, so only noise can do that."""
    fb, b = row.get("fwdbwd_time"), row.get("bwd_time")
    if fb is not None and b is not None and fb < b:
        return f"noisy: fwdbwd {fb:.3g} s < bwd {b:.3g} s"
    return None


SINKS_NOTE = "attention sinks not applied: one learned logit per head joins the softmax (FLOPs unchanged)"


def run_case(
    case: AttentionCase, device: torch.device, passes: Sequence[str], config: TimingConfig, cache: ProblemCache
) -> dict[str, Any]:
    """One CSV row. Raises Unsupported (and lets OOM/errors propagate) for run_sweep to turn into a row. The row
    keeps the case's shape and FLOPs; the backend runs ``kernel_problem``'s equivalent where they differ."""
    backend = BACKENDS[case.backend]
    with_grads = any(p in passes for p in ("bwd", "fwdbwd"))
    kernel, batch, kernel_note = kernel_problem(case.shape, case.batch_size)
    with warnings.catch_warnings():  # torch's kernel-selection chatter; reasons that matter land in the row
        warnings.simplefilter("ignore", UserWarning)
        try:
            prepared = backend.build(kernel, device, case.dtype)
        except Unsupported as exc:  # known before any allocation: the row needs no cleanup
            return {**case.as_row(), "status": STATUS_UNSUPPORTED, "error": str(exc)}
        problem = cache.get(kernel, batch, case.dtype, device, with_grads)
        errors = check(prepared.fn, backend.layout, problem, prepared.adapt_inputs)
    sinks_dropped = case.shape.sinks and case.shape.attn_kind not in (CSA, HCA)  # DeepSeek-V4's ops take theirs
    notes = [prepared.note, kernel_note, problem.note, SINKS_NOTE if sinks_dropped else ""]
    row = {**case.as_row(), "note": "; ".join(n for n in notes if n) or None, **errors}
    tol = TOLERANCE.get(case.dtype, 5e-3)
    wrong = [
        f"{what} rel err {row[col]:.3g} > {limit:.3g}" + (" (NaN/inf)" if math.isinf(row[col]) else "")
        for what, col, limit in (("output", "max_rel_err", tol), ("grad", "grad_max_rel_err", 2 * tol))
        if row.get(col) is not None and not row[col] <= limit
    ]
    if wrong:
        return {**row, "status": STATUS_ERROR, "error": "wrong result vs the reference: " + "; ".join(wrong)}
    if prepared.untimed_reason:
        return {**row, "status": STATUS_UNSUPPORTED, "error": prepared.untimed_reason}
    inputs = tuple(to_layout(t, backend.layout) for t in problem.inputs)
    with torch.no_grad():  # untimed: what the kernel is handed (K/V expanded for kernels without GQA)
        inputs = prepared.adapt_inputs(inputs) if prepared.adapt_inputs else inputs
    inputs = tuple(t.detach().requires_grad_() for t in inputs)
    picked = prepared.describe(inputs) if prepared.describe else ""
    if picked:
        row["note"] = "; ".join(filter(None, [row.get("note"), picked]))
    noisy = []
    for pass_, stats in time_passes(prepared.fn, inputs, passes, device, config).items():
        row.update(_stats_columns(pass_, stats, attention_flops(case.shape, case.batch_size, pass_)))
        note = timing_note(stats, pass_)
        if note:
            noisy.append(note)
    noisy += filter(None, [inconsistent_passes(row)])
    if noisy:
        row["note"] = "; ".join(filter(None, [row.get("note"), *noisy]))
    return {**row, "status": STATUS_OK, "error": None}
