"""Assemble report.md: environment, one section per benchmark (tables, plots, rows not measured), skipped files.

Tables are GitHub-flavoured markdown from tabulate; every cell is formatted by ``tables.cell`` so a missing
value is an empty cell, never a zero. Every value read from a CSV, a sidecar or a file name goes through
``inert`` (escaped, credentials masked) before it is written; only this module's own words are markup.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
from tabulate import tabulate

import opbench
from opbench.core.cli import MAX_WORLD

from . import inert
from .discover import Discovery
from .plots import Plot
from .regress import Regressions
from .tables import SPECS, Section, Table, cell

ENV_COLUMNS = ("file", "benchmark", "device", "accelerator stack", "torch", "opbench", "host", "ranks", "utc_time")


def markdown_table(frame: pd.DataFrame) -> str:
    """Numbers right-aligned, text left; cells formatted by ``cell``."""
    rows = [[inert.text(cell(v)) for v in row] for row in frame.itertuples(index=False, name=None)]
    align = [
        "right" if pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c]) else "left"
        for c in frame.columns
    ]
    return tabulate(
        rows, headers=[inert.text(c) for c in frame.columns], tablefmt="github", disable_numparse=True, colalign=align
    )


MAX_ENV_TEXT = 80  # characters of one sidecar value in the Environment table (versions, host and device names)
MAX_EPOCH_S = 253402300799  # 9999-12-31: a utc_time given as seconds since 1970 beyond it is not a time


def env_text(value: object) -> str:
    """A sidecar's value for one Environment cell: text cut to MAX_ENV_TEXT characters; a finite number as
    ``cell`` writes it; '' for a missing value; '?' for anything else (inf, a list, an object)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value if len(value) <= MAX_ENV_TEXT else value[: MAX_ENV_TEXT - 1] + "…"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, int) and abs(value) >= 10**15:
            return "?"  # no version, host or time is a 16-digit integer (and thousands of digits would not print)
        return cell(value) if math.isfinite(value) else "?"
    return "?"


def env_ranks(value: object) -> str:
    """A sidecar's world size: a whole number of ranks from 1 to core.limits.MAX_WORLD (as --world-size takes),
    given as a number or as ASCII digits; '' when missing, '?' for anything else."""
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        text = value.strip()
        if not (text.isascii() and text.isdigit() and len(text) <= 8):
            return "?"
        value = int(text)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_WORLD:
        return str(value)
    return "?"


def env_time(value: object) -> str:
    """A sidecar's utc_time: its ISO text (cut short), or seconds since 1970 written as ISO UTC time; '?' for a
    number out of range (1e999 reads as inf) or anything else."""
    if value is None or isinstance(value, str):
        return env_text(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= MAX_EPOCH_S:
        when = datetime.datetime.fromtimestamp(float(value), datetime.timezone.utc)
        return when.isoformat(timespec="seconds")
    return "?"


def _stack(meta: dict[str, Any]) -> str:
    if meta.get("hip"):
        return f"ROCm/HIP {env_text(meta['hip'])}"
    if meta.get("cuda") and meta.get("device_kind") != "cpu":
        return f"CUDA {env_text(meta['cuda'])}"
    return "CPU" if meta.get("device_kind") == "cpu" or "torch" in meta else ""


def environment_frame(found: Discovery) -> pd.DataFrame:
    """One row per CSV from its sidecar; every value bounded (env_text, env_ranks, env_time): a sidecar can come
    from anyone, and a 5000-digit world size or an infinite time is not an environment."""
    rows = []
    for f in found.files:
        m = f.meta
        rows.append(
            {
                "file": f.rel,
                "benchmark": f.kind.title,
                "device": env_text(m.get("device_name")),
                "accelerator stack": _stack(m),
                "torch": env_text(m.get("torch")),
                "opbench": env_text(m.get("opbench")),
                "host": env_text(m.get("host")),
                "ranks": env_ranks(m.get("world_size", m.get("WORLD_SIZE"))),
                "utc_time": env_time(m.get("utc_time")),
            }
        )
    return pd.DataFrame(rows, columns=list(ENV_COLUMNS))


def environment_md(found: Discovery, heading: str) -> list[str]:
    out = [f"## {heading}", "", markdown_table(environment_frame(found).fillna("")), ""]
    commands = [(f.rel, f.meta["command"]) for f in found.files if f.meta.get("command")]
    no_meta = [f.rel for f in found.files if not f.meta]
    if commands:  # one fenced block, each command under a comment naming its CSV; fence longer than any inside
        lines = [line for rel, cmd in commands for line in (f"# {rel}", str(cmd))]
        out += ["Commands:", "", *inert.code_block(lines, "sh"), ""]
    if no_meta:
        out += ["No sidecar (the CSV's `.meta.json`) for: " + ", ".join(inert.code(r) for r in no_meta), ""]
    return out


def regressions_md(found: Regressions, top: int | None = 40) -> list[str]:
    """The --compare summary that opens the report: which timings got slower beyond both runs' spread."""
    out = ["## Regressions: slower beyond their spread", ""]
    if not found.kinds:
        return out + [
            "No timings with a spread in both runs to compare (GEMM, attention and collectives have one).",
            "",
        ]
    out += [
        f"Compared {found.compared} timing(s) found in both runs ({', '.join(found.kinds)}): "
        f"{len(found.slower)} slower beyond their spread, {found.faster} faster beyond it, {found.within} within it"
        + (f"; {found.unjudged} without a recorded spread in one run, not judged" if found.unjudged else "")
        + ". A timing is slower beyond its spread when this run's fast end (p10, or the fastest trial) is slower "
        "than the other run's slow end (p90, or the slowest trial): the bands do not overlap. slower_x is this "
        "run's median / the other's.",
        "",
    ]
    if found.slower.empty:
        return out + ["No regressions.", ""]
    shown = found.slower.head(top) if top else found.slower
    return out + table_md(Table(None, shown, len(found.slower) - len(shown)))


def table_md(table: Table, level: str = "###") -> list[str]:
    out = [f"{level} {inert.text(table.title)}", ""] if table.title else []
    out += [markdown_table(table.frame), ""]
    if table.hidden:
        out += [f"… {table.hidden} more row(s) in the CSV (raise `--top` to show them).", ""]
    return out


def failed_md(section: Section) -> list[str]:
    failed = section.failed
    if failed.empty:
        return []
    counts = ", ".join(f"{inert.text(status)}: {n}" for status, n in failed["status"].value_counts().items())
    return [
        f"### Rows not measured ({len(failed)}: {counts})",
        "",
        markdown_table(failed.drop(columns=["file"], errors="ignore")),
        "",
    ]


def plot_md(plot: Plot, missing: dict[str, str]) -> list[str]:
    """An embedded image, or a line naming the plot and why it is not there."""
    if plot.filename in missing:
        why = inert.text(missing[plot.filename])
        return [f"Plot not made: {inert.code(plot.filename)} ({inert.text(plot.title)}): {why}", ""]
    return [f"![{inert.text(plot.title)}]({plot.filename})", ""]  # filename: plots._safe, [A-Za-z0-9._-] only


def section_md(section: Section, planned: Sequence[Plot], missing: dict[str, str], about: str) -> list[str]:
    """Title, files, what the order means, notes, each table with its plot, other plots, rows not measured."""
    out = [f"## {section.kind.title}", "", "Files: " + ", ".join(inert.code(r) for r in section.files), ""]
    out += [line for text in (about, *section.notes) if text for line in (inert.text(text), "")]
    mine = [p for p in planned if p.kind == section.kind.benchmark]
    for table in section.tables:
        out += table_md(table)
        out += [line for p in mine if p.group is not None and p.group == table.title for line in plot_md(p, missing)]
    out += [
        line
        for p in mine
        if p.group is None or p.group not in {t.title for t in section.tables}
        for line in plot_md(p, missing)
    ]
    out += failed_md(section)
    return out


def report_markdown(
    found: Discovery,
    sections: Sequence[Section],
    planned: Sequence[Plot],
    missing: dict[str, str],
    other: Discovery | None = None,
    regressions: Regressions | None = None,
    top: int | None = 40,
) -> str:
    out = [
        "# opbench report",
        "",
        f"Results: {inert.code(found.root)} ({len(found.files)} CSV file(s)); written by opbench "
        f"{opbench.__version__}.",
        "",
    ]
    if other is not None:
        out += [
            f"Compared with: {inert.code(other.root)} ({len(other.files)} CSV file(s)). Ratio columns are "
            "this run / the other run, matched on each table's identifying columns; `_other` columns are "
            "the other run's values.",
            "",
        ]
    if regressions is not None:
        out += regressions_md(regressions, top)
    out += environment_md(found, "Environment")
    if other is not None:
        out += environment_md(other, "Environment of the compared run")
    for section in sections:
        out += section_md(section, planned, missing, SPECS[section.kind.benchmark].about)
    if missing:
        out += ["## Plots not made", ""]
        titles = {p.filename: p.title for p in planned}
        out += [
            f"- {inert.code(name)} ({inert.text(titles.get(name, ''))}): {inert.text(why)}"
            for name, why in missing.items()
        ] + [""]
    for heading, listed in (("Rows left out", found.damaged), ("Skipped files", found.skipped)):
        if listed:
            out += [f"## {heading}", ""] + [f"- {inert.code(rel)}: {inert.text(why)}" for rel, why in listed] + [""]
    return "\n".join(out).rstrip() + "\n"
