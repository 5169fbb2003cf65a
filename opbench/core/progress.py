"""A sweep's progress on the console, wherever its output goes (docs/conventions.md, "Progress").

On a terminal (stdout and stderr both): the tqdm bar on stderr, gone when the sweep ends. Otherwise (a batch
job's log under sbatch/srun, a pipe, ``| tee``): a header when the sweep starts, then one line per finished row
on stdout, flushed at once, nccl-tests style: a batch log shows each result as it lands. ``OPBENCH_PROGRESS``
overrides the choice: ``bar`` (or ``1``), ``lines``, ``off`` (or ``0``). Torch-free.

A tool says what a line holds with :class:`Field` s; ``core.sweep.run_sweep`` drives it, and any other loop can
(``with RowProgress(...) as shown: ... shown.done(row)``).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

BAR, LINES, OFF = "bar", "lines", "off"

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Field:
    """One column of a progress line: its header (unit included), width, and how a row reads in it."""

    title: str
    width: int
    cell: Callable[[Row], str]
    left: bool = False  # names read left-aligned, numbers right-aligned


def time_text(seconds: Any) -> str:
    """A duration with its unit in the cell, scaled to read at a glance: 8.31 us, 91.9 ms, 2.51 s."""
    value = number(seconds)
    if value is None:
        return ""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}" if value / scale < 100 else f"{value / scale:.0f} {unit}"
    return f"{value / 1e-9:.3g} ns"


def number(value: Any) -> float | None:
    """A finite number from a row cell, or None (empty cell, text, nan)."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def figure(value: Any, fmt: str = ".4g") -> str:
    out = number(value)
    return "" if out is None else format(out, fmt)


def percent(fraction: Any) -> str:
    out = number(fraction)
    return "" if out is None else f"{100 * out:.0f}%"


def column(name: str, width: int, title: str | None = None, left: bool = False) -> Field:
    """A row value as it is (numbers to 4 significant digits)."""

    def cell(row: Row) -> str:
        value = row.get(name)
        if isinstance(value, float):
            return figure(value)
        return "" if value is None else str(value)

    return Field(title or name, width, cell, left)


def status_cell(row: Row) -> str:
    """ok (", noisy" when its spread stayed wide), or the status and the start of its reason (the CSV's error
    cell has the whole of it)."""
    status = str(row.get("status") or "")
    error = " ".join(str(row.get("error") or "").split())
    if status == "ok" or not error:
        return f"{status}, noisy" if "noisy" in str(row.get("note") or "") else status
    return f"{status}: {error[:60]}" + ("…" if len(error) > 60 else "")


STATUS = Field("status", 6, status_cell, left=True)


@dataclass(frozen=True)
class Workload:
    """What each item of a sweep costs, so the bar's remaining time weighs rows by their work, not their count (a
    Qwen3-0.6B gemm sweep: 12 rows in 10 s, then 3 lm_head rows of 24 s). Per item, the work (FLOPs) of each
    call it times; per finished row, the per-call seconds it measured for them (None where it measured none);
    and the wall seconds the timing harness spends on a call of a given length (core.timing.expected_seconds).
    The finished rows give the rate (work per second of a call) and each row's fixed cost besides timing
    (operands, reference check); a row to come costs that plus the harness' time for its calls at that rate."""

    work: Sequence[Sequence[float]]
    measured: Callable[[Row], Sequence[float | None]]
    wall: Callable[[float], float]


class Remaining:
    """The remaining-time estimate of a sweep with a Workload (its doc says how); None until a row has measured
    its calls."""

    def __init__(self, workload: Workload):
        self.workload = workload
        self.work = 0.0  # work of the calls measured so far ...
        self.seconds = 0.0  # ... and their per-call seconds
        self.fixed: list[float] = []  # per measured row: its wall time beyond the harness' (setup, checks)

    def finished(self, index: int, row: Row, wall_s: float) -> None:
        works = self.workload.work[index] if index < len(self.workload.work) else ()
        times = list(self.workload.measured(row))
        pairs = [(w, t) for w, t in zip(works, times, strict=False) if w and w > 0 and t is not None and t > 0]
        if not pairs or len(pairs) != len(works):
            return  # a failed or unsupported row: its time says nothing about the rate
        self.work += sum(w for w, _ in pairs)
        self.seconds += sum(t for _, t in pairs)
        self.fixed.append(max(0.0, wall_s - sum(self.workload.wall(t) for _, t in pairs)))

    def seconds_left(self, next_index: int) -> float | None:
        if self.seconds <= 0 or self.work <= 0:
            return None
        rate = self.work / self.seconds
        fixed = sum(self.fixed) / len(self.fixed)
        return sum(
            fixed + sum(self.workload.wall(w / rate) for w in works if w and w > 0)
            for works in self.workload.work[next_index:]
        )


def progress_mode(enabled: bool = True, environ: Mapping[str, str] | None = None) -> str:
    """bar on an interactive terminal, lines anywhere else; OPBENCH_PROGRESS overrides; off when not enabled
    (ranks other than 0)."""
    if not enabled:
        return OFF
    env = os.environ if environ is None else environ
    chosen = env.get("OPBENCH_PROGRESS", "").strip().lower()
    if chosen in ("1", BAR):
        return BAR
    if chosen in ("0", OFF):
        return OFF
    if chosen == LINES:
        return LINES
    return BAR if _isatty(sys.stdout) and _isatty(sys.stderr) else LINES


def _isatty(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):
        return False


def _bar_with_time_left() -> type:
    """tqdm whose bar_format may show ``{left}``, a time left the caller sets (tqdm's own {remaining} divides by
    the rows' rate)."""
    from tqdm import tqdm

    class Bar(tqdm):
        left = "?"

        @property
        def format_dict(self) -> dict[str, Any]:
            return {**super().format_dict, "left": self.left}

    return Bar


class RowProgress:
    """Progress of one sweep: ``done(row)`` after each finished row. See the module doc for where it shows."""

    def __init__(
        self,
        total: int | None,
        desc: str,
        fields: Sequence[Field] = (),
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        mode: str | None = None,
        workload: Workload | None = None,
    ):
        self.total, self.desc, self.fields = total, desc, list(fields)
        self.mode = mode or progress_mode(enabled)
        self.stream = stream
        self.count = 0
        self._bar: Any = None
        self._t0 = self._last = time.monotonic()
        self.remaining = Remaining(workload) if workload is not None else None

    @property
    def out(self) -> TextIO:
        return self.stream or sys.stdout

    def __enter__(self) -> RowProgress:
        if self.mode == BAR:
            from tqdm import tqdm

            if self.remaining is None:
                self._bar = tqdm(total=self.total, desc=self.desc, leave=False, dynamic_ncols=True, file=sys.stderr)
            else:  # the bar still counts rows; the time left after them is the work-weighted estimate
                self._bar = _bar_with_time_left()(
                    total=self.total,
                    desc=self.desc,
                    leave=False,
                    dynamic_ncols=True,
                    file=sys.stderr,
                    bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{left}]",
                )
        elif self.mode == LINES:
            of = f"{self.total} rows" if self.total is not None else "rows"
            self._print(f"# {self.desc}: {of}, one line per finished row (the CSV has every column)")
            self._print(self._line([f.title for f in self.fields], head=True))
        return self

    def _counter_width(self) -> int:
        return 2 * len(str(self.total or 0)) + 1

    def _line(self, cells: Sequence[str], head: bool = False) -> str:
        w = self._counter_width()
        if head:  # nccl-tests' style: header lines start with '#', result lines with spaces
            lead = f"# {'row':>{w}} {'elapsed':>7}"
        else:
            lead = f"  {self.count:>{w // 2}}/{self.total or '?':<{w // 2}} {self._elapsed():>7}"
        parts = [lead]
        for f, text in zip(self.fields, cells, strict=True):
            parts.append(f"{text:<{f.width}}" if f.left else f"{text:>{f.width}}")
        return "  ".join(parts).rstrip()

    def _elapsed(self) -> str:
        s = int(time.monotonic() - self._t0)
        return f"{s // 60}:{s % 60:02d}" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}"

    def _print(self, text: str) -> None:
        try:
            print(text, file=self.out, flush=True)
        except (OSError, ValueError):
            pass  # a closed or full console must not end the sweep; the CSV has the row

    def done(self, row: Row) -> None:
        self.count += 1
        now = time.monotonic()
        if self.remaining is not None:
            self.remaining.finished(self.count - 1, row, now - self._last)
        self._last = now
        if self.mode == BAR and self._bar is not None:
            if self.remaining is not None:
                self._bar.left = self.time_left()
            self._bar.update(1)
        elif self.mode == LINES:
            self._print(self._line([f.cell(row) for f in self.fields]))

    def time_left(self) -> str:
        """The work-weighted time left, as tqdm writes times (00:24), '?' before any row measured its calls."""
        from tqdm import tqdm

        left = self.remaining.seconds_left(self.count) if self.remaining is not None else None
        return "?" if left is None else tqdm.format_interval(left)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
