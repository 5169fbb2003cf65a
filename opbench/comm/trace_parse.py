"""Streaming parser for NCCL/RCCL ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL`` logs (REFERENCE §5).

One call line, every NCCL release from 2.3.7 to 2.30 and RCCL::

    host:pid:tid [dev] NCCL INFO AllGather: opCount c97 sendbuff 0x… recvbuff 0x… count 106956800
        datatype 9 op 0 root 0 comm 0x… [nranks=8] stream 0x…

with RCCL's `` acc 0x…|(nil)`` before ``count`` (2.27) and `` task N globalrank N`` at the end (>= 2.18),
old RCCL's µs timestamp between ``[dev]`` and ``NCCL INFO``, NCCL's optional ``[YYYY-mm-dd HH:MM:SS] `` prefix,
and whatever launchers glue in front (``[0] ``, `` 0: ``, ``[1,0]<stdout>:``, Ray tags, collector timestamps).

Why it is fast and small: the file is read in 4 MiB byte blocks (never decoded), and one compiled regex that
starts with the literal ``opCount `` runs over a whole block with ``finditer`` — the regex engine skips
non-NCCL text at memchr speed, so Python code only runs for real calls. Only the text *before* a match (the
prefix) is looked at with plain ``bytes`` methods. Memory is one block plus one partial line; lines longer
than ``MAX_LINE`` without a newline (binary garbage) are cut, so memory stays bounded on any input.

Torn lines (two processes writing into one line) are handled by parsing only complete call bodies: the
fragment of the interrupted call fails the regex and is counted in ``ParseStats.fragments``; the complete
call on that line keeps the prefix that immediately precedes it. Nothing in here raises on bad input.
"""

from __future__ import annotations

import gzip
import io
import re
import sys
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

from .conventions import COLLECTIVES, NCCL_DTYPES, NCCL_OP_TO_COLLECTIVE, redop_name

BLOCK = 4 << 20          # bytes read per step
MAX_LINE = 1 << 20       # a "line" longer than this without a newline is cut (garbage)

# The call body, from the literal "opCount" to the stream pointer (and RCCL's task/globalrank).
# No \s anywhere, so a match can never run across a newline.
_CALL = re.compile(
    rb"opCount (?P<opcount>[0-9a-fA-F]+) sendbuff (?P<sendbuff>\S+) recvbuff (?P<recvbuff>\S+) "
    rb"(?:acc (?P<acc>\S+) )?count (?P<count>\d+) datatype (?P<datatype>\d+) op (?P<op>\d+) "
    rb"root (?P<root>-?\d+) comm (?P<comm>\S+) \[nranks=(?P<nranks>\d+)\] "
    rb"stream (?P<stream>0x[0-9a-fA-F]+|\(nil\)|\S+)"
    rb"(?: task (?P<task>-?\d+) globalrank (?P<globalrank>-?\d+))?"
)
# "comm 0x… rank 3 nranks 8 cudaDev 3 [nvmlDev 3] busId … [commId 0x…] - Init COMPLETE" (INIT subsystem)
_INIT = re.compile(rb"comm (?P<comm>\S+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<dev>-?\d+)"
                   rb"(?:.*?commId (?P<commid>0x[0-9a-fA-F]+))?")
_OP_TAIL = re.compile(rb"([A-Za-z][A-Za-z0-9]*)$")
_INFO = b"NCCL INFO "
_P2P_OPS = frozenset({"Send", "Recv"})
_ROOTED = frozenset({"Broadcast", "Reduce", "Gather", "Scatter"})
# Op names this package synthesises (trace_p2p): an uneven all-to-all is timed as the even one moving as many bytes.
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
    inferred: str | None = None    # set on records synthesised from other lines (grouped Send/Recv → AlltoAll)

    @property
    def collective(self) -> str | None:
        """opbench collective name (conventions.NCCL_OP_TO_COLLECTIVE); None for ops nccl-tests has no row for."""
        return NCCL_OP_TO_COLLECTIVE.get(self.op) or INFERRED_OPS.get(self.op)

    @property
    def dtype(self) -> str:
        d = NCCL_DTYPES.get(self.datatype)
        return d.name if d else f"dtype{self.datatype}"

    @property
    def elt_size(self) -> int | None:
        d = NCCL_DTYPES.get(self.datatype)
        return d.size if d else None

    @property
    def bytes(self) -> int | None:
        """count × element size: the bytes this rank passes to NCCL for ``count`` (not the nccl-tests -b)."""
        size = self.elt_size
        return None if size is None else self.count * size

    @property
    def redop(self) -> str | None:
        """Reduction name for reducing ops; None for ops whose logged ``op`` field means nothing."""
        coll = COLLECTIVES.get(self.collective or "")
        return redop_name(self.op_enum) if coll is not None and coll.has_redop else None

    @property
    def peer(self) -> int | None:
        """Send/Recv log their peer in the ``root`` field."""
        return self.root if self.op in _P2P_OPS else None

    @property
    def root_rank(self) -> int | None:
        return self.root if self.op in _ROOTED else None

    @property
    def process(self) -> tuple[str | None, int | None, int | None]:
        """Who logged it: (host, pid, device). RCCL's globalrank is more precise where logged."""
        return (self.host, self.pid, self.device)


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
    fragments: int = 0      # 'opCount ' occurrences that were not a complete call (torn / truncated lines)
    init_lines: int = 0
    cut_lines: int = 0      # over-long lines cut at MAX_LINE
    read_errors: list[str] = field(default_factory=list)   # e.g. a truncated .gz (what came before is kept)

    @property
    def skipped(self) -> int:
        return self.lines - self.call_lines

    def as_dict(self) -> dict[str, int]:
        return {"bytes": self.bytes, "lines": self.lines, "calls": self.calls, "call_lines": self.call_lines,
                "skipped_lines": self.skipped, "fragments": self.fragments, "init_lines": self.init_lines,
                "cut_lines": self.cut_lines}


def open_log(path: str) -> BinaryIO:
    """Binary stream for a log path; '-' is stdin; gzip is detected by its magic bytes, not the name."""
    raw: BinaryIO = sys.stdin.buffer if path == "-" else open(path, "rb")
    buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw)  # type: ignore[arg-type]
    if buffered.peek(2)[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=buffered, mode="rb")  # type: ignore[return-value]
    return buffered


def _int(text: bytes) -> int | None:
    return int(text) if text.isdigit() else None


class _HostFixer:
    """Repairs hosts glued to a torn fragment ('0xdgx07' → 'dgx07') using hosts seen on clean lines."""

    def __init__(self) -> None:
        self.by_pid: dict[int, set[str]] = {}
        self.known: set[str] = set()

    def learn(self, host: str, pid: int | None) -> None:
        if host not in self.known:
            self.known.add(host)
        if pid is not None:
            self.by_pid.setdefault(pid, set()).add(host)

    def fix(self, host: str, pid: int | None) -> str:
        if host in self.known:
            return host
        candidates = self.by_pid.get(pid, set()) if pid is not None else set()
        for pool in (candidates, self.known):
            hits = [h for h in pool if host.endswith(h)]
            if hits:
                return max(hits, key=len)
        return host


def _parse_prefix(pre: bytes) -> tuple[str | None, int | None, int | None, int | None]:
    """``…host:pid:tid [dev] [ts] NCCL INFO `` → (host, pid, tid, dev); Nones where absent or unreadable."""
    if not pre.endswith(_INFO):
        return None, None, None, None
    tokens = pre[: -len(_INFO)].rsplit(None, 3)
    if len(tokens) >= 2 and not tokens[-1].startswith(b"[") and tokens[-2].startswith(b"["):
        tokens.pop()                                   # old RCCL: µs timestamp before "NCCL INFO"
    if len(tokens) < 2 or not (tokens[-1].startswith(b"[") and tokens[-1].endswith(b"]")):
        return None, None, None, None
    dev = tokens[-1][1:-1]
    device = int(dev) if dev.lstrip(b"-").isdigit() else None
    parts = tokens[-2].rsplit(b":", 2)
    if len(parts) != 3:
        return None, None, None, device
    host = parts[0].rsplit(b":", 1)[-1]               # '[1,0]<stdout>:host' → 'host'
    return host.decode("utf-8", "replace") or None, _int(parts[1]), _int(parts[2]), device


class LogParser:
    """Parses one or more logs into CallRecords (and InitRecords), keeping ParseStats.

    ``calls(path)`` is a generator, so callers aggregate on the fly and memory stays constant.
    """

    def __init__(self) -> None:
        self.stats = ParseStats()
        self.inits: list[InitRecord] = []
        self._hosts = _HostFixer()

    # -- public -------------------------------------------------------------------------------------
    def calls(self, path: str) -> Iterator[CallRecord]:
        self.stats.files.append(path)
        with open_log(path) as fh:
            yield from self.calls_from_stream(fh)

    def calls_from_stream(self, fh: BinaryIO) -> Iterator[CallRecord]:
        tail = b""
        read = getattr(fh, "read1", fh.read)   # read1: a truncated .gz still yields what precedes the damage
        while True:
            try:
                chunk = read(BLOCK)
            except (EOFError, OSError, ValueError) as exc:  # truncated or corrupt .gz: keep what was read
                self.stats.read_errors.append(f"{type(exc).__name__}: {exc}")
                chunk = b""
            if not chunk:
                break
            self.stats.bytes += len(chunk)
            data = tail + chunk if tail else chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                if len(data) > MAX_LINE:
                    self.stats.cut_lines += 1
                    self.stats.lines += 1
                    yield from self._block(data, newline_terminated=False)
                    tail = b""
                else:
                    tail = data
                continue
            tail = data[cut + 1:]
            yield from self._block(data[: cut + 1], newline_terminated=True)
            if len(tail) > MAX_LINE:
                self.stats.cut_lines += 1
                self.stats.lines += 1
                yield from self._block(tail, newline_terminated=False)
                tail = b""
        if tail:
            self.stats.lines += 1
            yield from self._block(tail, newline_terminated=False)

    def parse_bytes(self, data: bytes) -> list[CallRecord]:
        """Convenience for tests and small inputs."""
        return list(self.calls_from_stream(io.BytesIO(data)))

    # -- internals ----------------------------------------------------------------------------------
    def _block(self, block: bytes, newline_terminated: bool) -> Iterator[CallRecord]:
        stats = self.stats
        if newline_terminated:
            stats.lines += block.count(b"\n")
        if b"Init COMPLETE" in block:
            self._inits(block)
        matched = 0
        prev_end = 0
        last_line_start = -1
        for m in _CALL.finditer(block):
            start = m.start()
            line_start = block.rfind(b"\n", 0, start) + 1
            clean = prev_end <= line_start              # no earlier call on this line
            head = block[line_start if clean else prev_end:start]
            prev_end = m.end()
            rec = self._record(m, head, clean)
            if rec is None:
                continue
            matched += 1
            if line_start != last_line_start:
                stats.call_lines += 1
                last_line_start = line_start
            yield rec
        stats.calls += matched
        stats.fragments += block.count(b"opCount ") - matched

    def _record(self, m: re.Match[bytes], head: bytes, clean: bool) -> CallRecord | None:
        if not head.endswith(b": "):
            return None
        op_tok = head[:-2].rsplit(None, 1)[-1] if head[:-2].strip() else b""
        om = _OP_TAIL.search(op_tok)
        if om is None:
            return None
        op_b = om.group(1)
        pre = head[: len(head) - 2 - len(op_b)]
        host, pid, tid, dev = _parse_prefix(pre)
        if host is not None:
            if clean and pre.count(_INFO) == 1 and pre.find(b"opCount") < 0:
                self._hosts.learn(host, pid)
            else:
                host = self._hosts.fix(host, pid)
        g = m.group
        acc = g("acc")
        task = g("task")
        try:
            return CallRecord(
                op=op_b.decode("ascii"), opcount=int(g("opcount"), 16), count=int(g("count")),
                datatype=int(g("datatype")), op_enum=int(g("op")), root=int(g("root")),
                comm=g("comm").decode("ascii", "replace"), nranks=int(g("nranks")),
                stream=g("stream").decode("ascii", "replace"),
                sendbuff=g("sendbuff").decode("ascii", "replace"), recvbuff=g("recvbuff").decode("ascii", "replace"),
                acc=acc.decode("ascii", "replace") if acc is not None else None,
                task=int(task) if task is not None else None,
                globalrank=int(g("globalrank")) if task is not None else None,
                host=host, pid=pid, tid=tid, device=dev,
            )
        except (ValueError, UnicodeDecodeError):
            return None

    def _inits(self, block: bytes) -> None:
        pos = block.find(b"Init COMPLETE")
        while pos >= 0:
            ls = block.rfind(b"\n", 0, pos) + 1
            line = block[ls:pos]
            m = None
            k = line.rfind(b"comm ")
            while k >= 0 and m is None:               # the last "comm …" on the line (torn lines)
                m = _INIT.match(line, k)
                k = line.rfind(b"comm ", 0, k)
            if m is not None:
                info_at = line.rfind(_INFO, 0, m.start())
                host, pid, _tid, dev = _parse_prefix(line[: info_at + len(_INFO)]) if info_at >= 0 else (
                    None, None, None, None)
                self.inits.append(InitRecord(host, pid, dev, m.group("comm").decode("ascii", "replace"),
                                             int(m.group("rank")), int(m.group("nranks")),
                                             m.group("commid").decode() if m.group("commid") else None))
                self.stats.init_lines += 1
            pos = block.find(b"Init COMPLETE", pos + 13)
