"""Recognise all-to-all in pre-2.28 NCCL logs, where it appears as grouped Send/Recv (REFERENCE §5).

Before NCCL 2.28 there is no ncclAlltoAll: PyTorch's ``all_to_all_single`` issues, inside one
ncclGroupStart/End, a Send and a Recv to every rank of the communicator (itself included). NCCL logs each of
them on its own line with the peer in the ``root`` field; all of them carry the same opCount (the counter
advances once per group launch).

What we do, per process and communicator (host, pid, device, comm), over consecutive Send/Recv lines:

* a group is the run of Send/Recv lines with one opCount; it ends at another opCount, at any other op on the
  same comm, when a peer repeats, or when every rank has been sent to and received from (so back-to-back
  all-to-alls are split even on releases whose opCount does not advance);
* a group whose Sends and Recvs each reach every rank once (or every rank but itself, for nranks >= 3), with
  one datatype, becomes **one** synthetic call: ``AlltoAll`` with ``count`` = the per-peer count when all
  counts are equal (nccl-tests alltoall semantics: size = count·nranks·elt), or ``AlltoAllv`` with
  ``count`` = ceil(total elements sent / nranks) when they differ (MoE token dispatch) — timed as the even
  all-to-all that moves the same bytes;
* anything else (pipeline-parallel send/recv pairs, partial groups) stays as logged Send/Recv rows, whose
  nccl-tests equivalent is sendrecv_perf with ``-b`` = count·elt.

Memory: at most one open group per (process, comm), each capped at ``4·nranks + 8`` lines.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field

from .parse import P2P_OPS, CallRecord

GROUPED_NOTE = "grouped Send/Recv"


@dataclass
class _Group:
    opcount: int
    nranks: int
    lines: list[CallRecord] = field(default_factory=list)
    sends: dict[int, CallRecord] = field(default_factory=dict)
    recvs: dict[int, CallRecord] = field(default_factory=dict)

    def accepts(self, rec: CallRecord) -> bool:
        side = self.sends if rec.op == "Send" else self.recvs
        return (
            rec.opcount == self.opcount
            and rec.nranks == self.nranks
            and rec.root not in side
            and len(self.lines) < 4 * self.nranks + 8
        )

    def add(self, rec: CallRecord) -> None:
        self.lines.append(rec)
        (self.sends if rec.op == "Send" else self.recvs)[rec.root] = rec

    @property
    def complete(self) -> bool:
        return len(self.sends) == self.nranks and len(self.recvs) == self.nranks

    def as_alltoall(self) -> CallRecord | None:
        n = self.nranks
        peers = set(self.sends)
        if n < 2 or peers != set(self.recvs) or not peers <= set(range(n)):
            return None
        if not (len(peers) == n or (n >= 3 and len(peers) == n - 1)):
            return None
        if len({r.datatype for r in self.lines}) != 1:
            return None
        counts = {r.count for r in self.lines}
        first = self.lines[0]
        if len(counts) == 1:
            op, count = "AlltoAll", first.count
        else:
            total = sum(r.count for r in self.sends.values())
            op, count = "AlltoAllv", -(-total // n)
        return dataclasses.replace(
            first,
            op=op,
            count=count,
            root=-1,
            recvbuff=self.recvs[min(peers)].recvbuff,
            inferred=f"{GROUPED_NOTE} ({len(self.lines)} lines)",
        )


class P2pGrouper:
    """Incremental form: ``feed`` Send/Recv records, ``other`` when another op hits the same (process, comm),
    ``finish`` at the end; each returns the records to emit (merged AlltoAll or the original lines).

    ``key`` identifies the (process, comm) stream; callers may use any hashable (the fast tally uses raw
    bytes). ``open_keys`` is the set of keys with an unfinished group.
    """

    def __init__(self) -> None:
        self.groups: dict[Hashable, _Group] = {}
        self.open_keys: set[Hashable] = set()

    def feed(self, rec: CallRecord, key: Hashable) -> list[CallRecord]:
        if rec.op not in P2P_OPS:
            return self.other(key) + [rec]
        out: list[CallRecord] = []
        g = self.groups.get(key)
        if g is not None and not g.accepts(rec):
            out += self._flush(key)
            g = None
        if g is None:
            g = self.groups[key] = _Group(rec.opcount, rec.nranks)
            self.open_keys.add(key)
        g.add(rec)
        if g.complete:
            out += self._flush(key)
        return out

    def other(self, key: Hashable) -> list[CallRecord]:
        return self._flush(key) if key in self.groups else []

    def finish(self) -> list[CallRecord]:
        out: list[CallRecord] = []
        for key in list(self.groups):
            out += self._flush(key)
        return out

    def _flush(self, key: Hashable) -> list[CallRecord]:
        g = self.groups.pop(key)
        self.open_keys.discard(key)
        merged = g.as_alltoall()
        return [merged] if merged is not None else g.lines


def group_p2p(records: Iterable[CallRecord]) -> Iterator[CallRecord]:
    """Pass records through, replacing grouped Send/Recv all-to-all patterns by one AlltoAll record each."""
    grouper = P2pGrouper()
    for rec in records:
        yield from grouper.feed(rec, (rec.host, rec.pid, rec.device, rec.comm))
    yield from grouper.finish()
