"""Pass or fail: the outlier rule, the ``--expect`` thresholds and the ``--baseline`` comparison. No torch.

The outlier rule (docs/cluster.md, "Outliers"): among members of one kind measured on the same case (GPUs on one
GEMM, nodes on one collective size, node pairs), each member is compared with its peers — the OTHER members, itself
left out. It is named when it is below the peers' median by more than ``fraction`` of that median AND its ratio to
that median is beyond ``k`` scaled MADs of the peers' own ratios (the MAD of log values; 1.4826 · median absolute
deviation is the normal distribution's σ for a robust spread). The first condition ignores differences too small to matter, the second differences the peers themselves
show. Leaving the member out keeps a slow member from pulling the reference down and widening the spread it is
judged against; median and MAD keep one noisy peer from doing the same (with every member in, one 4× slow rank and
one noisy peer among four made the MAD wide enough to hide the slow one). Fewer than three members cannot say
which one is slow: no outliers then.
"""

from __future__ import annotations

import csv
import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opbench.core.cli import parse_bytes
from opbench.core.errors import UsageError
from opbench.core.inputs import parse_json, read_small_text
from opbench.core.sweep import STATUS_OK

from .schema import file_name

MIN_PEERS = 3
MAD_SCALE = 1.4826


@dataclass(frozen=True)
class Judged:
    median: float | None  # over every member (the case's headline)
    reference: list[float | None]  # per member: the median of its peers (the other members)
    vs_median_pct: list[float | None]  # (value − reference) / reference · 100, per member
    outlier: list[bool]


def _median_log_mad(values: Sequence[float]) -> tuple[float, float]:
    """The median of positive values, and the scaled MAD of their logarithms: the peers' spread as a ratio. On a
    linear scale three peers spread ±30 % give a 3-MAD band wider than the median itself, and no member could
    ever be named, however slow."""
    med = statistics.median(values)
    log_med = math.log(med)
    return med, MAD_SCALE * statistics.median(abs(math.log(v) - log_med) for v in values)


def judge(values: Sequence[float | None], fraction: float, k: float) -> Judged:
    """The outlier rule over one case's members; None, non-finite or non-positive values (failed members) are
    neither peers nor outliers."""
    good = [(i, v) for i, v in enumerate(values) if v is not None and math.isfinite(v) and v > 0]
    n = len(values)
    if not good:
        return Judged(None, [None] * n, [None] * n, [False] * n)
    reference: list[float | None] = [None] * n
    vs: list[float | None] = [None] * n
    flags = [False] * n
    for i, v in good:
        peers = [p for j, p in good if j != i]
        if not peers:
            continue
        ref, log_mad = _median_log_mad(peers)
        reference[i] = ref
        vs[i] = 100.0 * (v - ref) / ref
        flags[i] = len(good) >= MIN_PEERS and ref - v > fraction * ref and math.log(ref / v) > k * log_mad
    return Judged(statistics.median(v for _, v in good), reference, vs, flags)


@dataclass(frozen=True)
class Finding:
    """One reason the cluster fails: an outlier, a missed threshold, a regression against the baseline, a failed
    measurement or a throttling GPU."""

    kind: str  # "outlier" | "threshold" | "baseline" | "failed" | "throttle"
    check: str
    case: str
    member: str
    metric: str
    value: float | None
    reference: float | None  # the peers' median, the threshold, or the baseline's median
    detail: str


# -- --expect ----------------------------------------------------------------------------------------------------
# check -> metric columns a threshold may name (each a minimum: every metric here is higher-is-better)
EXPECTABLE: dict[str, tuple[str, ...]] = {
    "compute": ("tflops", "pct_of_peak", "pct_of_best_matmul"),
    "memory": ("gbs", "pct_of_peak"),
    "intra": ("busbw_gbs", "pct_of_link_peak"),
    "inter": ("busbw_gbs", "pct_of_link_peak"),
    "world": ("busbw_gbs", "pct_of_link_peak"),
    "pairs": ("gbs_per_gpu", "pct_of_link_peak"),
    "gpu_pairs": ("gbs_per_gpu", "pct_of_link_peak"),
}
SIZED = {"intra", "inter", "world", "pairs", "gpu_pairs"}  # thresholds may differ per message size


@dataclass(frozen=True)
class Threshold:
    minimum: float
    size_bytes: int | None = None  # None: every size


def load_expect(path: str) -> dict[str, dict[str, list[Threshold]]]:
    """Read a thresholds file: ``{"compute": {"tflops": 600}, "intra": {"busbw_gbs": {"64M": 100, "1G": 300}}}``.
    Every problem is one UsageError naming the file and the field."""
    text = read_small_text(path, 16 << 20, "a JSON file of thresholds", field="--expect")
    data = parse_json(text, source=path, field="--expect")
    if not isinstance(data, dict):
        raise UsageError("must be a JSON object of checks", source=path, field="--expect")
    out: dict[str, dict[str, list[Threshold]]] = {}
    for check, metrics in data.items():
        if check not in EXPECTABLE:
            raise UsageError(f"unknown check (choose from {', '.join(EXPECTABLE)})", source=path, field=check)
        if not isinstance(metrics, dict):
            raise UsageError("must be an object of metric: minimum", source=path, field=check)
        for metric, value in metrics.items():
            where = f"{check}.{metric}"
            if metric not in EXPECTABLE[check]:
                raise UsageError(
                    f"unknown metric (choose from {', '.join(EXPECTABLE[check])})", source=path, field=where
                )
            items = value.items() if isinstance(value, dict) else [(None, value)]
            if isinstance(value, dict) and check not in SIZED:
                raise UsageError("per-size thresholds apply to collectives and pairs only", source=path, field=where)
            found = []
            for size, minimum in items:
                if isinstance(minimum, bool) or not isinstance(minimum, int | float) or not math.isfinite(minimum):
                    raise UsageError(f"{minimum!r} is not a number", source=path, field=where)
                try:
                    size_bytes = None if size is None else parse_bytes(str(size))
                except Exception:  # noqa: BLE001 - argparse-style parser; its message names the value
                    raise UsageError(f"{size!r} is not a size like 64M", source=path, field=where) from None
                found.append(Threshold(float(minimum), size_bytes))
            out.setdefault(check, {})[metric] = found
    return out


def threshold_for(thresholds: Sequence[Threshold], size_bytes: int | None) -> float | None:
    """The size's own threshold, else the one for every size."""
    exact = [t.minimum for t in thresholds if t.size_bytes is not None and t.size_bytes == size_bytes]
    if exact:
        return exact[0]
    general = [t.minimum for t in thresholds if t.size_bytes is None]
    return general[0] if general else None


def check_thresholds(
    check: str,
    case: str,
    members: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    expect: Mapping[str, Mapping[str, Sequence[Threshold]]],
    size_bytes: int | None = None,
) -> list[Finding]:
    found = []
    for metric, thresholds in expect.get(check, {}).items():
        minimum = threshold_for(thresholds, size_bytes)
        if minimum is None:
            continue
        for member, row in zip(members, rows):
            value = row.get(metric)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                if row.get("status") == STATUS_OK:  # measured, but nothing to hold it to: not a pass either
                    why = (
                        "no link peak is known (--link-peak-gbs; docs/cluster.md, 'Link table')"
                        if metric == "pct_of_link_peak"
                        else "the device has no published figure for it (docs/conventions.md, 'Peaks')"
                    )
                    detail = f"no {metric} to hold to the expected {minimum:g}: {why}"
                    found.append(Finding("threshold", check, case, member, metric, None, minimum, detail))
                continue  # a failed measurement is reported as failed, not as a missed threshold
            if value < minimum:
                found.append(
                    Finding("threshold", check, case, member, metric, value, minimum, f"below the expected {minimum:g}")
                )
    return found


# -- --baseline --------------------------------------------------------------------------------------------------
# check file -> (case key columns, metric): the baseline compares each case's median over its members.
BASELINE_CASES: dict[str, tuple[tuple[str, ...], str]] = {
    "compute": (("gemm", "dtype"), "tflops"),
    "memory": (("kernel", "size_bytes"), "gbs"),
    "comm": (("scope", "collective", "dtype", "size_bytes"), "busbw_gbs"),
    "pairs": (("scope", "size_bytes"), "gbs_per_gpu"),
}


def case_medians(kind: str, rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, ...], float]:
    """Median of the kind's metric per case over the members that measured it (status ok)."""
    keys, metric = BASELINE_CASES[kind]
    values: dict[tuple[str, ...], list[float]] = {}
    for row in rows:
        if row.get("status") not in ("ok", None):
            continue
        try:
            value = float(row[metric])
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(value):
            values.setdefault(tuple(str(row.get(k, "")) for k in keys), []).append(value)
    return {case: statistics.median(v) for case, v in values.items()}


def load_baseline(directory: str) -> dict[str, dict[tuple[str, ...], float]]:
    """The case medians of an earlier cluster run's CSVs; a directory without any is a usage error."""
    if not os.path.isdir(directory):
        raise UsageError("no such directory", source=directory, field="--baseline")
    out = {}
    for kind in BASELINE_CASES:
        path = os.path.join(directory, file_name(kind))
        if os.path.isfile(path):
            with open(path, newline="", encoding="utf-8") as fh:
                out[kind] = case_medians(kind, csv.DictReader(fh))
    if not out:
        raise UsageError("holds no cluster_*.csv of an earlier run", source=directory, field="--baseline")
    return out


def compare_baseline(
    kind: str,
    current: Mapping[tuple[str, ...], float],
    baseline: Mapping[str, Mapping[tuple[str, ...], float]],
    tolerance: float,
) -> tuple[list[dict[str, Any]], list[Finding]]:
    """Per case present in both runs: a table row, and a finding when the median fell by more than tolerance."""
    rows, found = [], []
    keys, metric = BASELINE_CASES[kind]
    for case, now in sorted(current.items()):
        before = baseline.get(kind, {}).get(case)
        if before is None or before <= 0:
            continue
        change = 100.0 * (now - before) / before
        bad = now < before * (1 - tolerance)
        label = " ".join(case)
        rows.append(
            {
                "check": kind,
                "case": label,
                "metric": metric,
                "baseline": f"{before:.4g}",
                "now": f"{now:.4g}",
                "change_pct": f"{change:+.1f}",
                "verdict": "FAIL" if bad else "ok",
            }
        )
        if bad:
            found.append(
                Finding("baseline", kind, label, "median", metric, now, before, f"{change:+.1f} % vs baseline")
            )
    return rows, found
