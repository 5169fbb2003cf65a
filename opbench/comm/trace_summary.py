"""Aggregate parsed NCCL calls into the summary contract, per-rank and per-communicator breakdowns.

Everything is a running tally keyed by a few small tuples, so memory grows with the number of distinct
sizes/ranks/communicators, never with the number of calls.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from .conventions import COLLECTIVES, NCCL_DTYPES
from .trace_parse import CallRecord, InitRecord

SUMMARY_COLUMNS = ["op", "collective", "count", "datatype", "dtype", "redop", "nranks", "calls", "bytes",
                   "nccl_tests_bytes", "total_bytes", "note"]
PER_RANK_COLUMNS = ["rank", "host", "pid", "device", "globalrank", "op", "calls", "bytes", "distinct_sizes",
                    "last_opcount"]
PER_COMM_COLUMNS = ["comm", "commid", "nranks", "ranks_logged", "calls", "bytes", "ops"]

SizeKey = tuple[str, int, int, "str | None", int]     # (op, count, datatype, redop, nranks)
ProcKey = tuple["str | None", "int | None", "int | None"]  # (host, pid, device)


def nccl_tests_bytes(collective: str | None, count: int, nranks: int, datatype: int) -> int | None:
    """The nccl-tests ``-b`` for one logged call (conventions.Collective.size_bytes); None if unknown."""
    coll = COLLECTIVES.get(collective or "")
    dt = NCCL_DTYPES.get(datatype)
    if coll is None or dt is None:
        return None
    return coll.size_bytes(count, nranks, dt.size)


def proc_label(host: str | None, pid: int | None, device: int | None) -> str:
    return f"{host or '?'}:{pid if pid is not None else '?'}[{device if device is not None else '?'}]"


@dataclass
class _SizeTally:
    collective: str | None
    calls: int = 0
    notes: set[str] = field(default_factory=set)


@dataclass
class _RankTally:
    calls: int = 0
    bytes: int = 0
    sizes: set[tuple[int, int]] = field(default_factory=set)
    last_opcount: int = -1


class TraceSummary:
    """Running tallies over CallRecords; ``add`` is the only per-call cost."""

    def __init__(self) -> None:
        self.sizes: dict[SizeKey, _SizeTally] = {}
        self.ranks: dict[tuple[ProcKey, int | None, str], _RankTally] = defaultdict(_RankTally)
        self.comms: dict[tuple[ProcKey, str, int], Counter[str]] = defaultdict(Counter)
        self.comm_bytes: Counter[tuple[ProcKey, str, int]] = Counter()
        self.rccl_fields = False
        self.hosts: set[str] = set()

    def add(self, rec: CallRecord) -> None:
        key = (rec.op, rec.count, rec.datatype, rec.redop, rec.nranks)
        tally = self.sizes.get(key)
        if tally is None:
            tally = self.sizes[key] = _SizeTally(rec.collective)
        tally.calls += 1
        if rec.inferred:
            tally.notes.add(rec.inferred.split(" (")[0])
        proc = (rec.host, rec.pid, rec.device)
        nbytes = rec.bytes or 0
        rt = self.ranks[(proc, rec.globalrank, rec.op)]
        rt.calls += 1
        rt.bytes += nbytes
        if len(rt.sizes) < 10_000:
            rt.sizes.add((rec.count, rec.datatype))
        rt.last_opcount = max(rt.last_opcount, rec.opcount)
        ck = (proc, rec.comm, rec.nranks)
        self.comms[ck][rec.op] += 1
        self.comm_bytes[ck] += nbytes
        if rec.task is not None or rec.acc is not None:
            self.rccl_fields = True
        if rec.host:
            self.hosts.add(rec.host)

    def extend(self, records: Iterable[CallRecord]) -> "TraceSummary":
        for rec in records:
            self.add(rec)
        return self

    @property
    def total_calls(self) -> int:
        return sum(t.calls for t in self.sizes.values())

    # -- rows ---------------------------------------------------------------------------------------
    def summary_rows(self) -> list[dict[str, Any]]:
        """One row per distinct (op, count, datatype, redop, nranks), largest total bytes first."""
        rows = []
        for (op, count, datatype, redop, nranks), t in self.sizes.items():
            dt = NCCL_DTYPES.get(datatype)
            nbytes = count * dt.size if dt else None
            rows.append({
                "op": op, "collective": t.collective, "count": count, "datatype": datatype,
                "dtype": dt.name if dt else f"dtype{datatype}", "redop": redop, "nranks": nranks,
                "calls": t.calls, "bytes": nbytes,
                "nccl_tests_bytes": nccl_tests_bytes(t.collective, count, nranks, datatype),
                "total_bytes": nbytes * t.calls if nbytes is not None else None,
                "note": "; ".join(sorted(t.notes)) or None,
            })
        rows.sort(key=lambda r: (-(r["total_bytes"] or 0), r["op"], r["count"]))
        return rows

    def per_rank_rows(self, inits: list[InitRecord]) -> list[dict[str, Any]]:
        """One row per (rank, op). ``rank`` is RCCL's globalrank where logged, else the process's rank in the
        largest communicator announced by an ``Init COMPLETE`` line, else empty (the process label says who)."""
        world = _world_ranks(inits)
        rows = []
        for (proc, grank, op), t in self.ranks.items():
            rank = grank if grank is not None else world.get(proc)
            rows.append({"rank": rank, "host": proc[0], "pid": proc[1], "device": proc[2], "globalrank": grank,
                         "op": op, "calls": t.calls, "bytes": t.bytes, "distinct_sizes": len(t.sizes),
                         "last_opcount": f"{t.last_opcount:x}" if t.last_opcount >= 0 else None})
        rows.sort(key=lambda r: (r["rank"] if r["rank"] is not None else 1 << 30,
                                 proc_label(r["host"], r["pid"], r["device"]), r["op"]))
        return rows

    def per_comm_rows(self, inits: list[InitRecord]) -> list[dict[str, Any]]:
        """One row per communicator. Comm pointers are per process, so without ``commId`` (Init COMPLETE lines,
        NCCL >= 2.9 with the INIT subsystem on) each process's handle is its own row."""
        commid = {((i.host, i.pid, i.device), i.comm): i.commid for i in inits if i.commid}
        merged: dict[tuple[str, int], dict[str, Any]] = {}
        for (proc, comm, nranks), ops in self.comms.items():
            cid = commid.get((proc, comm))
            label = cid if cid else f"{proc_label(*proc)}/{comm}"
            row = merged.setdefault((label, nranks), {"comm": label, "commid": cid, "nranks": nranks,
                                                      "ranks_logged": 0, "calls": 0, "bytes": 0, "_ops": Counter()})
            row["ranks_logged"] += 1
            row["calls"] += sum(ops.values())
            row["bytes"] += self.comm_bytes[(proc, comm, nranks)]
            row["_ops"].update(ops)
        rows = []
        for row in merged.values():
            ops = row.pop("_ops")
            row["ops"] = " ".join(f"{op}x{n}" for op, n in ops.most_common())
            rows.append(row)
        rows.sort(key=lambda r: (-r["bytes"], r["comm"]))
        return rows

    def rank_mismatch(self) -> list[str]:
        """Processes whose number of calls on an op differs from the most common number (a desync/hang hint)."""
        by_op: dict[str, dict[ProcKey, int]] = defaultdict(lambda: defaultdict(int))
        for (proc, _grank, op), t in self.ranks.items():
            by_op[op][proc] += t.calls
        notes = []
        for op, per_proc in sorted(by_op.items()):
            if len(per_proc) < 2:
                continue
            common, _ = Counter(per_proc.values()).most_common(1)[0]
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
