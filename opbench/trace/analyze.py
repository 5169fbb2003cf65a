"""From log files to a TraceSummary: the parser's API for the CLI, the comm benchmark's
``--sizes-from-trace`` (``trace_sizes``) and callers that want every call (``iter_records``)."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from opbench.core.errors import UsageError

from .p2p import GROUPED_NOTE, Group, P2pGrouper, group_p2p, merged_record
from .parse import P2P_OPS, CallRecord, LineKey, LogParser, record_from_line
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


class _Tally:
    """The LineSink behind ``analyze``: LINE matches are counted as raw tuples (``Counter.update``: no Python
    per call) and parsed once per distinct tuple at the end; Send/Recv go through the P2pGrouper, and a group
    of lines that is an all-to-all is counted as one LineKey (op AlltoAll/AlltoAllv, its count) in ``merged``."""

    def __init__(self, summary: TraceSummary, raw_p2p: bool) -> None:
        self.summary = summary
        self.raw: Counter[LineKey] = Counter()
        self.merged: Counter[LineKey] = Counter()
        self.grouper = None if raw_p2p else P2pGrouper(self._emit, self.raw, self.merged)
        self.unmerged: list[LineKey] = []  # Send/Recv lines of groups that are no all-to-all, counted per block

    def lines(self, found: list[LineKey]) -> None:
        if self.grouper is not None:
            self.grouper.lines(found)
            self._count_unmerged()
        else:
            self.raw.update(map(_without_opcount, found))  # --raw-p2p: Send/Recv counted as logged

    def record(self, rec: CallRecord) -> None:
        if self.grouper is None or rec.op not in P2P_OPS:
            self.summary.add(rec)
        else:
            self.grouper.record(rec)

    def finish(self) -> None:
        if self.grouper is not None:
            self.grouper.finish()
            self._count_unmerged()
        self.summary.add_raw(self.raw)
        self.summary.add_raw(self.merged, note=GROUPED_NOTE)

    def _emit(self, group: Group) -> None:
        if not group.records:
            assert self.grouper is not None
            a2a = group.alltoall(self.grouper.rest_dtype)
            if a2a is None:
                self.unmerged += group.items
            else:
                who, _, _, _, _, rest, grank, _ = group.items[0]
                self.merged[(who, b"", b"", a2a[0].encode(), b"%d" % a2a[1], rest, grank, b"")] += 1
            return
        first = group.items[0]
        merged = merged_record(group, first if isinstance(first, CallRecord) else record_from_line(first))
        if merged is not None:
            self.summary.add(merged)
            return
        for item in group.items:
            if isinstance(item, CallRecord):
                self.summary.add(item)
            else:
                self.raw[_without_opcount(item)] += 1

    def _count_unmerged(self) -> None:
        if self.unmerged:
            self.raw.update(map(_without_opcount, self.unmerged))
            self.unmerged.clear()


def _without_opcount(key: LineKey) -> LineKey:
    """A Send/Recv LineKey with its opCount blanked (it would make every call distinct); others unchanged."""
    return (key[0], b"", b"", key[1], key[4], key[5], key[6], b"") if key[2] else key


def analyze(paths: Sequence[str], raw_p2p: bool = False) -> tuple[TraceSummary, LogParser]:
    """Parse logs into a TraceSummary at regex speed (LogParser.tally); Send/Recv lines are grouped into
    all-to-alls (p2p) in log order unless ``raw_p2p``."""
    parser, summary = LogParser(), TraceSummary()
    tally = _Tally(summary, raw_p2p)
    for path in check_paths(paths):
        with _reading(path):
            parser.tally(path, tally)
    tally.finish()
    summary.rccl_fields |= parser.stats.rccl_fields
    summary.repair_hosts()
    return summary, parser


def trace_sizes(paths: list[str]) -> list[TraceSize]:
    """Distinct (collective, count, dtype, nranks, redop) in NCCL/RCCL logs, for replaying them.

    Ops with no nccl-tests collective (Gather/Scatter of NCCL 2.28) and unknown datatypes are left out.
    Sorted by collective, then count. Raises UsageError for a missing/unreadable file, a log that could not be
    read to its end (a damaged .gz: replaying part of a job would time the wrong mix), or one with no calls.
    """
    from opbench.core.dtypes import BY_ENUM

    summary, parser = analyze(paths)
    if parser.stats.read_errors:
        raise UsageError(
            f"could not be read to its end ({parser.stats.read_errors[0]}); `opbench trace` shows what it holds",
            source=",".join(paths),
            field="--sizes-from-trace",
        )
    if not summary.summary_rows():
        raise UsageError(
            "no NCCL calls found (was the job run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL?)",
            source=",".join(paths),
            field="--sizes-from-trace",
        )
    merged: dict[tuple[str, int, int, int, str | None], int] = {}
    for row in summary.summary_rows():
        if row["collective"] is None or row["datatype"] not in BY_ENUM:
            continue
        key = (row["collective"], row["count"], row["datatype"], row["nranks"], row["redop"])
        merged[key] = merged.get(key, 0) + row["calls"]  # Send and Recv rows fold into send_recv
    return [TraceSize(c, n, d, r, op, calls) for (c, n, d, r, op), calls in sorted(merged.items(), key=str)]
