"""One plausibility rule per kind of quantity, written once (docs/conventions.md, "Plausible numbers").

A number can be finite and still no result: a step of 1e300 s, a memory of -5 GiB, a rate of -1e308 tokens/s. Each
kind below states the range a real measurement or projection of it falls in; schemas attach a kind to each column
(``Schema.plausible``: by the column's unit, or named in ``Schema.kinds``), and every reader that shows numbers
(``opbench report``'s tables and plots, ``project --results``) and ``opbench project``'s own figures hold cells to
it. What falls outside is set aside and named (file, row, column), never shown as a result.

The second half says what a real *part* can do, for judging the rates a projection is built on: a GEMM row of
10⁶ s or a memory bandwidth of 10⁻⁶ GB/s passes the bounds a flag would take, yet no part runs that slowly.

Imports nothing of the tools (and no pandas, no torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

YEAR_S = 365.25 * 86400  # seconds: no timed kernel, step or checkpoint of a benchmark takes a year
PIB = float(1 << 50)  # bytes: no device holds a pebibyte
EIB = float(1 << 60)  # bytes: no message, checkpoint or log total moves an exbibyte


@dataclass(frozen=True)
class Kind:
    """A kind of quantity and the range a real value of it falls in: ``low`` to ``high`` in ``base`` units, ``low``
    itself excluded where ``open_low`` (a time of 0 s is no measurement)."""

    name: str
    what: str  # "a time"
    base: str  # the unit low and high are in: "s"
    low: float
    high: float
    open_low: bool = False
    shown: str = ""  # the range in words, when the numbers alone read badly ("at most 1 year")

    def plausible(self, value: float) -> bool:
        """Whether a finite value in ``base`` units falls in the range (NaN is no value: the caller's to judge)."""
        return (value > self.low if self.open_low else value >= self.low) and value <= self.high

    @property
    def rule(self) -> str:
        """'a time: more than 0 s and at most 1 year'."""
        low = f"more than {self.low:g}" if self.open_low else f"at least {self.low:g}"
        high = self.shown or f"at most {self.high:g}"
        unit = f" {self.base}" if self.base else ""
        return f"{self.what}: {low}{unit} and {high}" + ("" if self.shown else unit)

    def problem(self, value: float) -> str:
        """Why ``value`` (in ``base`` units) is no result of this kind, or '' when it is plausible (NaN included)."""
        if math.isnan(value) or self.plausible(value):
            return ""
        return f"outside the plausible range of {self.rule}"


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        # durations of something that ran: a kernel, a collective, a step, a save
        Kind("time", "a time", "s", 0.0, YEAR_S, open_low=True, shown="at most 1 year"),
        # a part of a time, a spread or a wait, which may be 0 (exposed communication, a step's bubble, a std)
        Kind("time_part", "a part of a time", "s", 0.0, YEAR_S, shown="at most 1 year"),
        Kind("memory", "a memory size", "B", 0.0, PIB, shown="at most 1 PiB"),  # what a device holds
        Kind("size", "a data size", "B", 0.0, EIB, shown="at most 1 EiB"),  # bytes moved or stored
        # 100 PFLOP/s: 20 times the fastest dense FP8 peak in the peak table (MI355X, 5 PFLOP/s)
        Kind("flop_rate", "a compute rate", "TFLOP/s", 0.0, 1e5),
        # 1 PB/s: 100 times the fastest HBM (8 TB/s), 500 times the fastest link
        Kind("bandwidth", "a bandwidth", "GB/s", 0.0, 1e6),
        # 10^11 tokens/s: a million GPUs at 10^5 tokens/s each (a 0.6B model's rate on an H100)
        Kind("token_rate", "a token rate", "tokens/s", 0.0, 1e11),
        # a share of a peak or a reference: above 100 % is possible (a peak table's figure, a cache), 100 times not
        Kind("percent", "a percentage", "%", 0.0, 1e4),
        # a value against its peers' median, (x / median - 1) · 100: never below -100 %
        Kind("deviation", "a deviation from a median", "%", -100.0, 1e6),
        Kind("fraction", "a fraction", "", 0.0, 1.0),  # MFU, the estimated share of a step
        Kind("ratio", "a ratio", "", 0.0, 1e6),  # one positive quantity over another
        Kind("count", "a count", "", 0.0, 2.0**63),  # elements, calls, shapes, ranks
        Kind("flops", "a FLOP count", "FLOP", 0.0, 1e30),
        Kind("clock", "a clock", "MHz", 0.0, 1e5),
        Kind("temperature", "a temperature", "°C", -100.0, 300.0),
        Kind("power", "a power draw", "W", 0.0, 1e5),
    )
}

# A column's unit (as schemas state it) -> its kind by default and the factor to the kind's base unit
UNITS: dict[str, tuple[str, float]] = {
    "s": ("time", 1.0),
    "ms": ("time", 1e-3),
    "µs": ("time", 1e-6),
    "us": ("time", 1e-6),
    "B": ("size", 1.0),
    "GiB": ("memory", float(1 << 30)),
    "GB/s": ("bandwidth", 1.0),
    "MiB/s": ("bandwidth", (1 << 20) / 1e9),
    "TFLOP/s": ("flop_rate", 1.0),
    "TFLOPS": ("flop_rate", 1.0),
    "tokens/s": ("token_rate", 1.0),
    "%": ("percent", 1.0),
    "FLOP": ("flops", 1.0),
    "elements": ("count", 1.0),
    "calls": ("count", 1.0),
    "MHz": ("clock", 1.0),
    "°C": ("temperature", 1.0),
    "W": ("power", 1.0),
}


def kind_of(unit: str, kind: str | None = None) -> tuple[Kind, float] | None:
    """The kind of a column with ``unit`` (``kind`` names it where the unit's default is not it: a spread in
    seconds is a ``time_part``) and the factor from the unit to the kind's base; None when neither says."""
    default, scale = UNITS.get(unit, (None, 1.0))
    name = kind or default
    if name is None:
        return None
    found = KINDS[name]
    if kind and default and KINDS[default].base != found.base:
        raise ValueError(f"kind {kind} ({found.base}) does not fit the unit {unit!r}")
    return found, scale


# -- what a real part can do ---------------------------------------------------------------------------------------

# The slowest rate any part runs a real kernel at, with OVERHEAD_S on top for launch, latency and timer: a single
# CPU core without vector units (0.1 GFLOP/s), a DDR channel (0.1 GB/s), a 10 Mb/s network (10^-3 GB/s)
SLOWEST: dict[str, float] = {"compute": 1e-4, "memory": 0.1, "link": 1e-3}
# The fastest rate any part reaches where the part is not in the peak table: twice the fastest listed peak
FASTEST: dict[str, float] = {"compute": 1e4, "memory": 1e5, "link": 1e4}
UNIT_OF = {"compute": "TFLOP/s", "memory": "GB/s", "link": "GB/s"}
OVERHEAD_S = 0.1  # a kernel or a collective beyond its work at the slowest rate: a launch, a latency, a stall
PEAK_MARGIN = 1.5  # a measured rate above the part's own peak by more than this is no measurement of that part


def part_range(what: str, work: float, peak: float | None = None) -> tuple[float, float]:
    """(slowest, fastest) plausible rate for ``work`` units (TFLOP, GB) of ``what`` (compute, memory, link) on a
    part whose peak rate is ``peak`` (None: a part not in the peak table): the slowest any part does it in
    (``work / SLOWEST + OVERHEAD_S``; SLOWEST itself for an endless ``work``: a sustained rate), the fastest its
    peak × PEAK_MARGIN (or FASTEST)."""
    if math.isinf(work):  # a sustained rate (a flag's): no overhead to spread
        slowest = SLOWEST[what]
    else:
        slowest = work / (work / SLOWEST[what] + OVERHEAD_S) if work > 0 else 0.0
    fastest = peak * PEAK_MARGIN if peak else FASTEST[what]
    return slowest, fastest


def how_far(rate: float, low: float, high: float) -> tuple[float, str] | None:
    """(factor, 'below'/'above') when ``rate`` lies outside [low, high]; None inside. A rate of 0 or less is
    infinitely below."""
    if rate < low:
        return (low / rate if rate > 0 else math.inf), "below"
    if rate > high:
        return rate / high, "above"
    return None
