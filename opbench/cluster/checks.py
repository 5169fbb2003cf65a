"""The measurements of ``opbench cluster``, run on every rank of one job (torchrun, srun or a self-launch).

Each check measures, gathers what every rank saw to rank 0, and rank 0 judges the members against their peers
(``verdict.judge``), writes the rows (as each case completes: a crash loses nothing already measured) and keeps
what the summary needs. Every rank runs the same sequence of collectives; a rank that dies or hangs makes the
others' next collective fail inside ``--timeout``, which ends the job with one line (``ClusterFailure``).
"""

from __future__ import annotations

import math
import socket
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from opbench.comm.ops import OPS, Ctx
from opbench.core.clock import seconds_clock
from opbench.core.collectives import COLLECTIVES
from opbench.core.device import device_info, synchronize, torch_dtype
from opbench.core.dist import RankFailure, Ranks
from opbench.core.dtypes import element_size
from opbench.core.errors import raise_if_terminated
from opbench.core.faults import Faults
from opbench.core.rankstats import rank_stats
from opbench.core.sweep import STATUS_OK, classify_failure, release_memory
from opbench.core.timing import TimingConfig, measure
from opbench.gemm.backends import BACKENDS
from opbench.gemm.runner import make_operands, max_rel_err
from opbench.gemm.shapes import GemmShape

from . import telemetry
from .links import LinkPeaks
from .plan import COMM_COLLECTIVES, Sizes, link_phase, shift_peers
from .verdict import MIN_PEERS, Finding, Threshold, check_thresholds, judge

CPU_ROUNDS = 3  # interleaved measuring rounds of the CPU ranks (compute, memory)


def median_row(rows: Sequence[dict[str, Any]], metric: str) -> dict[str, Any]:
    """The round whose ``metric`` is the median of the successful rounds (an actual measurement, with its own
    spread), else the first failed one."""
    ok = sorted((r for r in rows if r.get("status") == STATUS_OK), key=lambda r: r[metric])
    return ok[(len(ok) - 1) // 2] if ok else rows[0]


def link_time(table: np.ndarray, senders: Sequence[int], receivers: Sequence[int]) -> float:
    """Seconds per iteration of the link from ``senders`` to ``receivers`` (the k-th rank of one unit to the k-th
    of the other) from the ranks × iterations times of one pairs round, where each rank's time covers its send
    and its receive of that round. A slow link A→B makes both A's and B's times slow, while a slow link into A
    or out of B slows only one of them, so a pair's time is the faster of its two ranks (NaN-aware); a unit's
    link is as slow as its slowest pair, and the median over iterations is kept."""
    per_pair = np.fmin(table[list(senders)], table[list(receivers)])
    return float(np.median(np.nanmax(per_pair, axis=0)))


class ClusterFailure(Exception):
    """The job itself broke: a peer rank exited, hung past --timeout, or the network failed."""


@dataclass(frozen=True)
class GemmSpec:
    name: str
    m: int
    n: int
    k: int


@dataclass(frozen=True)
class Member:
    """Who a rank is: where it runs and which GPU it drives."""

    host: str
    node: str
    rank: int
    local_rank: int
    device_name: str
    device_id: str  # UUID where the platform exposes it, else the PCI bus id, else empty
    device_kind: str
    pci_bus_id: str = ""
    device_index: int | None = None

    @property
    def label(self) -> str:
        return f"{self.node} gpu{self.local_rank} (rank {self.rank}, {self.host})"

    def identity(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "node": self.node,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "device_name": self.device_name,
            "device_id": self.device_id,
        }


def identify(ranks: Ranks) -> Member:
    info = device_info(ranks.device)
    uuid = pci = ""
    index = None
    if ranks.device.type == "cuda":
        index = ranks.device.index if ranks.device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        uuid = str(getattr(props, "uuid", "") or "")
        if hasattr(props, "pci_bus_id"):
            pci = f"{getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
    if uuid and info.kind == "cuda" and not uuid.startswith("GPU-"):
        uuid = f"GPU-{uuid}"  # NVML's spelling (nvidia-smi -L)
    return Member(
        socket.gethostname(),
        ranks.env.node,
        ranks.rank,
        ranks.local_rank,
        info.name,
        uuid or pci,
        info.kind,
        pci,
        index,
    )


@dataclass
class Config:
    checks: tuple[str, ...]
    sizes: Sizes
    dtype: str
    gemms: list[GemmSpec]
    fraction: float = 0.10
    mad_k: float = 3.0
    timeout_s: float = 300.0
    gpu_pairs: bool = False
    links: LinkPeaks = field(default_factory=LinkPeaks)
    expect: dict[str, dict[str, list[Threshold]]] = field(default_factory=dict)
    faults: Faults = field(default_factory=Faults)


@dataclass
class Collected:
    """What rank 0 keeps for the summary and the baseline: bounded by the number of ranks, nodes and pairs."""

    members: list[Member] = field(default_factory=list)
    compute: list[dict[str, Any]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    telemetry: list[dict[str, Any]] = field(default_factory=list)
    comm: list[dict[str, Any]] = field(default_factory=list)
    pairs: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)  # (scope, size) -> GB/s per GPU matrix
    pair_labels: dict[str, list[str]] = field(default_factory=dict)  # scope -> row/column names of its matrix
    pair_rows: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # check -> what it measured ("4 GPUs"), or why it measured nothing ("one node"): the summary lists both, so a
    # PASS never stands for a check that did not run
    ran: dict[str, str] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


class Cluster:
    """One rank's part of the check. ``out(kind)`` is the rank-0 report of one CSV (a NullReport elsewhere)."""

    def __init__(self, ranks: Ranks, cfg: Config, out: Callable[[str], Any], say: Callable[[str], None]):
        self.ranks, self.cfg, self.out, self.say = ranks, cfg, out, say
        self.device = ranks.device
        self.rank, self.world = ranks.rank, ranks.world_size
        self.got = Collected()
        self.me = identify(ranks)
        self.members: list[Member] = ranks.gather(self.me)
        self.got.members = self.members if ranks.is_main else []
        order: dict[str, list[int]] = {}
        for m in self.members:
            order.setdefault(m.node, []).append(m.rank)
        self.nodes = list(order)
        self.node_ranks = [order[n] for n in self.nodes]
        self.gpu = self.device.type == "cuda"
        self.dtype = torch_dtype(cfg.dtype)

    # -- plumbing ------------------------------------------------------------------------------------------------
    def _collective(self, what: str, fn: Callable[[], Any]) -> Any:
        """A step every rank takes together; a failure here means the job is broken."""
        try:
            return fn()
        except RankFailure:
            raise
        except Exception as exc:
            raise ClusterFailure(
                f"rank {self.rank}/{self.world}: {what} failed (--timeout {self.cfg.timeout_s:g} s): {_short(exc)} "
                "(a peer rank probably exited or hung)"
            ) from exc

    def _gather_objects(self, what: str, value: Any) -> list[Any] | None:
        box: list[Any] | None = [None] * self.world if self.ranks.is_main else None
        self._collective(what, lambda: dist.gather_object(value, box, dst=0))
        return box

    def _gather_times(self, what: str, times: Sequence[float], iters: int) -> np.ndarray | None:
        """Every rank's per-iteration times (NaN where a rank sat the case out) as ranks × iterations, on rank 0."""
        mine = torch.full((iters,), math.nan, dtype=torch.float64, device=self.device)
        if times:
            mine.copy_(torch.tensor(list(times), dtype=torch.float64))
        bufs = [torch.empty_like(mine) for _ in range(self.world)] if self.ranks.is_main else None
        self._collective(what, lambda: dist.gather(mine, bufs, dst=0))
        return torch.stack(bufs).cpu().numpy() if bufs is not None else None

    def _one_at_a_time(self, fn: Callable[[], list[dict[str, Any]]], metric: str) -> list[dict[str, Any]]:
        """GPUs all at once (the point: every GPU under load together). On a CPU the ranks share cores, so each rank
        measures alone while the others wait, in CPU_ROUNDS interleaved rounds; each case keeps its median round, so
        a burst of load from outside hits one round of one rank instead of deciding that rank's result."""
        if self.gpu:
            self._collective("barrier before compute", self.ranks.barrier)
            return fn()
        rounds: list[list[dict[str, Any]]] = []
        for _ in range(CPU_ROUNDS):
            for turn in range(self.world):
                if turn == self.rank:
                    rounds.append(fn())
                self._collective("barrier between CPU turns", self.ranks.barrier)
        return [median_row([r[i] for r in rounds], metric) for i in range(len(rounds[0]))]

    def _barriers(self, count: int) -> None:
        for _ in range(count):
            self.ranks.barrier()

    def _iteration_times(
        self, call: Callable[[], Any], iters: int, warmup: int, barrier: Callable[[], Any] | None = None
    ) -> list[float]:
        """Per-iteration seconds of ``call``, back to back, or with ``barrier`` before each timed iteration (the
        pairs check: see _pair_rounds)."""
        for _ in range(warmup):
            call()
        synchronize(self.device)
        if self.gpu:
            events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)
            ]
            for start, end in events:
                if barrier is not None:
                    barrier()  # NCCL's barrier returns once its all-reduce has run, so the GPU is at it too
                start.record()
                call()
                end.record()
            torch.cuda.synchronize(self.device)
            return [start.elapsed_time(end) / 1e3 for start, end in events]
        out = []
        clock = seconds_clock()  # wall time, or CPU time (OPBENCH_CLOCK=cpu)
        for _ in range(iters):
            if barrier is not None:
                barrier()
            t0 = clock()
            call()  # gloo calls return when the data has arrived
            out.append(clock() - t0)
        return out

    def _timing(self) -> TimingConfig:
        """The shared harness's stop rule; a CPU's budget is split over its interleaved rounds."""
        budget = self.cfg.sizes.budget_s / (1 if self.gpu else CPU_ROUNDS)
        return TimingConfig(warmup_iters=2, warmup_s=0.02, min_iters=5, max_iters=500, budget_s=budget)

    def _ran(self, check: str, members: int, unit: str, extra: str = "") -> None:
        """Record what a check measured; with fewer than MIN_PEERS members its outliers cannot be judged."""
        what = f"{members} {unit}{'' if members == 1 else 's'}{extra}"
        self.got.ran[check] = what + ("" if members >= MIN_PEERS else f"; too few to name outliers (needs {MIN_PEERS})")

    def _judge_rows(self, check: str, case: str, rows: list[dict[str, Any]], metric: str, labels: list[str]) -> None:
        """Fill vs_median_pct / outlier of one case's rows and record the findings (rank 0)."""
        values = [r.get(metric) if r.get("status") == STATUS_OK else None for r in rows]
        j = judge(values, self.cfg.fraction, self.cfg.mad_k)
        for r, vs, flag in zip(rows, j.vs_median_pct, j.outlier):
            r["vs_median_pct"], r["outlier"] = vs, flag
        peers = sum(v is not None for v in values) - 1
        for r, label, flag, ref in zip(rows, labels, j.outlier, j.reference):
            if flag:
                self.got.findings.append(
                    Finding(
                        "outlier",
                        check,
                        case,
                        label,
                        metric,
                        r[metric],
                        ref,
                        f"{-r['vs_median_pct']:.1f} % below the median of its {peers} peers",
                    )
                )
            if r.get("status") != STATUS_OK:
                self.got.findings.append(
                    Finding("failed", check, case, label, metric, None, None, f"{r['status']}: {r.get('error') or ''}")
                )
        size = rows[0].get("size_bytes") if rows else None
        self.got.findings += check_thresholds(check, case, labels, rows, self.cfg.expect, size)

    # -- compute, memory, telemetry --------------------------------------------------------------------------------
    def _gemm(self, spec: GemmSpec) -> dict[str, Any]:
        cfg = self.cfg
        row: dict[str, Any] = {"gemm": spec.name, "m": spec.m, "n": spec.n, "k": spec.k, "dtype": cfg.dtype}
        try:
            cfg.faults.prepare(self.rank)
            shape = GemmShape("cluster", spec.name, "fwd", 1, spec.m, spec.n, spec.k, 1, False, False)
            seed = zlib.crc32(spec.name.encode())
            a, b = make_operands(shape, cfg.dtype, self.device, torch.Generator(device=self.device).manual_seed(seed))
            fn, _ = BACKENDS["torch"].build(a, b, cfg.dtype)
            err = max_rel_err(fn(), a, b, torch.Generator().manual_seed(seed))
            stats = measure(cfg.faults.timed(fn, self.rank, self.device), self.device, self._timing())
            tflops = shape.flops / stats.median / 1e12
            info = device_info(self.device)
            peak, best = info.peak_tflops(cfg.dtype), info.best_matmul_tflops(cfg.dtype)
            row.update(
                time_s=stats.median,
                time_iqr_rel=stats.iqr_rel,
                tflops=tflops,
                pct_of_peak=100.0 * tflops / peak if peak else None,
                pct_of_best_matmul=100.0 * tflops / best if best else None,
                max_rel_err=err,
                status=STATUS_OK,
            )
        except Exception as exc:  # noqa: BLE001 - one GPU failing a GEMM is a row, not the end of the check
            raise_if_terminated()
            status, message = classify_failure(exc)
            row.update(status=status, error=message)
            release_memory()
        return row

    def _memory(self, kernel: str, size: int) -> dict[str, Any]:
        row: dict[str, Any] = {"kernel": kernel, "size_bytes": size}
        try:
            n = size // 4
            a = torch.empty(n, dtype=torch.float32, device=self.device)
            b = torch.ones(n, dtype=torch.float32, device=self.device)
            c = torch.ones(n, dtype=torch.float32, device=self.device)
            if kernel == "copy":
                fn: Callable[[], Any] = lambda: a.copy_(b)  # noqa: E731
                moved = 2 * n * 4  # read b, write a
            else:  # triad (STREAM): a = b + s·c
                fn = lambda: torch.add(b, c, alpha=3.0, out=a)  # noqa: E731
                moved = 3 * n * 4
            stats = measure(self.cfg.faults.timed(fn, self.rank, self.device), self.device, self._timing())
            gbs = moved / stats.median / 1e9
            peak = device_info(self.device).peak
            row.update(
                bytes_moved=moved,
                time_s=stats.median,
                time_iqr_rel=stats.iqr_rel,
                gbs=gbs,
                pct_of_peak=100.0 * gbs / (peak.hbm_tbs * 1e3) if peak else None,
                status=STATUS_OK,
            )
        except Exception as exc:  # noqa: BLE001 - a row with its status
            raise_if_terminated()
            status, message = classify_failure(exc)
            row.update(status=status, error=message)
            release_memory()
        return row

    def _telemetry(self, phase: str) -> None:
        me = self.me
        reading = telemetry.read(
            me.device_kind, me.device_id if me.device_id.startswith("GPU-") else "", me.pci_bus_id, me.device_index
        )
        rows = self._gather_objects("gathering telemetry", {**me.identity(), "phase": phase, **reading.as_row()})
        if rows is None:
            return
        report = self.out("telemetry")
        for member, row in zip(self.members, rows):
            report.append(row)
            self.got.telemetry.append(row)
            if phase == "after" and row.get("throttle_flagged"):
                self.got.findings.append(
                    Finding(
                        "throttle",
                        "telemetry",
                        "after compute",
                        member.label,
                        "throttle",
                        None,
                        None,
                        row["throttle_flagged"],
                    )
                )

    def _per_rank_check(
        self,
        check: str,
        work: Callable[[], list[dict[str, Any]]],
        case_key: Callable[[dict[str, Any]], str],
        metric: str,
    ) -> None:
        mine = self._one_at_a_time(work, metric)
        gathered = self._gather_objects(f"gathering {check} results", mine)
        if gathered is None:
            return
        report = self.out(check)
        store = self.got.compute if check == "compute" else self.got.memory
        for i in range(len(gathered[0])):
            rows = [{**m.identity(), **g[i]} for m, g in zip(self.members, gathered)]
            case = case_key(rows[0])
            self._judge_rows(check, case, rows, metric, [m.label for m in self.members])
            report.extend(rows)
            store.extend(rows)
            ok = [r[metric] for r in rows if r.get("status") == STATUS_OK]
            flagged = sum(bool(r["outlier"]) for r in rows)
            self.say(
                f"{check:<8} {case:<28} {metric} median {np.median(ok) if ok else float('nan'):.4g} "
                f"(min {min(ok) if ok else float('nan'):.4g}, max {max(ok) if ok else float('nan'):.4g}) over {len(ok)} of "
                f"{len(rows)} ranks" + (f"; {flagged} outlier(s)" if flagged else "")
            )

    def compute(self) -> None:
        self.cfg.faults.before_timing(self.rank, self.cfg.timeout_s)
        self._telemetry("before")
        self._per_rank_check(
            "compute", lambda: [self._gemm(s) for s in self.cfg.gemms], lambda r: f"{r['gemm']} {r['dtype']}", "tflops"
        )
        self._ran("compute", self.world, "GPU" if self.gpu else "CPU rank")
        self._telemetry("after")

    def memory(self) -> None:
        size = self.cfg.sizes.memory_bytes
        self._per_rank_check(
            "memory",
            lambda: [self._memory(k, size) for k in ("copy", "triad")],
            lambda r: f"{r['kernel']} {r['size_bytes'] >> 20} MiB",
            "gbs",
        )
        self._ran("memory", self.world, "GPU" if self.gpu else "CPU rank")

    # -- collectives in groups -------------------------------------------------------------------------------------
    def _subgroups(self, groups: list[list[int]]) -> Any:
        """This rank's group of a partition (created collectively on every rank); None when it is in none."""
        if len(groups) == 1 and len(groups[0]) == self.world:
            return dist.group.WORLD
        mine, _ = self._collective("creating process groups", lambda: dist.new_subgroups_by_enumeration(groups))
        return mine

    def _comm_scope(self, scope: str, groups: list[list[int]], names: list[str], nodes_per_group: list[int]) -> None:
        """all_reduce and all_gather at every size in each group of ``groups`` at once; one row per group."""
        cfg, s = self.cfg, self.cfg.sizes
        handle = self._subgroups(groups)
        mine = next((g for g in groups if self.rank in g), None)
        peak = cfg.links.for_scope(scope)
        for coll_name in COMM_COLLECTIVES:
            coll, op = COLLECTIVES[coll_name], OPS[coll_name]
            for size in s.comm_bytes:
                elt = element_size(cfg.dtype)
                times: list[float] = []
                status, message = STATUS_OK, ""

                def prepare() -> Any:
                    if mine is None:
                        return None
                    n = len(mine)
                    count = coll.count_for_size(size, n, elt)
                    if count == 0:
                        raise ValueError(f"{size} B is less than one element per rank")
                    ctx = Ctx(handle, tuple(mine), mine.index(self.rank), count, self.dtype, self.device)
                    return ctx, op.alloc(ctx, op.variants[0])

                try:
                    prepared = self.ranks.agree(prepare)
                except RankFailure as exc:
                    prepared, status, message = None, exc.status, str(exc)
                except Exception as exc:  # noqa: BLE001 - Unsupported from agree: a row with its status
                    prepared, (status, message) = None, classify_failure(exc)
                if prepared is not None:
                    ctx, bufs = prepared
                    call = cfg.faults.timed(op.bind(ctx, bufs), self.rank, self.device)
                    times = self._collective(
                        f"{scope} {coll_name} at {size} B", lambda: self._iteration_times(call, s.iters, s.warmup)
                    )
                    del bufs
                table = self._gather_times(f"gathering {scope} times", times, s.iters)
                if table is None:
                    continue
                rows, labels = [], []
                for group, name, nnodes in zip(groups, names, nodes_per_group):
                    n = len(group)
                    count = coll.count_for_size(size, n, elt)
                    actual = coll.size_bytes(count, n, elt)
                    row: dict[str, Any] = {
                        "scope": scope,
                        "group": name,
                        "nodes": nnodes,
                        "nranks": n,
                        "collective": coll_name,
                        "dtype": cfg.dtype,
                        "size_bytes": actual,
                        "count": count,
                        "iters": s.iters,
                        "link_peak_gbs": peak,
                        "status": status,
                        "error": message or None,
                    }
                    if status == STATUS_OK:
                        st = rank_stats(table[group], group)
                        t = st.slowest_p50
                        busbw = coll.busbw_gbs(actual, t, n)
                        row.update(
                            time_us=t * 1e6,
                            slowest_p95_us=st.slowest_p95 * 1e6,
                            slowest_rank=st.slowest_rank,
                            slowest_share=st.slowest_share,
                            rank_spread_us=st.spread * 1e6,
                            algbw_gbs=coll.algbw_gbs(actual, t),
                            busbw_gbs=busbw,
                            pct_of_link_peak=100.0 * busbw / peak if peak else None,
                        )
                    rows.append(row)
                    labels.append(name)
                case = f"{scope} {coll_name} {size >> 20} MiB" if size >= 1 << 20 else f"{scope} {coll_name} {size} B"
                self._judge_rows(scope, case, rows, "busbw_gbs", labels)
                self.out("comm").extend(rows)
                self.got.comm.extend(rows)
                ok = [r for r in rows if r["status"] == STATUS_OK]
                if ok:
                    worst = min(ok, key=lambda r: r["busbw_gbs"])
                    self.say(
                        f"{scope:<8} {coll_name} {actual:>11} B: busbw median {np.median([r['busbw_gbs'] for r in ok]):.4g} GB/s "
                        f"over {len(ok)} group(s), lowest {worst['group']} {worst['busbw_gbs']:.4g}; slowest rank {worst['slowest_rank']}"
                    )

    def intra(self) -> None:
        if max(len(g) for g in self.node_ranks) < 2:
            self.got.not_run["intra"] = "one rank on this node" if len(self.nodes) == 1 else "one rank per node"
            return
        self._comm_scope("intra", self.node_ranks, self.nodes, [1] * len(self.nodes))
        self._ran("intra", len(self.nodes), "node")

    def inter(self) -> None:
        if len(self.nodes) < 2:
            self.got.not_run["inter"] = "one node"
            return
        width = max(len(g) for g in self.node_ranks)
        rails = [[g[p] for g in self.node_ranks if p < len(g)] for p in range(width)]
        rails = [r for r in rails if len(r) >= 2]
        self._comm_scope("inter", rails, [f"rail{p}" for p in range(len(rails))], [len(r) for r in rails])
        self._comm_scope("world", [list(range(self.world))], ["world"], [len(self.nodes)])
        self._ran("inter", len(rails), "rail", f" across {len(self.nodes)} nodes, then the world of {self.world} ranks")

    # -- point to point ------------------------------------------------------------------------------------------
    def _pair_rounds(self, scope: str, rings: list[list[list[int]]], names: list[list[str]]) -> None:
        """Shift rounds over every ring at once: in round r unit i of a ring sends to unit (i + r) mod n and
        receives from unit (i − r) mod n, the k-th rank of one unit paired with the k-th of the other; the round
        where 2r = n runs in two halves, one direction each (plan.link_phase)."""
        cfg, s = self.cfg, self.cfg.sizes
        size = s.pair_bytes
        n_rounds = max(len(ring) for ring in rings) - 1
        labels = [name for ring_names in names for name in ring_names]
        index = {name: i for i, name in enumerate(labels)}
        matrix = np.full((len(labels), len(labels)), np.nan)
        peak = cfg.links.for_scope("gpu" if scope == "gpu" else "inter")
        count = size // element_size(cfg.dtype)
        send = torch.ones(count, dtype=self.dtype, device=self.device)
        recv = torch.empty_like(send)
        for r in range(1, n_rounds + 1):
            halves = 2 if any(2 * r == len(ring) for ring in rings) else 1
            for half in range(halves):
                what = f"{scope} pairs round {r}" + (f" half {half + 1}" if halves > 1 else "")
                rows = self._pair_round(what, scope, rings, names, r, half, send, recv)
                for row in rows or []:
                    matrix[index[row["src"]], index[row["dst"]]] = row["gbs_per_gpu"]
                    row["link_peak_gbs"] = peak
                    row["pct_of_link_peak"] = 100.0 * row["gbs_per_gpu"] / peak if peak else None
                if rows is not None:
                    self.out("pairs").extend(rows)  # as each round completes; judged (and rewritten) after the last
                    self.got.pair_rows.extend(rows)
        del send, recv
        if self.ranks.is_main:
            self.got.pairs[(scope, size)] = matrix
            self.got.pair_labels[scope] = labels
            mine = [r for r in self.got.pair_rows if r["scope"] == scope]
            self._judge_rows(
                "pairs" if scope == "inter" else "gpu_pairs",
                f"{scope} pairs {size >> 20} MiB",
                mine,
                "gbs_per_gpu",
                [f"{r['src']} -> {r['dst']}" for r in mine],
            )
            ok = [r["gbs_per_gpu"] for r in mine]
            if ok:
                worst = min(mine, key=lambda r: r["gbs_per_gpu"])
                self.say(
                    f"pairs    {scope} {size} B: {len(mine)} pairs in {n_rounds} rounds, median {np.median(ok):.4g} GB/s per GPU, "
                    f"lowest {worst['src']} -> {worst['dst']} {worst['gbs_per_gpu']:.4g}"
                )

    def _pair_round(
        self,
        what: str,
        scope: str,
        rings: list[list[list[int]]],
        names: list[list[str]],
        r: int,
        half: int,
        send: torch.Tensor,
        recv: torch.Tensor,
    ) -> list[dict[str, Any]] | None:
        """One shift (or one half of it, plan.link_phase) on every rank; its rows on rank 0, None elsewhere."""
        s = self.cfg.sizes
        peer_to = peer_from = None
        for ring in rings:
            n = len(ring)
            if r >= n:
                continue
            for i, unit in enumerate(ring):
                if self.rank in unit:
                    p = unit.index(self.rank)
                    to, frm = shift_peers(i, r, n)
                    dst, src = ring[to], ring[frm]
                    if link_phase(i, r, n) == half:
                        peer_to = dst[p] if p < len(dst) else None
                    if link_phase(frm, r, n) == half:
                        peer_from = src[p] if p < len(src) else None
        times: list[float] = []
        self._collective(f"barrier before {what}", self.ranks.barrier)
        # Every rank starts each timed iteration together (a barrier, which ranks without a peer this round
        # join too): back to back, a late receive would delay that rank's next send, and one slow link would
        # pace every pair of its cycle within a few iterations.
        if peer_to is None and peer_from is None:
            self._collective(what, partial(self._barriers, s.iters))
        else:
            sends = [dist.P2POp(dist.isend, send, peer_to)] if peer_to is not None else []
            recvs = [dist.P2POp(dist.irecv, recv, peer_from)] if peer_from is not None else []
            late = self.cfg.faults.send_delay(self.rank)

            def exchange() -> None:
                if late and sends:  # fault injection: a slow link out of this rank (receives posted on time)
                    reqs = dist.batch_isend_irecv(recvs) if recvs else []
                    time.sleep(late)
                    reqs += dist.batch_isend_irecv(sends)
                else:
                    reqs = dist.batch_isend_irecv(sends + recvs)
                for req in reqs:
                    req.wait()

            call = self.cfg.faults.timed(exchange, self.rank, self.device)
            times = self._collective(
                what, lambda: self._iteration_times(call, s.iters, s.warmup, barrier=self.ranks.barrier)
            )
        table = self._gather_times(f"gathering {scope} pair times", times, s.iters)
        if table is None:
            return None
        rows: list[dict[str, Any]] = []
        for ring, ring_names in zip(rings, names):
            n = len(ring)
            if r >= n:
                continue
            for i, unit in enumerate(ring):
                if link_phase(i, r, n) != half:
                    continue
                to = shift_peers(i, r, n)[0]
                dst_unit = ring[to]
                senders = unit[: len(dst_unit)]
                t = link_time(table, senders, dst_unit[: len(senders)])
                gbs = s.pair_bytes / t / 1e9
                rows.append(
                    {
                        "scope": scope,
                        "src": ring_names[i],
                        "dst": ring_names[to],
                        "round": r,
                        "nranks": len(senders),
                        "size_bytes": s.pair_bytes,
                        "iters": s.iters,
                        "time_us": t * 1e6,
                        "gbs_per_gpu": gbs,
                        "gbs_total": gbs * len(senders),
                        "status": STATUS_OK,
                    }
                )
        return rows

    def pairs(self) -> None:
        if len(self.nodes) < 2:
            self.got.not_run["pairs"] = "one node"
        else:
            self._pair_rounds("inter", [self.node_ranks], [self.nodes])
            n = len(self.nodes)
            self._ran("pairs", n * (n - 1), "node pair")
        if self.cfg.gpu_pairs:
            rings = [[[r] for r in g] for g in self.node_ranks if len(g) > 1]
            names = [
                [f"{node}:{i}" for i in range(len(g))] for node, g in zip(self.nodes, self.node_ranks) if len(g) > 1
            ]
            if rings:
                self._pair_rounds("gpu", rings, names)
                self._ran("gpu_pairs", sum(len(g) * (len(g) - 1) for g in rings), "GPU pair", " inside the nodes")
            else:
                self.got.not_run["gpu_pairs"] = "one rank per node" if len(self.nodes) > 1 else "one rank on this node"
