"""Streaming parser for NCCL/RCCL ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL`` logs (docs/conventions.md, "NCCL debug-log lines").

One call line, every NCCL release from 2.3.7 to 2.30 and RCCL::

    host:pid:tid [dev] NCCL INFO AllGather: opCount c97 sendbuff 0x… recvbuff 0x… count 106956800
        datatype 9 op 0 root 0 comm 0x… [nranks=8] stream 0x…

with RCCL's `` acc 0x…|(nil)`` before ``count`` (2.27) and `` task N globalrank N`` at the end (>= 2.18),
old RCCL's µs timestamp between ``[dev]`` and ``NCCL INFO``, NCCL's optional ``[YYYY-mm-dd HH:MM:SS] `` prefix,
and whatever launchers glue in front (``[0] ``, `` 0: ``, ``[1,0]<stdout>:``, Ray tags, collector timestamps).

Why it is fast and small: the file is read in 128 KiB byte blocks (never decoded) and ONE compiled regex,
anchored at line starts (``LINE``), runs over a whole block with ``findall``: the regex engine, not Python,
jumps from line to line and splits the fields, and ``tally`` only counts the distinct field tuples (the summary
needs nothing else). Send/Recv lines, whose opCount and peer matter for all-to-all recognition, come out of the
same ``findall`` in log order. ``calls`` builds a CallRecord per call for callers that want them. Memory is one
block plus one partial line; lines longer than ``MAX_LINE`` without a newline (binary garbage) are cut. Every
pattern is linear in the line length (possessive repeats, a bounded host, an op only at a word start), so a
megabyte of garbage costs no more than a megabyte of calls.

Every line is read by one grammar (docs/conventions.md, "NCCL debug-log lines": no pattern crosses a newline, a
field inside the call is every byte to the next space). ``LINE`` knows one call per line, after its
``host:pid:tid [dev] NCCL INFO`` header. A line holding two ``opCount `` (two processes writing into one line: a
torn line) comes out of LINE as its text and is read with ``_FULL``, which finds calls anywhere in a line; a
line with one ``opCount `` that LINE does not read (a call without its header) is read with ``_LONE``, LINE's
grammar with the header optional, line by line. There the interrupted call fails to match
(counted in ``ParseStats.fragments``) and a complete call after it keeps the prefix right before it; such calls
are flagged ``torn`` because junk may be glued to their host ('0x7fnode07'), and TraceSummary.repair_hosts()
maps them to the host of the same pid seen on clean lines (HostFixer).
Nothing in here raises on bad input.
"""

from __future__ import annotations

import gzip
import io
import re
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import compress, filterfalse
from operator import itemgetter, methodcaller
from typing import Any, BinaryIO, Protocol

from opbench.core.collectives import COLLECTIVES, NCCL_OP_TO_COLLECTIVE, redop_name
from opbench.core.dtypes import BY_ENUM

BLOCK = 128 << 10  # bytes read per step: a block's matches stay in the CPU caches (measured 5-20 % faster than 1 MiB)
MAX_LINE = 1 << 20  # a "line" longer than this without a newline is cut (garbage)

# Numbers read from a log go through the command line's bounds (opbench.core.cli): a value outside them becomes
# OUT_OF_RANGE, and TraceSummary skips the call and counts it (ParseStats / the "parsed" line). A digit run
# longer than MAX_DIGITS is out of range unread (int() of 5000 digits raises; of 400, it makes byte counts no
# formatter can print).
MAX_DIGITS = 20
MAX_COUNT = 1 << 50  # elements: 1 PiB of bytes, as core.limits.MAX_MIB
MAX_RANKS = 1 << 22  # core.limits.MAX_WORLD
MAX_ENUM = 1 << 16  # datatype and reduction-op enums
OUT_OF_RANGE = -(1 << 62)


def bounded(text: bytes | None, low: int, high: int) -> int:
    """``int(text)`` when it has at most MAX_DIGITS digits and lies in [low, high]; else OUT_OF_RANGE."""
    if text is None or len(text) > MAX_DIGITS + 1:
        return OUT_OF_RANGE
    value = int(text)
    return value if low <= value <= high else OUT_OF_RANGE


# "host:pid:tid [dev]"; the host may be glued to a launcher tag ('[1,0]<stdout>:host'), hence the excluded
# characters. At most 255 characters (a DNS name is at most 253), which keeps every search linear in the line.
_HOST = rb"[^\s:\[\]<>()]{1,255}+"
_WHO = rb"(?P<host>" + _HOST + rb"):(?P<pid>\d++):(?P<tid>\d++) \[(?P<dev>-?\d++)\]"
# _FULL: a call anywhere in a line, every field captured (the record path and torn lines). No \s, so a match
# never crosses a newline.
_FULL = re.compile(
    rb"(?:(?P<prefix>" + _WHO + rb") (?:[0-9.]++ )?NCCL INFO )?"
    rb"(?<![A-Za-z0-9])(?P<op>[A-Za-z][A-Za-z0-9]*+): "
    rb"opCount (?P<opcount>[0-9a-fA-F]++) sendbuff (?P<sendbuff>[^ \n]++) recvbuff (?P<recvbuff>[^ \n]++) "
    rb"(?:acc (?P<acc>[^ \n]++) )?count (?P<count>\d++) datatype (?P<datatype>\d++) op (?P<redop>\d++) "
    rb"root (?P<root>-?\d++) comm (?P<comm>[^ \n]++) \[nranks=(?P<nranks>\d++)\] "
    rb"stream (?P<stream>0x[0-9a-fA-F]++|\(nil\)|\S++)"
    rb"(?: task (?P<task>-?\d++) globalrank (?P<globalrank>-?\d++))?"
)
# _LONE: the call of a line that holds one 'opCount ' (a call without its header, or one LINE does not read): LINE's
# grammar with the header optional, so a line reads the same whichever reader and road reads it. Only on a torn
# line does _FULL's stream stop at the hex of a pointer, where the next call's host may be glued to it.
_LONE = re.compile(_FULL.pattern.replace(rb"(?P<stream>0x[0-9a-fA-F]++|\(nil\)|\S++)", rb"(?P<stream>\S++)"))
assert _LONE.pattern != _FULL.pattern
# LINE: the fast grammar, run over a block (which starts with a newline): one call per line, after a "host:pid:tid [dev] NCCL INFO"
# token, on a line with no other 'opCount ' (it skips no 'opCount ' token before the call and stops at one
# after it, so a torn line is never half-read here; LogParser reads those, and a call without its header, with
# _LONE). Captures only what the tally keys on (LineKey); Send/Recv also capture their opCount. Fields inside
# the call use [^ \n] (every byte but a space, within the line); the tokens before it and the last field are \S
# (they stop at any whitespace). Requiring the header makes a failed line start cheaper (measured: -15% per MB).
LINE = re.compile(
    rb"\n(?:(?!opCount )\S*+ )*?(\S++ \[-?\d++\]) (?:[0-9.]++ )?NCCL INFO "
    rb"(?:(Send|Recv): opCount ([0-9a-fA-F]++)|([A-Za-z][A-Za-z0-9]*+): opCount [0-9a-fA-F]++)"
    rb" sendbuff [^ \n]++ recvbuff [^ \n]++ (?:acc [^ \n]++ )?"
    rb"count (\d++) (datatype \d++ op \d++ root -?\d++ comm [^ \n]++ \[nranks=\d++\]) stream \S++"
    rb"(?: task -?\d++ globalrank (-?\d++))?(?![^\n]*opCount )"
    # a torn line or an Init COMPLETE line: its text only (read with _FULL / _INIT)
    rb"|\n(?=[^\n]*?opCount [^\n]*opCount |[^\n]*?Init COMPLETE)([^\n]++)"
)
# A LINE match: (who, p2p op, p2p opCount, other op, count, rest, globalrank, other line); absent fields are b"".
# "other line" is the text of a torn line or an Init COMPLETE line (then every other field is empty).
LineKey = tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes]
_OTHER_LINE = itemgetter(7)
WHO_TOKEN = re.compile(_WHO + rb"\Z")  # the process in LINE's who token (a glued launcher tag is skipped)
REST = re.compile(rb"datatype (\d+) op (\d+) root (-?\d+) comm ([^ \n]+) \[nranks=(\d+)\]")
# "comm 0x… rank 3 nranks 8 cudaDev 3 [nvmlDev 3] busId … [commId 0x…] - Init COMPLETE" (INIT subsystem)
_INIT = re.compile(
    rb"(?:" + _WHO + rb" (?:[0-9.]++ )?NCCL INFO )?"
    rb"(?<!\w)(?:\w++ )?comm (?P<comm>\S++) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev -?\d+"
    rb"[^\n]*?(?:commId (?P<commid>0x[0-9a-fA-F]+)[^\n]*?)?Init COMPLETE"
)
_COUNT_OPCOUNT = methodcaller("count", b"opCount ")
_RCCL_MARKERS = (b" globalrank ", b" acc 0x", b" acc (nil)")
_MARKER_SPAN = 1 << 13  # RCCL markers are looked for in a block's first 8 KiB (an RCCL log has them on every call)
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
    raw = sys.stdin.buffer if path == "-" else open(path, "rb")
    buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw)  # type: ignore[type-var]
    if buffered.peek(2)[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=buffered, mode="rb")  # type: ignore[return-value]
    return buffered


MAX_TEXT_LINE = 64 << 10  # a line of a text report (nccl-tests output) longer than this is not one: skipped


@dataclass
class LineStats:
    """What ``bounded_lines`` saw besides the lines it yielded."""

    lines: int = 0
    long_lines: int = 0  # lines over the limit, skipped (never held whole)
    read_errors: list[str] = field(default_factory=list)  # e.g. a damaged .gz: reading stopped, earlier lines kept


def bounded_lines(fh: BinaryIO, stats: LineStats, max_len: int = MAX_TEXT_LINE) -> Iterator[bytes]:
    """The lines of ``fh`` in linear time and bounded memory: a line longer than ``max_len`` is read past in
    ``max_len`` pieces and counted, not joined; a read error (truncated or corrupt gzip) ends the stream and is
    recorded, and every line before it has been yielded."""
    while True:
        try:
            line = fh.readline(max_len + 1)
            if len(line) > max_len and not line.endswith(b"\n"):
                stats.long_lines += 1
                while line and not line.endswith(b"\n"):
                    line = fh.readline(max_len)
                continue
        except (EOFError, OSError, ValueError, zlib.error) as exc:
            stats.read_errors.append(f"{type(exc).__name__}: {exc}")
            return
        if not line:
            return
        stats.lines += 1
        yield line


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
    """pid, tid, device, task, globalrank: None when absent or beyond any real value."""
    value = bounded(b, -(1 << 62) + 1, 1 << 62)
    return None if value == OUT_OF_RANGE else value


def record_from_match(m: re.Match[bytes], torn: bool = False) -> CallRecord:
    """The CallRecord for one ``_FULL`` match (every field the line has)."""
    g = m.group
    return CallRecord(
        g("op").decode("ascii"),
        int(g("opcount")[-16:], 16),
        bounded(g("count"), 0, MAX_COUNT),
        bounded(g("datatype"), 0, MAX_ENUM),
        bounded(g("redop"), 0, MAX_ENUM),
        bounded(g("root"), -MAX_RANKS, MAX_RANKS),
        _s(g("comm")) or "",
        bounded(g("nranks"), 1, MAX_RANKS),
        _s(g("stream")) or "",
        _s(g("sendbuff")) or "",
        _s(g("recvbuff")) or "",
        _s(g("acc")),
        _i(g("task")),
        _i(g("globalrank")),
        _s(g("host")),
        _i(g("pid")),
        _i(g("tid")),
        _i(g("dev")),
        torn=torn,
    )


ProcFields = tuple["str | None", "int | None", "int | None"]  # (host, pid, device)
RestFields = tuple[int, int, int, str, int]  # (datatype, op_enum, root, comm, nranks)


def who_fields(who: bytes) -> ProcFields:
    """(host, pid, device) from LINE's who token; all None when it is not ``host:pid:tid [dev]``."""
    m = WHO_TOKEN.search(who) if who else None
    if m is None:
        return (None, None, None)
    return (m.group("host").decode("utf-8", "replace"), _i(m.group("pid")), _i(m.group("dev")))


def rest_fields(rest: bytes) -> RestFields:
    """(datatype, op_enum, root, comm, nranks) from LINE's ``datatype … [nranks=N]`` span."""
    m = REST.fullmatch(rest)
    if m is None:  # LINE and the native reader capture only spans of this form; anything else is out of range
        return (OUT_OF_RANGE, OUT_OF_RANGE, OUT_OF_RANGE, "", OUT_OF_RANGE)
    dt, op, root, comm, nranks = m.groups()
    return (
        bounded(dt, 0, MAX_ENUM),
        bounded(op, 0, MAX_ENUM),
        bounded(root, -MAX_RANKS, MAX_RANKS),
        comm.decode("utf-8", "replace"),
        bounded(nranks, 1, MAX_RANKS),
    )


def record_from_line(key: LineKey) -> CallRecord:
    """A CallRecord from a LINE match (pointers, stream and task were not captured: empty/None)."""
    who, p2p, opcount, op, count, rest, grank, _ = key
    host, pid, dev = who_fields(who)
    dt, op_enum, root, comm, nranks = rest_fields(rest)
    return CallRecord(
        (p2p or op).decode("ascii"),
        int(opcount[-16:], 16) if opcount else -1,
        bounded(count, 0, MAX_COUNT),
        dt,
        op_enum,
        root,
        comm,
        nranks,
        "",
        globalrank=_i(grank) if grank else None,
        host=host,
        pid=pid,
        device=dev,
    )


TORN_MARK = b"\x00torn "  # starts the who token of a LineKey made from a torn line (HostFixer repairs its host)


def line_key(m: re.Match[bytes], torn: bool = False) -> LineKey:
    """The LineKey for one ``_FULL`` match: what LINE would have captured (the who token marked if ``torn``)."""
    g = m.group
    op = g("op")
    p2p = op in (b"Send", b"Recv")
    who = g("prefix") or b""
    rest = b"datatype %s op %s root %s comm %s [nranks=%s]" % (
        g("datatype"),
        g("redop"),
        g("root"),
        g("comm"),
        g("nranks"),
    )
    return (
        TORN_MARK + who if torn else who,
        op if p2p else b"",
        g("opcount") if p2p else b"",
        b"" if p2p else op,
        g("count"),
        rest,
        g("globalrank") or b"",
        b"",
    )


def line_calls(line: bytes, occurrences: int | None = None) -> Iterator[tuple[re.Match[bytes], bool]]:
    """The calls of one line (without its newline) as (match, torn), by the one grammar of a line
    (docs/conventions.md, "NCCL debug-log lines"): a line with one 'opCount ' holds at most one call (``_LONE``);
    a line with two or more is torn and ``_FULL`` finds each complete call in it, torn when another call or a
    fragment precedes it there. ``occurrences``: the line's 'opCount ' count, when the caller has it."""
    n = line.count(b"opCount ") if occurrences is None else occurrences
    if n == 1:
        m = _LONE.search(line)
        if m is not None:
            yield m, False
    elif n > 1:
        prev_end = -1
        for m in _FULL.finditer(line):
            yield m, prev_end >= 0 or line.count(b"opCount ", 0, m.start()) > 0
            prev_end = m.end()


def _calls_with_flags(text: bytes) -> Iterator[tuple[re.Match[bytes], bool, bool]]:
    """(match, first call on its line, torn) for every line of ``text``."""
    for line in text.split(b"\n"):
        first = True
        for m, torn in line_calls(line):
            yield m, first, torn
            first = False


class LineSink(Protocol):
    """What ``LogParser.tally`` feeds, in log order: LINE matches in bulk, CallRecords for calls read with
    ``_FULL`` (torn lines and stretches LINE could not read)."""

    def lines(self, found: list[LineKey]) -> None: ...

    def record(self, rec: CallRecord) -> None: ...


class LogParser:
    """Parses one or more logs, keeping ParseStats and InitRecords across them.

    ``calls(path)`` yields CallRecords (full detail, in file order). ``tally(path, sink)`` is the fast road:
    LINE's matches go to the sink a block at a time (the caller counts them, at C speed where it can), so
    Python touches a call only where the caller needs it to (Send/Recv). Both stream: memory never grows with
    the log. Hosts are kept as logged, with ``torn`` set where a torn line may have glued junk to them (the
    summary repairs them). Both roads give the same calls.
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
        for block in self._blocks_from(io.BufferedReader(io.BytesIO(data))):
            out += self._records(block)
        return out

    def tally(self, path: str, sink: LineSink) -> None:
        """Feed every call of ``path`` to ``sink``, in log order."""
        self.stats.files.append(path)
        with open_log(path) as fh:
            self.tally_stream(fh, sink)

    def tally_stream(self, fh: BinaryIO, sink: LineSink) -> None:
        """``tally`` of an open stream (a worker of ``--jobs`` reads a byte range of a log through it)."""
        stats = self.stats
        native = getattr(sink, "native", None)  # the native reader's Engine (analyze.native_reader)
        for block in self._blocks_from(fh, count_lines=native is None):
            if native is None:
                expected = block.count(b"opCount ")
                calls, call_lines = self._tally_text(block, sink, expected)
            else:
                calls, call_lines, expected = self._tally_native(block, sink, native)
            stats.call_lines += call_lines
            self._block_stats(block, calls, expected, inits=False)  # LINE hands Init lines over

    def _tally_native(self, block: bytes, sink: LineSink, native: Any) -> tuple[int, int, int]:
        """(calls, call lines, 'opCount ' occurrences) of a block read by the native reader; each line it leaves
        (its ``stop``) is read here with the Python reader, in its place. Counts the block's lines."""
        calls = call_lines = occurrences = pos = 0
        lines = -1  # the block's first newline ends the line before it
        while True:
            read, stop, newlines = native.scan(block, pos)
            calls += read
            call_lines += read
            occurrences += read  # a line the engine reads holds one 'opCount '
            lines += newlines
            if stop < 0:
                break
            end = block.find(b"\n", stop + 1)
            pos = len(block) if end < 0 else end
            text = block[stop:pos]
            expected = text.count(b"opCount ")
            more, more_lines = self._tally_text(text, sink, expected)
            calls += more
            call_lines += more_lines
            occurrences += expected
            lines += 1
        self.stats.lines += lines
        return calls, call_lines, occurrences

    def _tally_text(self, text: bytes, sink: LineSink, expected: int) -> tuple[int, int]:
        """(calls, call lines) of ``text`` (whole lines after a newline) fed to ``sink`` by the Python reader."""
        found = LINE.findall(text)
        # the common case: one call on every line that has an 'opCount ' (a torn or Init line LINE hands over can
        # balance a call LINE missed: an Init line and a call without its header)
        if len(found) == expected and not any(map(_OTHER_LINE, found)):
            sink.lines(found)
            return len(found), len(found)
        return self._tally_irregular(text, found, sink, expected)

    # -- internals ----------------------------------------------------------------------------------
    def _tally_irregular(self, block: bytes, found: list[LineKey], sink: LineSink, expected: int) -> tuple[int, int]:
        """A block where LINE's matches are not one per 'opCount ' (``expected``). LINE hands over torn lines
        (two or more 'opCount ') and Init COMPLETE lines as their text; the latter are read here. When LINE
        read every other call line (the usual case), the calls of torn lines, read with _FULL, take their place
        as LineKeys (``line_key``, torn ones marked) and the block goes to the sink in one piece. Otherwise each
        stretch between torn lines where LINE falls short is read again with _FULL and goes to the sink as
        CallRecords."""
        torn_at = list(compress(range(len(found)), map(_OTHER_LINE, found)))  # torn and Init COMPLETE lines
        texts = [found[i][7] for i in torn_at]
        for text in texts:
            if b"Init COMPLETE" in text:
                self._inits(text)
        if len(found) - len(torn_at) + sum(text.count(b"opCount ") for text in texts) == expected:
            keys: list[LineKey] = []
            call_lines = len(found) - len(torn_at)
            prev = 0
            for i, text in zip(torn_at, texts):
                keys += found[prev:i]
                for m, first, torn in _calls_with_flags(text):
                    keys.append(line_key(m, torn))
                    call_lines += first
                prev = i + 1
            keys += found[prev:]
            sink.lines(keys)
            return len(keys), call_lines

        lines = block.split(b"\n")
        per_line = list(map(_COUNT_OPCOUNT, lines))
        torn_lines = compress(range(len(per_line)), map((1).__lt__, per_line))
        calls = call_lines = 0

        def via_full(line: bytes) -> None:  # a torn line
            nonlocal calls, call_lines
            first = True
            for m, torn in line_calls(line):
                sink.record(record_from_match(m, torn))
                calls += 1
                call_lines += first
                first = False

        def stretch(first: int, end: int) -> None:  # lines[first:end], none of them torn
            nonlocal calls, call_lines
            text = b"\n".join(lines[first:end])
            part = list(filterfalse(_OTHER_LINE, LINE.findall(b"\n" + text)))  # Init lines: read above
            if len(part) == sum(per_line[first:end]):
                sink.lines(part)
                calls += len(part)
                call_lines += len(part)
                return
            # Line by line, as the native reader reads them: LINE where it reads the line, else the line's one
            # call without its header (_LONE), else a fragment. Never a stretch at once: a pattern run over
            # several lines would read a different grammar than one line at a time.
            keys: list[LineKey] = []
            for i in compress(range(first, end), per_line[first:end]):
                m = LINE.match(b"\n" + lines[i])
                if m is not None and not m.group(8):
                    keys.append(m.groups(b""))  # type: ignore[arg-type]
                    continue
                lone = _LONE.search(lines[i])
                if lone is None:
                    continue
                if keys:  # log order
                    sink.lines(keys)
                    calls += len(keys)
                    call_lines += len(keys)
                    keys = []
                sink.record(record_from_match(lone))
                calls += 1
                call_lines += 1
            if keys:
                sink.lines(keys)
                calls += len(keys)
                call_lines += len(keys)

        start = 0
        for i in torn_lines:
            if i > start:
                stretch(start, i)
            via_full(lines[i])
            start = i + 1
        if start < len(lines):
            stretch(start, len(lines))
        return calls, call_lines

    def _records(self, block: bytes) -> list[CallRecord]:
        out = []
        call_lines = 0
        for m, first, torn in _calls_with_flags(block):
            out.append(record_from_match(m, torn))
            call_lines += first
        self.stats.call_lines += call_lines
        self._block_stats(block, len(out), block.count(b"opCount "))
        return out

    def _block_stats(self, block: bytes, calls: int, occurrences: int, inits: bool = True) -> None:
        stats = self.stats
        stats.calls += calls
        stats.fragments += occurrences - calls
        if not stats.rccl_fields and calls:
            stats.rccl_fields = any(block.find(marker, 0, _MARKER_SPAN) >= 0 for marker in _RCCL_MARKERS)
        if inits and b"Init COMPLETE" in block:
            self._inits(block)

    def _blocks(self, path: str) -> Iterator[bytes]:
        self.stats.files.append(path)
        with open_log(path) as fh:
            yield from self._blocks_from(fh)

    def _blocks_from(self, fh: BinaryIO, count_lines: bool = True) -> Iterator[bytes]:
        """Blocks of whole lines, about BLOCK bytes each; lines are counted here (``count_lines`` False: the
        native reader counts a block's newlines; a cut line and the last line are still counted here). Every
        block starts with a newline (the one that ended the line before it; one is made up before the first
        line), so LINE anchors on every line start without another copy of the block."""
        stats = self.stats
        tail = b"\n"  # the newline that ended the last block and what came after it
        read = getattr(fh, "read1", fh.read)  # read1: a truncated .gz still yields what precedes the damage
        while True:
            try:
                chunk = read(BLOCK)
            except (EOFError, OSError, ValueError, zlib.error) as exc:  # truncated or corrupt .gz: keep what was read
                stats.read_errors.append(f"{type(exc).__name__}: {exc}")
                chunk = b""
            if not chunk:
                break
            stats.bytes += len(chunk)
            cut = chunk.rfind(b"\n")
            if cut < 0:  # a line longer than this chunk
                tail += chunk
            else:
                block = b"".join((tail, memoryview(chunk)[: cut + 1]))
                tail = chunk[cut:]
                if count_lines:
                    stats.lines += block.count(b"\n") - 1
                yield block
            if len(tail) > MAX_LINE + 1:
                stats.cut_lines += 1
                stats.lines += 1
                yield tail
                tail = b"\n"
        if len(tail) > 1:
            stats.lines += 1
            yield tail

    def _inits(self, block: bytes) -> None:
        for m in _INIT.finditer(block):
            host, pid, dev, comm, rank, nranks, commid = m.group(
                "host", "pid", "dev", "comm", "rank", "nranks", "commid"
            )
            self.inits.append(
                InitRecord(
                    _s(host),
                    _i(pid),
                    _i(dev),
                    _s(comm) or "",
                    bounded(rank, 0, MAX_RANKS),
                    bounded(nranks, 1, MAX_RANKS),
                    _s(commid),
                )
            )
            self.stats.init_lines += 1
