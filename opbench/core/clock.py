"""The host clock every CPU-side timing reads (docs/conventions.md, "Timing", "The CPU clock").

Wall time by default (``time.perf_counter_ns``). ``OPBENCH_CLOCK=cpu`` switches every CPU measurement of opbench
to the process's CPU time (``time.process_time_ns``: user + system time of all its threads): what a step or a
kernel costs the CPU, which does not move when other processes share the cores, as wall time does on a shared
machine (a rate measured minutes before a step, at another load, read 0.5 of it). It is meant for one thread per
process (OMP_NUM_THREADS=1), where CPU time is the wall time of an idle core; with more threads it sums them. GPU
timings never read it (device events, and wall time where the host waits on a GPU). Torch-free: imported by the harness, the collectives' loops, the faults
and ``--validate``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from .errors import UsageError

ENV = "OPBENCH_CLOCK"
CLOCKS = ("wall", "cpu")
WARMUP_ENV = "OPBENCH_FIRST_CPU_WARMUP_S"


def kind() -> str:
    """``wall`` or ``cpu``: what OPBENCH_CLOCK asks for; anything else is a UsageError (``opbench`` checks it
    before a tool starts: one line, exit 2)."""
    value = os.environ.get(ENV, "").strip().lower() or "wall"
    if value not in CLOCKS:
        raise UsageError(f"{value!r} is not a clock: expected one of {', '.join(CLOCKS)}", field=ENV)
    return value


def on_cpu_time() -> bool:
    return kind() == "cpu"


def ns_clock() -> Callable[[], int]:
    """The host clock in nanoseconds, chosen once (a timed loop reads it without looking at the environment):
    wall time, or this process's CPU time under OPBENCH_CLOCK=cpu."""
    return time.process_time_ns if on_cpu_time() else time.perf_counter_ns


def seconds_clock() -> Callable[[], float]:
    """``ns_clock`` in seconds."""
    return time.process_time if on_cpu_time() else time.perf_counter


def note() -> str | None:
    """What a row or a report says when its CPU times are CPU time, not wall time (None for wall time)."""
    return f"timed in process CPU time ({ENV}=cpu)" if on_cpu_time() else None


def first_cpu_warmup_s(default: float) -> float:
    """How long a process's first CPU measurement warms up (core/timing.py, FIRST_CPU_WARMUP_S, says why): the
    default, or OPBENCH_FIRST_CPU_WARMUP_S in [0, 60] seconds. The test suite sets it shorter (docs/development.md,
    "Tests"): its hundreds of short-lived processes check behaviour, not rates; a user keeps the default."""
    raw = os.environ.get(WARMUP_ENV, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 60:
        raise UsageError(f"{raw!r} is not a warm-up in seconds within [0, 60]", field=WARMUP_ENV)
    return value
