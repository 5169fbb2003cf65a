"""The one timing harness every benchmark uses (docs/conventions.md, "Timing").

Per call: device events on GPU, recorded back to back with one synchronisation per batch; ``perf_counter_ns``
around a synchronised call on CPU. On GPU each batch starts behind a device-side sleep as long as the host
needs to enqueue the batch, so the events bracket back-to-back kernels rather than the host's launch latency
(without it a 1024³ bf16 GEMM on an H100 read 29 µs per call instead of 9 µs), and calls under 50 µs are timed
as replays of a captured CUDA graph of many calls (in groups between one event pair where capture fails). Calls run in batches after a warm-up until the median is stable to
``rel_tol`` between batches and the spread (interquartile range / median, as torch.utils.benchmark's
adaptive_autorange) is at most ``max_spread``, or the time budget / iteration cap is reached; a measurement that
ends with a wider spread is marked ``noisy``. Cache-cold measurement is the
caller's ``before`` hook (operand rotation), which runs outside the timed region.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .clock import first_cpu_warmup_s, ns_clock, on_cpu_time
from .clock import note as clock_note
from .units import wrapped

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions that time something: TimingConfig's defaults appear in --help texts,
# which must come up without loading torch.


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
    iqr_rel: float = 0.0  # (p75 - p25) / median: the spread the stop rule and the noisy flag look at
    noisy: bool = False  # the measurement ended (budget or iteration cap) with iqr_rel above max_spread
    timed_as: str = ""  # how the calls were timed when not one event pair per call ("CUDA graph of 64 calls")
    cpu_clock: bool = False  # timed on a CPU in the process's CPU time (OPBENCH_CLOCK=cpu), not wall time

    @classmethod
    def from_samples(cls, samples: list[float] | np.ndarray) -> Stats:
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
            iqr_rel=spread(arr),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def spread(samples: list[float] | np.ndarray) -> float:
    """Interquartile range over the median (0 for fewer than 4 samples or a zero median)."""
    arr = np.asarray(samples, dtype=np.float64)
    if arr.size < 4:
        return 0.0
    q25, q50, q75 = np.percentile(arr, (25, 50, 75))
    return float((q75 - q25) / q50) if q50 > 0 else 0.0


@dataclass(frozen=True)
class TimingConfig:
    warmup_iters: int = 2  # at least this many untimed calls ...
    warmup_s: float = 0.05  # ... and at least this long
    min_iters: int = 5
    max_iters: int = 1000
    rel_tol: float = 0.02  # stop when the median moves less than this between batches ...
    max_spread: float = 0.1  # ... and the IQR is at most this fraction of the median (else: noisy at the end)
    budget_s: float = 2.0  # per measured shape, timed calls only
    cuda_graph: bool = True  # GPU calls under GRAPH_BELOW_S are timed as replays of a captured CUDA graph

    @classmethod
    def quick(cls) -> TimingConfig:
        """For CPU smoke runs and tests: a few calls, short budget."""
        return cls(warmup_iters=1, warmup_s=0.0, min_iters=3, max_iters=50, rel_tol=0.05, budget_s=0.5)


def rotation_count(bytes_per_set: int, device: torch.device, cap: int = 64) -> int:
    """Operand sets needed so cycling through them streams more than the LLC (Primus rotates ~512 MiB)."""
    from .device import last_level_cache_bytes

    target = 2 * last_level_cache_bytes(device)
    if bytes_per_set >= target:
        return 1  # one set already streams past the cache on every call
    return min(cap, math.ceil(target / max(1, bytes_per_set)) + 1)


# A GPU batch is at most this many calls and its hold at most this long: the launch queue holds about a
# thousand entries, and a batch that overflows it would block the host until the GPU has caught up.
GPU_BATCH_CAP = 256
MAX_HOLD_S = 0.05
# A pair of events costs the GPU a few microseconds between kernels (3 µs per 1024³ bf16 GEMM on an H100), so
# calls shorter than this are timed in groups, one event pair per group: each sample is a group's mean.
MIN_SAMPLE_S = 50e-6
MAX_CALLS_PER_SAMPLE = 64
# Calls shorter than this are captured into a CUDA graph of many calls and timed per replay (tritonbench's
# cudagraph mode): the host's launch cost and the gaps between kernels leave the timed region. At 1024³ bf16 on an
# H100 (a 7 µs GEMM) grouped events read 0.80 of the graph's rate. A graph holds enough calls for ~1 ms.
GRAPH_BELOW_S = 50e-6
GRAPH_TARGET_S = 1e-3
MAX_GRAPH_CALLS = 256
_sleep_rate: dict[int, float] = {}


def _sleep_cycles_per_s(device: torch.device) -> float | None:
    """Clock cycles per second of ``torch.cuda._sleep`` on this device, measured once (None: not available)."""
    import torch

    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _sleep_rate:
        cycles = 2_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        sleep(cycles)  # first call loads the kernel
        start.record()
        sleep(cycles)
        end.record()
        end.synchronize()
        _sleep_rate[index] = cycles / max(start.elapsed_time(end) * 1e-3, 1e-6)
    return _sleep_rate[index]


def hold_stream(device: torch.device, seconds: float) -> None:
    """Keep the GPU busy for ``seconds`` (at most MAX_HOLD_S) so the host can enqueue a batch ahead of it; does
    nothing where the sleep kernel's rate is unknown."""
    import torch

    rate = _sleep_cycles_per_s(device)
    if rate is not None and seconds > 0:
        torch.cuda._sleep(int(min(seconds, MAX_HOLD_S) * rate))


_capture_broken = ""  # why capture is off for the rest of the process (an earlier capture failed), else ""


def capture_graph(
    fn: Callable[[], Any], before: Callable[[], Any] | None, calls: int, device: torch.device
) -> tuple[Any, str]:
    """A CUDA graph of ``calls`` calls (each after its ``before``), or None and why capture failed: a call that
    synchronises, reads a value back to the host or changes shapes cannot be captured, and is timed with events.
    Warm-up runs on a side stream first, as torch.cuda.graphs' documentation requires.

    A failed capture leaves torch's graph state behind: ``torch.cuda.graph`` skips restoring the caller's stream
    when ``capture_end`` raises (so the capture runs inside our own ``torch.cuda.stream``, which restores it), and
    the caching allocator may still count the capture as under way (torch 2.11). So after one failure no call of
    this process is captured again."""
    global _capture_broken
    import torch

    if _capture_broken:
        return None, f"off after an earlier failure ({_capture_broken})"
    side = torch.cuda.Stream(device)
    try:
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                if before is not None:
                    before()
                fn()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                for _ in range(calls):
                    if before is not None:
                        before()
                    fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph.replay()
        torch.cuda.synchronize(device)
        return graph, ""
    except Exception as exc:  # noqa: BLE001 - any capture failure means: time it the other way
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:160]
        _capture_broken = why
        try:
            torch.cuda.synchronize(device)
        except RuntimeError:
            pass  # the error the capture left is reported by the next call that meets it
        return None, why


def _run_batch(
    fn: Callable[[], Any],
    n: int,
    device: torch.device,
    before: Callable[[], Any] | None,
    hold_s: float = 0.0,
    calls_per_sample: int = 1,
) -> tuple[list[float], float]:
    """Time ``n`` samples of ``calls_per_sample`` calls each; returns the per-call time of each sample and the
    host's seconds per call spent enqueueing them."""
    import torch

    from .device import synchronize

    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        hold_stream(device, hold_s)
        t0 = time.perf_counter()
        for i in range(n):
            starts[i].record()
            for _ in range(calls_per_sample):
                if before is not None:
                    before()
                fn()
            ends[i].record()
        host_s = (time.perf_counter() - t0) / (n * calls_per_sample)
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) * 1e-3 / calls_per_sample for s, e in zip(starts, ends)], host_s
    out = []
    clock = ns_clock()  # wall time, or the process's CPU time (OPBENCH_CLOCK=cpu)
    for _ in range(n):
        if before is not None:
            before()
        t0 = clock()
        fn()
        synchronize(device)
        out.append((clock() - t0) * 1e-9)
    return out, 0.0


# The first CPU measurement of a process warms up at least this long, whatever --warmup says. Just after a
# cold start (page cache dropped, as after an install) a 256³ fp32 matmul on 2 cores took 16 ms a call, not
# 0.2 ms, for the first ~0.4 s of calls (44 ms for the first), then 0.2 ms: `opbench selftest`'s one warm-up
# call and 0.5 s budget timed only that and printed 0.0021 TFLOP/s where a second run printed 0.16. A count of
# calls cannot tell, a time can; later measurements of the process keep their own warm-up.
FIRST_CPU_WARMUP_S = 1.0
FIRST_CPU_WARMUP_CALLS = 100_000
_cpu_warmed = False


def measure(
    fn: Callable[[], Any],
    device: torch.device,
    config: TimingConfig = TimingConfig(),
    before: Callable[[], Any] | None = None,
) -> Stats:
    """Time ``fn`` per call. ``before`` runs ahead of every call, untimed, and must be host-side only (operand
    rotation, picking the next gradient): GPU calls shorter than ``MIN_SAMPLE_S`` are timed in groups, and
    device work in ``before`` would then be timed with them."""
    from .device import synchronize

    # Warm-up: compile/autotune/allocate; also gives the first estimate of the per-call time. Each call is waited
    # for: on a GPU the host would otherwise queue up to the cap before the clock moved (1000 × a 5 ms GEMM: 5 s).
    # The first CPU measurement of a process warms up FIRST_CPU_WARMUP_S at least (by time, not count: see there).
    global _cpu_warmed
    first = device.type == "cpu" and not _cpu_warmed
    _cpu_warmed = _cpu_warmed or device.type == "cpu"
    warm_s = max(config.warmup_s, first_cpu_warmup_s(FIRST_CPU_WARMUP_S)) if first else config.warmup_s
    cap = FIRST_CPU_WARMUP_CALLS if first else 1000
    synchronize(device)
    t0 = time.perf_counter()
    n_warm = 0
    while n_warm < config.warmup_iters or (time.perf_counter() - t0) < warm_s:
        if before is not None:
            before()
        fn()
        synchronize(device)
        n_warm += 1
        if n_warm >= cap:
            break
    est = max((time.perf_counter() - t0) / max(1, n_warm), 1e-7)

    samples: list[float] = []
    spent = 0.0
    prev_median: float | None = None
    # Batches of ~1/5 of the budget, so the stability check runs a handful of times.
    batch = int(min(max(config.min_iters, config.budget_s / 5 / est), config.max_iters))
    batch = max(1, batch)
    host_per_call = est  # the warm-up's wall time per call bounds the host's enqueue time from above
    gpu_per_call = 0.0  # unknown until the first batch: hold for the whole batch then
    group = 1
    timed_fn, timed_before, per_sample = fn, before, 1  # per_sample: calls inside one timed_fn (a graph's)
    timed_as = ""
    graph = None
    while True:
        n = min(batch, config.max_iters - len(samples))
        # Hold the GPU only for the host's lag behind it: kernels longer than their launch keep the queue full
        # by themselves, and idle gaps between batches would let the clocks recover and flatter the result.
        lag = max(0.0, host_per_call - gpu_per_call)
        if device.type == "cuda" and lag > 0:
            n = min(n, GPU_BATCH_CAP)
        got, host_per_call = _run_batch(
            timed_fn,
            n,
            device,
            timed_before,
            calls_per_sample=group,
            hold_s=1.25 * lag * n * group + 2e-4 if lag > 0 else 0.0,
        )
        if per_sample > 1:
            got = [t / per_sample for t in got]
            host_per_call /= per_sample
        gpu_per_call = statistics.median(got)
        if device.type == "cuda" and group == 1 and per_sample == 1 and gpu_per_call < MIN_SAMPLE_S:
            # The first batch only calibrated: from now on a CUDA graph of many calls per sample, or (capture off
            # or failed) groups of calls between one event pair; only those samples are kept.
            calls = min(MAX_GRAPH_CALLS, math.ceil(GRAPH_TARGET_S / max(gpu_per_call, 1e-9)))
            why = "off"
            if config.cuda_graph and gpu_per_call < GRAPH_BELOW_S:
                graph, why = capture_graph(fn, before, calls, device)
            if graph is not None:
                timed_fn, timed_before, per_sample = graph.replay, None, calls
                timed_as = f"CUDA graph of {calls} calls"
                batch = max(config.min_iters, batch // calls)
            else:
                group = min(MAX_CALLS_PER_SAMPLE, math.ceil(MIN_SAMPLE_S / max(gpu_per_call, 1e-9)))
                timed_as = f"events around groups of {group} calls" + (
                    f" (CUDA graph capture failed: {why})" if why != "off" else ""
                )
                batch = max(config.min_iters, batch // group)
            continue
        samples.extend(got)
        spent += sum(got) * group * per_sample  # got is per call; each sample timed group × per_sample calls
        median = statistics.median(samples)
        if len(samples) >= config.max_iters:
            break
        if len(samples) >= config.min_iters:
            if spent >= config.budget_s:
                break
            stable = prev_median is not None and abs(median - prev_median) <= config.rel_tol * median
            if stable and spread(samples) <= config.max_spread:
                break
        prev_median = median
    del graph  # its memory pool goes with it
    stats = Stats.from_samples(samples)
    return replace(
        stats,
        noisy=stats.iqr_rel > config.max_spread,
        iters=stats.iters * group * per_sample,
        timed_as=timed_as,
        cpu_clock=device.type != "cuda" and on_cpu_time(),
    )


ISSUE_CALLS = 11  # calls whose host time is taken (issue_time); the median is the figure


def issue_time(fn: Callable[[], Any], device: torch.device, calls: int = ISSUE_CALLS) -> float:
    """The host's time to issue one call of ``fn``: the median wall time from the call to its return, each call
    started with the device idle and not waited for inside the timed span (docs/conventions.md, "Host issue
    time"). On a GPU this is the Python, dispatcher and launch work a training step's host does for the call while
    the GPU runs, the figure that says whether the call is host-bound (issue longer than ``measure``'s device time);
    a call that synchronises inside (a ``.tolist()`` of device values) includes its wait for the device. On a CPU
    the host is the device: the issue is the work, and this is the call's time again."""
    from .device import synchronize

    times = []
    for _ in range(max(1, calls)):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    synchronize(device)
    return statistics.median(times)


def expected_seconds(call_s: float, config: TimingConfig = TimingConfig(), extra_calls: int = 0) -> float:
    """Wall seconds ``measure`` spends on a call that always takes ``call_s``, if the median is stable from its
    second batch on (the earliest the stop rule allows), plus ``extra_calls`` untimed calls (a correctness
    check): what a row costs in a sweep's remaining-time estimate (core.progress.Workload). A 20 ms call is
    ~40 calls (two batches of a fifth of the budget), a 0.75 s one 2 warm-up and 5 timed calls. GPU batching
    (graphs, groups of calls) is left out: there a row's fixed costs dominate, which the estimate learns."""
    t = max(call_s, 1e-9)
    warm = min(1000, max(config.warmup_iters, math.ceil(config.warmup_s / t)))
    batch = max(1, int(min(max(config.min_iters, config.budget_s / 5 / t), config.max_iters)))
    timed = batches = 0
    while True:
        timed += min(batch, config.max_iters - timed)
        batches += 1
        if timed >= config.max_iters or (timed >= config.min_iters and (timed * t >= config.budget_s or batches >= 2)):
            break
    return (warm + timed + extra_calls) * t


def timing_note(stats: Stats, what: str = "") -> str | None:
    """What a row's note says about its timing: how the calls were timed when not one event pair each, and the
    spread when noisy; None when there is nothing to say."""
    parts = [
        f"timed as {stats.timed_as}" if stats.timed_as else "",
        noisy_note(stats, what) if stats.noisy else "",
        (clock_note() or "") if stats.cpu_clock else "",  # a GPU's events are device time whatever the clock
    ]
    return "; ".join(p for p in parts if p) or None


def noisy_note(stats: Stats, what: str = "") -> str:
    """The row note of a noisy measurement: how wide its spread stayed."""
    return f"noisy{' ' + what if what else ''}: IQR {100 * stats.iqr_rel:.0f}% of the median"


def noisy_advice(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """One console line under a table with noisy rows (their note starts "noisy"): how many, and what to do. Those
    rows' medians can be far off, so the user must see it where the numbers are, not only in the CSV."""
    noisy = sum(1 for r in rows if str(r.get("note") or "").startswith("noisy") or "; noisy" in str(r.get("note")))
    if not noisy:
        return None
    return wrapped(  # 240 characters: lines of 120 (docs/conventions.md, "Console lines")
        f"{noisy} of {len(rows)} rows are noisy (their spread stayed above --max-spread until the time budget ran "
        "out): do not compare them. Rerun on a quiet machine, with fewer threads (OMP_NUM_THREADS) on a shared "
        "CPU, or with a larger --budget."
    )
