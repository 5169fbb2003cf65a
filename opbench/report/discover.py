"""Find the opbench CSVs in a results folder and tell which benchmark wrote each one.

The sidecar (``<stem>.meta.json``) names the benchmark and schema version; every opbench tool writes one. A
CSV without a readable sidecar is identified by its header: the schema whose identifying columns the header
contains (the most specific one; the file-name hint breaks ties). Anything else is listed as skipped with the
reason, never silently ignored. The schemas are the benchmarks' own (``opbench/<tool>/schema.py``).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from opbench.attention.schema import SCHEMA as ATTENTION
from opbench.ckpt.schema import SCHEMA as CKPT
from opbench.cluster.schema import COMM as CLUSTER_COMM
from opbench.cluster.schema import COMPUTE as CLUSTER_COMPUTE
from opbench.cluster.schema import MEMORY as CLUSTER_MEMORY
from opbench.cluster.schema import PAIRS as CLUSTER_PAIRS
from opbench.cluster.schema import TELEMETRY as CLUSTER_TELEMETRY
from opbench.comm.schema import SCHEMA as COMM
from opbench.core.errors import UsageError, describe_os_error
from opbench.core.outputs import kept_aside
from opbench.core.plausible import KINDS, Kind
from opbench.core.results import sidecar_path
from opbench.core.schema import Schema
from opbench.fsdp_model.schema import SCHEMA as FSDP
from opbench.gemm.schema import SCHEMA as GEMM
from opbench.moe.schema import SCHEMA as MOE
from opbench.project.schema import SCHEMA as PROJECT
from opbench.project.schema import VALIDATE_SCHEMA as PROJECT_VALIDATE
from opbench.selftest.schema import SCHEMA as SELFTEST
from opbench.steptrace.schema import ITEMS as STEP_ITEMS
from opbench.steptrace.schema import KERNELS as STEP_KERNELS
from opbench.steptrace.schema import TIMELINE as STEP_TIMELINE
from opbench.trace.schema import NCCL_TESTS, TRACE, TRACE_FSDP, TRACE_PER_COMM, TRACE_PER_RANK

# Report order: one section per schema, in this order.
SCHEMAS: dict[str, Schema] = {
    s.benchmark: s
    for s in (
        SELFTEST,
        GEMM,
        ATTENTION,
        MOE,
        COMM,
        NCCL_TESTS,
        FSDP,
        TRACE,
        TRACE_PER_RANK,
        TRACE_PER_COMM,
        TRACE_FSDP,
        CKPT,
        CLUSTER_COMPUTE,
        CLUSTER_MEMORY,
        CLUSTER_TELEMETRY,
        CLUSTER_COMM,
        CLUSTER_PAIRS,
        PROJECT,
        PROJECT_VALIDATE,
        STEP_ITEMS,
        STEP_KERNELS,
        STEP_TIMELINE,
    )
}


@dataclass(frozen=True)
class Dropped:
    """One row left out of a CSV for a bad number: where it was and why (for a note naming file:line and field)."""

    line: int | None  # the line an editor shows (from 1); None when it could not be told
    field: str
    why: str  # TEXT | INFINITE | IMPLAUSIBLE | CUT (a row with the wrong number of fields: no field)
    value: str  # the cell, quoted and cut short: 'huge'
    rule: str = ""  # IMPLAUSIBLE: the range the cell's kind of quantity falls in (core.plausible.Kind.rule)

    def detail(self) -> str:
        """The cell and, for an implausible one, its rule: "'-5' (a memory size: at least 0 B and at most 1 PiB)"."""
        return f"{self.value} ({self.rule})" if self.rule else self.value


@dataclass
class ResultFile:
    """One recognised CSV with its rows and its sidecar's environment (empty dict when there is none)."""

    path: Path
    rel: str
    kind: Schema
    frame: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    identified_by: str = "sidecar"  # "sidecar" | "header"
    lines: list[int] | None = None  # the file line (from 1) of each row of ``frame``
    dropped: list[Dropped] = field(default_factory=list)  # rows left out: cut short, or a bad number


@dataclass
class Discovery:
    root: Path
    files: list[ResultFile]
    skipped: list[tuple[str, str]]  # (relative path, why)
    damaged: list[tuple[str, str]] = field(default_factory=list)  # (relative path, rows left out and why)

    def of_kind(self, kind: str) -> list[ResultFile]:
        return [f for f in self.files if f.kind.benchmark == kind]

    def frame(self, kind: str) -> pd.DataFrame:
        """All rows of one kind, with a ``file`` column naming where each row came from."""
        parts = [f.frame.assign(file=f.rel) for f in self.of_kind(kind) if not f.frame.empty]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


# Every schema's old column names -> current ones.
OLD_NAMES = {old: new for kind in SCHEMAS.values() for old, new in kind.aliases.items()}


# Columns the report reads from each kind's rows without checking for them (tables.DERIVE, the plots): a CSV
# without one of them is skipped with the reason, never read into a KeyError. Other columns may be missing.
NEEDS: dict[str, tuple[str, ...]] = {
    "gemm": ("model", "layer", "pass", "time_s"),
    # the model, backend and the shape keys the table joins in pairs ('seqlen q/kv'): tables._derive_attention
    "attention": tuple(
        k for k in ATTENTION.keys if k.startswith(("model", "backend", "seqlen", "num_head", "head_dim"))
    ),
    "moe": ("model", "routing", "backend", "phase", "pass", "time_s"),
    "comm": ("collective", "backend", "dtype", "inplace", "size_bytes", "busbw_gbs"),
    "nccl_tests": ("type", "size_bytes", "ip_busbw_gbs", "oop_busbw_gbs"),
    "fsdp": ("unit", "calls_per_step"),
    "step": ("trace", "rank", "item", "measured_s"),  # plots._draw_step
    "step_timeline": ("trace", "rank", "lane", "class", "start_s", "end_s"),  # plots.timeline_bars
    "ckpt": ("storage", "method", "save_bandwidth_mib_per_s", "load_bandwidth_mib_per_s"),
    "cluster_compute": ("gemm", "dtype", "node", "local_rank", "m", "n", "k", "tflops", "time_s"),
    "cluster_memory": ("time_s",),
    "cluster_pairs": ("scope", "size_bytes", "src", "dst", "gbs_per_gpu"),
    "project": ("model", "layout"),
}


def missing_needs(kind: Schema, columns: pd.Index) -> list[str]:
    """The columns this kind's report needs that the CSV does not have (NEEDS), in NEEDS order."""
    return [c for c in NEEDS.get(kind.benchmark, ()) if c not in columns]


def identify(columns: set[str], filename: str) -> Schema | None:
    """From the header alone: the most specific schema whose identifying columns the header contains; the
    file-name hint breaks ties."""
    fits = [k for k in SCHEMAS.values() if k.identifying <= columns]
    if not fits:
        return None
    stem = Path(filename).stem
    return max(fits, key=lambda k: (len(k.identifying), bool(k.file_hint and re.search(k.file_hint, stem))))


MAX_SIDECAR = 16 << 20  # a sidecar holds an environment and a command line: kilobytes; a larger one is not read
MAX_CSV = 1 << 30  # opbench's CSVs hold at most tens of MB (trace tables); a larger file is not read into memory

_NOT_REGULAR = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a named pipe",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _size_text(nbytes: int) -> str:
    return f"{nbytes >> 30} GiB" if nbytes >= 1 << 30 else f"{nbytes >> 20} MiB"


def open_regular(path: Path, cap: int) -> tuple[IO[bytes] | None, str | None]:
    """``path`` opened for binary reading when it is (or links to) a regular file of at most ``cap`` bytes; else
    None and why not. A named pipe would block a reader forever and a device (/dev/zero) never ends: the type is
    checked before opening (stat follows links) and again on the open file, which is opened without blocking."""
    try:
        before = os.stat(path)
        if stat.S_ISREG(before.st_mode):
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            st = os.fstat(fd)
        else:
            fd, st = -1, before
    except OSError as exc:
        return None, f"unreadable ({describe_os_error(exc)})"
    if not stat.S_ISREG(st.st_mode):
        if fd >= 0:
            os.close(fd)
        return None, f"not a regular file ({_NOT_REGULAR.get(stat.S_IFMT(st.st_mode), 'not a file')}): not read"
    if st.st_size > cap:
        os.close(fd)
        return None, f"larger than {_size_text(cap)} ({_size_text(st.st_size)}): not read"
    return os.fdopen(fd, "rb"), None


def read_meta(csv_path: Path) -> tuple[dict[str, Any], str | None]:
    """The sidecar's environment; a missing or unreadable sidecar is an empty dict (the CSV still counts). The
    second value says why a sidecar that is there was not read (not a regular file, over MAX_SIDECAR), else None."""
    side = sidecar_path(csv_path)
    if not os.path.lexists(side):
        return {}, None
    fh, why = open_regular(side, MAX_SIDECAR)
    if fh is None:
        return {}, why
    try:
        with fh:
            raw = fh.read(MAX_SIDECAR + 1)  # a file that grew after the check is still read no further
        if len(raw) > MAX_SIDECAR:
            return {}, f"larger than {_size_text(MAX_SIDECAR)}: not read"
        meta = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested too deeply to be a sidecar
        return {}, None
    return (meta, None) if isinstance(meta, dict) else ({}, None)


# Columns that hold numbers in every schema that has them (besides each schema's metric and unit columns).
NUMERIC = frozenset({"size_bytes", "count", "m", "n", "k", "mbs", "world_size", "nranks", "iters", "nnodes", "calls"})


TEXT, INFINITE, CUT = "text where a number belongs", "a number that is not finite", "the wrong number of fields"
IMPLAUSIBLE = "a value outside its plausible range"


def plausibility(kind: Schema, column: str) -> tuple[Kind, float] | None:
    """The column's kind of quantity (docs/conventions.md, "Plausible numbers") and the factor to its base unit: as
    the schema declares it, else a count for the NUMERIC columns no schema gives a unit (m, n, k, ranks)."""
    declared = kind.plausible(column)
    if declared is None and column in NUMERIC:
        return KINDS["count"], 1.0
    return declared


def _shown(value: object) -> str:
    text = str(value)
    return repr(text if len(text) <= 20 else text[:19] + "…")


def _number(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError:  # an integer of hundreds of digits: beyond any float, so out of every range
        return math.inf if value > 0 else -math.inf  # type: ignore[operator]
    except (TypeError, ValueError):
        return math.nan


def as_numbers(column: pd.Series) -> pd.Series:
    """``pd.to_numeric(errors='coerce')`` that also takes the Python ints pandas keeps for a 20+-digit cell: one
    beyond any float is ±inf (to_numeric raises OverflowError on it, coerce or not)."""
    try:
        return pd.to_numeric(column, errors="coerce")
    except OverflowError:
        return pd.Series(
            [_number(v) if isinstance(v, int) else _number(pd.to_numeric(v, errors="coerce")) for v in column],
            index=column.index,
            dtype=float,
        )


def drop_garbage(
    frame: pd.DataFrame, kind: Schema, lines: list[int] | None = None
) -> tuple[pd.DataFrame, list[Dropped]]:
    """Rows whose number columns hold text ('huge' as a size) or an infinite number are left out, not turned into
    a crash or an 'inf' later; so are measured rows (status ok, or no status column) with a number outside its
    kind's plausible range (a step of 1e300 s, -5 GiB: docs/conventions.md, "Plausible numbers"). Each is returned
    with its line (from ``lines``, one per row) and first bad field."""
    numeric = [c for c in frame.columns if c in NUMERIC or c in kind.metrics or c in kind.units or c in kind.kinds]
    why = pd.Series("", index=frame.index, dtype=object)
    where = pd.Series("", index=frame.index, dtype=object)
    shown = pd.Series("", index=frame.index, dtype=object)
    rule = pd.Series("", index=frame.index, dtype=object)
    # rows not measured (failed, planned, implausible) show no numbers: only their keys, status and error
    measured = (
        frame["status"].astype(str) == "ok" if "status" in frame else pd.Series(True, index=frame.index, dtype=bool)
    )
    for col in numeric:
        if pd.api.types.is_bool_dtype(frame[col]):
            continue
        cells = frame[col]  # as written, for the note
        if not pd.api.types.is_numeric_dtype(frame[col]):
            as_num = as_numbers(frame[col])
            text = as_num.isna() & frame[col].notna() & (why == "")
            why[text] = TEXT
            where[text] = col
            shown[text] = frame[col][text].map(_shown)
            frame[col] = as_num
        values = frame[col].to_numpy(dtype=float, na_value=np.nan)
        infinite = pd.Series(np.isinf(values), index=frame.index)
        infinite &= why == ""
        why[infinite] = INFINITE
        where[infinite] = col
        shown[infinite] = cells[infinite].map(_shown)
        found = plausibility(kind, col)
        if found is None:
            continue
        k, scale = found
        scaled = values * scale
        low_ok = scaled > k.low if k.open_low else scaled >= k.low
        inside = pd.Series(np.isnan(scaled) | (low_ok & (scaled <= k.high)), index=frame.index)
        outside = ~inside & measured & (why == "")
        why[outside] = IMPLAUSIBLE
        where[outside] = col
        shown[outside] = cells[outside].map(_shown)
        rule[outside] = k.rule
    bad = why != ""
    if not bad.any():
        return frame, []
    dropped = [
        Dropped(lines[i] if lines is not None else None, where.iloc[i], why.iloc[i], shown.iloc[i], rule.iloc[i])
        for i in range(len(frame))
        if bad.iloc[i]
    ]
    if lines is not None:
        lines[:] = [n for n, b in zip(lines, bad.tolist()) if not b]
    return frame[~bad].reset_index(drop=True), dropped


def dropped_note(dropped: list[Dropped]) -> str:
    """'2 row(s) with text where a number belongs left out (line 3 field 'm': 'huge'; line 7 …)'; rows set aside
    for an implausible value say so: '1 row(s) with a value outside its plausible range set aside (line 2 field
    'step_time_s': '1e+300' (a time: more than 0 s and at most 1 year))'."""
    kinds = sorted({d.why for d in dropped}, reverse=True)  # text first, as the line always said
    first = "; ".join(
        (f"line {d.line} " if d.line is not None else "") + f"field '{d.field}': {d.detail()}" for d in dropped[:3]
    )
    verb = "set aside" if kinds == [IMPLAUSIBLE] else "left out"
    return f"{len(dropped)} row(s) with {' or '.join(kinds)} {verb} ({first}" + ("; …)" if len(dropped) > 3 else ")")


class Rows:
    """The rows of one results CSV as Python's csv module splits them (docs/report.md, "What the report trusts"):
    a line ends at \\n, \\r\\n or a lone \\r outside quotes, everywhere (report and project --results read through
    this one path). Rows whose field count is not the header's are left out and counted by the line they start
    on; the others are kept re-written in one dialect, so pandas reads exactly these rows (it splits lines by
    rules of its own, and a row wider than its header became a row index thousands of levels deep). Time and
    memory are linear in the file and bounded per row: a row costs its own fields and is dropped as soon as its
    width is wrong, and a line longer than any row of the header's width can be (each field at most the csv
    module's field_size_limit) is not split into fields at all: it is one row of the wrong width."""

    def __init__(self, text: IO[str]) -> None:
        self.cut: list[int] = []  # the line (from 1) each row of the wrong width starts on
        self.lines: list[int] = []  # the line (from 1) each kept row starts on
        self.clean = io.StringIO()
        self.longest = 0  # characters of a line before the header is known: no bound yet
        reader = csv.reader(self._bounded(text))
        header = next((row for row in reader if row), None)  # blank lines before it are no header
        if header is None:
            raise pd.errors.EmptyDataError("No columns to parse from file")
        self.longest = (len(header) + 1) * (csv.field_size_limit() + 3)  # quotes and a delimiter a field
        writer = csv.writer(self.clean, lineterminator="\r\n")  # \r\n: a field holding \r or \n is quoted
        writer.writerow(header)
        start = reader.line_num + 1
        for row in reader:
            if row and len(row) != len(header):
                self.cut.append(start)
            elif row:
                writer.writerow(row)
                self.lines.append(start)
            start = reader.line_num + 1
        self.clean.seek(0)

    def _bounded(self, text: IO[str]) -> Iterator[str]:
        """The file's lines, each longer than ``longest`` replaced by one field (a row of the wrong width, on the
        same line): thousands of fields are never made from it."""
        for line in text:
            yield line if not self.longest or len(line) <= self.longest else "\x00\n"


def read_rows(path: Path) -> tuple[pd.DataFrame, list[int], list[int]]:
    """The CSV's rows (read from a regular file of at most MAX_CSV bytes: ``open_regular``), the lines (from 1) of
    the rows left out for a wrong field count, and the file line (from 1) of each row read (``Rows``)."""
    raw, why = open_regular(path, MAX_CSV)
    if raw is None:
        raise _NotRead(why or "not read")
    with raw:
        rows = Rows(io.TextIOWrapper(raw, encoding="utf-8-sig", newline=""))  # -sig: a BOM is no header text
    frame = pd.read_csv(rows.clean, low_memory=False)  # low_memory: no DtypeWarning on a long mixed column
    if len(frame) != len(rows.lines):  # every row written is one record: pandas cannot disagree
        raise pd.errors.ParserError(f"{len(frame)} rows read where {len(rows.lines)} were written")
    return frame, rows.cut, rows.lines


class _NotRead(Exception):
    """A path discovery does not read (not a regular file, too large); the message says why."""


def discover(root: str | Path) -> Discovery:
    """Every ``*.csv`` under root (recursively), sorted by path, sorted into kinds or skipped."""
    base = Path(root)
    if not base.is_dir():
        raise UsageError("results folder does not exist" if not base.exists() else "not a folder", source=str(root))
    found = Discovery(base, [], [])
    for path in sorted(base.rglob("*.csv")):
        rel = path.relative_to(base).as_posix()
        aside = kept_aside(rel)  # an earlier run's CSV under earlier/, a dry run's plan: not this run's rows
        if aside:
            found.skipped.append((rel, aside))
            continue
        try:
            frame, short, lines = read_rows(path)
            if short:
                found.damaged.append(
                    (
                        rel,
                        f"{len(short)} row(s) with the wrong number of fields left out (line "
                        + ", ".join(str(i) for i in short[:5])
                        + (", …" if len(short) > 5 else "")
                        + "; a write cut short?)",
                    )
                )
        except _NotRead as exc:
            found.skipped.append((rel, str(exc)))
            continue
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, OSError, csv.Error) as exc:
            found.skipped.append(
                (rel, f"unreadable CSV ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:80]})")
            )
            continue
        frame = frame.rename(columns=OLD_NAMES)  # CSVs written before a column was renamed (Schema.aliases)
        meta, meta_why = read_meta(path)
        if meta_why:
            found.skipped.append((sidecar_path(path).relative_to(base).as_posix(), f"sidecar {meta_why}"))
        kind = SCHEMAS.get(str(meta.get("benchmark")))
        how = "sidecar"
        if kind is None:
            kind, how = identify(set(frame.columns), path.name), "header"
        if kind is None:
            found.skipped.append((rel, "columns match no opbench benchmark"))
            continue
        lacking = missing_needs(kind, frame.columns)
        if lacking:
            whose = "the sidecar's benchmark" if how == "sidecar" else f"benchmark {kind.benchmark}"
            found.skipped.append((rel, f"columns do not match {whose} (missing {', '.join(lacking)})"))
            continue
        frame, dropped = drop_garbage(frame, kind, lines)
        if dropped:
            found.damaged.append((rel, dropped_note(dropped)))
        cut = [Dropped(i, "", CUT, "") for i in short]
        found.files.append(ResultFile(path, rel, kind, frame, meta, how, lines, cut + dropped))
    return found


def require_results(found: Discovery) -> Discovery:
    """A report needs at least one opbench CSV; say what was there instead."""
    if not found.files:
        what = f"{len(found.skipped)} CSV(s) but none from opbench" if found.skipped else "no CSV files"
        if found.skipped:  # why each was skipped (the first few): 'columns do not match …' is not 'not opbench'
            from .inert import one_line

            reasons = "; ".join(f"{one_line(rel)}: {one_line(why)}" for rel, why in found.skipped[:3])
            what += f" that can be read ({reasons}" + ("; …)" if len(found.skipped) > 3 else ")")
        raise UsageError(f"nothing to report: {what}", source=str(found.root))
    return found
