"""Fault injection, off by default: make one rank of a job misbehave on purpose, to check that opbench — and
the user's own tooling around it — catches a bad rank. One environment variable drives it::

    OPBENCH_FAULTS="exit:1,hang:2,slow:3:4,corrupt:1,oom:0"

==============  ==============================================================================================
``exit:R``      rank R exits (code 0, as a node that vanished) just before its first timed step
``hang:R``      rank R stops just before its first timed step (sleeps far past any timeout)
``slow:R:F``    every timed call on rank R takes about F times as long (the call, then F−1 times its duration
                more: on a GPU a sleep after synchronising, so the sleep follows the work; on a CPU a busy wait)
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
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .clock import seconds_clock
from .errors import UsageError
from .limits import MAX_WORLD

ENV_VAR = "OPBENCH_FAULTS"
KINDS = ("exit", "hang", "slow", "corrupt", "oom", "late_send")
_WITH_VALUE = ("slow", "late_send")  # kinds with a third field
_SYNTAX = (
    "expected a comma-separated list of exit:RANK, hang:RANK, slow:RANK:FACTOR, corrupt:RANK, oom:RANK, "
    "late_send:RANK:SECONDS"
)


_ASCII_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?", re.ASCII)


def _shown(item: str) -> str:
    """The item as the error line shows it: a non-ASCII or control character escaped (``'exit:\\u0661'``), so a
    line is one line and a look-alike digit is visible as what it is."""
    return item if item.isascii() and item.isprintable() else ascii(item)[1:-1]


def _rank(item: str, text: str) -> int:
    """RANK: ASCII digits only (Python's int() also takes Arabic-Indic and other Unicode digits) and below the
    command line's bound on a world (core.limits.MAX_WORLD), so a typo is refused in every mode, --dry-run included."""
    if not (text.isascii() and text.isdigit()):
        raise UsageError(f"'{_shown(item)}': RANK must be ASCII digits 0-9; {_SYNTAX}", field=ENV_VAR)
    if len(text) > len(str(MAX_WORLD)) or int(text) >= MAX_WORLD:
        raise UsageError(
            f"'{_shown(item)}': rank {text[:12]}{'…' if len(text) > 12 else ''} is beyond any job (at most "
            f"{MAX_WORLD:,} ranks, as --nproc-per-node × --nnodes)",
            field=ENV_VAR,
        )
    return int(text)


def _number(item: str, text: str, name: str) -> float:
    if not _ASCII_NUMBER.fullmatch(text):  # float() would take Unicode digits, "inf", "1_0" and spaces
        raise UsageError(f"'{_shown(item)}': {name} must be a finite number in ASCII digits", field=ENV_VAR)
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise UsageError(f"'{_shown(item)}': {name} must be a finite number", field=ENV_VAR)
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
            if kind not in KINDS or len(parts) != (3 if kind in _WITH_VALUE else 2):
                raise UsageError(f"'{_shown(item)}': {_SYNTAX}", field=ENV_VAR)
            rank = _rank(item, parts[1])
            factor, seconds = 1.0, 0.0
            if kind == "slow":
                factor = _number(item, parts[2], "FACTOR")
                if not factor >= 1:
                    raise UsageError(f"'{_shown(item)}': FACTOR must be at least 1", field=ENV_VAR)
            if kind == "late_send":
                seconds = _number(item, parts[2], "SECONDS")
                if not 0 < seconds <= 60:
                    raise UsageError(f"'{_shown(item)}': SECONDS must be above 0 and at most 60", field=ENV_VAR)
            found.append(Fault(kind, rank, factor, seconds))
        if sum(f.kind == "late_send" for f in found) > 1:
            # two late ranks in one shift cycle would each queue a receive before their send on NCCL's stream
            raise UsageError("late_send names one rank at most", field=ENV_VAR)
        return cls(tuple(found))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Faults:
        return cls.parse((os.environ if env is None else env).get(ENV_VAR, ""))

    @classmethod
    def validate(cls, world_size: int | None = None, env: Mapping[str, str] | None = None) -> Faults:
        """The one check of OPBENCH_FAULTS every mode runs, ``--dry-run`` and ``--plan`` included: the syntax, ASCII
        rank numbers within the command line's bound and, where the world is known before any rank starts, ranks
        that exist in it. A real run checks the world again once the ranks have joined (``for_world``)."""
        faults = cls.from_env(env)
        return faults if world_size is None else faults.for_world(world_size)

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
        extra = fault.factor - 1
        if getattr(device, "type", "cpu") == "cuda":
            import torch

            def slowed_gpu() -> Any:
                start = time.perf_counter()
                out = fn()
                torch.cuda.synchronize(device)  # the sleep follows the work, not the launch
                time.sleep(extra * (time.perf_counter() - start))
                return out

            return slowed_gpu

        clock = seconds_clock()  # the clock the harness times with: the slowdown is FACTOR on it (OPBENCH_CLOCK)

        def slowed_cpu() -> Any:
            # Busy, not asleep: a process that sleeps is given the CPU first when it wakes, so on a loaded machine
            # its next call ran faster than its peers' and a 4× slow rank measured 1.9–3.6× (docs/faults.md).
            start = clock()
            out = fn()
            until = clock() + extra * (clock() - start)
            while clock() < until:
                pass
            return out

        return slowed_cpu
