"""Fault injection, off by default: make one rank of a job misbehave on purpose, to check that opbench — and
the user's own tooling around it — catches a bad rank. One environment variable drives it::

    OPBENCH_FAULTS="exit:1,hang:2,slow:3:4,corrupt:1,oom:0"

==============  ==============================================================================================
``exit:R``      rank R exits (code 0, as a node that vanished) just before its first timed step
``hang:R``      rank R stops just before its first timed step (sleeps far past any timeout)
``slow:R:F``    every timed call on rank R takes about F times as long (the call, then a sleep of F−1 times its
                duration; on a GPU the slowed rank synchronises after each call so the sleep follows the work)
``corrupt:R``   rank R damages its data: comm adds 1 to its first send element before a checked call; ckpt
                flips a byte of what rank R saved before it is loaded
``oom:R``       rank R fails to allocate its first case, as an out-of-memory error
``late_send:R:S`` rank R posts each point-to-point send of the cluster pairs check S seconds late, its receives
                on time: a slow link out of rank R
==============  ==============================================================================================

The benchmarks ask this module at five named points (``prepare``, ``before_timing``, ``timed``, ``corrupts``
and ``send_delay``); the only fault code in a measurement is the pairs exchange posting its send late when
``send_delay`` says so. docs/faults.md shows each fault's effect.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import UsageError

ENV_VAR = "OPBENCH_FAULTS"
KINDS = ("exit", "hang", "slow", "corrupt", "oom", "late_send")
_WITH_VALUE = ("slow", "late_send")  # kinds with a third field
_SYNTAX = (
    "expected a comma-separated list of exit:RANK, hang:RANK, slow:RANK:FACTOR, corrupt:RANK, oom:RANK, "
    "late_send:RANK:SECONDS"
)


def _number(item: str, text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"'{item}': {name} must be a number", field=ENV_VAR) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise UsageError(f"'{item}': {name} must be a finite number", field=ENV_VAR)
    return value


class InjectedOOM(MemoryError):
    """The ``oom`` fault; the sweep classifies it as status ``oom`` like a real allocation failure."""


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    factor: float = 1.0  # slow
    seconds: float = 0.0  # late_send


@dataclass
class Faults:
    """The faults of this job; ``Faults()`` (the default when the variable is unset) does nothing."""

    faults: tuple[Fault, ...] = ()
    _fired: set[tuple[str, int]] = field(default_factory=set)

    @classmethod
    def parse(cls, text: str) -> Faults:
        found = []
        for item in (p.strip() for p in text.split(",")):
            if not item:
                continue
            parts = item.split(":")
            kind = parts[0]
            if kind not in KINDS or len(parts) != (3 if kind in _WITH_VALUE else 2) or not parts[1].isdigit():
                raise UsageError(f"'{item}': {_SYNTAX}", field=ENV_VAR)
            factor, seconds = 1.0, 0.0
            if kind == "slow":
                factor = _number(item, parts[2], "FACTOR")
                if not factor >= 1:
                    raise UsageError(f"'{item}': FACTOR must be at least 1", field=ENV_VAR)
            if kind == "late_send":
                seconds = _number(item, parts[2], "SECONDS")
                if not 0 < seconds <= 60:
                    raise UsageError(f"'{item}': SECONDS must be above 0 and at most 60", field=ENV_VAR)
            found.append(Fault(kind, int(parts[1]), factor, seconds))
        if sum(f.kind == "late_send" for f in found) > 1:
            # two late ranks in one shift cycle would each queue a receive before their send on NCCL's stream
            raise UsageError("late_send names one rank at most", field=ENV_VAR)
        return cls(tuple(found))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Faults:
        return cls.parse((os.environ if env is None else env).get(ENV_VAR, ""))

    def __bool__(self) -> bool:
        return bool(self.faults)

    def for_world(self, world_size: int) -> Faults:
        """These faults, once every rank they name exists: a fault for rank 99 of a 2-rank job would never fire,
        and a test relying on it would pass for the wrong reason."""
        missing = sorted({f.rank for f in self.faults if f.rank >= world_size})
        if missing:
            raise UsageError(
                f"names rank(s) {', '.join(map(str, missing))}, but the job has {world_size} rank(s)", field=ENV_VAR
            )
        return self

    def _mine(self, kind: str, rank: int) -> Fault | None:
        return next((f for f in self.faults if f.kind == kind and f.rank == rank), None)

    def _once(self, kind: str, rank: int) -> bool:
        if self._mine(kind, rank) is None or (kind, rank) in self._fired:
            return False
        self._fired.add((kind, rank))
        return True

    # -- the five points the benchmarks call --------------------------------------------------------------
    def prepare(self, rank: int) -> None:
        """Before a case allocates: ``oom`` fails the first case on its rank."""
        if self._once("oom", rank):
            raise InjectedOOM(f"out of memory (injected by {ENV_VAR} oom:{rank})")

    def before_timing(self, rank: int, timeout_s: float = 600.0) -> None:
        """Just before the first timed step: ``exit`` and ``hang`` take their rank out of the job."""
        for kind in ("exit", "hang"):
            if self._once(kind, rank):
                print(f"[rank {rank}] injected fault ({ENV_VAR}): {kind}", file=sys.stderr, flush=True)
                if kind == "exit":
                    os._exit(0)
                time.sleep(10 * timeout_s + 60)

    def corrupts(self, rank: int) -> bool:
        """Whether this rank should damage its data (every checked call / every saved checkpoint)."""
        return self._mine("corrupt", rank) is not None

    def send_delay(self, rank: int) -> float:
        """Seconds this rank waits before posting each point-to-point send of the pairs check (``late_send``)."""
        fault = self._mine("late_send", rank)
        return fault.seconds if fault is not None else 0.0

    def timed(self, fn: Callable[[], Any], rank: int, device: Any = None) -> Callable[[], Any]:
        """``fn`` itself, or for a ``slow`` rank a call that takes FACTOR times as long."""
        fault = self._mine("slow", rank)
        if fault is None or fault.factor == 1:
            return fn
        sync: Callable[[], None] = lambda: None  # noqa: E731
        if getattr(device, "type", "cpu") == "cuda":
            import torch

            sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
        extra = fault.factor - 1

        def slowed() -> Any:
            start = time.perf_counter()
            out = fn()
            sync()
            time.sleep(extra * (time.perf_counter() - start))
            return out

        return slowed
