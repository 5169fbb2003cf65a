"""Aggregate parsed NCCL calls into the summary contract, per-rank and per-communicator breakdowns.

Everything is one tally: calls per (op, count, datatype, redop, nranks, host, pid, device, comm, globalrank,
note). Its size grows with distinct sizes × ranks × communicators, never with the number of calls; every
table is a group-by over it at the end.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from opbench.core.collectives import COLLECTIVES, NCCL_OP_TO_COLLECTIVE, NCCL_OPS
from opbench.core.dtypes import BY_ENUM

from .parse import (
    INFERRED_OPS,
    MAX_COUNT,
    OUT_OF_RANGE,
    TORN_MARK,
    CallRecord,
    HostFixer,
    InitRecord,
    LineKey,
    bounded,
    redop_for,
    rest_fields,
    who_fields,
)

ProcKey = tuple["str | None", "int | None", "int | None"]  # (host, pid, device)


@dataclass(frozen=True)
class Key:
    op: str
    count: int
    datatype: int
    op_enum: int
    nranks: int
    host: str | None
    pid: int | None
    device: int | None
    comm: str
    globalrank: int | None
    note: str | None = None
    torn: bool = False  # from a torn line: the host may carry glued junk until repair_hosts()

    @property
    def proc(self) -> ProcKey:
        return (self.host, self.pid, self.device)

    @property
    def nbytes(self) -> int | None:
        dt = BY_ENUM.get(self.datatype)
        return self.count * dt.size if dt else None


def nccl_tests_bytes(collective: str | None, count: int, nranks: int, datatype: int) -> int | None:
    """The nccl-tests ``-b`` for one logged call (core.collectives.Collective.size_bytes); None if unknown."""
    coll = COLLECTIVES.get(collective or "")
    dt = BY_ENUM.get(datatype)
    if coll is None or dt is None:
        return None
    return coll.size_bytes(count, nranks, dt.size)


def proc_label(host: str | None, pid: int | None, device: int | None) -> str:
    return f"{host or '?'}:{pid if pid is not None else '?'}[{device if device is not None else '?'}]"


# Op names a call may carry: every NCCL/RCCL op, and the ones this package synthesises (p2p all-to-alls).
KNOWN_OPS = frozenset((*NCCL_OPS, *INFERRED_OPS))


class TraceSummary:
    """The tally and the tables derived from it."""

    def __init__(self) -> None:
        self.counts: Counter[Key] = Counter()
        self.rccl_fields = False
        # Calls whose op name is no NCCL/RCCL op (torn lines cut inside the name: 'duceScatter'; damaged bytes:
        # 'ReduceSc7tter'): counted here, never tallied as calls.
        self.unknown_ops: Counter[str] = Counter()
        # Calls with a number outside the command line's bounds (parse.bounded), by field: skipped, counted.
        self.out_of_range: Counter[str] = Counter()
        self.reader = "python"  # which reader read the logs: "native" (analyze.native_reader) or "python"

    def _out_of_range(self, n: int, count: int, nranks: int, datatype: int, op_enum: int) -> bool:
        for name, value in (("count", count), ("nranks", nranks), ("datatype", datatype), ("op", op_enum)):
            if value == OUT_OF_RANGE:
                self.out_of_range[name] += n
                return True
        return False

    def add(self, rec: CallRecord, n: int = 1) -> None:
        if rec.op not in KNOWN_OPS:
            self.unknown_ops[rec.op] += n
            return
        if self._out_of_range(n, rec.count, rec.nranks, rec.datatype, rec.op_enum):
            return
        note = rec.inferred.split(" (")[0] if rec.inferred else None
        self.counts[
            Key(
                rec.op,
                rec.count,
                rec.datatype,
                rec.op_enum,
                rec.nranks,
                rec.host,
                rec.pid,
                rec.device,
                rec.comm,
                rec.globalrank,
                note,
                rec.torn,
            )
        ] += n
        if rec.task is not None or rec.acc is not None:
            self.rccl_fields = True

    def merge(self, other: TraceSummary) -> None:
        """Add another summary's tallies (a ``--jobs`` worker's)."""
        self.counts.update(other.counts)
        self.unknown_ops.update(other.unknown_ops)
        self.out_of_range.update(other.out_of_range)
        self.rccl_fields |= other.rccl_fields

    def extend(self, records: Iterable[CallRecord]) -> TraceSummary:
        for rec in records:
            self.add(rec)
        return self

    def add_raw(self, raw: Counter[LineKey], note: str | None = None) -> None:
        """Merge LINE matches counted by ``analyze`` (parse.LineKey, opCount left out), parsed here once each;
        ``note`` marks synthesised calls (p2p.GROUPED_NOTE)."""
        for (who, p2p, _, op, count, rest, grank, _), n in raw.items():
            name = (p2p or op).decode("ascii")
            if name not in KNOWN_OPS:
                self.unknown_ops[name] += n
                continue
            host, pid, dev = who_fields(who)
            dt, op_enum, _, comm, nranks = rest_fields(rest)
            number = bounded(count, 0, MAX_COUNT)
            if self._out_of_range(n, number, nranks, dt, op_enum):
                continue
            grank_value = bounded(grank, -(1 << 62) + 1, 1 << 62) if grank else None
            key = Key(
                name,
                number,
                dt,
                op_enum,
                nranks,
                host,
                pid,
                dev,
                comm,
                None if grank_value == OUT_OF_RANGE else grank_value,
                note,
                who.startswith(TORN_MARK),
            )
            self.counts[key] += n

    def repair_hosts(self) -> None:
        """Hosts from torn lines ('0x7fdgx07') become the host of the same pid seen on clean lines
        (parse.HostFixer); call once, after all logs are in."""
        fixer = HostFixer()
        for k, n in self.counts.items():
            if k.host and not k.torn:
                fixer.learn(k.host, k.pid, n)
        fixed: Counter[Key] = Counter()
        for k, n in self.counts.items():
            host = fixer.fix(k.host, k.pid) if k.torn else k.host
            fixed[dataclasses.replace(k, host=host, torn=False)] += n
        self.counts = fixed

    @property
    def total_calls(self) -> int:
        return sum(self.counts.values())

    # -- rows ---------------------------------------------------------------------------------------
    def summary_rows(self) -> list[dict[str, Any]]:
        """One row per distinct (op, count, datatype, redop, nranks), largest total bytes first."""
        sizes: dict[tuple, list[Any]] = {}
        for k, n in self.counts.items():
            entry = sizes.setdefault((k.op, k.count, k.datatype, redop_for(k.op, k.op_enum), k.nranks), [0, set()])
            entry[0] += n
            if k.note:
                entry[1].add(k.note)
        rows = []
        for (op, count, datatype, redop, nranks), (calls, notes) in sizes.items():
            dt = BY_ENUM.get(datatype)
            collective = NCCL_OP_TO_COLLECTIVE.get(op) or INFERRED_OPS.get(op)
            nbytes = count * dt.size if dt else None
            rows.append(
                {
                    "op": op,
                    "collective": collective,
                    "count": count,
                    "datatype": datatype,
                    "dtype": dt.name if dt else f"dtype{datatype}",
                    "redop": redop,
                    "nranks": nranks,
                    "calls": calls,
                    "bytes": nbytes,
                    "nccl_tests_bytes": nccl_tests_bytes(collective, count, nranks, datatype),
                    "total_bytes": nbytes * calls if nbytes is not None else None,
                    "note": "; ".join(sorted(notes)) or None,
                }
            )
        rows.sort(  # a total order, so the table does not depend on the order calls were met
            key=lambda r: (-(r["total_bytes"] or 0), r["op"], r["count"], r["datatype"], r["redop"] or "", r["nranks"])
        )
        return rows

    def per_rank_rows(self, inits: list[InitRecord]) -> list[dict[str, Any]]:
        """One row per (rank, op). ``rank`` is RCCL's globalrank where logged, else the process's rank in the
        largest communicator announced by an ``Init COMPLETE`` line, else empty (host/pid/device say who)."""
        world = _world_ranks(inits)
        acc: dict[tuple, list[Any]] = {}
        for k, n in self.counts.items():
            entry = acc.setdefault((k.proc, k.globalrank, k.op), [0, 0, set()])
            entry[0] += n
            entry[1] += (k.nbytes or 0) * n
            entry[2].add((k.count, k.datatype))
        rows = []
        for (proc, grank, op), (calls, nbytes, sizes) in acc.items():
            rank = grank if grank is not None else world.get(proc)
            rows.append(
                {
                    "rank": rank,
                    "host": proc[0],
                    "pid": proc[1],
                    "device": proc[2],
                    "globalrank": grank,
                    "op": op,
                    "calls": calls,
                    "bytes": nbytes,
                    "distinct_sizes": len(sizes),
                }
            )
        rows.sort(
            key=lambda r: (
                r["rank"] if r["rank"] is not None else 1 << 30,
                proc_label(r["host"], r["pid"], r["device"]),
                r["op"],
                r["globalrank"] if r["globalrank"] is not None else -1,
            )
        )
        return rows

    def per_comm_rows(self, inits: list[InitRecord]) -> list[dict[str, Any]]:
        """One row per communicator. Comm pointers are per process, so without ``commId`` (Init COMPLETE lines,
        NCCL >= 2.9 with the INIT subsystem on) each process's handle is its own row."""
        commid = {((i.host, i.pid, i.device), i.comm): i.commid for i in inits if i.commid}
        merged: dict[tuple[str, int], dict[str, Any]] = {}
        procs: dict[tuple[str, int], set] = defaultdict(set)
        for k, n in self.counts.items():
            cid = commid.get((k.proc, k.comm))
            label = cid if cid else f"{proc_label(*k.proc)}/{k.comm}"
            row = merged.setdefault(
                (label, k.nranks),
                {"comm": label, "commid": cid, "nranks": k.nranks, "calls": 0, "bytes": 0, "_ops": Counter()},
            )
            procs[(label, k.nranks)].add(k.proc)
            row["calls"] += n
            row["bytes"] += (k.nbytes or 0) * n
            row["_ops"][k.op] += n
        rows = []
        for key, row in merged.items():
            ops = row.pop("_ops")
            row["ranks_logged"] = len(procs[key])
            # most calls first, ties by name: the same whichever order the readers counted in
            row["ops"] = " ".join(f"{op}x{n}" for op, n in sorted(ops.items(), key=lambda item: (-item[1], item[0])))
            rows.append(row)
        rows.sort(key=lambda r: (-r["bytes"], r["comm"], r["nranks"]))
        return rows

    def rank_mismatch(self) -> list[str]:
        """Processes whose number of calls on an op differs from the most common number (a desync/hang hint)."""
        by_op: dict[str, Counter[ProcKey]] = defaultdict(Counter)
        for k, n in self.counts.items():
            by_op[k.op][k.proc] += n
        notes = []
        for op, per_proc in sorted(by_op.items()):
            if len(per_proc) < 2:
                continue
            # the call count most processes logged (a tie: the larger count, whatever order they were counted in)
            common = max(Counter(per_proc.values()).items(), key=lambda item: (item[1], item[0]))[0]
            odd = {p: n for p, n in per_proc.items() if n != common}
            if odd and len(odd) < len(per_proc):
                shown = ", ".join(f"{proc_label(*p)}={n}" for p, n in sorted(odd.items(), key=str)[:8])
                notes.append(f"{op}: most processes logged {common} calls; {shown}")
        return notes


def _world_ranks(inits: list[InitRecord]) -> dict[ProcKey, int]:
    best: dict[ProcKey, InitRecord] = {}
    for i in inits:
        key = (i.host, i.pid, i.device)
        if key not in best or i.nranks > best[key].nranks:
            best[key] = i
    return {k: v.rank for k, v in best.items()}
