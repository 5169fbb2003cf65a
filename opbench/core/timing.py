"""The one timing harness every benchmark uses.

Per call: device events on GPU (recorded back to back, one synchronisation per batch, so the host never
drains the queue), ``perf_counter_ns`` around a synchronised call on CPU. Calls run in batches after a
warm-up until the median is stable to ``rel_tol`` between batches, or the time budget / iteration cap is
reached. Cache-cold measurement is the caller's ``before`` hook (operand rotation, or ``CacheFlusher``),
which runs outside the timed region.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
import torch

from .device import last_level_cache_bytes, synchronize


@dataclass(frozen=True)
class Stats:
    """Summary of per-call times in seconds. The median is the headline figure; never report a mean alone."""

    median: float
    min: float
    max: float
    mean: float
    std: float
    p10: float
    p90: float
    iters: int

    @classmethod
    def from_samples(cls, samples: list[float] | np.ndarray) -> "Stats":
        arr = np.asarray(samples, dtype=np.float64)
        if arr.size == 0:
            raise ValueError("no samples")
        return cls(
            median=float(np.median(arr)),
            min=float(arr.min()),
            max=float(arr.max()),
            mean=float(arr.mean()),
            std=float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
            p10=float(np.percentile(arr, 10)),
            p90=float(np.percentile(arr, 90)),
            iters=int(arr.size),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TimingConfig:
    warmup_iters: int = 2          # at least this many untimed calls ...
    warmup_s: float = 0.05         # ... and at least this long
    min_iters: int = 5
    max_iters: int = 1000
    rel_tol: float = 0.02          # stop when the median moves less than this between batches
    budget_s: float = 2.0          # per measured shape, timed calls only

    @classmethod
    def quick(cls) -> "TimingConfig":
        """For CPU smoke runs and tests: a few calls, short budget."""
        return cls(warmup_iters=1, warmup_s=0.0, min_iters=3, max_iters=50, rel_tol=0.05, budget_s=0.5)


class CacheFlusher:
    """Overwrites a buffer larger than the last-level cache so the next call starts cold (triton do_bench style)."""

    def __init__(self, device: torch.device, nbytes: int | None = None):
        nbytes = nbytes or 2 * last_level_cache_bytes(device)
        self.buf = torch.empty(nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buf.zero_()


def rotation_count(bytes_per_set: int, device: torch.device, cap: int = 64) -> int:
    """Operand sets needed so cycling through them streams more than the LLC (Primus rotates ~512 MiB)."""
    target = 2 * last_level_cache_bytes(device)
    if bytes_per_set >= target:
        return 1  # one set already streams past the cache on every call
    return min(cap, math.ceil(target / max(1, bytes_per_set)) + 1)


def _run_batch(fn: Callable[[], Any], n: int, device: torch.device, before: Callable[[], Any] | None) -> list[float]:
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            if before is not None:
                before()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends)]
    out = []
    clock = time.perf_counter_ns
    for _ in range(n):
        if before is not None:
            before()
        t0 = clock()
        fn()
        synchronize(device)
        out.append((clock() - t0) * 1e-9)
    return out


def measure(
    fn: Callable[[], Any],
    device: torch.device,
    config: TimingConfig = TimingConfig(),
    before: Callable[[], Any] | None = None,
) -> Stats:
    """Time ``fn`` per call. ``before`` runs ahead of every call, untimed (rotation, cache flush, grad reset)."""
    # Warm-up: compile/autotune/allocate; also gives the first estimate of the per-call time.
    synchronize(device)
    t0 = time.perf_counter()
    n_warm = 0
    while n_warm < config.warmup_iters or (time.perf_counter() - t0) < config.warmup_s:
        if before is not None:
            before()
        fn()
        n_warm += 1
        if n_warm >= 1000:
            break
    synchronize(device)
    est = max((time.perf_counter() - t0) / max(1, n_warm), 1e-7)

    samples: list[float] = []
    spent = 0.0
    prev_median: float | None = None
    # Batches of ~1/5 of the budget, so the stability check runs a handful of times.
    batch = int(min(max(config.min_iters, config.budget_s / 5 / est), config.max_iters))
    batch = max(1, batch)
    while True:
        n = min(batch, config.max_iters - len(samples))
        got = _run_batch(fn, n, device, before)
        samples.extend(got)
        spent += sum(got)
        median = statistics.median(samples)
        if len(samples) >= config.max_iters:
            break
        if len(samples) >= config.min_iters:
            if spent >= config.budget_s:
                break
            if prev_median is not None and abs(median - prev_median) <= config.rel_tol * median:
                break
        prev_median = median
    return Stats.from_samples(samples)
