"""Find the opbench CSVs in a results folder and tell which benchmark wrote each one.

A CSV is identified by its header (the contract columns each benchmark promises), not by its file name:
users pick names for attention, FSDP, trace and nccl-tests CSVs. When several kinds fit, the one whose
signature is largest (most specific) wins and the file-name hint breaks ties. Anything else is listed as
skipped with the reason, never silently ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from opbench.core.errors import UsageError
from opbench.core.report import sidecar_path


@dataclass(frozen=True)
class Kind:
    """One benchmark's CSV: the columns that identify it and a file-name hint."""

    name: str
    title: str
    signature: frozenset[str]
    hint: str = ""            # regex on the file name, only used to break ties

    def matches(self, columns: set[str]) -> bool:
        return self.signature <= columns


def _kind(name: str, title: str, columns: str, hint: str = "") -> Kind:
    return Kind(name, title, frozenset(columns.split()), hint)


# Signatures use the issue contracts' column names (which the benchmarks must keep).
KINDS: dict[str, Kind] = {k.name: k for k in (
    _kind("gemm", "GEMM", "model layer pass m n k groups backend time_s tflops pct_of_peak status",
          r"^benchmark_gemm_"),
    _kind("attention", "Attention", "seqlen_q seqlen_kv num_head_q num_head_kv head_dim_qk head_dim_v backend "
          "fwd_time fwd_tflops bwd_time bwd_tflops status", r"attn|attention"),
    _kind("comm", "Collectives", "collective backend world_size size_bytes count inplace time_us algbw_gbs busbw_gbs",
          r"_benchmark$"),
    _kind("nccl_tests", "nccl-tests / rccl-tests", "size_bytes count type oop_time_us oop_busbw_gbs ip_time_us "
          "ip_busbw_gbs", r"nccl|rccl"),
    _kind("fsdp", "FSDP collectives", "unit collective count dtype bytes_per_rank calls_per_step nccl_tests_bytes",
          r"fsdp"),
    _kind("trace", "NCCL trace summary", "op count datatype dtype redop nranks calls bytes nccl_tests_bytes",
          r"trace|nccl|sizes"),
    _kind("trace_per_rank", "NCCL trace per rank", "host pid device op calls bytes distinct_sizes", r"per_rank"),
    _kind("trace_per_comm", "NCCL trace per communicator", "comm nranks ranks_logged calls bytes ops", r"per_comm"),
    _kind("trace_fsdp", "NCCL trace vs FSDP model", "unit collective count calls_per_step log_calls matched",
          r"fsdp"),
    _kind("ckpt", "Checkpoint", "method storage world_size thread_count save_block_time save_total_time load_time "
          "iter_folder_size save_bandwidth_in_mbps load_bandwidth_in_mbps", r"ckpt"),
)}


@dataclass
class ResultFile:
    """One recognised CSV with its rows and its sidecar's environment (empty dict when there is none)."""

    path: Path
    rel: str
    kind: Kind
    frame: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Discovery:
    root: Path
    files: list[ResultFile]
    skipped: list[tuple[str, str]]   # (relative path, why)

    def of_kind(self, kind: str) -> list[ResultFile]:
        return [f for f in self.files if f.kind.name == kind]

    def frame(self, kind: str) -> pd.DataFrame:
        """All rows of one kind, with a ``file`` column naming where each row came from."""
        parts = [f.frame.assign(file=f.rel) for f in self.of_kind(kind) if not f.frame.empty]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def identify(columns: set[str], filename: str) -> Kind | None:
    """The most specific kind whose signature the header contains; the file-name hint breaks ties."""
    fits = [k for k in KINDS.values() if k.matches(columns)]
    if not fits:
        return None
    stem = Path(filename).stem
    return max(fits, key=lambda k: (len(k.signature), bool(k.hint and re.search(k.hint, stem))))


def read_meta(csv_path: Path) -> dict[str, Any]:
    """The sidecar's environment; a missing or unreadable sidecar is an empty dict (the CSV still counts)."""
    side = sidecar_path(csv_path)
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def discover(root: str | Path) -> Discovery:
    """Every ``*.csv`` under root (recursively), sorted by path, sorted into kinds or skipped."""
    base = Path(root)
    if not base.is_dir():
        raise UsageError("results folder does not exist" if not base.exists() else "not a folder", source=str(root))
    found = Discovery(base, [], [])
    for path in sorted(base.rglob("*.csv")):
        rel = path.relative_to(base).as_posix()
        try:
            frame = pd.read_csv(path)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, OSError) as exc:
            found.skipped.append((rel, f"unreadable CSV ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})"))
            continue
        kind = identify(set(frame.columns), path.name)
        if kind is None:
            found.skipped.append((rel, "columns match no opbench benchmark"))
            continue
        found.files.append(ResultFile(path, rel, kind, frame, read_meta(path)))
    return found


def require_results(found: Discovery) -> Discovery:
    """A report needs at least one opbench CSV; say what was there instead."""
    if not found.files:
        what = f"{len(found.skipped)} CSV(s) but none from opbench" if found.skipped else "no CSV files"
        raise UsageError(f"nothing to report: {what}", source=str(found.root))
    return found
