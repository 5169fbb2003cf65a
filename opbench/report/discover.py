"""Find the opbench CSVs in a results folder and tell which benchmark wrote each one.

The sidecar (``<stem>.meta.json``) names the benchmark and schema version; every opbench tool writes one. A
CSV without a readable sidecar is identified by its header: the schema whose identifying columns the header
contains (the most specific one; the file-name hint breaks ties). Anything else is listed as skipped with the
reason, never silently ignored. The schemas are the benchmarks' own (``opbench/<tool>/schema.py``).
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from opbench.attention.schema import SCHEMA as ATTENTION
from opbench.ckpt.schema import SCHEMA as CKPT
from opbench.cluster.schema import COMM as CLUSTER_COMM
from opbench.cluster.schema import COMPUTE as CLUSTER_COMPUTE
from opbench.cluster.schema import MEMORY as CLUSTER_MEMORY
from opbench.cluster.schema import PAIRS as CLUSTER_PAIRS
from opbench.cluster.schema import TELEMETRY as CLUSTER_TELEMETRY
from opbench.comm.schema import SCHEMA as COMM
from opbench.core.errors import UsageError
from opbench.core.outputs import kept_aside
from opbench.core.results import sidecar_path
from opbench.core.schema import Schema
from opbench.fsdp_model.schema import SCHEMA as FSDP
from opbench.gemm.schema import SCHEMA as GEMM
from opbench.project.schema import SCHEMA as PROJECT
from opbench.project.schema import VALIDATE_SCHEMA as PROJECT_VALIDATE
from opbench.selftest.schema import SCHEMA as SELFTEST
from opbench.trace.schema import NCCL_TESTS, TRACE, TRACE_FSDP, TRACE_PER_COMM, TRACE_PER_RANK

# Report order: one section per schema, in this order.
SCHEMAS: dict[str, Schema] = {
    s.benchmark: s
    for s in (
        SELFTEST,
        GEMM,
        ATTENTION,
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
    )
}


@dataclass
class ResultFile:
    """One recognised CSV with its rows and its sidecar's environment (empty dict when there is none)."""

    path: Path
    rel: str
    kind: Schema
    frame: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    identified_by: str = "sidecar"  # "sidecar" | "header"


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


def identify(columns: set[str], filename: str) -> Schema | None:
    """From the header alone: the most specific schema whose identifying columns the header contains; the
    file-name hint breaks ties."""
    fits = [k for k in SCHEMAS.values() if k.identifying <= columns]
    if not fits:
        return None
    stem = Path(filename).stem
    return max(fits, key=lambda k: (len(k.identifying), bool(k.file_hint and re.search(k.file_hint, stem))))


def read_meta(csv_path: Path) -> dict[str, Any]:
    """The sidecar's environment; a missing or unreadable sidecar is an empty dict (the CSV still counts)."""
    side = sidecar_path(csv_path)
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested too deeply to be a sidecar
        return {}
    return meta if isinstance(meta, dict) else {}


# Columns that hold numbers in every schema that has them (besides each schema's metric and unit columns).
NUMERIC = frozenset({"size_bytes", "count", "m", "n", "k", "mbs", "world_size", "nranks", "iters", "nnodes", "calls"})


def drop_garbage(frame: pd.DataFrame, kind: Schema) -> tuple[pd.DataFrame, int]:
    """Rows whose number columns hold text ('huge' as a size) are left out, not turned into a crash later."""
    numeric = [c for c in frame.columns if c in NUMERIC or c in kind.metrics or c in kind.units]
    bad = pd.Series(False, index=frame.index)
    for col in numeric:
        if not pd.api.types.is_numeric_dtype(frame[col]) and not pd.api.types.is_bool_dtype(frame[col]):
            as_num = pd.to_numeric(frame[col], errors="coerce")
            bad |= as_num.isna() & frame[col].notna()
            frame[col] = as_num
    return (frame[~bad].reset_index(drop=True), int(bad.sum())) if bad.any() else (frame, 0)


def malformed_rows(path: Path) -> list[int]:
    """0-based line numbers (as pandas' skiprows counts them; the header is 0) of rows whose field count differs
    from the header's: a row cut short by a failed write must not be read as a row with empty cells."""
    bad: list[int] = []
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            return bad
        for row in reader:
            if row and len(row) != len(header):
                bad.append(reader.line_num - 1)
    return bad


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
            short = malformed_rows(path)
            frame = pd.read_csv(path, skiprows=short or None)
            if short:
                found.damaged.append(
                    (
                        rel,
                        f"{len(short)} row(s) with the wrong number of fields left out (line "
                        + ", ".join(str(i + 1) for i in short[:5])  # skiprows counts from 0, editors from 1
                        + (", …" if len(short) > 5 else "")
                        + "; a write cut short?)",
                    )
                )
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, OSError, csv.Error) as exc:
            found.skipped.append((rel, f"unreadable CSV ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})"))
            continue
        frame = frame.rename(columns=OLD_NAMES)  # CSVs written before a column was renamed (Schema.aliases)
        meta = read_meta(path)
        kind = SCHEMAS.get(str(meta.get("benchmark")))
        how = "sidecar"
        if kind is None:
            kind, how = identify(set(frame.columns), path.name), "header"
        if kind is None:
            found.skipped.append((rel, "columns match no opbench benchmark"))
            continue
        frame, garbage = drop_garbage(frame, kind)
        if garbage:
            found.damaged.append((rel, f"{garbage} row(s) with text where a number belongs left out"))
        found.files.append(ResultFile(path, rel, kind, frame, meta, how))
    return found


def require_results(found: Discovery) -> Discovery:
    """A report needs at least one opbench CSV; say what was there instead."""
    if not found.files:
        what = f"{len(found.skipped)} CSV(s) but none from opbench" if found.skipped else "no CSV files"
        raise UsageError(f"nothing to report: {what}", source=str(found.root))
    return found
