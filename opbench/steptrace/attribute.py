"""Put every kernel of a trace in its place, and every instant of each step in one class.

A GPU kernel is tied to the CPU operator that launched it by the trace's ids (kernel → its launch's ``correlation``
→ the launch's ``External id`` → the innermost CPU operator with that id), and that operator's enclosing spans say
whether it ran in backward (``autograd::engine::evaluate_function: …``) or in the optimizer (``Optimizer.step#…``).
On a CPU trace the operators stand in for kernels: each instant belongs to the innermost operator running then,
classed as its outermost classified enclosing operator (``aten::linear``'s transposes are the GEMM's).

Each step (``ProfilerStep#N``) is then cut into one class per instant (``partition``): compute kernels first (shared
equally when several run at once), then collectives not hidden by compute (exposed), then copies, else idle; so
the classes add up to the step's time exactly, and a collective's time splits into exposed and overlapped. A
pipeline stage's waits are the ``bubble``: its exposed p2p and, in a step with p2p, its idle before the first and
after the last compute (docs/step.md, "The pipeline bubble"). ``timeline`` records one step's pieces for the
picture. No torch import.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from . import rules
from .reader import CpuOp, GpuEvent, Trace

IDLE = "idle"
_BACKWARD_SPAN = re.compile(r"^autograd::engine::evaluate_function|Backward\d*$")


@dataclass(frozen=True)
class Key:
    """What identifies a row of the kernel table: the class and what the class says about the kernel."""

    klass: str
    name: str
    kind: str = ""  # gemm: fwd/dgrad/wgrad/bwd; attention: backend fwd/bwd; comm: the collective
    m: int | None = None
    n: int | None = None
    k: int | None = None
    groups: int | None = None
    dtype: str = ""
    nbytes: int | None = None  # a collective's message bytes (record_param_comms' In msg nelems × dtype)
    group: str = ""  # a collective's process group ranks


@dataclass(slots=True)
class Interval:
    start: float  # µs
    end: float
    lane: tuple[int, int]  # (device or -1 for a CPU thread, stream or thread id)
    depth: int
    key: Key
    counted: bool = True  # a call of its row (a CPU operator inside the one that named the row is not)


@dataclass
class StepResult:
    """One step of one rank: its span, the exact partition of that span, and each kernel row's time."""

    name: str
    start_us: float
    dur_us: float
    partition: dict[str, float] = field(default_factory=dict)  # class or comm:<kind> or idle -> µs
    busy: dict[str, float] = field(default_factory=dict)  # class -> µs of kernel time (overlaps counted twice)
    comm_busy: dict[str, float] = field(default_factory=dict)  # collective kind -> µs some collective of it ran
    comm_exposed: dict[str, float] = field(default_factory=dict)  # ... of which with no compute running
    kernels: dict[Key, list[float]] = field(default_factory=dict)  # key -> [calls, µs]


Context = tuple[str | None, bool, bool, int | None, int | None, int]


class _Ops:
    """The CPU operators of one trace with their nesting, to answer "who launched this, and in which phase"."""

    def __init__(self, ops: list[CpuOp]):
        self.ops = sorted(ops, key=lambda o: (o.tid, o.ts, -o.dur))
        self.parent: list[int] = [-1] * len(self.ops)
        self.depth: list[int] = [0] * len(self.ops)
        stack: list[int] = []
        tid = None
        for i, op in enumerate(self.ops):
            if op.tid != tid:
                stack, tid = [], op.tid
            while stack and self.ops[stack[-1]].ts + self.ops[stack[-1]].dur <= op.ts:
                stack.pop()
            if stack:
                self.parent[i] = stack[-1]
                self.depth[i] = len(stack)
            stack.append(i)
        self.by_ext: dict[int, int] = {}
        for i, op in enumerate(self.ops):
            if op.ext is not None and op.name.startswith(("aten::", "record_param_comms", "c10d", "_c10d")):
                self.by_ext[op.ext] = i  # the innermost operator with an id wins: it comes later in nesting order
            elif op.ext is not None:
                self.by_ext.setdefault(op.ext, i)
        self._context: dict[int, Context] = {}

    def chain(self, i: int) -> Iterable[int]:
        while i >= 0:
            yield i
            i = self.parent[i]

    def context(self, i: int) -> Context:
        """(outermost class on the chain, in backward, in the optimizer, innermost matmul op, record_param_comms op,
        the operator that gave the class)."""
        got = self._context.get(i)
        if got is not None:
            return got
        todo = []  # the chain up to the first operator already known, then each one from its parent's, outwards in
        j = i
        while j >= 0 and j not in self._context:
            todo.append(j)
            j = self.parent[j]
        for j in reversed(todo):
            up = self._context.get(self.parent[j])
            op = self.ops[j]
            c = rules.op_class(op.name)
            if up is None:
                klass, backward, optimizer, matmul, comm, outer = c, False, False, None, None, j
            else:
                klass, backward, optimizer, matmul, comm, outer = up
                if klass is None:
                    klass, outer = c, j
            if c == rules.GEMM and op.dims:
                matmul = j
            if op.comm is not None or (c == rules.COMM and op.dims and (comm is None or self.ops[comm].comm is None)):
                comm = j
            backward = backward or bool(_BACKWARD_SPAN.search(op.name))
            optimizer = optimizer or op.name.startswith("Optimizer.step#")
            self._context[j] = (klass, backward, optimizer, matmul, comm, outer)
        return self._context[i]


def _comm_key(name: str, op: CpuOp | None) -> Key:
    """A collective's row: kind, bytes and group from record_param_comms' arguments; without them (gloo, or a
    trace of an older torch) from the c10d operator's input tensor (``Input Dims`` / ``Input type``)."""
    args = (op.comm or {}) if op else {}
    kind = rules.collective_kind(str(args.get("Collective name") or name))
    dtype = rules.COMM_DTYPES.get(str(args.get("dtype")), str(args.get("dtype") or ""))
    nelems = args.get("In msg nelems")
    if op is not None and op.comm is None and op.dims:
        nelems, dtype = rules.comm_input(op.name, op.dims, op.types)
    nbytes = None
    if isinstance(nelems, int) and dtype in rules.ELEMENT_BYTES:
        nbytes = nelems * rules.ELEMENT_BYTES[dtype]
    ranks = args.get("Process Group Ranks")
    group = " ".join(str(ranks).split()) if ranks is not None else ""
    return Key(rules.COMM, name, kind, dtype=dtype, nbytes=nbytes, group=group)


def _key(ops: _Ops, name: str, klass: str, index: int | None) -> Item:
    """The kernel row key of a kernel or operator of class ``klass`` launched by (or being) operator ``index``;
    with the GEMM's (m, n, k) and whether it ran in backward, for the pass to be told once forward shapes are known."""
    op_class, backward, optimizer, matmul, comm, _ = (
        ops.context(index) if index is not None else (None, False, False, None, None, 0)
    )
    if klass == rules.OTHER and op_class is not None:
        klass = op_class
    blank = Interval(0.0, 0.0, (0, 0), 0, Key(klass, name))
    if klass == rules.COMM:
        blank.key = _comm_key(name, ops.ops[comm] if comm is not None else None)
        return blank, None, backward, None
    if optimizer and klass not in (rules.MEMCPY,):
        blank.key = Key(rules.OPTIMIZER, name)
        return blank, None, backward, None
    if klass == rules.GEMM:
        shape = rules.gemm_shape(ops.ops[matmul].name, ops.ops[matmul].dims) if matmul is not None else None
        if shape is None or matmul is None:
            blank.key = Key(rules.GEMM, name, "bwd" if backward else "fwd")
            return blank, None, backward, None
        mm = ops.ops[matmul]
        dtype = rules.dtype_name(mm.types[0]) if isinstance(mm.types, list) and mm.types else ""
        m, n, k, groups = shape
        blank.key = Key(rules.GEMM, name, "bwd" if backward else "fwd", m, n, k, groups, dtype)
        return blank, (m, n, k), backward, _transposed(mm.strides)
    if klass == rules.ATTENTION:
        where = name if index is None else f"{name} {ops.ops[index].name}"
        kind = f"{rules.attention_backend(where)} {'bwd' if backward or rules.direction(where) == 'bwd' else 'fwd'}"
        blank.key = Key(rules.ATTENTION, name, kind)
    return blank, None, backward, None


Item = tuple[Interval, tuple[int, int, int] | None, bool, bool | None]  # interval, (m, n, k), backward, A transposed


def _with_passes(items: list[Item]) -> list[Interval]:
    """Name each backward GEMM's pass from the forward shapes of the same trace: forward (T, N, K) makes dgrad
    (T, K, N) and wgrad (N, K, T) (docs/conventions.md, "GEMM shapes of a training step"); where both fit (square
    shapes), wgrad's first operand is dYᵀ, a transposed view (its ``Input Strides`` say so), dgrad's is dY."""
    forward = {mnk for iv, mnk, bwd, _ in items if mnk and not bwd}
    out = []
    canon: dict[Key, Key] = {}  # one Key object per distinct row, not one per kernel: the memory of a long trace
    for iv, mnk, bwd, a_transposed in items:
        if mnk and bwd:
            m, n, k = mnk
            dgrad, wgrad = (m, k, n) in forward, (k, m, n) in forward
            if dgrad and wgrad and a_transposed is not None:
                dgrad, wgrad = not a_transposed, a_transposed
            kind = "dgrad" if dgrad and not wgrad else "wgrad" if wgrad and not dgrad else "bwd"
            iv.key = replace(iv.key, kind=kind)
        iv.key = canon.setdefault(iv.key, iv.key)
        out.append(iv)
    return out


def _transposed(strides: object) -> bool | None:
    """Whether a matmul's first operand is a transposed view: its last dimension's stride is not 1."""
    if isinstance(strides, list) and strides and isinstance(strides[0], list) and len(strides[0]) >= 2:
        first = strides[0]
        return bool(first[-1] != 1 and first[-2] == 1)
    return None


def intervals(trace: Trace) -> list[Interval]:
    """Every kernel (a GPU trace) or operator (a CPU trace) as a classified interval."""
    ops = _Ops(trace.cpu_ops)
    items: list[Item] = []
    if trace.on_gpu:
        for ev in trace.gpu:
            items.append(_gpu_item(ev, trace, ops))
    else:
        for i, op in enumerate(ops.ops):
            if op.name.startswith("Optimizer.") and not op.name.startswith("Optimizer.step#"):
                continue  # zero_grad and friends: their operators are classed on their own
            klass, *_, outer = ops.context(i)
            item = _key(ops, ops.ops[outer].name, klass or rules.OTHER, i)
            iv = item[0]
            iv.start, iv.end, iv.lane, iv.depth = op.ts, op.ts + op.dur, (-1, op.tid), ops.depth[i]
            iv.counted = outer == i
            items.append(item)
    return _with_passes(items)


def _gpu_item(ev: GpuEvent, trace: Trace, ops: _Ops) -> Item:
    lane = (ev.device, ev.stream)
    if ev.cat != "kernel":
        return Interval(ev.ts, ev.ts + ev.dur, lane, 0, Key(rules.MEMCPY, ev.name)), None, False, None
    ext = ev.ext
    if ev.corr is not None and ev.corr in trace.launches:
        ext = trace.launches[ev.corr][0] if trace.launches[ev.corr][0] is not None else ext
    index = ops.by_ext.get(ext) if ext is not None else None
    item = _key(ops, ev.name, rules.kernel_class(ev.name), index)
    iv = item[0]
    iv.start, iv.end, iv.lane = ev.ts, ev.ts + ev.dur, lane
    return item


def label(key: Key) -> str:
    return f"comm:{key.kind}" if key.klass == rules.COMM else key.klass


def partition(
    items: list[Interval], start: float, end: float, result: StepResult, record: Timeline | None = None
) -> None:
    """Cut [start, end) into one label per instant (module docstring) and add each interval's own time to its row;
    with ``record``, keep the pieces for the timeline picture (``Timeline``). A sweep over the interval ends:
    O(n log n), each lane's top interval (deepest, latest started) read per cut. A step with pipeline p2p
    (``send_recv``) counts its idle before the first and after the last compute as ``bubble`` (``_edges``)."""
    cuts: list[tuple[float, int, int]] = []  # (time, +1 open / -1 close, index)
    for i, iv in enumerate(items):
        s, e = max(iv.start, start), min(iv.end, end)
        if e > s:
            cuts.append((s, 1, i))
            cuts.append((e, -1, i))
    cuts.sort(key=lambda c: (c[0], c[1]))
    lanes: dict[tuple[int, int], list[tuple[int, float, int]]] = defaultdict(list)  # heap of (-depth, -start, i)
    closed: set[int] = set()
    edges = _Edges()
    last = start
    for t, what, i in cuts:
        if t > last:
            edges.add(_segment(items, lanes, closed, last, t, result, record), t - last)
            last = t
        if what == 1:
            iv = items[i]
            heapq.heappush(lanes[iv.lane], (-iv.depth, -iv.start, i))
        else:
            closed.add(i)
    if end > last:
        result.partition[IDLE] = result.partition.get(IDLE, 0.0) + end - last
        edges.add(IDLE, end - last)
        if record is not None and not record.full(last):
            record.add(STEP_LANE, IDLE, last, end)
    _edges(result, edges, record)


class _Edges:
    """The idle time before a step's first compute and since its last one, as the sweep goes."""

    def __init__(self) -> None:
        self.lead = self.tail = 0.0
        self.computed = False
        self.first = self.last = math.nan  # µs from the sweep's start: where the first compute began, the last ended
        self.clock = 0.0

    def add(self, label: str, seg: float) -> None:
        if label == COMPUTING:
            if not self.computed:
                self.first = self.clock
            self.computed, self.tail = True, 0.0
            self.last = self.clock + seg
        elif label == IDLE:
            if self.computed:
                self.tail += seg
            else:
                self.lead += seg
        self.clock += seg


def _edges(result: StepResult, edges: _Edges, record: Timeline | None) -> None:
    """A pipeline stage (its step ran p2p sends/receives) waits for its neighbours before its first forward and
    after its last backward: that idle is the bubble (docs/step.md, "The pipeline bubble"), not idle."""
    if P2P not in result.comm_busy:
        return
    moved = edges.lead + edges.tail if edges.computed else edges.lead
    if moved <= 0:
        return
    part = result.partition
    part[IDLE] = part.get(IDLE, 0.0) - moved
    if abs(part[IDLE]) < 1e-9:
        del part[IDLE]
    part[BUBBLE] = part.get(BUBBLE, 0.0) + moved
    if record is not None:
        first, last = edges.first + result.start_us, edges.last + result.start_us
        record.relabel_edges(first if edges.computed else math.inf, last if edges.computed else math.inf)


def _segment(
    items: list[Interval],
    lanes: dict[tuple[int, int], list[tuple[int, float, int]]],
    closed: set[int],
    t0: float,
    t1: float,
    result: StepResult,
    record: Timeline | None,
) -> str:
    """Give the piece [t0, t1) its label(s) and each lane's top kernel its time; returns ``COMPUTING``, or the
    label of a piece with no compute."""
    seg = t1 - t0
    compute: list[str] = []
    comm: set[str] = set()
    copy = False
    tops: list[tuple[tuple[int, int], Key]] = []
    for lane, heap in lanes.items():
        while heap and heap[0][2] in closed:
            heapq.heappop(heap)
        if not heap:
            continue
        key = items[heap[0][2]].key
        row = result.kernels.setdefault(key, [0.0, 0.0])
        row[1] += seg
        if record is not None:
            tops.append((lane, key))
        if key.klass in rules.COMPUTE:
            compute.append(key.klass)
        elif key.klass == rules.COMM:
            comm.add(key.kind)
        else:
            copy = True
    part = result.partition
    for kind in comm:
        result.comm_busy[kind] = result.comm_busy.get(kind, 0.0) + seg
    pieces: list[str] = []  # the step lane's labels for this piece, each an equal share of it
    if compute:
        share = seg / len(compute)
        for klass in compute:
            part[klass] = part.get(klass, 0.0) + share
        pieces = sorted(compute)
    elif comm:
        share = seg / len(comm)
        for kind in comm:
            name = BUBBLE if kind == P2P else f"comm:{kind}"  # a pipeline p2p wait: the stage has nothing to do
            part[name] = part.get(name, 0.0) + share
            result.comm_exposed[kind] = result.comm_exposed.get(kind, 0.0) + seg
            pieces.append(name)
        pieces.sort()
    elif copy:
        part[rules.MEMCPY] = part.get(rules.MEMCPY, 0.0) + seg
        pieces = [rules.MEMCPY]
    else:
        part[IDLE] = part.get(IDLE, 0.0) + seg
        pieces = [IDLE]
    if record is not None and not record.full(t0):
        width = seg / len(pieces)
        for j, name in enumerate(pieces):
            record.add(STEP_LANE, name, t0 + j * width, t1 if j == len(pieces) - 1 else t0 + (j + 1) * width)
        for lane, key in tops:
            record.add(lane, lane_label(key, bool(compute)), t0, t1)
    return COMPUTING if compute else pieces[0]


def lane_label(key: Key, computing: bool) -> str:
    """A kernel's colour on its stream's bar: its class; a collective exposed or overlapped with compute."""
    if key.klass != rules.COMM:
        return key.klass
    if computing:
        return COMM_OVERLAPPED
    return BUBBLE if key.kind == P2P else COMM_EXPOSED


@dataclass
class Timeline:
    """One step's pieces for the picture: per lane (``STEP_LANE`` = the step's own cut, one label per instant, as
    the partition counts it; else a stream or thread: its top kernel's class), merged where the same label runs on.
    ``limit`` caps the pieces kept (a long step of small kernels): once reached, nothing from ``cut_us`` on is
    kept, on any lane, so what is kept is the whole picture of the step's first part; ``dropped`` counts the
    pieces of the sweep left out."""

    start_us: float
    limit: int = 20_000
    pieces: dict[tuple[int, int], list[list[Any]]] = field(default_factory=dict)  # lane -> [[label, t0, t1]]
    kept: int = 0
    dropped: int = 0
    cut_us: float = math.inf

    def full(self, t0: float) -> bool:
        """Whether the piece starting at ``t0`` is left out (the cap was reached at or before it)."""
        if self.kept >= self.limit:
            self.cut_us = min(self.cut_us, t0)
            self.dropped += 1
            return True
        return False

    def add(self, lane: tuple[int, int], label: str, t0: float, t1: float) -> None:
        rows = self.pieces.setdefault(lane, [])
        if rows and rows[-1][0] == label and rows[-1][2] == t0:
            rows[-1][2] = t1
        else:
            rows.append([label, t0, t1])
            self.kept += 1

    def relabel_edges(self, first: float, last: float) -> None:
        """The step lane's idle before ``first`` and after ``last`` (µs) is bubble (``_edges``)."""
        for row in self.pieces.get(STEP_LANE, []):
            if row[0] == IDLE and (row[2] <= first or row[1] >= last):
                row[0] = BUBBLE


STEP_LANE = (-2, 0)  # the step's own cut in a Timeline
BUBBLE, P2P, COMPUTING = "bubble", "send_recv", "computing"
COMM_EXPOSED, COMM_OVERLAPPED = "comm exposed", "comm overlapped"


def timeline(items: list[Interval], step: StepResult, limit: int = 20_000) -> Timeline:
    """The pieces of one already attributed step, for the picture: its partition again, recorded."""
    record = Timeline(step.start_us, limit)
    inside = [iv for iv in items if iv.end > step.start_us and iv.start < step.start_us + step.dur_us]
    partition(inside, step.start_us, step.start_us + step.dur_us, StepResult(step.name, step.start_us, step.dur_us),
              record)  # fmt: skip
    return record


def steps(trace: Trace, items: list[Interval] | None = None) -> list[StepResult]:
    """Each ProfilerStep#N of the trace, attributed; a trace without step markers is one step, named "trace"."""
    items = intervals(trace) if items is None else items
    spans = sorted(trace.steps, key=lambda s: s[1])
    if trace.on_gpu:
        spans = [(n, *trace.gpu_steps.get(n, (ts, dur))) for n, ts, dur in spans]
    if not spans:
        if not items:
            return []
        lo, hi = min(iv.start for iv in items), max(iv.end for iv in items)
        spans = [("trace", lo, hi - lo)]
    ordered = sorted(items, key=lambda iv: iv.start)
    starts = [iv.start for iv in ordered]
    longest = max((iv.end - iv.start for iv in ordered), default=0.0)
    out = []
    import bisect

    for name, ts, dur in spans:
        lo = bisect.bisect_left(starts, ts - longest)
        hi = bisect.bisect_right(starts, ts + dur)
        inside = [iv for iv in ordered[lo:hi] if iv.end > ts and iv.start < ts + dur]
        result = StepResult(name, ts, dur)
        partition(inside, ts, ts + dur, result)
        for iv in inside:
            s, e = max(iv.start, ts), min(iv.end, ts + dur)
            result.busy[iv.key.klass] = result.busy.get(iv.key.klass, 0.0) + (e - s)
            row = result.kernels.setdefault(iv.key, [0.0, 0.0])
            row[0] += iv.counted
        out.append(result)
    return out


def summed(results: list[StepResult]) -> dict[str, Any]:
    """The median step's partition (by duration) and the mean of every class over the steps, for the table."""
    if not results:
        return {}
    total = sum(r.dur_us for r in results)
    classes: dict[str, float] = defaultdict(float)
    for r in results:
        for k, v in r.partition.items():
            classes[k] += v
    return {"steps": len(results), "step_us": total / len(results), **{k: v / len(results) for k, v in classes.items()}}


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return math.nan if not n else s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
