"""From attributed steps to the rows of the tables: line items per rank, kernel rows, and across ranks the slowest
one and the collectives its peers waited in. Times are means over a trace's steps. No torch import."""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from . import attribute, reader, rules
from .reader import Trace

# line items in table order: compute classes, then collectives (by kind), copies, idle
ITEM_ORDER = (*rules.COMPUTE, rules.MEMCPY)


@dataclass
class RankSteps:
    """One trace (one rank): its attributed steps."""

    path: str
    rank: int
    on_gpu: bool
    steps: list[attribute.StepResult]
    warnings: list[str] = field(default_factory=list)
    events: int = 0
    timeline: attribute.Timeline | None = None  # the median step's pieces, for the picture
    timeline_step: str = ""
    reading: dict[str, Any] = field(default_factory=dict)  # how the trace was read: whole, or by step (the sidecar's)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def step_s(self) -> float:
        return attribute.median([s.dur_us for s in self.steps]) / 1e6 if self.steps else 0.0

    def mean(self, values: list[float]) -> float:
        return sum(values) / len(self.steps) / 1e6 if self.steps else 0.0


def analyse(
    paths: list[str], memory_mib: float | None = None, say: Callable[[str], None] | None = None
) -> list[RankSteps]:
    """Read and attribute each trace; ranks come from the trace's distributedInfo, else its position. With
    ``memory_mib``, a trace whose kept events pass that budget is read again by step, as many per pass as fit
    (``_by_step``); ``say`` hears of the switch and the plan (the CLI prints it)."""
    out = []
    budget = int(memory_mib * (1 << 20)) if memory_mib is not None else None
    for i, path in enumerate(paths):
        over = ""
        try:
            rs = _whole(path, i, reader.read(path, budget=budget))
        except reader.OverBudget as exc:
            over = str(exc)  # not the exception: its traceback holds the columns read so far
        if over:
            rs = _by_step(path, i, memory_mib or 0.0, over, say)
        out.append(rs)
    ranks = [r.rank for r in out]
    if len(set(ranks)) != len(ranks):  # two traces of the same rank (or no distributedInfo): number by position
        for i, r in enumerate(out):
            r.rank = i
    return out


def _whole(path: str, i: int, trace: Trace, reading: dict[str, Any] | None = None) -> RankSteps:
    """A trace read whole, attributed one step's intervals at a time (memory: the trace's columns and one step)."""
    work = attribute.Attribution(trace)
    results = work.steps()
    rank = trace.rank if trace.rank is not None else i
    rs = RankSteps(path, rank, trace.on_gpu, results, trace.warnings, trace.events)
    rs.reading = reading or {"mode": "whole", "passes": 1}
    if results:  # the median step (by duration, the earlier of two): the one the timeline picture draws
        pick = results[_median_index([(s.dur_us, s.start_us) for s in results])]
        rs.timeline = attribute.timeline(work.inside(pick.start_us, pick.dur_us), pick)
        rs.timeline_step = pick.name
    return rs


def _median_index(keys: list[tuple[float, float]]) -> int:
    """The median step by (duration, start), the earlier of two: the rule the timeline picture's step is chosen by."""
    return sorted(range(len(keys)), key=lambda k: keys[k])[(len(keys) - 1) // 2]


@dataclass
class _Plan:
    """How many consecutive steps one pass reads under ``budget`` (bytes). A window of k steps keeps their events
    and the operators and launches of the step before the first (``reader.Window``): k steps are estimated at
    (k + 1) × the largest cost per step seen so far, a pass's estimate (``Trace.nbytes`` × ``WORK_FACTOR``) over
    the steps whose events it kept (its own, and the one before unless it starts at the first step). A pass that
    goes over the budget all the same (its steps cost more than those seen) is given up and halves the steps per
    pass from there on; a single step is read whatever it costs."""

    budget: int
    per_step: float = 0.0  # bytes, the largest seen
    cap: int = 1 << 30  # steps per pass at most, lowered by a pass over the budget
    sizes: list[int] = field(default_factory=list)  # steps of each pass read through
    given_up: int = 0  # passes over the budget, given up

    def fit(self) -> int:
        """Steps for the next pass: the most whose estimate stays under the budget, at least one."""
        if self.per_step <= 0:
            return 1  # nothing known yet: one step, which tells what a step costs
        return max(1, min(self.cap, int(self.budget // self.per_step) - 1))

    def learn(self, first: int, steps: int, need: float) -> None:
        """A pass of ``steps`` steps from window ``first`` read through, its estimate ``need`` (bytes)."""
        self.per_step = max(self.per_step, need / (steps + (first > 0)))
        self.sizes.append(steps)

    def over(self, steps: int) -> None:
        """A pass of ``steps`` steps went over the budget."""
        self.given_up += 1
        self.cap = max(1, steps // 2)


def _by_step(path: str, i: int, memory_mib: float, over: str, say: Callable[[str], None] | None) -> RankSteps:
    """A trace over the memory budget, read by step (docs/step.md, "Under a memory budget: steps per pass"): the
    markers by a text search (``reader.step_windows``), then passes over the file, each a windowed read of as many
    consecutive steps as fit the budget (``_Plan``; the first pass one step, which tells what a step costs) and
    their attribution, so memory is a few steps' events; time is a read per pass. The timeline is drawn for the
    median step, known from the markers' spans. Backward GEMMs are named by the forward shapes of every step: a
    step whose names would differ with them is attributed once more (``_renamed``). A trace without markers is read
    whole."""
    budget, mib = int(memory_mib * (1 << 20)), f"{memory_mib:g} MiB"
    marks = reader.step_windows(path)
    if not marks.steps:
        whole = reader.read(path)
        whole.warnings.append(f"over the memory budget ({mib}) but without ProfilerStep markers: read whole")
        return _whole(path, i, whole, {"mode": "whole", "passes": 2, "budget_mib": memory_mib, "markers": 0})
    wins = reader.windows(marks)
    # the median step under either reading of its spans (the GPU's where the trace has kernels): known after a pass
    cpu_keys = [(w.dur, w.ts) for w in wins]
    gpu_spans = [marks.gpu_steps.get(w.name, (w.ts, w.dur)) for w in wins]  # as Attribution.spans takes them
    gpu_keys = [(dur, ts) for ts, dur in gpu_spans]
    picks = {_median_index(cpu_keys), _median_index(gpu_keys)}
    results: list[attribute.StepResult | None] = [None] * len(wins)
    forwards: list[set[tuple[int, int, int]]] = [set() for _ in wins]
    timelines: dict[int, attribute.Timeline] = {}
    warnings: list[str] = []
    plan = _Plan(budget)
    head = Trace(path)  # the last pass's trace without its columns: rank, kernels or not, counts, warnings

    def one_pass(ks: list[int], forward: set[tuple[int, int, int]] | None) -> bool:
        """Steps ``ks`` (consecutive windows) read in one window and attributed; only their results stay, not the
        columns. False: the read passed the budget and was given up (only a pass of several steps is watched)."""
        nonlocal head
        gone_over = False
        keep = reader.group([wins[k] for k in ks])
        back = ks[0]
        try:
            while True:
                trace = reader.read(path, keep=keep, budget=budget if len(ks) > 1 else None)
                if not reader.unlaunched(trace) or keep.cpu[0] == -math.inf:
                    break
                # kernels launched before the window began (a GPU over a step behind): from one step earlier
                back -= 1
                keep = replace(keep, cpu=(wins[back].cpu[0] if back >= 0 else -math.inf, keep.cpu[1]))
                del trace
        except reader.OverBudget:
            gone_over = True  # out of the handler first: its traceback holds the columns read so far
        if gone_over:
            plan.over(len(ks))
            warnings.append(f"a pass of {len(ks)} steps from {wins[ks[0]].name} passed the budget of {mib}: "
                            f"{plan.cap} steps per pass from there")  # fmt: skip
            return False
        head = Trace(path, trace.rank, events=trace.events, warnings=trace.warnings, on_gpu=trace.on_gpu,
                     markers_seen=trace.markers_seen)  # fmt: skip
        work = attribute.Attribution(trace, forward)
        for k in ks:
            win = wins[k]
            result = results[k] = work.step(*attribute.step_span(trace, win.name, win.ts, win.dur))
            forwards[k] = work.forward
            if k in picks:
                timelines[k] = attribute.timeline(work.inside(result.start_us, result.dur_us), result)
        need = trace.nbytes() * reader.WORK_FACTOR
        plan.learn(ks[0], len(ks), need)
        if len(ks) == 1 and need > budget:
            warnings.append(
                f"step {wins[ks[0]].name} alone needs ~{need / (1 << 20):.1f} MiB, over the budget of {mib}"
            )
        return True

    def passes(ks: list[int], forward: set[tuple[int, int, int]] | None) -> None:
        """Steps ``ks`` (ascending), each pass as many consecutive ones as the plan fits."""
        at = 0
        while at < len(ks):
            run = ks[at : at + 1]
            while len(run) < plan.fit() and at + len(run) < len(ks) and ks[at + len(run)] == run[-1] + 1:
                run.append(ks[at + len(run)])
            if one_pass(run, forward):
                at += len(run)

    passes([0], None)
    if head.markers_seen != len(marks.steps):  # the text search missed (or miscounted) a marker: read it whole
        whole = reader.read(path)
        whole.warnings.append(
            f"over the memory budget ({mib}) but the marker search found {len(marks.steps)} of "
            f"{head.markers_seen} step markers: read whole"
        )
        return _whole(path, i, whole, {"mode": "whole", "passes": 3, "budget_mib": memory_mib})
    per = plan.fit()
    if say is not None:
        say(f"{path}: its kept events passed the memory budget of {mib} ({over}): reading it by step: a step "
            f"~{plan.per_step / (1 << 20):.1f} MiB, so {per} step{'s' * (per > 1)} per pass after the first, "
            f"{1 + -(-(len(wins) - 1) // per)} passes of the file for {len(wins)} steps")  # fmt: skip
    passes(list(range(1, len(wins))), None)
    everyone = set().union(*forwards)
    again = [k for k, r in enumerate(results) if r is not None and _renamed(r, forwards[k], everyone)]
    passes(again, everyone)
    steps = [r for r in results if r is not None]
    rank = head.rank if head.rank is not None else i
    rs = RankSteps(path, rank, head.on_gpu, steps, head.warnings + warnings, head.events)
    pick = _median_index(gpu_keys if head.on_gpu else cpu_keys)
    rs.timeline, rs.timeline_step = timelines[pick], steps[pick].name
    rs.reading = {
        "mode": "by step",
        "passes": 1 + len(plan.sizes) + plan.given_up,  # the whole read given up, the passes by step
        "steps_per_pass": plan.sizes,  # of each pass read through, the renamed steps' last
        "passes_over_budget": plan.given_up,  # given up, their steps read again in smaller passes
        "renamed_steps": len(again),
        "budget_mib": memory_mib,
        "largest_step_mib": round(plan.per_step / (1 << 20), 1),  # the largest estimate per step seen
        "marker_scan_chars": marks.chars,
    }
    return rs


def _renamed(result: attribute.StepResult, mine: set[tuple[int, int, int]], every: set[tuple[int, int, int]]) -> bool:
    """Whether a backward GEMM row of this step would be named otherwise (dgrad, wgrad, bwd) by the forward shapes
    of every step than by its own window's: ``attribute._with_passes`` asks (m, k, n) and (k, m, n)."""
    for key in result.kernels:
        if key.klass == rules.GEMM and key.kind != "fwd" and key.m and key.n and key.k:
            fit = ((key.m, key.k, key.n), (key.k, key.m, key.n))
            if [f in mine for f in fit] != [f in every for f in fit]:
                return True
    return False


def items(rs: RankSteps) -> dict[str, dict[str, float]]:
    """Line item -> {measured_s, busy_s, exposed_s, overlapped_s}: the step's partition, each collective kind
    with its exposed and overlapped time, means over the steps."""
    part: dict[str, float] = defaultdict(float)
    busy: dict[str, float] = defaultdict(float)
    comm_busy: dict[str, float] = defaultdict(float)
    comm_exposed: dict[str, float] = defaultdict(float)
    for s in rs.steps:
        for k, v in s.partition.items():
            part[k] += v
        for k, v in s.busy.items():
            busy[k] += v
        for k, v in s.comm_busy.items():
            comm_busy[k] += v
        for k, v in s.comm_exposed.items():
            comm_exposed[k] += v
    out: dict[str, dict[str, float]] = {}
    for klass in ITEM_ORDER:
        if klass in part or klass in busy:
            out[klass] = {"measured_s": rs.mean([part.get(klass, 0.0)]), "busy_s": rs.mean([busy.get(klass, 0.0)])}
    for kind in sorted(set(comm_busy) | {k.split(":", 1)[1] for k in part if k.startswith("comm:")}):
        exposed = rs.mean([comm_exposed.get(kind, 0.0)])
        busy_kind = rs.mean([comm_busy.get(kind, 0.0)])
        out[f"comm:{kind}"] = {
            "measured_s": rs.mean([part.get(f"comm:{kind}", 0.0)]),
            "busy_s": busy_kind,
            "exposed_s": exposed,
            "overlapped_s": max(0.0, busy_kind - exposed),
        }
    if attribute.BUBBLE in part:
        out[attribute.BUBBLE] = {"measured_s": rs.mean([part[attribute.BUBBLE]])}
    out[attribute.IDLE] = {"measured_s": rs.mean([part.get(attribute.IDLE, 0.0)])}
    out["step"] = {"measured_s": rs.mean([s.dur_us for s in rs.steps])}
    return out


def item_rows(rs: RankSteps, projected: dict[str, float] | None = None) -> list[dict[str, Any]]:
    got = items(rs)
    step = got["step"]["measured_s"] or 1.0
    rows = []
    for item, v in got.items():
        row: dict[str, Any] = {"trace": rs.name, "rank": rs.rank, "steps": len(rs.steps), "item": item, **v}
        row["share"] = v["measured_s"] / step
        if item == f"comm:{attribute.P2P}" and attribute.BUBBLE in got:
            row["note"] = "pipeline p2p: its exposed time is counted as the bubble"
        rows.append(row)
    return rows


def kernel_rows(rs: RankSteps) -> list[dict[str, Any]]:
    """One row per kernel key (class, kind, name, shape), time per step, most time first."""
    merged: dict[attribute.Key, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for s in rs.steps:
        for key, (calls, us) in s.kernels.items():
            merged[key][0] += calls
            merged[key][1] += us
    n = len(rs.steps) or 1
    step = rs.mean([s.dur_us for s in rs.steps]) or 1.0
    rows = []
    for key, (calls, us) in sorted(merged.items(), key=lambda kv: -kv[1][1]):
        time_s = us / n / 1e6
        flops = 2.0 * key.m * key.n * key.k * (key.groups or 1) if key.m and key.n and key.k else None
        rows.append(
            {
                "trace": rs.name,
                "rank": rs.rank,
                "class": key.klass,
                "kind": key.kind,
                "name": key.name,
                "m": key.m,
                "n": key.n,
                "k": key.k,
                "groups": key.groups,
                "dtype": key.dtype,
                "bytes": key.nbytes,
                "group_ranks": key.group,
                "calls": calls / n,
                "time_s": time_s,
                "share": time_s / step,
                "tflops": flops * (calls / n) / time_s / 1e12 if flops and time_s > 0 else None,
            }
        )
    return rows


def lane_name(lane: tuple[int, int]) -> str:
    if lane == attribute.STEP_LANE:
        return "step"
    device, stream = lane
    return f"thread {stream}" if device == -1 else f"gpu{device} stream {stream}"


def timeline_rows(rs: RankSteps) -> list[dict[str, Any]]:
    """The median step's pieces (``attribute.Timeline``), seconds from the step's start: the ``step`` lane is the
    partition itself (its pieces add up to each line item of that step), the other lanes each stream or thread."""
    tl = rs.timeline
    if tl is None:
        return []
    rows = []
    for lane in sorted(tl.pieces, key=lambda ln: (ln != attribute.STEP_LANE, ln)):
        name = lane_name(lane)
        for label, t0, t1 in tl.pieces[lane]:
            rows.append(
                {
                    "trace": rs.name,
                    "rank": rs.rank,
                    "step": rs.timeline_step,
                    "lane": name,
                    "class": label,
                    "start_s": (t0 - tl.start_us) / 1e6,
                    "end_s": (t1 - tl.start_us) / 1e6,
                }
            )
    return rows


def compute_s(rs: RankSteps) -> float:
    """Seconds per step the rank's device was computing (its compute classes in the partition)."""
    got = items(rs)
    return sum(got[k]["measured_s"] for k in rules.COMPUTE if k in got)


@dataclass
class Straggler:
    rank: int
    compute_s: float  # per step
    median_compute_s: float  # the other ranks' median
    kernels: list[tuple[str, float]]  # (kernel row, seconds per step more than the other ranks' median)
    waits: list[tuple[int, str, float]]  # (rank, collective kind, seconds per step more exposed than the straggler)


def straggler(ranks: list[RankSteps], top: int = 5) -> Straggler | None:
    """The slowest rank, the kernel rows where it spent most beyond the other ranks' median, and the collectives
    where the other ranks sat exposed longer than it did: waiting for it. Collectives make every rank's step as
    long as the slowest one's, so the slowest rank is the one that computed longest, not the longest step."""
    if len(ranks) < 2:
        return None
    slow = max(ranks, key=compute_s)
    others = [r for r in ranks if r is not slow]
    per: list[dict[str, float]] = []
    for r in ranks:
        d: dict[str, float] = defaultdict(float)
        for row in kernel_rows(r):
            if row["class"] in rules.COMPUTE:
                d[f"{row['class']} {row['kind']} {row['name']}".strip()] += row["time_s"]
        per.append(d)
    mine = per[ranks.index(slow)]
    theirs = [per[ranks.index(r)] for r in others]
    extra = []
    for name, t in mine.items():
        ref = attribute.median([d.get(name, 0.0) for d in theirs])
        if t - ref > 0:
            extra.append((name, t - ref))
    extra.sort(key=lambda x: -x[1])
    slow_items = items(slow)
    waits = []
    for r in others:
        for item, v in items(r).items():
            if item.startswith("comm:"):
                more = v.get("exposed_s", 0.0) - slow_items.get(item, {}).get("exposed_s", 0.0)
                if more > 0:
                    waits.append((r.rank, item.split(":", 1)[1], more))
    waits.sort(key=lambda x: -x[2])
    return Straggler(
        slow.rank, compute_s(slow), attribute.median([compute_s(r) for r in others]), extra[:top], waits[:top]
    )
