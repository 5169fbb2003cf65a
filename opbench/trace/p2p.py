"""Recognise all-to-all in pre-2.28 NCCL logs, where it appears as grouped Send/Recv
(docs/conventions.md, "NCCL debug-log lines").

Before NCCL 2.28 there is no ncclAlltoAll: PyTorch's ``all_to_all_single`` issues, inside one
ncclGroupStart/End, a Send and a Recv to every rank of the communicator (itself included). NCCL logs each of
them on its own line with the peer in the ``root`` field; all of them carry the same opCount (the counter
advances once per group launch).

What we do, per stream (process = host, pid, device; communicator = comm, nranks), over its Send/Recv lines
in log order:

* a group is the run of Send/Recv lines with one opCount; it ends at another opCount, when a peer repeats, or
  when every rank has been sent to and received from (so back-to-back all-to-alls are split even on releases
  whose opCount does not advance). Other ops in between do not end it: outside the group they carry another
  opCount anyway, and inside it (a collective in the same ncclGroup) they do not change what the Send/Recv do;
* a group whose Sends and Recvs each reach every rank once (or every rank but itself, for nranks >= 3), with
  one datatype, becomes **one** synthetic call: ``AlltoAll`` with ``count`` = the per-peer count when all
  counts are equal (nccl-tests alltoall semantics: size = count·nranks·elt), or ``AlltoAllv`` with
  ``count`` = ceil(total elements sent / nranks) when they differ (MoE token dispatch), timed as the even
  all-to-all that moves the same bytes;
* anything else (pipeline-parallel send/recv pairs, partial groups) stays as logged Send/Recv rows, whose
  nccl-tests equivalent is sendrecv_perf with ``-b`` = count·elt.

Memory: at most one open group per stream, each capped at ``4·nranks + 8`` lines.

Two inputs share one P2pGrouper, so a torn line's call joins the group of the clean lines around it: ``lines``
takes a block of LINE matches (parse.LineKey tuples, torn lines already turned into LineKeys in their place;
the fast road of ``analyze``), ``record`` takes one CallRecord (the record road, and stretches the fast road
could not read). Finished groups go to ``emit``; on the fast road an all-to-all is counted straight into
``merged`` and other calls into ``raw``.

Why ``lines`` is fast: Python touches a run, not a line. The block's Send/Recv lines are stably sorted by
process (log order kept within a process) and described by columns built at C speed (map, filter, compress,
dict lookups of the few distinct spans): a run is a stretch of one process and one opCount, and one int per
line says its communicator, datatype, peer and direction. A run that is one whole group on its own (one
communicator and datatype, no repeated peer, at most 2·nranks lines, no open group before it: every
all-to-all and every pipeline send/recv) is decided in one step from slices of those columns; other runs are
walked line by line with ``record``'s rules. The lines of groups still open at the end of a block are read
again in front of the next block, so a block boundary does not cut an all-to-all into walked pieces.
"""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, compress, filterfalse, repeat
from operator import itemgetter
from typing import Any

from .parse import MAX_COUNT, OUT_OF_RANGE, P2P_OPS, CallRecord, LineKey, ProcFields, bounded, rest_fields, who_fields

GROUPED_NOTE = "grouped Send/Recv"
CACHE_LIMIT = 1 << 16  # parsed who/rest spans kept (a log with per-line junk in them stays bounded)

_WHO, _P2P, _OPCOUNT, _COUNT, _REST = (itemgetter(i) for i in (0, 1, 2, 4, 5))
_SEND = b"Send"
_MIXED, _REPEAT, _ALLTOALL, _GROUP = range(4)  # kinds of run (P2pGrouper._shape)
Shape = tuple[int, int, int, list[bool], frozenset[int], frozenset[int]]
_PEER0 = 1 << 30  # peers are stored shifted by this in line codes (root may be negative in odd logs)


def alltoall_count(counts: list[bytes], sends: Iterable[bool], n: int) -> tuple[str, int]:
    """(op, count) of an all-to-all group from its lines' counts as logged: ``AlltoAll`` with the per-peer count
    when all are equal, else ``AlltoAllv`` with ceil(elements sent / n) (the module docstring's rule)."""
    if max(map(len, counts)) > 17:  # beyond parse.MAX_COUNT whatever it says: the summary skips and counts it
        return ("AlltoAll", OUT_OF_RANGE)
    if counts.count(counts[0]) == len(counts) or (
        min(counts)[:1] == b"0" and len(set(map(int, counts))) == 1  # "08" is 8
    ):
        return ("AlltoAll", int(counts[0]))
    return ("AlltoAllv", -(-sum(map(int, compress(counts, sends))) // n))


class Group:
    """One run of Send/Recv lines of one stream with one opCount. ``items`` are what was fed: LineKey tuples
    or CallRecords, in log order; ``records`` says whether any is a CallRecord."""

    __slots__ = ("opcount", "nranks", "items", "sends", "recvs", "records")

    def __init__(self, opcount: bytes, nranks: int) -> None:
        self.opcount = opcount  # as logged (lower-case hex)
        self.nranks = nranks
        self.items: list[Any] = []
        self.sends: set[int] = set()
        self.recvs: set[int] = set()
        self.records = False

    def alltoall(self, rest_dtype: dict[bytes, int] | None = None) -> tuple[str, int] | None:
        """(op, count) of the all-to-all this group is, or None when it is not one. ``rest_dtype`` (rest span →
        datatype, P2pGrouper's cache) saves parsing the spans of LineKey items again."""
        n, peers = self.nranks, self.sends
        if n < 2 or peers != self.recvs or min(peers) < 0 or max(peers) >= n:
            return None
        if not (len(peers) == n or (n >= 3 and len(peers) == n - 1)):
            return None
        items = self.items
        if not self.records:  # LineKeys only: every step below is C-level
            dtypes = set(map((rest_dtype or {}).get, map(_REST, items)))
            if None in dtypes:  # a span no longer cached
                dtypes = {rest_fields(rest)[0] for rest in map(_REST, items)}
            if len(dtypes) != 1:
                return None
            return alltoall_count(list(map(_COUNT, items)), map(_SEND.__eq__, map(_P2P, items)), n)
        sends: list[int] = []
        num: set[int] = set()
        dts: set[int] = set()
        for item in items:
            if isinstance(item, CallRecord):
                is_send, count, dt = item.op == "Send", item.count, item.datatype
            else:
                is_send, count, dt = item[1] == _SEND, bounded(item[4], 0, MAX_COUNT), rest_fields(item[5])[0]
            num.add(count)
            dts.add(dt)
            if is_send:
                sends.append(count)
        if len(dts) != 1:
            return None
        if OUT_OF_RANGE in num:
            return ("AlltoAll", OUT_OF_RANGE)
        if len(num) == 1:
            return ("AlltoAll", num.pop())
        return ("AlltoAllv", -(-sum(sends) // n))


class P2pGrouper:
    """Groups Send/Recv calls per stream as the module docstring says; ``emit`` gets each finished group,
    ``finish`` flushes the open ones at the end."""

    def __init__(
        self,
        emit: Callable[[Group], None],
        raw: Counter[LineKey] | None = None,
        merged: Counter[LineKey] | None = None,
    ) -> None:
        self.emit = emit
        self.raw: Counter[LineKey] = Counter() if raw is None else raw  # calls other than Send/Recv (``lines``)
        self.merged: Counter[LineKey] = Counter() if merged is None else merged  # all-to-alls found by ``lines``
        self.open: dict[int, Group] = {}
        # Send/Recv lines of the groups a block opened and left open: they go in front of the next block's, so a
        # group cut by a block boundary is read in one piece. Once only: a group still open after that stays in
        # ``open`` and later lines join it one at a time, so lines are never read again block after block (a log
        # with thousands of communicators, each with one open group, stays linear).
        self._pending: list[LineKey] = []
        self._opened: list[tuple[int, Group]] = []  # groups opened since the block began (sid, group)
        self._procs: dict[ProcFields, int] = {}  # process → id << 32
        self._comms: dict[tuple[str, int], int] = {}  # (comm, nranks) → id
        self._nranks: dict[int, int] = {}  # comm id → nranks
        self._classes: dict[tuple[int, int], int] = {}  # (comm id, datatype) → class id
        self._class_comm: dict[int, int] = {}  # class id → comm id
        self._shapes: dict[tuple[int, ...], Shape] = {}  # run codes → _shape()
        # caches of the spans met in LINE matches (bounded by CACHE_LIMIT)
        self._who_proc: dict[bytes, int] = {}  # who token → process id << 32
        self._rest_code: dict[bytes, int] = {}  # rest span → class << 32 | (peer + _PEER0) << 1
        self._rest_comm: dict[bytes, int] = {}  # rest span → comm id
        self._rest_peer: dict[bytes, int] = {}  # rest span → root (the peer)
        self.rest_dtype: dict[bytes, int] = {}  # rest span → datatype (for Group.alltoall)

    # -- ids ----------------------------------------------------------------------------------------
    def _proc_id(self, proc: ProcFields) -> int:
        pid = self._procs.get(proc)
        if pid is None:
            pid = self._procs[proc] = (len(self._procs) + 1) << 32
        return pid

    def _comm_id(self, comm: str, nranks: int) -> int:
        cid = self._comms.get((comm, nranks))
        if cid is None:
            cid = self._comms[(comm, nranks)] = len(self._comms)
            self._nranks[cid] = nranks
        return cid

    def _learn(self, p2p: list[LineKey]) -> None:
        """Put this block's new who/rest spans in the caches (a handful per block after the first)."""
        who_proc, rest_code = self._who_proc, self._rest_code
        new_who = set(map(_WHO, p2p)).difference(who_proc)
        new_rest = set(map(_REST, p2p)).difference(rest_code)
        if len(who_proc) + len(new_who) > CACHE_LIMIT or len(rest_code) + len(new_rest) > CACHE_LIMIT:
            for cache in (who_proc, rest_code, self._rest_peer, self._rest_comm, self.rest_dtype):
                cache.clear()
            new_who, new_rest = set(map(_WHO, p2p)), set(map(_REST, p2p))
        for who in new_who:
            who_proc[who] = self._proc_id(who_fields(who))
        for rest in new_rest:
            dtype, _, peer, comm, nranks = rest_fields(rest)
            comm_id = self._rest_comm[rest] = self._comm_id(comm, nranks)
            cls = self._classes.get((comm_id, dtype))
            if cls is None:
                cls = self._classes[(comm_id, dtype)] = len(self._classes)
                self._class_comm[cls] = comm_id
            rest_code[rest] = (cls << 32) + ((min(max(peer, -_PEER0), _PEER0 - 1) + _PEER0) << 1)
            self._rest_peer[rest] = peer
            self.rest_dtype[rest] = dtype

    # -- input --------------------------------------------------------------------------------------
    def lines(self, found: list[LineKey]) -> None:
        """A block of LINE matches in log order. Calls other than Send/Recv are counted in ``raw``; a run that
        is a whole all-to-all is counted in ``merged`` as one LineKey (op ``AlltoAll``/``AlltoAllv`` and its
        count, the rest from its first line); every other group goes to ``emit``."""
        p2p = list(filter(_P2P, found))
        if len(p2p) < len(found):
            self.raw.update(filterfalse(_P2P, found))
        fresh = p2p[:]
        self._opened.clear()
        if self._pending:
            p2p[:0] = self._pending
            self._pending = []
        if p2p:
            self._process(p2p)
        if self._opened:
            new = set(map(id, fresh))  # a group that starts with a line read again is not read a third time
            open_ = self.open
            for sid, g in self._opened:
                if open_.get(sid) is g and not g.records and id(g.items[0]) in new:
                    self._pending += open_.pop(sid).items
            self._opened.clear()

    def _process(self, p2p: list[LineKey]) -> None:
        """Group Send/Recv LINE matches given in log order."""
        try:
            procs = list(map(self._who_proc.__getitem__, map(_WHO, p2p)))
            codes = list(map(self._rest_code.__getitem__, map(_REST, p2p)))
        except KeyError:  # spans not met before
            self._learn(p2p)
            procs = list(map(self._who_proc.__getitem__, map(_WHO, p2p)))
            codes = list(map(self._rest_code.__getitem__, map(_REST, p2p)))
        # Columns sorted by process (stable: log order within a process), built at C speed. A run is a stretch
        # of one process and one opCount. A line's code is class << 32 | (peer + 2**30) << 1 | is_send, with
        # class = (communicator, datatype): one int says which (send/recv, peer) of which stream a line is.
        order = sorted(range(len(p2p)), key=procs.__getitem__)
        keys = list(map(p2p.__getitem__, order))
        opcount_col = list(map(_OPCOUNT, keys))
        is_send = map(operator.eq, map(_P2P, keys), repeat(_SEND))
        code_col = list(map(operator.add, map(codes.__getitem__, order), is_send))
        count_col = list(map(_COUNT, keys))
        per_proc = Counter(procs)
        proc_starts = accumulate(per_proc[proc] for proc in sorted(per_proc))  # each process's end, in order
        opcount_starts = compress(range(1, len(keys)), map(operator.ne, opcount_col[1:], opcount_col))
        starts = sorted({0, *opcount_starts, *proc_starts} - {len(keys)})
        who_proc, shapes, merged, open_, emit = self._who_proc, self._shapes, self.merged, self.open, self.emit
        for s, e in zip(starts, [*starts[1:], len(keys)]):
            run_codes = tuple(code_col[s:e])
            shape = shapes.get(run_codes)
            if shape is None:
                shape = self._shape(run_codes)
            kind, comm_id, n, sends, send_peers, recv_peers = shape
            if kind == _MIXED:
                self._walk(keys[s:e])
                continue
            first = keys[s]
            sid, opcount = who_proc[first[0]] + comm_id, first[2]
            g = open_.get(sid)
            if g is not None:
                if g.opcount == opcount:  # a group continued from an earlier block or who token
                    self._walk(keys[s:e])
                    continue
                emit(open_.pop(sid))
            if kind == _REPEAT:
                self._walk(keys[s:e])
                continue
            if kind == _ALLTOALL:
                op, count = alltoall_count(count_col[s:e], sends, n)
                merged[(first[0], b"", b"", op.encode(), b"%d" % count, first[5], first[6], b"")] += 1
                continue
            g = Group(opcount, n)  # the whole run is one group (kind _GROUP)
            g.items = keys[s:e]
            g.sends, g.recvs = set(send_peers), set(recv_peers)
            if len(g.sends) == n and len(g.recvs) == n:
                emit(g)
            else:
                open_[sid] = g
                self._opened.append((sid, g))

    def _shape(self, codes: tuple[int, ...]) -> Shape:
        """What a run with these line codes is, as far as the codes tell (cached: a job repeats a few shapes):
        (kind, comm id, nranks, is_send per line, peers sent to, peers received from). _MIXED: more than one communicator or datatype; _REPEAT: a
        repeated peer or more than 2·nranks lines (walked line by line); _ALLTOALL: every peer 0..n-1 once each
        way (a whole all-to-all); _GROUP: any other run that is one group on its own (it cannot complete before
        its last line)."""
        if len(self._shapes) >= CACHE_LIMIT:
            self._shapes.clear()
        low, high, size = min(codes), max(codes), len(codes)
        cls = low >> 32
        sends = [bool(code & 1) for code in codes]
        peers = [((code >> 1) & 0x7FFFFFFF) - _PEER0 for code in codes]
        send_peers = frozenset(compress(peers, sends))
        recv_peers = frozenset(peer for peer, send in zip(peers, sends) if not send)
        if high >> 32 != cls:
            shape: Shape = (_MIXED, 0, 0, sends, send_peers, recv_peers)
        else:
            comm_id = self._class_comm[cls]
            n = self._nranks[comm_id]
            base = (cls << 32) + (_PEER0 << 1)
            if size > 2 * n or len(set(codes)) != size:
                kind = _REPEAT
            elif size == 2 * n >= 4 and sum(sends) == n and low >= base and high < base + 2 * n:
                kind = _ALLTOALL  # peers 0..n-1 both ways in one datatype (distinct codes, 2n of them)
            else:
                kind = _GROUP
            shape = (kind, comm_id, n, sends, send_peers, recv_peers)
        self._shapes[codes] = shape
        return shape

    def _walk(self, keys: list[LineKey]) -> None:
        """Feed LINE matches one at a time (their spans are cached: ``lines`` learnt them)."""
        who_proc, rest_comm, rest_peer, nranks_of = self._who_proc, self._rest_comm, self._rest_peer, self._nranks
        for key in keys:
            comm_id = rest_comm[key[5]]
            sid = who_proc[key[0]] + comm_id
            self._feed(sid, nranks_of[comm_id], key[2], rest_peer[key[5]], key[1] == _SEND, key)

    def record(self, rec: CallRecord) -> None:
        """One Send/Recv CallRecord, same rules as ``lines``."""
        if self._pending:  # lines before it come first
            self._process(self._pending)
            self._pending = []
        sid = self._proc_id((rec.host, rec.pid, rec.device)) + self._comm_id(rec.comm, rec.nranks)
        self._feed(sid, rec.nranks, b"%x" % rec.opcount, rec.root, rec.op == "Send", rec)

    def _feed(self, sid: int, n: int, opcount: bytes, peer: int, is_send: bool, item: Any) -> None:
        """One call, in log order: the rules of the module docstring, one line at a time."""
        g = self.open.get(sid)
        if g is not None and (
            g.opcount != opcount or peer in (g.sends if is_send else g.recvs) or len(g.items) >= 4 * n + 8
        ):
            self.emit(self.open.pop(sid))
            g = None
        if g is None:
            g = self.open[sid] = Group(opcount, n)
            self._opened.append((sid, g))
        (g.sends if is_send else g.recvs).add(peer)
        g.items.append(item)
        g.records = g.records or isinstance(item, CallRecord)
        if len(g.sends) == n and len(g.recvs) == n:
            self.emit(self.open.pop(sid))

    def finish(self) -> None:
        if self._pending:
            self._process(self._pending)
            self._pending = []
        for g in list(self.open.values()):
            self.emit(g)
        self.open.clear()


def merged_record(group: Group, first: CallRecord) -> CallRecord | None:
    """The one AlltoAll/AlltoAllv record a group stands for (fields from its ``first`` line), or None."""
    a2a = group.alltoall()
    if a2a is None:
        return None
    return dataclasses.replace(
        first, op=a2a[0], count=a2a[1], root=-1, inferred=f"{GROUPED_NOTE} ({len(group.items)} lines)"
    )


def group_p2p(records: Iterable[CallRecord]) -> Iterator[CallRecord]:
    """Pass records through, replacing grouped Send/Recv all-to-all patterns by one AlltoAll record each."""
    out: list[CallRecord] = []

    def emit(g: Group) -> None:
        merged = merged_record(g, g.items[0])
        out.extend([merged] if merged is not None else g.items)

    grouper = P2pGrouper(emit)
    for rec in records:
        if rec.op in P2P_OPS:
            grouper.record(rec)
        else:
            out.append(rec)
        if out:
            yield from out
            out.clear()
    grouper.finish()
    yield from out
