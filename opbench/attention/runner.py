"""Runs one (shape, batch size, backend) case: check against the oracle once, then time fwd / bwd / fwdbwd.

Backward is timed alone: the forward runs once, untimed, keeping its graph, and each timed call is
``torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)``; the harness' untimed ``before`` hook
swaps in a different ``grad_out`` for every call. The forward is timed as in training (inputs require grad, so autograd
records and the kernel saves what backward needs).
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from opbench.core.device import torch_dtype
from opbench.core.sweep import STATUS_ERROR, STATUS_OK, STATUS_UNSUPPORTED, Unsupported
from opbench.core.timing import Stats, TimingConfig, measure, noisy_note

from .backends import BACKENDS, from_layout, to_layout
from .flops import attention_flops
from .reference import max_errors, reference_attention
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
    """Inputs of one (shape, batch) in bshd, and the oracle's answer, shared by every backend."""

    key: tuple
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad_out: torch.Tensor | None
    ref: tuple[torch.Tensor, ...]


class ProblemCache:
    """Keeps the last problem: cases arrive grouped by shape, so the oracle runs once per shape."""

    def __init__(self) -> None:
        self._problem: Problem | None = None

    def get(self, case: AttentionCase, device: torch.device, with_grads: bool) -> Problem:
        key = (case.shape.key, case.batch_size, case.dtype, with_grads)
        if self._problem is None or self._problem.key != key:
            self._problem = None  # release the previous shape's tensors before allocating
            self._problem = make_problem(case, device, with_grads)
        return self._problem


def make_problem(case: AttentionCase, device: torch.device, with_grads: bool) -> Problem:
    s, b = case.shape, case.batch_size
    gen = torch.Generator(device=device)
    gen.manual_seed(zlib.crc32(repr((s.key, b)).encode()))
    dt = torch_dtype(case.dtype)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(size, generator=gen, device=device, dtype=dt)

    q = randn(b, s.seqlen_q, s.num_head_q, s.head_dim_qk)
    k = randn(b, s.seqlen_kv, s.num_head_kv, s.head_dim_qk)
    v = randn(b, s.seqlen_kv, s.num_head_kv, s.head_dim_v)
    grad_out = randn(b, s.seqlen_q, s.num_head_q, s.head_dim_v) if with_grads else None
    ref = reference_attention(q, k, v, s.causal, grad_out)
    return Problem((s.key, b, case.dtype, with_grads), q, k, v, grad_out, ref if with_grads else (ref,))


def _stats_columns(pass_: str, stats: Stats, flops: float) -> dict[str, Any]:
    row = {f"{pass_}_{col}": getattr(stats, field) for col, field in STAT_SUFFIXES.items()}
    row[f"{pass_}_tflops"] = flops / stats.median / 1e12 if stats.median > 0 else None
    return row


def check(case: AttentionCase, fn, layout: str, problem: Problem) -> dict[str, Any]:
    """Run the backend once on the problem; errors of the output (and of dq, dk, dv) against the oracle."""
    q, k, v = (
        to_layout(t, layout).detach().requires_grad_(problem.grad_out is not None)
        for t in (problem.q, problem.k, problem.v)
    )
    out = fn(q, k, v)
    row: dict[str, Any] = {}
    row["max_abs_err"], row["max_rel_err"] = max_errors(from_layout(out, layout), problem.ref[0])
    if problem.grad_out is not None:
        grads = torch.autograd.grad(out, (q, k, v), to_layout(problem.grad_out, layout))
        errs = [max_errors(from_layout(g, layout), r) for g, r in zip(grads, problem.ref[1:])]
        row["grad_max_abs_err"] = max(e[0] for e in errs)
        row["grad_max_rel_err"] = max(e[1] for e in errs)
    return row


def time_passes(
    fn,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    passes: Sequence[str],
    device: torch.device,
    config: TimingConfig,
) -> dict[str, Stats]:
    inputs = (q, k, v)
    stats: dict[str, Stats] = {}
    if "fwd" in passes:
        stats["fwd"] = measure(lambda: fn(q, k, v), device, config)
    if "bwd" in passes or "fwdbwd" in passes:
        out = fn(q, k, v)
        # Untimed, before each call: the next of two different output gradients, so no call repeats the
        # previous one's input (drawing a new one per call costs more than the CPU backward itself).
        pool = [torch.randn_like(out), torch.randn_like(out)]
        current = [0]  # which of the pool the next call uses

        def fresh_grad() -> None:
            current[0] ^= 1

        if "bwd" in passes:
            stats["bwd"] = measure(
                lambda: torch.autograd.grad(out, inputs, pool[current[0]], retain_graph=True),
                device,
                config,
                before=fresh_grad,
            )
        del out  # free the retained graph before fwdbwd builds its own
        if "fwdbwd" in passes:
            stats["fwdbwd"] = measure(
                lambda: torch.autograd.grad(fn(q, k, v), inputs, pool[current[0]]), device, config, before=fresh_grad
            )
    return stats


def inconsistent_passes(row: dict[str, Any]) -> str | None:
    """A noisy note when fwd+bwd came out faster than bwd alone: it contains bwd, so only noise can do that."""
    fb, b = row.get("fwdbwd_time"), row.get("bwd_time")
    if fb is not None and b is not None and fb < b:
        return f"noisy: fwdbwd {fb:.3g} s < bwd {b:.3g} s"
    return None


def run_case(
    case: AttentionCase, device: torch.device, passes: Sequence[str], config: TimingConfig, cache: ProblemCache
) -> dict[str, Any]:
    """One CSV row. Raises Unsupported (and lets OOM/errors propagate) for run_sweep to turn into a row."""
    backend = BACKENDS[case.backend]
    with_grads = any(p in passes for p in ("bwd", "fwdbwd"))
    with warnings.catch_warnings():  # torch's kernel-selection chatter; reasons that matter land in the row
        warnings.simplefilter("ignore", UserWarning)
        try:
            prepared = backend.build(case.shape, device, case.dtype)
        except Unsupported as exc:  # known before any allocation: the row needs no cleanup
            return {**case.as_row(), "status": STATUS_UNSUPPORTED, "error": str(exc)}
        problem = cache.get(case, device, with_grads)
        errors = check(case, prepared.fn, backend.layout, problem)
    row = {**case.as_row(), "note": prepared.note or None, **errors}
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
    q, k, v = (to_layout(t, backend.layout).detach().requires_grad_() for t in (problem.q, problem.k, problem.v))
    noisy = []
    for pass_, stats in time_passes(prepared.fn, q, k, v, passes, device, config).items():
        row.update(_stats_columns(pass_, stats, attention_flops(case.shape, case.batch_size, pass_)))
        if stats.noisy:
            noisy.append(noisy_note(stats, pass_))
    noisy += filter(None, [inconsistent_passes(row)])
    if noisy:
        row["note"] = "; ".join(filter(None, [row.get("note"), *noisy]))
    return {**row, "status": STATUS_OK, "error": None}
