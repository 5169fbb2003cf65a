"""``cluster_summary.md``: the verdict first, then the named members, then compact tables. No torch.

Tables stay readable at a thousand nodes: per-GPU tables show at most ``MAX_ROWS`` nodes (the worst first when
there are more), and the node × node matrix is printed whole only up to ``MAX_MATRIX`` nodes; the CSVs hold
everything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tabulate import tabulate

from opbench.core.outputs import write_file

from .verdict import Finding

MAX_ROWS = 48
MAX_MATRIX = 24
KIND_TITLES = {
    "outlier": "outliers (below their peers)",
    "threshold": "missed --expect thresholds",
    "baseline": "regressions against --baseline",
    "failed": "failed measurements",
    "throttle": "throttling GPUs",
}


def _num(v: Any, fmt: str = ".4g") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return format(v, fmt) if isinstance(v, float) else str(v)


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    return tabulate(
        [[_num(c) for c in r] for r in rows], headers=list(headers), tablefmt="github", disable_numparse=True
    )


def per_gpu_grid(rows: Sequence[Mapping[str, Any]], case_col: str, case: str, metric: str) -> tuple[str, int]:
    """node × local GPU table of one case's metric; (markdown, nodes left out)."""
    grid: dict[str, dict[int, float | None]] = {}
    hosts: dict[str, str] = {}
    for r in rows:
        if str(r.get(case_col)) != case:
            continue
        value = r.get(metric) if r.get("status") == "ok" else None
        grid.setdefault(str(r["node"]), {})[int(r["local_rank"])] = value
        hosts[str(r["node"])] = str(r.get("host", ""))
    width = max((max(g) + 1 for g in grid.values() if g), default=0)
    nodes = list(grid)
    if len(nodes) > MAX_ROWS:  # the worst nodes first
        nodes.sort(key=lambda n: min((v for v in grid[n].values() if v is not None), default=-math.inf))
    shown = nodes[:MAX_ROWS]
    body = [[n, hosts[n], *[grid[n].get(i) for i in range(width)]] for n in shown]
    return _table(body, ["node", "host", *[f"gpu{i}" for i in range(width)]]), len(nodes) - len(shown)


def matrix_table(matrix: np.ndarray, labels: Sequence[str]) -> str:
    body = [[src, *[None if math.isnan(v) else float(v) for v in matrix[i]]] for i, src in enumerate(labels)]
    return _table(body, ["src \\ dst", *labels])


def write_summary(
    path: str,
    passed: bool,
    header: Sequence[str],
    findings: Sequence[Finding],
    got: Any,
    baseline_rows: Sequence[Mapping[str, Any]] = (),
    notes: Sequence[str] = (),
) -> str:
    """Write the summary and return its first lines (the verdict) for the console."""
    counts = {k: sum(f.kind == k for f in findings) for k in KIND_TITLES}
    verdict = "PASS" if passed else "FAIL"
    lines = [f"# Cluster check: {verdict}", ""]
    lines += [f"- {h}" for h in header]
    reasons = [f"{n} {KIND_TITLES[k]}" for k, n in counts.items() if n]
    lines.append(
        f"- verdict: {verdict} ({'; '.join(reasons) if reasons else 'every check that ran is within its peers and limits'})"
    )
    lines.append("")
    head = list(lines)
    if findings:
        lines += ["## Named", ""]
        lines.append(
            _table(
                [
                    [f.kind, f.check, f.case, f.member, f.metric, f.value, f.reference, f.detail]
                    for f in findings[: 4 * MAX_ROWS]
                ],
                ["kind", "check", "case", "member", "metric", "value", "reference", "detail"],
            )
        )
        if len(findings) > 4 * MAX_ROWS:
            lines.append(f"\n… {len(findings) - 4 * MAX_ROWS} more")
        lines.append("")
    if baseline_rows:
        lines += ["## Against the baseline (median of each case)", ""]
        lines.append(_table([list(r.values()) for r in baseline_rows], list(baseline_rows[0])))
        lines.append("")
    for title, rows, case_col, metric, unit in (
        ("Compute", got.compute, "gemm", "tflops", "TFLOP/s per GPU"),
        ("Memory", got.memory, "kernel", "gbs", "GB/s per GPU"),
    ):
        for case in dict.fromkeys(str(r[case_col]) for r in rows):
            text, left = per_gpu_grid(rows, case_col, case, metric)
            lines += [f"## {title}: {case} ({unit})", "", text]
            if left:
                lines.append(f"\n… {left} more nodes in the CSV (the {MAX_ROWS} slowest are shown)")
            lines.append("")
    hot = [r for r in got.telemetry if r.get("phase") == "after" and r.get("source")]
    if hot:
        clocks = [float(r["sm_clock_mhz"]) for r in hot if r.get("sm_clock_mhz") is not None]
        temps = [float(r["temperature_c"]) for r in hot if r.get("temperature_c") is not None]
        lines += ["## Telemetry after the compute check", ""]
        if clocks:
            lines.append(f"SM clock {min(clocks):.0f}–{max(clocks):.0f} MHz over {len(clocks)} GPUs; ")
        if temps:
            lines.append(f"temperature {min(temps):.0f}–{max(temps):.0f} °C.")
        flagged = [r for r in hot if r.get("throttle_flagged")]
        if flagged:
            lines += [
                "",
                _table(
                    [[r["node"], r["local_rank"], r["throttle_flagged"]] for r in flagged], ["node", "gpu", "throttle"]
                ),
            ]
        lines.append("")
    if got.comm:
        lines += ["## Collectives (time = the slowest rank's median; busbw from it)", ""]
        comm = got.comm[: 4 * MAX_ROWS]
        lines.append(
            _table(
                [
                    [
                        r["scope"],
                        r["group"],
                        r["collective"],
                        r["size_bytes"],
                        r.get("busbw_gbs"),
                        r.get("pct_of_link_peak"),
                        r.get("slowest_rank"),
                        r.get("rank_spread_us"),
                        "yes" if r.get("outlier") else "",
                        r["status"],
                    ]
                    for r in comm
                ],
                [
                    "scope",
                    "group",
                    "collective",
                    "size (B)",
                    "busbw (GB/s)",
                    "% of link",
                    "slowest rank",
                    "rank spread (µs)",
                    "outlier",
                    "status",
                ],
            )
        )
        if len(got.comm) > len(comm):
            lines.append(f"\n… {len(got.comm) - len(comm)} more rows in cluster_comm.csv")
        lines.append("")
    for (scope, size), matrix in got.pairs.items():
        labels = got.pair_labels[scope]
        title = "node → node" if scope == "inter" else "GPU → GPU inside each node"
        lines += [f"## Pairs, {title}: GB/s per GPU at {size} B", ""]
        if len(labels) <= MAX_MATRIX:
            lines.append(matrix_table(matrix, labels))
        else:
            worst = sorted((r for r in got.pair_rows if r["scope"] == scope), key=lambda r: r["gbs_per_gpu"])[:MAX_ROWS]
            lines.append(
                _table([[r["src"], r["dst"], r["gbs_per_gpu"]] for r in worst], ["src", "dst", "GB/s per GPU"])
            )
            lines.append(
                f"\n({len(labels)} members: the {len(worst)} slowest pairs; the matrix is in cluster_pairs.csv)"
            )
        lines.append("")
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    write_file(path, "\n".join(lines).encode("utf-8"))  # a FIFO or a link there is replaced, not written through
    return "\n".join(head)
