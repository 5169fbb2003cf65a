"""``report --compare``'s regression table: timings slower than the other run's beyond both runs' spread.

A timing (one row, one pass) is *slower beyond its spread* when the fast end of this run's spread is slower than
the slow end of the other run's: the two bands do not overlap and this run's is the higher one. The band is what
each benchmark records per row (docs/report.md, "Regressions"): p10–p90 of the timed calls for GEMM and attention,
the fastest to the slowest trial for collectives. A timing without a band on either side is counted, not judged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from opbench.attention.schema import PASSES as ATTENTION_PASSES
from opbench.core.schema import Schema

from .tables import SCHEMAS, Section, _key_text, keyed, keys_of


@dataclass(frozen=True)
class Band:
    """One timed quantity of a row: its median and the low/high ends of its spread, in ``to_ms`` units."""

    what: str  # the pass it times, "" when a row times one thing
    median: str
    low: str
    high: str
    to_ms: float
    spread: str  # how the band is named in the table


SAMPLES = "p10–p90"
BANDS: dict[str, tuple[Band, ...]] = {
    "gemm": (Band("", "time_s", "time_p10_s", "time_p90_s", 1e3, SAMPLES),),
    "attention": tuple(Band(p, f"{p}_time", f"{p}_time_p10", f"{p}_time_p90", 1e3, SAMPLES) for p in ATTENTION_PASSES),
    "comm": (Band("", "time_us", "time_us_trial_min", "time_us_trial_max", 1e-3, "trial min–max"),),
}
COLUMNS = (
    "benchmark",
    "row",
    "pass",
    "median_ms",
    "spread_ms",
    "median_ms_other",
    "spread_ms_other",
    "band",
    "slower_x",
)


@dataclass
class Regressions:
    """What --compare found: the timings slower beyond their spread, and how many were compared in all."""

    slower: pd.DataFrame  # COLUMNS, slowest-down first
    compared: int = 0  # timings in both runs with a band on both sides
    faster: int = 0  # ... whose band lies wholly below the other run's
    unjudged: int = 0  # timings in both runs without a band on one side (an older CSV, a failed spread)
    kinds: tuple[str, ...] = ()  # benchmark titles that had timings to compare

    @property
    def within(self) -> int:
        return self.compared - len(self.slower) - self.faster


# Key pairs named once: "seq=128/128" rather than "seqlen_q=128 seqlen_kv=128".
PAIRED = (
    ("seqlen_q", "seqlen_kv", "seq"),
    ("num_head_q", "num_head_kv", "heads"),
    ("head_dim_qk", "head_dim_v", "dim"),
)


def _described(frame: pd.DataFrame, keys: list[str]) -> pd.Series:
    """A short name per row: its model, then the key values that differ between rows (a number as key=value);
    the pass has its own column."""
    varying = [k for k in keys if k in frame and k not in ("model", "pass") and frame[k].nunique(dropna=True) > 1]
    varying = (["model"] if "model" in frame else []) + (varying or [k for k in keys[:3] if k != "model"])
    for first, second, _ in PAIRED:  # both halves of a pair, once, where either half varies
        if first in varying or second in varying:
            at = varying.index(first if first in varying else second)
            varying = [k for k in varying if k not in (first, second)]
            varying.insert(at, first)
    names = {first: (second, short) for first, second, short in PAIRED}

    def name(row: pd.Series) -> str:
        parts = []
        for k in varying:
            value = _key_text(row.get(k))
            if k in names:
                second, k = names[k]
                value = f"{value}/{_key_text(row.get(second))}"
            if value:
                parts.append(f"{k}={value}" if re.fullmatch(r"[-\d./]+", value) else value)
        return " ".join(parts)

    return frame.apply(name, axis=1) if not frame.empty else pd.Series(dtype=object)


def _judge(kind: Schema, this: pd.DataFrame, other: pd.DataFrame, found: Regressions) -> list[pd.DataFrame]:
    keys = [k for k in keys_of(kind.benchmark) if k in this or k in other]
    kcols = [f"_k_{k}" for k in keys]
    bands = [b for b in BANDS[kind.benchmark] if b.median in this and b.median in other]
    wanted = [c for b in bands for c in (b.median, b.low, b.high) if c in other]
    right = keyed(other, keys).drop_duplicates(kcols, keep="last")[kcols + wanted]
    both = keyed(this, keys).merge(right, on=kcols, how="inner", suffixes=("", "_other"))
    both = both.assign(_row=_described(both, keys))
    out = []
    for band in bands:
        timed = both[both[band.median].notna() & both[f"{band.median}_other"].notna()]
        cols = (band.low, band.high, f"{band.low}_other", f"{band.high}_other")
        has_band = timed[[c for c in cols if c in timed]].notna().all(axis=1) if all(c in timed for c in cols) else None
        if has_band is None:
            found.unjudged += len(timed)
            continue
        found.unjudged += int((~has_band).sum())
        judged = timed[has_band]
        found.compared += len(judged)
        found.faster += int((judged[band.high] < judged[f"{band.low}_other"]).sum())
        slow = judged[judged[band.low] > judged[f"{band.high}_other"]]
        if slow.empty:
            continue

        def ms(col: str, part: pd.DataFrame = slow, b: Band = band) -> pd.Series:
            return part[col] * b.to_ms

        def spread(low: str, high: str) -> pd.Series:
            return ms(low).map(lambda v: f"{v:.4g}") + "–" + ms(high).map(lambda v: f"{v:.4g}")

        out.append(
            pd.DataFrame(
                {
                    "benchmark": kind.title,
                    "row": slow["_row"],
                    "pass": band.what or slow.get("pass", pd.Series("", index=slow.index)),
                    "median_ms": ms(band.median),
                    "spread_ms": spread(band.low, band.high),
                    "median_ms_other": ms(f"{band.median}_other"),
                    "spread_ms_other": spread(f"{band.low}_other", f"{band.high}_other"),
                    "band": band.spread,
                    "slower_x": slow[band.median] / slow[f"{band.median}_other"],
                },
                columns=list(COLUMNS),
            )
        )
    return out


def find_regressions(sections: list[Section]) -> Regressions:
    """Every timing of the compared sections that the other run also has, judged against both runs' bands."""
    found = Regressions(pd.DataFrame(columns=list(COLUMNS)))
    parts: list[pd.DataFrame] = []
    kinds = []
    for section in sections:
        kind = section.kind
        other = section.other_ok
        if kind.benchmark not in BANDS or other is None or other.empty or section.ok.empty:
            continue
        kinds.append(kind.title)
        parts += _judge(SCHEMAS[kind.benchmark], section.ok, other, found)
    found.kinds = tuple(kinds)
    if parts:
        slower = pd.concat(parts, ignore_index=True)
        found.slower = slower.sort_values("slower_x", ascending=False, kind="stable").reset_index(drop=True)
    return found
