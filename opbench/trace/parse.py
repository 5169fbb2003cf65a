"""Streaming parser for NCCL/RCCL ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL`` logs (REFERENCE §5).

One call line, every NCCL release from 2.3.7 to 2.30 and RCCL::

    host:pid:tid [dev] NCCL INFO AllGather: opCount c97 sendbuff 0x… recvbuff 0x… count 106956800
        datatype 9 op 0 root 0 comm 0x… [nranks=8] stream 0x…

with RCCL's `` acc 0x…|(nil)`` before ``count`` (2.27) and `` task N globalrank N`` at the end (>= 2.18),
old RCCL's µs timestamp between ``[dev]`` and ``NCCL INFO``, NCCL's optional ``[YYYY-mm-dd HH:MM:SS] `` prefix,
and whatever launchers glue in front (``[0] ``, `` 0: ``, ``[1,0]<stdout>:``, Ray tags, collector timestamps).

Why it is fast and small: the file is read in 1 MiB byte blocks (never decoded) and ONE compiled regex runs
over a whole block with ``finditer`` — the regex engine, not Python, walks past non-NCCL text and splits the
fields, so Python only touches real calls. ``tally`` goes further and only counts distinct field tuples
(the summary needs nothing else); ``calls`` builds a CallRecord per call for callers that want them. Memory is
one block plus one partial line; lines longer than ``MAX_LINE`` without a newline (binary garbage) are cut.

Torn lines (two processes writing into one line) are handled by the regex itself: the interrupted call
fails to match (counted in ``ParseStats.fragments``) and the complete call on that line keeps the prefix
right before it; such calls are flagged ``torn`` because junk may be glued to their host ('0x7fnode07'), and
TraceSummary.repair_hosts() maps them to the host of the same pid seen on clean lines (HostFixer).
Nothing in here raises on bad input.
"""

from __future__ import annotations

import gzip
import io
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from opbench.core.collectives import COLLECTIVES, NCCL_OP_TO_COLLECTIVE, redop_name
from opbench.core.dtypes import BY_ENUM

BLOCK = 1 << 20  # bytes read per step
MAX_LINE = 1 << 20  # a "line" longer than this without a newline is cut (garbage)

_OPS = rb"AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|Send|Recv|AlltoAll|AllToAll|AllToAllPivot|Gather|Scatter"
# "host:pid:tid [dev]" — the host may be glued to a launcher tag ('[1,0]<stdout>:host'), hence the excluded chars
_WHO = rb"(?P<host>[^\s:\[\]<>()]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>-?\d+)\]"
# Optional prefix "host:pid:tid [dev] [µs] NCCL INFO ", then the call body. No \s, so never across a newline.
_FULL = re.compile(
    rb"(?:(?P<prefix>" + _WHO + rb") (?:[0-9.]+ )?NCCL INFO )?"
    rb"(?P<op>(?<![A-Za-z0-9])[A-Za-z][A-Za-z0-9]*|" + _OPS + rb"): "
    rb"opCount (?P<opcount>[0-9a-fA-F]+) sendbuff (?P<sendbuff>\S+) recvbuff (?P<recvbuff>\S+) "
    rb"(?:acc (?P<acc>\S+) )?(?P<args>count (?P<count>\d+) datatype (?P<datatype>\d+) op (?P<redop>\d+) "
    rb"root (?P<root>-?\d+) comm (?P<comm>\S+) \[nranks=(?P<nranks>\d+)\]) "
    rb"stream (?P<stream>0x[0-9a-fA-F]+|\(nil\)|\S+)"
    rb"(?: task (?P<task>-?\d+) globalrank (?P<globalrank>-?\d+))?"
)
# A tally key is 4 spans (prefix, op, args, globalrank — findall returns groups in pattern order); _KEYED is
# _FULL capturing only those; PREFIX and ARGS re-parse the spans once per distinct key (TraceSummary.add_raw).
TALLY_FIELDS = ("prefix", "op", "args", "globalrank")
_TALLY_INDEX = tuple(_FULL.groupindex[f] for f in TALLY_FIELDS)
_KEYED = re.compile(
    re.sub(rb"\(\?P<(\w+)>", lambda m: m.group(0) if m.group(1).decode() in TALLY_FIELDS else b"(?:", _FULL.pattern)
)
PREFIX = re.compile(_WHO)
ARGS = re.compile(
    rb"count (?P<count>\d+) datatype (?P<datatype>\d+) op (?P<redop>\d+) root (?P<root>-?\d+) "
    rb"comm (?P<comm>\S+) \[nranks=(?P<nranks>\d+)\]"
)
_TWO_ON_A_LINE = re.compile(rb"opCount [^\n]*opCount ")
# "comm 0x… rank 3 nranks 8 cudaDev 3 [nvmlDev 3] busId … [commId 0x…] - Init COMPLETE" (INIT subsystem)
_INIT = re.compile(
    rb"(?:" + _WHO + rb" (?:[0-9.]+ )?NCCL INFO )?"
    rb"(?:\w+ )?comm (?P<comm>\S+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev -?\d+"
    rb"[^\n]*?(?:commId (?P<commid>0x[0-9a-fA-F]+)[^\n]*?)?Init COMPLETE"
)
_RCCL_MARKERS = (b" globalrank ", b" acc 0x", b" acc (nil)")
P2P_OPS = frozenset({"Send", "Recv"})
_ROOTED = frozenset({"Broadcast", "Reduce", "Gather", "Scatter"})
# Op names this package synthesises (p2p): an uneven all-to-all is timed as the even one moving as many bytes.
INFERRED_OPS = {"AlltoAllv": "all_to_all"}


@dataclass(slots=True)
class CallRecord:
    """One logged NCCL call on one rank. Pointers are kept as logged text (they are only identifiers)."""

    op: str
    opcount: int
    count: int
    datatype: int
    op_enum: int
    root: int
    comm: str
    nranks: int
    stream: str
    sendbuff: str = ""
    recvbuff: str = ""
    acc: str | None = None
    task: int | None = None
    globalrank: int | None = None
    host: str | None = None
    pid: int | None = None
    tid: int | None = None
    device: int | None = None
    inferred: str | None = None  # set on records synthesised from other lines (grouped Send/Recv → AlltoAll)
    torn: bool = False  # a torn line: junk may be glued to ``host`` (HostFixer repairs it)

    @property
    def collective(self) -> str | None:
        """opbench collective name (core.collectives.NCCL_OP_TO_COLLECTIVE); None for ops nccl-tests has no row for."""
        return NCCL_OP_TO_COLLECTIVE.get(self.op) or INFERRED_OPS.get(self.op)

    @property
    def dtype(self) -> str:
        d = BY_ENUM.get(self.datatype)
        return d.name if d else f"dtype{self.datatype}"

    @property
    def elt_size(self) -> int | None:
        d = BY_ENUM.get(self.datatype)
        return d.size if d else None

    @property
    def bytes(self) -> int | None:
        """count × element size: the bytes this rank passes to NCCL for ``count`` (not the nccl-tests -b)."""
        size = self.elt_size
        return None if size is None else self.count * size

    @property
    def redop(self) -> str | None:
        return redop_for(self.op, self.op_enum)

    @property
    def peer(self) -> int | None:
        """Send/Recv log their peer in the ``root`` field."""
        return self.root if self.op in P2P_OPS else None

    @property
    def root_rank(self) -> int | None:
        return self.root if self.op in _ROOTED else None


def redop_for(op: str, op_enum: int) -> str | None:
    """Reduction name for reducing ops; None for ops whose logged ``op`` field means nothing (gathers, p2p)."""
    coll = COLLECTIVES.get(NCCL_OP_TO_COLLECTIVE.get(op) or INFERRED_OPS.get(op) or "")
    return redop_name(op_enum) if coll is not None and coll.has_redop else None


@dataclass(frozen=True, slots=True)
class InitRecord:
    """An ``Init COMPLETE`` line: maps a process-local comm pointer to its rank and (2.9+) commId."""

    host: str | None
    pid: int | None
    device: int | None
    comm: str
    rank: int
    nranks: int
    commid: str | None


@dataclass
class ParseStats:
    """What the parser saw. ``skipped`` = lines that held no complete call (other output, garbage, torn tails)."""

    files: list[str] = field(default_factory=list)
    bytes: int = 0
    lines: int = 0
    call_lines: int = 0
    calls: int = 0
    fragments: int = 0  # 'opCount ' occurrences that were not a complete call (torn / truncated lines)
    init_lines: int = 0
    cut_lines: int = 0  # over-long lines cut at MAX_LINE
    rccl_fields: bool = False  # RCCL-only fields (acc, task/globalrank) were seen
    read_errors: list[str] = field(default_factory=list)  # e.g. a truncated .gz (what came before is kept)

    @property
    def skipped(self) -> int:
        return self.lines - self.call_lines

    def as_dict(self) -> dict[str, int]:
        return {
            "bytes": self.bytes,
            "lines": self.lines,
            "calls": self.calls,
            "call_lines": self.call_lines,
            "skipped_lines": self.skipped,
            "fragments": self.fragments,
            "init_lines": self.init_lines,
            "cut_lines": self.cut_lines,
        }


def open_log(path: str) -> BinaryIO:
    """Binary stream for a log path; '-' is stdin; gzip is detected by its magic bytes, not the name."""
    raw: BinaryIO = sys.stdin.buffer if path == "-" else open(path, "rb")
    buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw)  # type: ignore[arg-type]
    if buffered.peek(2)[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=buffered, mode="rb")  # type: ignore[return-value]
    return buffered


class HostFixer:
    """Repairs a host glued to a torn fragment ('0x7fdgx07' → 'dgx07', or 'gx07' when the fragment's hex ate
    the 'd'): learn hosts from clean lines, then ``fix`` picks the most-seen clean host of the same pid that
    the torn one ends with, or that ends with it."""

    def __init__(self) -> None:
        self.seen: dict[int | None, dict[str, int]] = {}

    def learn(self, host: str, pid: int | None, n: int = 1) -> None:
        hosts = self.seen.setdefault(pid, {})
        hosts[host] = hosts.get(host, 0) + n

    def fix(self, host: str | None, pid: int | None) -> str | None:
        hosts = self.seen.get(pid)
        if not host or not hosts:
            return host
        own = hosts.get(host, 0)
        best = [(n, g) for g, n in hosts.items() if g != host and n > own and (host.endswith(g) or g.endswith(host))]
        return max(best)[1] if best else host


def _s(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8", "replace")


def _i(b: bytes | None) -> int | None:
    return None if b is None else int(b)


def record_from_match(m: re.Match[bytes], torn: bool = False) -> CallRecord:
    """The CallRecord for one ``_FULL`` match (every field the line has)."""
    (
        _prefix,
        host,
        pid,
        tid,
        dev,
        op,
        opcount,
        sendbuff,
        recvbuff,
        acc,
        _args,
        count,
        datatype,
        redop,
        root,
        comm,
        nranks,
        stream,
        task,
        globalrank,
    ) = m.groups()
    return CallRecord(
        op.decode("ascii"),
        int(opcount, 16),
        int(count),
        int(datatype),
        int(redop),
        int(root),
        _s(comm),
        int(nranks),
        _s(stream),
        _s(sendbuff),
        _s(recvbuff),
        _s(acc),
        _i(task),
        _i(globalrank),
        _s(host),
        _i(pid),
        _i(tid),
        _i(dev),
        torn=torn,
    )


def _calls_with_flags(block: bytes) -> Iterator[tuple[re.Match[bytes], bool, bool]]:
    """(match, first call on its line, torn): torn = another call or an 'opCount ' fragment precedes it there."""
    find = block.find
    prev_end = -1
    for m in _FULL.finditer(block):
        start = m.start()
        first = prev_end < 0 or find(b"\n", prev_end, start) >= 0
        torn = not first or block.count(b"opCount ", block.rfind(b"\n", 0, start) + 1, start) > 0
        prev_end = m.end()
        yield m, first, torn


# (prefix, op, args, globalrank[, True if torn]) -> calls; fields are bytes spans of the line, b"" if absent
RawTally = Counter
RecordSink = Callable[[CallRecord], None]
P2P_MARKERS = (b"Send: opCount", b"Recv: opCount")


class LogParser:
    """Parses one or more logs, keeping ParseStats and InitRecords across them.

    ``calls(path)`` yields CallRecords (full detail, in file order). ``tally(path, counts, sink)`` is the fast
    road: it only counts TALLY_FIELDS tuples per call, at regex speed; blocks holding Send/Recv (or any block
    while ``busy()`` says a Send/Recv group is still open) go to ``sink`` as records instead, so all-to-all
    recognition sees them in log order. Both stream: memory never grows with the log. Hosts are kept as
    logged, with ``torn`` set where a torn line may have glued junk to them (summary repairs them).
    """

    def __init__(self) -> None:
        self.stats = ParseStats()
        self.inits: list[InitRecord] = []

    # -- public -------------------------------------------------------------------------------------
    def calls(self, path: str) -> Iterator[CallRecord]:
        for block in self._blocks(path):
            yield from self._records(block)

    def parse_bytes(self, data: bytes) -> list[CallRecord]:
        """Convenience for tests and small inputs."""
        out: list[CallRecord] = []
        for block in self._blocks_from(io.BufferedReader(io.BytesIO(data))):  # type: ignore[arg-type]
            out += self._records(block)
        return out

    def tally(
        self, path: str, counts: RawTally, sink: RecordSink | None = None, busy: Callable[[], bool] = lambda: False
    ) -> None:
        """Add each call's key spans (TALLY_FIELDS) to ``counts``.

        Counting is all C (``findall`` + ``Counter.update``); only a line holding two 'opCount ' (a torn
        line) is looked at again, to move its torn calls to keys flagged torn.
        """
        for block in self._blocks(path):
            if sink is not None and (busy() or P2P_MARKERS[0] in block or P2P_MARKERS[1] in block):
                for rec in self._records(block):
                    sink(rec)
                continue
            found = _KEYED.findall(block)
            counts.update(found)
            self.stats.call_lines += len(found)
            for m in _TWO_ON_A_LINE.finditer(block):  # rare: torn lines; re-key their torn calls
                self._flag_torn_line(block, m.start(), counts)
            self._block_stats(block, len(found))

    # -- internals ----------------------------------------------------------------------------------
    def _flag_torn_line(self, block: bytes, pos: int, counts: RawTally) -> None:
        start = block.rfind(b"\n", 0, pos) + 1
        end = block.find(b"\n", pos)
        for m, first, torn in _calls_with_flags(block[start:] if end < 0 else block[start:end]):
            if torn:
                key = tuple(g or b"" for g in m.group(*_TALLY_INDEX))  # findall's b"" for a missing group
                counts[key] -= 1
                if not counts[key]:
                    del counts[key]
                counts[key + (True,)] += 1
            if not first:
                self.stats.call_lines -= 1

    def _records(self, block: bytes) -> list[CallRecord]:
        out = []
        for m, first, torn in _calls_with_flags(block):
            out.append(record_from_match(m, torn))
            self.stats.call_lines += first
        self._block_stats(block, len(out))
        return out

    def _block_stats(self, block: bytes, calls: int) -> None:
        stats = self.stats
        stats.calls += calls
        stats.fragments += block.count(b"opCount ") - calls
        if not stats.rccl_fields and calls and any(marker in block for marker in _RCCL_MARKERS):
            stats.rccl_fields = True
        if b"Init COMPLETE" in block:
            self._inits(block)

    def _blocks(self, path: str) -> Iterator[bytes]:
        self.stats.files.append(path)
        with open_log(path) as fh:
            yield from self._blocks_from(fh)

    def _blocks_from(self, fh: BinaryIO) -> Iterator[bytes]:
        """Whole-line blocks of about BLOCK bytes; lines are counted here."""
        stats = self.stats
        tail = b""
        read = getattr(fh, "read1", fh.read)  # read1: a truncated .gz still yields what precedes the damage
        while True:
            try:
                chunk = read(BLOCK)
            except (EOFError, OSError, ValueError) as exc:  # truncated or corrupt .gz: keep what was read
                stats.read_errors.append(f"{type(exc).__name__}: {exc}")
                chunk = b""
            if not chunk:
                break
            stats.bytes += len(chunk)
            data = tail + chunk if tail else chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                if len(data) > MAX_LINE:
                    stats.cut_lines += 1
                    stats.lines += 1
                    yield data
                    tail = b""
                else:
                    tail = data
                continue
            tail = data[cut + 1 :]
            block = data[: cut + 1]
            stats.lines += block.count(b"\n")
            yield block
            if len(tail) > MAX_LINE:
                stats.cut_lines += 1
                stats.lines += 1
                yield tail
                tail = b""
        if tail:
            stats.lines += 1
            yield tail

    def _inits(self, block: bytes) -> None:
        for m in _INIT.finditer(block):
            host, pid, dev, comm, rank, nranks, commid = m.group(
                "host", "pid", "dev", "comm", "rank", "nranks", "commid"
            )
            self.inits.append(
                InitRecord(_s(host), _i(pid), _i(dev), _s(comm) or "", int(rank), int(nranks), _s(commid))
            )
            self.stats.init_lines += 1
