"""From log files to a TraceSummary: the parser's API for the CLI, the comm benchmark's
``--sizes-from-trace`` (``trace_sizes``) and callers that want every call (``iter_records``)."""

from __future__ import annotations

import contextlib
import gzip
import os
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import filterfalse
from operator import itemgetter
from typing import Any

from opbench.core import outputs
from opbench.core.errors import UsageError

from .p2p import GROUPED_NOTE, Group, P2pGrouper, group_p2p, merged_record
from .parse import (
    P2P_OPS,
    CallRecord,
    InitRecord,
    LineKey,
    LogParser,
    ParseStats,
    open_log,
    record_from_line,
    rest_fields,
    who_fields,
)
from .summary import TraceSummary

_P2P = itemgetter(1)


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
    outputs.protect(out)  # a --report-csv-path naming one of them is refused, not written over the input
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


READER_ENV = "OPBENCH_TRACE_READER"  # auto (default), native or python: which reader ``analyze`` uses
READERS = ("auto", "native", "python")


def native_reader() -> Any:
    """The native reader (opbench.trace._scan, docs/trace.md "Native reader") ``analyze`` uses, or None for the
    Python reader: OPBENCH_TRACE_READER=python, or the extension was not built (no C compiler at install time).
    =native where it was not built is one clear error."""
    choice = os.environ.get(READER_ENV, "").strip().lower() or "auto"
    if choice not in READERS:
        raise UsageError(f"must be one of {', '.join(READERS)}", field=READER_ENV)
    if choice == "python":
        return None
    try:
        from . import _scan
    except ImportError:
        if choice == "native":
            raise UsageError(
                "the native reader was not built (no C compiler when opbench was installed?)", field=READER_ENV
            ) from None
        return None
    return _scan


class _Tally:
    """The LineSink behind ``analyze``: LINE matches are counted as raw tuples (``Counter.update``: no Python
    per call) and parsed once per distinct tuple at the end; Send/Recv go through the P2pGrouper, and a group
    of lines that is an all-to-all is counted as one LineKey (op AlltoAll/AlltoAllv, its count) in ``merged``.

    With ``native`` (the module native_reader returns) the counting and grouping state lives in its Engine:
    LogParser.tally_stream hands it whole blocks (``self.native.scan``), and the lines it leaves to the Python
    reader come back here (``lines``/``record``) and go into the same state. The grouper then only numbers
    processes and communicators (its ``_proc_id``/``_comm_id``) for the engine, so both readers use one set of
    ids and rules (p2p's module docstring)."""

    def __init__(self, summary: TraceSummary, raw_p2p: bool, native: Any = None, piece: bool = False) -> None:
        self.summary = summary
        self.raw: Counter[LineKey] = Counter()
        self.merged: Counter[LineKey] = Counter()
        self.grouper = None if raw_p2p else P2pGrouper(self._emit, self.raw, self.merged)
        self.unmerged: list[LineKey] = []  # Send/Recv lines of groups that are no all-to-all, counted per block
        self.native: Any = None
        if native is not None:
            self._ids = self.grouper or P2pGrouper(self._emit)
            self.native = native.Engine(
                self._proc_of, self._rest_of, self._emit_native, group_p2p=not raw_p2p, piece=piece and not raw_p2p
            )

    def _proc_of(self, who: bytes) -> int:
        return self._ids._proc_id(who_fields(who))

    def _rest_of(self, rest: bytes) -> tuple[int, int, int, int]:
        dtype, _, peer, comm, nranks = rest_fields(rest)
        return (self._ids._comm_id(comm, nranks), nranks, dtype, peer)

    def _emit_native(self, opcount: bytes, nranks: int, items: list[Any], sends: set[int], recvs: set[int]) -> None:
        """A group the engine finished that holds CallRecords: the Python rules (``_emit``) decide it."""
        group = Group(opcount, nranks)
        group.items, group.sends, group.recvs, group.records = items, sends, recvs, True
        self._emit(group)

    def lines(self, found: list[LineKey]) -> None:
        if self.native is not None and self.grouper is not None:
            p2p = list(filter(_P2P, found))
            if len(p2p) < len(found):
                self.raw.update(filterfalse(_P2P, found))
            if p2p:
                self.native.feed_keys(p2p)
        elif self.grouper is not None:
            self.grouper.lines(found)
            self._count_unmerged()
        else:
            self.raw.update(map(_without_opcount, found))  # --raw-p2p: Send/Recv counted as logged

    def record(self, rec: CallRecord) -> None:
        if self.grouper is None or rec.op not in P2P_OPS:
            self.summary.add(rec)
        elif self.native is not None:
            ids = self._ids
            sid = ids._proc_id((rec.host, rec.pid, rec.device)) + ids._comm_id(rec.comm, rec.nranks)
            self.native.feed_record(sid, rec.nranks, b"%x" % rec.opcount, rec.root, rec.op == "Send", rec)
        else:
            self.grouper.record(rec)

    def finish(self) -> None:
        if self.native is not None:
            self.native.finish()
            raw, merged = self.native.counts()
            self.raw.update(dict(raw))
            self.merged.update(dict(merged))
        elif self.grouper is not None:
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


def analyze(paths: Sequence[str], raw_p2p: bool = False, jobs: int = 1) -> tuple[TraceSummary, LogParser]:
    """Parse logs into a TraceSummary at regex speed (LogParser.tally); Send/Recv lines are grouped into
    all-to-alls (p2p) in log order unless ``raw_p2p``. ``jobs`` > 1 reads the logs in that many processes
    (``analyze_parallel``); the result is the same."""
    paths = check_paths(paths)
    native = native_reader()  # checks OPBENCH_TRACE_READER in every mode
    if jobs > 1 and "-" not in paths:
        return analyze_parallel(paths, raw_p2p, jobs, native is not None)
    parser, summary = LogParser(), TraceSummary()
    tally = _Tally(summary, raw_p2p, native)
    summary.reader = "python" if tally.native is None else "native"
    for path in paths:
        with _reading(path):
            parser.tally(path, tally)
    tally.finish()
    summary.rccl_fields |= parser.stats.rccl_fields
    summary.repair_hosts()
    return summary, parser


# -- --jobs N ---------------------------------------------------------------------------------------------------
SPLIT_MIN = 16 << 20  # a plain log at least this big is cut into byte ranges (a .gz cannot be: one piece)
PIECE = 8 << 20  # bytes per piece: small results, so the parent holds only the pieces in flight


@dataclass
class Piece:
    """A byte range of one log, starting and ending at a line boundary (end None: to the end of the file)."""

    path: str
    start: int = 0
    end: int | None = None


StreamKey = tuple["str | None", "int | None", "int | None", str, int]  # (host, pid, device, comm, nranks)


@dataclass
class PieceResult:
    """What a worker read in a Piece. Its own _Tally grouped the Send/Recv of every stream (process and
    communicator) from that stream's first opCount change on: from there no group can reach back into the piece
    before. Before it, a stream's lines may continue a group of the previous piece: they are ``head``, in log
    order, for the parent's one P2pGrouper; the groups still open at the end are ``tail``. ``settled`` names the
    streams whose opCount changed in the piece. Everything else is already tallied (``summary``, ``raw``,
    ``merged``), so a result holds a few groups per stream, not the piece's lines."""

    stats: ParseStats
    inits: list[InitRecord]
    summary: TraceSummary
    raw: Counter[LineKey] = field(default_factory=Counter)
    merged: Counter[LineKey] = field(default_factory=Counter)
    head: list[list[LineKey] | CallRecord] = field(default_factory=list)
    tail: list[list[LineKey] | CallRecord] = field(default_factory=list)
    settled: set[StreamKey] = field(default_factory=set)


class _RangeReader:
    """``read`` of the bytes [start, end) of a file (LogParser._blocks_from reads through it)."""

    def __init__(self, fh: object, left: int | None) -> None:
        self.fh, self.left = fh, left

    def read(self, n: int) -> bytes:
        if self.left is not None:
            n = min(n, self.left)
            if n <= 0:
                return b""
        data = self.fh.read(n)  # type: ignore[attr-defined]
        if self.left is not None:
            self.left -= len(data)
        return data


def _stream_of(who: bytes, rest: bytes) -> StreamKey:
    """The StreamKey of a call line, from its who and rest spans."""
    host, pid, dev = who_fields(who)
    _, _, _, comm, nranks = rest_fields(rest)
    return (host, pid, dev, comm, nranks)


def _line_stream(key: LineKey, cache: dict[tuple[bytes, bytes], StreamKey]) -> StreamKey:
    found = cache.get((key[0], key[5]))
    if found is None:
        if len(cache) > 1 << 16:
            cache.clear()
        found = cache[(key[0], key[5])] = _stream_of(key[0], key[5])
    return found


class _PieceSink:
    """The LineSink of a worker: a _Tally for the settled streams, the head (module docstring of PieceResult)
    kept in log order for the parent."""

    def __init__(self, result: PieceResult, raw_p2p: bool) -> None:
        self.result = result
        self.tally = _Tally(result.summary, raw_p2p)
        self.tally.raw, self.tally.merged = result.raw, result.merged
        if self.tally.grouper is not None:
            self.tally.grouper.raw, self.tally.grouper.merged = result.raw, result.merged
        self._last: dict[StreamKey, bytes] = {}  # opCount of each unsettled stream's last line
        self._streams: dict[tuple[bytes, bytes], StreamKey] = {}

    def lines(self, found: list[LineKey]) -> None:
        if self.tally.grouper is None:
            self.tally.lines(found)
            return
        streams = [_line_stream(k, self._streams) for k in filter(_P2P, found)]
        settled = self.result.settled
        if all(map(settled.__contains__, streams)):  # the usual block: every stream settled already
            self.tally.lines(found)
            return
        keep: list[LineKey] = []
        head: list[LineKey] = []
        it = iter(streams)
        for key in found:
            if not key[1]:
                keep.append(key)
                continue
            stream = next(it)
            if stream in settled or self._settles(stream, key[2]):
                keep.append(key)
            else:
                head.append(key)
        if head:
            self.result.head.append(head)
        self.tally.lines(keep)

    def record(self, rec: CallRecord) -> None:
        if self.tally.grouper is None or rec.op not in P2P_OPS:
            self.tally.record(rec)
            return
        stream = (rec.host, rec.pid, rec.device, rec.comm, rec.nranks)
        if stream in self.result.settled or self._settles(stream, b"%x" % rec.opcount):
            self.tally.record(rec)
        else:
            self.result.head.append(rec)

    def _settles(self, stream: StreamKey, opcount: bytes) -> bool:
        """True when this line's opCount differs from the stream's line before it (the stream settles here)."""
        last = self._last.get(stream)
        if last is not None and last != opcount:
            self.result.settled.add(stream)
            del self._last[stream]
            return True
        self._last[stream] = opcount
        return False

    def finish(self) -> None:
        """Tally what is done; the groups still open become the tail."""
        tally, grouper = self.tally, self.tally.grouper
        if grouper is not None:
            pending, grouper._pending = grouper._pending, []
            if pending:
                self.result.tail.append(pending)
            for group in grouper.open.values():
                self.result.tail.extend(_as_items(group.items))
            grouper.open.clear()
            tally._count_unmerged()


def _as_items(items: list[LineKey | CallRecord]) -> list[list[LineKey] | CallRecord]:
    """Items in order, consecutive LineKeys as one list (one ``lines`` call), CallRecords alone."""
    out: list[list[LineKey] | CallRecord] = []
    for item in items:
        if isinstance(item, CallRecord):
            out.append(item)
        elif out and isinstance(out[-1], list):
            out[-1].append(item)
        else:
            out.append([item])
    return out


def read_piece(piece: Piece, raw_p2p: bool, native: bool = False) -> PieceResult:
    """Worker: tally one Piece (LogParser.tally's road, on a byte range), with the native reader where ``native``:
    its engine in piece mode keeps the head, the settled streams and the open groups apart as _PieceSink does."""
    parser = LogParser()
    result = PieceResult(parser.stats, parser.inits, TraceSummary())
    sink: _PieceSink | _Tally
    sink = _Tally(result.summary, raw_p2p, native_reader(), piece=True) if native else _PieceSink(result, raw_p2p)
    with open_log(piece.path) as fh:
        if piece.start:
            fh.seek(piece.start)
        left = None if piece.end is None else piece.end - piece.start
        parser.tally_stream(_RangeReader(fh, left), sink)  # type: ignore[arg-type]
    if isinstance(sink, _PieceSink):
        sink.finish()
        return result
    engine = sink.native
    if sink.grouper is not None:
        head, tail, settled = engine.piece_end()
        result.head, result.tail = _as_items(head), _as_items(tail)
        result.settled = {_settled_stream(s) for s in settled}
    raw, merged = engine.counts()
    result.raw.update(sink.raw)  # groups with CallRecords, decided by Python (_Tally._emit), and non-Send/Recv
    result.raw.update(dict(raw))
    result.merged.update(sink.merged)
    result.merged.update(dict(merged))
    return result


def _settled_stream(item: tuple[bytes, bytes] | CallRecord) -> StreamKey:
    """The StreamKey of a stream the native engine settled: from a line's (who, rest) spans or a CallRecord."""
    if isinstance(item, CallRecord):
        return (item.host, item.pid, item.device, item.comm, item.nranks)
    return _stream_of(*item)


def split_pieces(paths: Sequence[str], jobs: int) -> Iterator[Piece]:
    """Pieces in log order: each plain log of at least SPLIT_MIN bytes cut into ranges of about PIECE bytes at
    line starts, every other log (a .gz, a small file) whole."""
    for path in paths:
        size = os.path.getsize(path)
        with open_log(path) as fh:
            if isinstance(fh, gzip.GzipFile) or size < SPLIT_MIN or jobs < 2:
                yield Piece(path)
                continue
            start = 0
            while start < size:
                fh.seek(start + PIECE)
                while True:  # to the next line start, read 1 MiB at a time (a garbage line may be long)
                    part = fh.readline(1 << 20)
                    if not part or part.endswith(b"\n"):
                        break
                end = fh.tell()
                yield Piece(path, start, end if end < size else None)
                start = end


def _feed(tally: _Tally, items: list[list[LineKey] | CallRecord]) -> None:
    for item in items:
        if isinstance(item, CallRecord):
            tally.record(item)
        else:
            tally.lines(item)


def _close(tally: _Tally, streams: set[StreamKey]) -> None:
    """End the open groups of the streams a piece settled: one process would have ended them at the line where
    the opCount changed (the piece's worker grouped from there on)."""
    grouper = tally.grouper
    if grouper is None or not streams:
        return
    if grouper._pending:
        grouper._process(grouper._pending)
        grouper._pending = []
    for host, pid, dev, comm, nranks in streams:
        sid = grouper._proc_id((host, pid, dev)) + grouper._comm_id(comm, nranks)
        group = grouper.open.pop(sid, None)
        if group is not None:
            grouper.emit(group)
    tally._count_unmerged()


def analyze_parallel(
    paths: Sequence[str], raw_p2p: bool, jobs: int, native: bool = False
) -> tuple[TraceSummary, LogParser]:
    """``analyze`` across ``jobs`` processes: the workers read pieces (split_pieces) with the native reader where
    ``native``, else the regex; the parent merges their counts and feeds their Send/Recv, in log order, to one
    P2pGrouper (docs/trace.md, "--jobs")."""
    from concurrent.futures import Future, ProcessPoolExecutor

    parser, summary = LogParser(), TraceSummary()
    summary.reader = "native" if native else "python"
    tally = _Tally(summary, raw_p2p)
    stats = parser.stats
    stats.files.extend(paths)
    with ProcessPoolExecutor(max_workers=jobs) as pool, _reading(", ".join(paths)):
        in_flight: deque[Future[PieceResult]] = deque()
        pieces = split_pieces(paths, jobs)
        while True:
            while len(in_flight) < 2 * jobs:  # a window: memory holds at most 2·jobs pieces' results
                piece = next(pieces, None)
                if piece is None:
                    break
                in_flight.append(pool.submit(read_piece, piece, raw_p2p, native))
            if not in_flight:
                break
            res = in_flight.popleft().result()
            part = res.stats
            for name in ("bytes", "lines", "call_lines", "calls", "fragments", "init_lines", "cut_lines"):
                setattr(stats, name, getattr(stats, name) + getattr(part, name))
            stats.rccl_fields |= part.rccl_fields
            stats.read_errors += part.read_errors
            parser.inits += res.inits
            summary.merge(res.summary)
            tally.raw.update(res.raw)
            tally.merged.update(res.merged)
            _feed(tally, res.head)
            _close(tally, res.settled)
            _feed(tally, res.tail)
    tally.finish()
    summary.rccl_fields |= stats.rccl_fields
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
