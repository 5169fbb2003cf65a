"""From log files to a TraceSummary: the parser's API for the CLI, the comm benchmark's
``--sizes-from-trace`` (``trace_sizes``) and callers that want every call (``iter_records``)."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from opbench.core.errors import UsageError

from .p2p import P2pGrouper, group_p2p
from .parse import CallRecord, LogParser
from .summary import TraceSummary


@dataclass(frozen=True)
class TraceSize:
    """One distinct collective size from a log, in the terms the comm benchmark takes.

    ``count`` is the per-rank NCCL count as logged (total for AllReduce/Broadcast/Reduce, per rank for
    AllGather/ReduceScatter, per peer for AlltoAll, per call for Send/Recv); convert with
    ``core.collectives.COLLECTIVES[collective].size_bytes(count, nranks, elt)`` to the nccl-tests ``-b``.
    ``redop`` is None for collectives without a reduction. ``calls`` = log lines (one per rank per call).
    """

    collective: str
    count: int
    dtype_enum: int
    nranks: int
    redop: str | None
    calls: int


def check_paths(paths: Iterable[str]) -> list[str]:
    """Every path must be '-' or a readable file; a bad one is a usage error naming it (exit 2)."""
    out = []
    for p in paths:
        if p != "-":
            if not os.path.exists(p):
                raise UsageError("no such file", source=p)
            if os.path.isdir(p):
                raise UsageError("is a directory, expected a log file", source=p)
            if not os.access(p, os.R_OK):
                raise UsageError("not readable", source=p)
        out.append(p)
    if not out:
        raise UsageError("no log file given", field="LOG")
    return out


def iter_records(parser: LogParser, paths: Sequence[str], raw_p2p: bool = False) -> Iterator[CallRecord]:
    """Every call of every log as a CallRecord, in file order; grouped Send/Recv become AlltoAll unless
    ``raw_p2p``. The API for callers that want per-call detail (``analyze`` takes a faster road)."""

    def stream() -> Iterator[CallRecord]:
        for path in check_paths(paths):
            with _reading(path):
                yield from parser.calls(path)

    return stream() if raw_p2p else group_p2p(stream())


@contextlib.contextmanager
def _reading(path: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise UsageError(f"cannot read: {exc.strerror or exc}", source=path) from None


def analyze(paths: Sequence[str], raw_p2p: bool = False) -> tuple[TraceSummary, LogParser]:
    """Parse logs into a TraceSummary: calls are tallied at regex speed; blocks with Send/Recv go through
    CallRecords so all-to-all recognition (p2p) sees them in log order."""
    parser, summary = LogParser(), TraceSummary()
    raw: Counter[tuple] = Counter()
    grouper = None if raw_p2p else P2pGrouper()

    def sink(rec: CallRecord) -> None:
        for out in grouper.feed(rec, (rec.host, rec.pid, rec.device, rec.comm)) if grouper is not None else [rec]:
            summary.add(out)

    for path in check_paths(paths):
        with _reading(path):
            parser.tally(path, raw, sink, busy=lambda: bool(grouper and grouper.open_keys))
    if grouper is not None:
        summary.extend(grouper.finish())
    summary.add_raw(raw)
    summary.rccl_fields |= parser.stats.rccl_fields
    summary.repair_hosts()
    return summary, parser


def trace_sizes(paths: list[str]) -> list[TraceSize]:
    """Distinct (collective, count, dtype, nranks, redop) in NCCL/RCCL logs, for replaying them.

    Ops with no nccl-tests collective (Gather/Scatter of NCCL 2.28) and unknown datatypes are left out.
    Sorted by collective, then count. Raises UsageError for a missing/unreadable file.
    """
    from opbench.core.dtypes import BY_ENUM

    summary, _ = analyze(paths)
    merged: dict[tuple[str, int, int, int, str | None], int] = {}
    for row in summary.summary_rows():
        if row["collective"] is None or row["datatype"] not in BY_ENUM:
            continue
        key = (row["collective"], row["count"], row["datatype"], row["nranks"], row["redop"])
        merged[key] = merged.get(key, 0) + row["calls"]  # Send and Recv rows fold into send_recv
    return [TraceSize(c, n, d, r, op, calls) for (c, n, d, r, op), calls in sorted(merged.items(), key=str)]
