"""The torchrun driver: time each collective the way nccl-tests does, agree on the numbers across ranks,
and have rank 0 write the rows.

Per case and variant (out-of-place / in-place): ``-w`` warm-up calls, then ``trials`` timed loops of ``-n``
back-to-back calls (device events around the loop on GPU, ``perf_counter_ns`` around a loop of synchronous
gloo calls on CPU). Every rank runs exactly the same number of calls — an adaptive stopping rule (as
``core.timing.measure`` uses for single-device kernels) would let ranks disagree and deadlock. The
per-iteration time of each loop is gathered from every rank: ``time_us`` is the median over trials of the
rank average (nccl-tests' default ``-a 1``), ``time_us_max`` the median over trials of the slowest rank, and
the trial min/max of the rank average give the spread.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from opbench.core.clock import ns_clock
from opbench.core.collectives import COLLECTIVES, alltoallv_imbalance
from opbench.core.device import synchronize, torch_dtype
from opbench.core.dist import RankFailure, Ranks, job_broken
from opbench.core.dtypes import dtype as dtype_info
from opbench.core.errors import raise_if_terminated
from opbench.core.faults import Faults
from opbench.core.rankstats import rank_stats
from opbench.core.redact import redact_text
from opbench.core.results import environment, progress
from opbench.core.sweep import (
    STATUS_ERROR,
    STATUS_OK,
    STATUS_OOM,
    STATUS_UNSUPPORTED,
    Unsupported,
    classify_failure,
    release_memory,
)
from opbench.core.timing import hold_stream
from opbench.core.units import one_line

from .flags import AVERAGE, BLOCKING
from .ops import OPS, Buffers, CommOp, Ctx, all_gather_fn, corrupt, count_wrong, fill_for_check
from .schema import SCHEMA
from .sizes import CommCase, actual_size, count_for, group_layout

_STATUS_CODES = [STATUS_OK, STATUS_UNSUPPORTED, STATUS_OOM, STATUS_ERROR]  # worst last


class CommFailure(Exception):
    """A collective could not complete: a peer rank exited, hung past --timeout, or the network failed."""


@dataclass(frozen=True)
class RunConfig:
    """One run's measurement settings; the nccl-tests flags keep nccl-tests' meanings (docs/comm.md, "Flags")."""

    iters: int = 20
    warmup: int = 5
    trials: int = 3
    blocking: int = 0  # -z: 0 none, 1 wait + barrier per call, 2 wait per call, 3 wait + untimed barrier per iteration
    check: int = 0  # -c: checked calls per size
    average: int = 1  # -a: 0 rank 0's time, 1 the rank average, 2 the fastest rank, 3 the slowest
    agg: int = 1  # -m: calls per timed iteration
    cycles: int = 1  # -N: times the whole plan runs
    root: int = 0
    p2p_mode: str = "ring"
    timeout_s: float = 300.0
    faults: Faults = field(default_factory=Faults)  # OPBENCH_FAULTS (core.faults); none by default
    per_rank: bool = False  # keep every call's time on every rank: who was slowest (core.rankstats)


def timed_loop(
    call,
    iters: int,
    device: torch.device,
    blocking: int = 0,
    per_call: list[float] | None = None,
    hold_s: float = 0.0,
    agg: int = 1,
    barrier=None,
) -> tuple[float, float]:
    """(seconds per call over ``iters`` iterations of ``agg`` back-to-back calls, measured on the device stream; the
    host's seconds per call spent issuing them). With ``per_call``, each iteration's time per call is appended to it
    too (an event, or a clock reading, between iterations: the loop stays back to back). On a GPU ``hold_s`` keeps
    the stream busy while the host queues the calls, so a small message is timed at NCCL's pace, not at the rate
    Python issues calls (nccl-tests issues from C). ``blocking`` is nccl-tests' -z: 1 waits for each call and then
    ``barrier()`` (timed), 2 only waits, 3 waits once per iteration and calls ``barrier()`` outside the timing."""
    sync = partial(synchronize, device)
    if blocking == 3:
        # the host clock around a wait: wall time on a GPU (the wait is the GPU's time), OPBENCH_CLOCK's on a CPU
        clock = ns_clock() if device.type == "cpu" else time.perf_counter_ns
        return _timed_iterations(call, iters, agg, sync, barrier, per_call, clock), 0.0

    def iteration() -> None:
        for _ in range(agg):
            call()
            if blocking:
                sync()
                if blocking == 1 and barrier is not None:
                    barrier()

    if agg == 1 and not blocking:
        iteration = call  # the default loop calls straight into torch.distributed, no Python layer between calls

    calls = iters * agg
    if device.type == "cuda":
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1 if per_call is not None else 2)]
        if not blocking:
            hold_stream(device, hold_s)
        issued = time.perf_counter()
        marks[0].record()
        for i in range(iters):
            iteration()
            if per_call is not None:
                marks[i + 1].record()
        marks[-1].record()
        host_s = (time.perf_counter() - issued) / calls
        marks[-1].synchronize()
        if per_call is not None:
            per_call += [a.elapsed_time(b) / 1e3 / agg for a, b in zip(marks, marks[1:])]
        return marks[0].elapsed_time(marks[-1]) / 1e3 / calls, host_s
    clock = ns_clock()  # wall time, or CPU time (OPBENCH_CLOCK=cpu)
    t0 = clock()
    if per_call is None:
        for _ in range(iters):
            iteration()  # gloo calls return when the data has arrived
        return (clock() - t0) / 1e9 / calls, 0.0
    stamps = [t0]
    for _ in range(iters):
        iteration()
        stamps.append(clock())
    per_call += [(b - a) / 1e9 / agg for a, b in zip(stamps, stamps[1:])]
    return (stamps[-1] - t0) / 1e9 / calls, 0.0


def _timed_iterations(
    call, iters: int, agg: int, sync, barrier, per_call: list[float] | None, clock=time.perf_counter_ns
) -> float:
    """nccl-tests' -z 3: each iteration's calls, then a wait, timed on the host clock ``clock``; then a barrier, not
    timed."""
    total = 0
    for _ in range(iters):
        t0 = clock()
        for _ in range(agg):
            call()
        sync()
        took = clock() - t0
        total += took
        if per_call is not None:
            per_call.append(took / 1e9 / agg)
        if barrier is not None:
            barrier()
    return total / 1e9 / (iters * agg)


class Bench:
    """Runs cases on every rank; every rank returns the same rows."""

    def __init__(self, cfg: RunConfig, ranks: Ranks):
        self.cfg, self.ranks = cfg, ranks
        self.device, self.backend, self.nnodes = ranks.device, ranks.backend, ranks.env.nnodes
        self.rank, self.world = ranks.rank, ranks.world_size
        self._groups: dict[tuple[int, int], tuple[Any, tuple[int, ...]]] = {}
        self._per_call: list[float] | None = None  # the last case's per-call times (--per-rank)

    # -- groups ----------------------------------------------------------------------------------------
    def group(self, size: int, stride: int) -> tuple[Any, tuple[int, ...]]:
        """The process group of this rank for a layout (created once, collectively, on every rank)."""
        key = (size, stride)
        if key not in self._groups:
            if size == self.world:
                self._groups[key] = (None, tuple(range(self.world)))
            else:
                layout = group_layout(self.world, size, stride)
                mine, _ = dist.new_subgroups_by_enumeration(layout)
                self._groups[key] = (mine, tuple(next(g for g in layout if self.rank in g)))
        return self._groups[key]

    def context(self, case: CommCase) -> Ctx:
        group, ranks = self.group(case.group_size or self.world, case.group_stride)
        n = len(ranks)
        if not 0 <= self.cfg.root < n:
            raise Unsupported(f"root {self.cfg.root} is outside a group of {n} ranks")
        return Ctx(
            group,
            ranks,
            ranks.index(self.rank),
            count_for(case, n),
            dtype_of(case.dtype),
            self.device,
            case.redop,
            self.cfg.root,
            self.cfg.p2p_mode,
            None if case.splits is None else tuple(map(tuple, case.splits.matrix(n))),
        )

    # -- one case ------------------------------------------------------------------------------------------
    def _time(self, call) -> list[float]:
        cfg = self.cfg
        start = time.perf_counter()
        for _ in range(cfg.warmup):
            call()
        host_s = (time.perf_counter() - start) / max(1, cfg.warmup)  # bounds the issue time from above
        device_s = 0.0  # unknown before the first trial: hold for all of it
        synchronize(self.device)
        if self.device.type == "cuda":
            hold_stream(self.device, 0.0)  # measures the sleep kernel's rate now, not inside a timed trial
        times = []
        self._per_call = [] if cfg.per_rank else None
        for _ in range(cfg.trials):
            # hold only for the host's lag behind the GPU, as the timing harness does (core.timing.measure)
            lag = host_s - device_s
            hold_s = self._barrier_agreeing_on(1.25 * lag * cfg.iters * cfg.agg + 2e-4 if lag > 0 else 0.0)
            device_s, host_s = timed_loop(
                call, cfg.iters, self.device, cfg.blocking, self._per_call, hold_s, cfg.agg, dist.barrier
            )
            times.append(device_s)
        return times

    def _barrier_agreeing_on(self, hold_s: float) -> float:
        """A barrier before a trial that also agrees on the GPU hold: the longest any rank asks for, so every rank
        sleeps as long and no rank's timed loop starts early and waits out a peer's sleep inside its timing."""
        if self.device.type != "cuda":
            dist.barrier()
            return 0.0
        longest = torch.tensor([hold_s], dtype=torch.float64, device=self.device)
        dist.all_reduce(longest, op=dist.ReduceOp.MAX)
        return float(longest.item())  # .item() waits for the all-reduce, so the ranks leave it together

    def _check(self, op: CommOp, ctx: Ctx, bufs: Buffers) -> int:
        fill_for_check(op, ctx, bufs)
        if self.cfg.faults.corrupts(self.rank):
            corrupt(bufs)
        op.bind(ctx, bufs)()
        synchronize(self.device)
        return count_wrong(op, ctx, bufs)

    def _prepare(self, case: CommCase, op: CommOp, inplace: bool) -> tuple[Ctx, Buffers]:
        """This rank's context and buffers for the case; raises Unsupported / OOM like any allocation."""
        self.cfg.faults.prepare(self.rank)
        ctx = self.context(case)
        if case.splits is not None and case.splits.tokens == 0:
            s = case.splits
            raise Unsupported(
                f"{case.size_bytes} B is less than one token per rank (top-{s.top_k} · hidden {s.hidden} · "
                f"{ctx.dtype.itemsize} B)"
            )
        if ctx.count == 0:
            raise Unsupported(f"{case.size_bytes} B is less than one element per rank")
        if case.collective == "send_recv" and len(ctx.ranks) == 1 and self.backend == "gloo":
            raise Unsupported("gloo cannot send to itself; send_recv needs 2 or more ranks")
        if ctx.pattern == "pingpong" and case.collective == "send_recv" and len(ctx.ranks) % 2:
            raise Unsupported(f"ping-pong pairs ranks; a group of {len(ctx.ranks)} is odd")
        fp8 = ctx.dtype.is_floating_point and ctx.dtype.itemsize == 1
        if fp8 and "gloo" in self.backend and self.device.type == "cpu":
            raise Unsupported("gloo has no fp8 type (NCCL/RCCL move fp8 on GPUs)")
        return ctx, op.alloc(ctx, inplace)

    def run_variant(self, case: CommCase, op: CommOp, inplace: bool) -> dict[str, Any]:
        coll = COLLECTIVES[case.collective]
        cfg = self.cfg
        nranks = len(self.group(case.group_size or self.world, case.group_stride)[1])
        count = count_for(case, nranks)
        size = actual_size(case, nranks)  # all_to_all_v: the busiest rank's bytes (nccl-tests 2.19 alltoallv_perf)
        pattern = cfg.p2p_mode if case.collective == "send_recv" else ""
        row: dict[str, Any] = {
            "collective": case.collective,
            "backend": self.backend,
            "world_size": self.world,
            "nnodes": self.nnodes,
            "nranks": nranks,
            "dtype": case.dtype,
            "redop": case.redop if coll.has_redop else "none",
            "root": cfg.root if coll.has_root else -1,
            "size_bytes": size,
            "count": count,
            "inplace": inplace,
            "pattern": pattern,
            "iters": cfg.iters,
            "trials": cfg.trials,
            "source": case.source,
            "imbalance": None if case.splits is None else alltoallv_imbalance(case.splits.matrix(nranks)),
        }
        status, message, wrong = STATUS_OK, "", 0
        times = [math.nan] * cfg.trials
        self._per_call = None
        bufs = None
        try:
            # Every rank must have prepared the case before any rank enters a collective: one that fails alone
            # (an OOM on a shared GPU) would leave its peers inside a call it never joins.
            ctx, bufs = self.ranks.agree(lambda: self._prepare(case, op, inplace))
            cfg.faults.before_timing(self.rank, cfg.timeout_s)
            times = self._time(cfg.faults.timed(op.bind(ctx, bufs), self.rank, self.device))
            if pattern == "pingpong":  # one iteration is a round trip; report one way (osu_latency)
                times = [t / 2 for t in times]
                if self._per_call is not None:  # --per-rank columns in the same one-way unit as time_us
                    self._per_call = [t / 2 for t in self._per_call]
            for _ in range(cfg.check):  # nccl-tests' -c N: N checked calls, their wrong elements summed
                wrong += self._check(op, ctx, bufs)
        except Exception as exc:
            raise_if_terminated()
            if job_broken(exc):
                raise CommFailure(
                    f"rank {self.rank}/{self.world}: {case.collective} at {size} B failed "
                    f"(--timeout {cfg.timeout_s:g} s): {' '.join(str(exc).split())[:300]} "
                    f"(a peer rank probably exited or hung)"
                ) from exc
            status, message = (exc.status, str(exc)) if isinstance(exc, RankFailure) else classify_failure(exc)
            if status == STATUS_ERROR and "Float8 dtypes are not" in message:  # torch's NCCL: no fp8 reductions
                status = STATUS_UNSUPPORTED
            line = f"[rank {self.rank}] {case.collective} {size} B: {status}: {one_line(message)}"
            print(redact_text(line), file=sys.stderr, flush=True)  # an error may quote a storage URL or a token
        finally:
            del bufs
            if status != STATUS_OK:
                release_memory()
        return self._agree(row, status, message, wrong, times, coll, size, nranks)

    def _agree(self, row, status, message, wrong, times, coll, size, nranks) -> dict[str, Any]:
        """One gather of (status, wrong, trial times[, per-call times]) from every rank; every rank computes the same
        row."""
        calls: list[float] = []
        if self.cfg.per_rank:
            n_calls = self.cfg.trials * self.cfg.iters
            calls = self._per_call if self._per_call and len(self._per_call) == n_calls else [math.nan] * n_calls
        mine = torch.tensor(
            [_STATUS_CODES.index(status), wrong, *times, *calls], dtype=torch.float64, device=self.device
        )
        every = torch.empty(self.world * mine.numel(), dtype=torch.float64, device=self.device)
        try:
            all_gather_fn()(every, mine)
        except Exception as exc:
            raise CommFailure(
                f"rank {self.rank}/{self.world}: gathering results after {row['collective']} "
                f"{size} B failed: {' '.join(str(exc).split())[:300]} "
                f"(a peer rank probably exited or hung)"
            ) from exc
        table = every.view(self.world, -1).cpu()
        codes = table[:, 0].long().tolist()
        if any(codes):
            worst = max(codes)
            failed = [r for r, c in enumerate(codes) if c == worst]
            row["status"] = _STATUS_CODES[worst]
            mine = codes[self.rank] == worst and message
            row["error"] = message if mine else f"{row['status']} on rank(s) {failed}; see their stderr"
            return row
        per_trial = table[:, 2 : 2 + self.cfg.trials]
        if self.cfg.per_rank:
            row.update(rank_stats(table[:, 2 + self.cfg.trials :].numpy()).as_row())
        reported, slowest = combine_ranks(per_trial, self.cfg.average), per_trial.max(dim=0).values.tolist()
        t = statistics.median(reported)
        row.update(
            time_us=t * 1e6,
            time_us_max=statistics.median(slowest) * 1e6,
            time_us_trial_min=min(reported) * 1e6,
            time_us_trial_max=max(reported) * 1e6,
            algbw_gbs=coll.algbw_gbs(size, t),
            busbw_gbs=coll.busbw_gbs(size, t, nranks),
            wrong=int(table[:, 1].sum()) if self.cfg.check else None,
            status=STATUS_OK,
            error=None,
        )
        return row

    def run(self, cases: Sequence[CommCase], out: Output) -> list[dict[str, Any]]:
        """Every case, ``cycles`` times over (nccl-tests' -N); each row says its cycle."""
        rows = []
        plan = [(cycle, case) for cycle in range(1, self.cfg.cycles + 1) for case in cases]
        for cycle, case in progress(plan, total=len(plan), desc="comm", enabled=self.ranks.is_main):
            op = OPS[case.collective]
            done = []
            for inplace in op.variants:
                row = {**self.run_variant(case, op, inplace), "cycle": cycle}
                out.add(row)
                done.append(row)
            out.case_done(done)
            rows += done
        out.finish()
        return rows


def combine_ranks(per_trial: torch.Tensor, average: int) -> list[float]:
    """Each trial's time from the ranks' times (a ranks × trials table), as nccl-tests' -a: 0 rank 0's, 1 the
    mean, 2 the fastest rank, 3 the slowest."""
    if average == 0:
        return per_trial[0].tolist()
    if average == 2:
        return per_trial.min(dim=0).values.tolist()
    if average == 3:
        return per_trial.max(dim=0).values.tolist()
    return per_trial.mean(dim=0).tolist()


def dtype_of(name: str) -> torch.dtype:
    """torch dtype of an opbench dtype name (fp8 resolves to MI300's fnuz flavour there)."""
    return torch_dtype(name)


# -- the output: one CSV per collective (rank 0 writes, through Ranks.open_report), nccl-tests style console ---
_HEAD = "#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}"


class Output:
    """Every rank has one; only rank 0's writes files and prints (every rank computes the same rows)."""

    def __init__(self, ranks: Ranks, report_dir: str, meta: dict[str, Any], earlier: str | None = None, stream=None):
        self.ranks, self.report_dir, self.meta, self.earlier = ranks, report_dir, meta, earlier
        self.stream = stream or sys.stdout
        self.reports: dict[str, Any] = {}
        self.current: tuple[str, int] | None = None  # (collective, cycle) of the table being printed
        self._busbw: list[float] = []

    def path(self, collective: str) -> str:
        return os.path.join(self.report_dir, f"{collective}_benchmark.csv")

    def close(self) -> None:
        """Close every CSV (its rows are on disk already): its writer lock goes, and its lock file with it."""
        for report in self.reports.values():
            report.close()

    def add(self, row: dict[str, Any]) -> None:
        name = row["collective"]
        if name not in self.reports:
            self.reports[name] = self.ranks.open_report(self.path(name), SCHEMA, self.meta, earlier=self.earlier)
        self.reports[name].append(row)

    def _print(self, text: str) -> None:
        if self.ranks.is_main:
            print(text, file=self.stream, flush=True)

    def settings(self) -> str:
        """The nccl-tests flags in force, as the header states them (nothing when they are nccl-tests' defaults)."""
        meta = self.meta
        parts = []
        if meta.get("agg_iters", 1) != 1:
            parts.append(f", -m {meta['agg_iters']} calls per iteration")
        if meta.get("blocking"):
            parts.append(f", -z {meta['blocking']} ({BLOCKING[meta['blocking']]})")
        return "".join(parts)

    def _header(self, row: dict[str, Any]) -> None:
        cycles = self.meta.get("run_cycles", 1)
        self._print(
            f"#\n# {row['collective']}: backend {row['backend']}, world {row['world_size']} "
            f"({row['nnodes']} node{'s' if row['nnodes'] != 1 else ''}), iters {row['iters']}, "
            f"trials {row['trials']}{self.settings()}"
            + (f", cycle {row['cycle']} of {cycles}" if cycles != 1 else "")
            + f"; time = median over trials of {AVERAGE[self.meta.get('average', 1)]}"
        )
        self._print("#" + " " * 58 + "out-of-place" + " " * 23 + "in-place")
        self._print(
            _HEAD.format(
                "size",
                "count",
                "type",
                "redop",
                "root",
                "time",
                "algbw",
                "busbw",
                "#wrong",
                "time",
                "algbw",
                "busbw",
                "#wrong",
            )
        )
        self._print(
            _HEAD.format(
                "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
            )
        )

    @staticmethod
    def _half(row: dict[str, Any] | None) -> str:
        if row is None:
            return f"  {'N/A':>7}  {'':>6}  {'':>6}  {'':>6}"
        if row.get("status") != STATUS_OK:
            return f"  {row['status']:>7}  {'':>6}  {'':>6}  {'':>6}"
        t = row["time_us"]
        tstr = f"{t:7.0f}" if t >= 10000 else f"{t:7.1f}" if t >= 100 else f"{t:7.2f}"
        wrong = "N/A" if row["wrong"] is None else row["wrong"]
        return f"  {tstr}  {row['algbw_gbs']:6.2f}  {row['busbw_gbs']:6.2f}  {wrong:>6}"

    def case_done(self, rows: list[dict[str, Any]]) -> None:
        first = rows[0]
        if (first["collective"], first["cycle"]) != self.current:
            self.finish()
            self.current = (first["collective"], first["cycle"])
            self._header(first)
        by_variant = {r["inplace"]: r for r in rows}
        type_name = dtype_info(first["dtype"]).nccl_tests
        line = (
            f" {first['size_bytes']:>11}  {first['count']:>12}  {type_name:>8}  {first['redop']:>6}  "
            f"{first['root']:>6}" + self._half(by_variant.get(False)) + self._half(by_variant.get(True))
        )
        extra = [one_line(first["source"])] if first["source"] != "sweep" else []  # names from configs and logs
        if first["nranks"] != first["world_size"]:
            extra.insert(0, f"nranks {first['nranks']}")
        if first["pattern"]:
            extra.insert(0, first["pattern"])
        if first.get("imbalance") is not None:
            extra.append(f"busiest rank / mean {first['imbalance']:.3g}")
        straggler = next((r for r in rows if r.get("slowest_rank") is not None), None)
        if straggler is not None:  # --per-rank
            extra.append(
                f"slowest rank {straggler['slowest_rank']} in {100 * straggler['slowest_share']:.0f} % of calls, "
                f"p95 {straggler['slowest_p95_us']:.4g} us, spread {straggler['rank_spread_us']:.3g} us"
            )
        self._print(line + ("   # " + "; ".join(extra) if extra else ""))
        self._busbw += [r["busbw_gbs"] for r in rows if r.get("status") == STATUS_OK]

    def finish(self) -> None:
        if self.current is not None:
            avg = f"{sum(self._busbw) / len(self._busbw):.6g}" if self._busbw else "N/A"
            self._print(f"# Avg bus bandwidth    : {avg}   ({one_line(self.path(self.current[0]))})")
        self.current, self._busbw = None, []


def run_meta(device: torch.device, extra: dict[str, Any]) -> dict[str, Any]:
    """Environment sidecar plus the collective library version."""
    meta = dict(extra)
    if device.type == "cuda":
        try:
            meta["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - a build without NCCL still runs gloo
            meta["nccl_version"] = None
    return environment(device, meta)
