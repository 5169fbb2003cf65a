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
picture. ``Attribution`` makes the intervals of one step at a time, so memory holds one step's, not the trace's
(docs/step.md, "Reading large traces"). No torch import.
"""

from __future__ import annotations

import bisect
import heapq
import math
import re
from array import array
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from . import rules
from .reader import GPU_CAT_NAMES, NONE, CpuOp, GpuEvent, Trace, to_column

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
    """The CPU operators of one trace with their nesting, to answer "who launched this, and in which phase". The
    operators stay in the trace's columns; here only their nesting order, parents and depths (typed arrays, a few
    bytes each) and the ``External id`` lookup (two sorted arrays: a dict of ints would cost ~100 bytes an entry)."""

    def __init__(self, trace: Trace):
        self.trace = trace
        n = len(trace.cpu_name)
        tid, ts, dur = _np(trace.cpu_tid, np.int64), _np(trace.cpu_ts, np.float64), _np(trace.cpu_dur, np.float64)
        order = np.lexsort((-dur, ts, tid))  # stable: sorted by (tid, ts, -dur), ties in file order
        self.order = to_column("q", order)
        self.parent = array("i", bytes(4 * n))
        self.depth = array("i", bytes(4 * n))
        tids, starts = to_column("q", tid[order]), to_column("d", ts[order])
        ends = to_column("d", ts[order] + dur[order])
        stack: list[int] = []
        cur = None
        for i in range(n):
            if tids[i] != cur:
                stack, cur = [], tids[i]
            while stack and ends[stack[-1]] <= starts[i]:
                stack.pop()
            if stack:
                self.parent[i] = stack[-1]
                self.depth[i] = len(stack)
            else:
                self.parent[i] = -1
            stack.append(i)
        del tids, starts, ends
        # by External id: the innermost operator (aten::, c10d, record_param_comms) with it wins, it comes later in
        # nesting order; else the first with it. As a score, the highest per id: the last preferred one, else the first.
        ext = _np(trace.cpu_ext, np.int64)[order]
        names = _np(trace.cpu_name, np.int32)[order]
        preferred = np.array([nm.startswith(("aten::", "record_param_comms", "c10d", "_c10d")) for nm in trace.names],
                             dtype=bool)  # fmt: skip
        has = np.nonzero(ext != NONE)[0]
        score = np.where(preferred[names[has]], n + has, n - has)
        by = np.lexsort((score, ext[has]))
        keys, vals = ext[has][by], has[by]
        last = np.ones(len(keys), dtype=bool)
        last[:-1] = keys[1:] != keys[:-1]
        self.ext_keys = to_column("q", keys[last])
        self.ext_index = to_column("q", vals[last])
        self._context: dict[int, Context] = {}

    def __len__(self) -> int:
        return len(self.order)

    def op(self, i: int) -> CpuOp:
        """The ``i``-th operator in nesting order, as an object."""
        return self.trace.cpu_op(self.order[i])

    def name(self, i: int) -> str:
        return self.trace.names[self.trace.cpu_name[self.order[i]]]

    def by_ext(self, ext: int) -> int | None:
        """The operator that launched a kernel of this ``External id`` (see ``__init__``), None if none has it."""
        at = bisect.bisect_left(self.ext_keys, ext)
        return self.ext_index[at] if at < len(self.ext_keys) and self.ext_keys[at] == ext else None

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
        if len(self._context) > CONTEXT_CACHE:  # a cache, not a table: memory bounded, the answers the same
            self._context.clear()
        todo = []  # the chain up to the first operator already known, then each one from its parent's, outwards in
        j = i
        while j >= 0 and j not in self._context:
            todo.append(j)
            j = self.parent[j]
        for j in reversed(todo):
            up = self._context.get(self.parent[j])
            op = self.op(j)
            c = rules.op_class(op.name)
            if up is None:
                klass, backward, optimizer, matmul, comm, outer = c, False, False, None, None, j
            else:
                klass, backward, optimizer, matmul, comm, outer = up
                if klass is None:
                    klass, outer = c, j
            if c == rules.GEMM and op.dims:
                matmul = j
            if op.comm is not None or (c == rules.COMM and op.dims and (comm is None or self.op(comm).comm is None)):
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
        blank.key = _comm_key(name, ops.op(comm) if comm is not None else None)
        return blank, None, backward, None
    if optimizer and klass not in (rules.MEMCPY,):
        blank.key = Key(rules.OPTIMIZER, name)
        return blank, None, backward, None
    if klass == rules.GEMM:
        mm = ops.op(matmul) if matmul is not None else None
        shape = rules.gemm_shape(mm.name, mm.dims) if mm is not None else None
        if shape is None or mm is None:
            blank.key = Key(rules.GEMM, name, "bwd" if backward else "fwd")
            return blank, None, backward, None
        dtype = rules.dtype_name(mm.types[0]) if isinstance(mm.types, list) and mm.types else ""
        m, n, k, groups = shape
        blank.key = Key(rules.GEMM, name, "bwd" if backward else "fwd", m, n, k, groups, dtype)
        return blank, (m, n, k), backward, _transposed(mm.strides)
    if klass == rules.ATTENTION:
        where = name if index is None else f"{name} {ops.name(index)}"
        kind = f"{rules.attention_backend(where)} {'bwd' if backward or rules.direction(where) == 'bwd' else 'fwd'}"
        blank.key = Key(rules.ATTENTION, name, kind)
    return blank, None, backward, None


Item = tuple[Interval, tuple[int, int, int] | None, bool, bool | None]  # interval, (m, n, k), backward, A transposed


def _with_passes(items: list[Item], forward: set[tuple[int, int, int]], canon: dict[Key, Key]) -> list[Interval]:
    """Name each backward GEMM's pass from the forward shapes of the same trace: forward (T, N, K) makes dgrad
    (T, K, N) and wgrad (N, K, T) (docs/conventions.md, "GEMM shapes of a training step"); where both fit (square
    shapes), wgrad's first operand is dYᵀ, a transposed view (its ``Input Strides`` say so), dgrad's is dY."""
    out = []
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


class Attribution:
    """One trace's kernels (a GPU trace) or operators (a CPU trace), to be made intervals one step at a time: memory is
    the trace's columns, a few arrays of 4 to 8 bytes per kernel, and one step's intervals, not an object per kernel of
    the whole trace (docs/step.md, "Reading large traces")."""

    def __init__(self, trace: Trace, forward: set[tuple[int, int, int]] | None = None):
        self.trace = trace
        self.ops = _Ops(trace)
        self.canon: dict[Key, Key] = {}  # one Key object per distinct row, not one per kernel
        if trace.on_gpu:
            starts, durs = _np(trace.gpu_ts, np.float64), _np(trace.gpu_dur, np.float64)
            src = np.arange(len(starts), dtype=np.int64)  # the trace's GPU events
        else:  # the operators in nesting order, less zero_grad and friends (their operators are classed on their own)
            names = self.ops.trace.names
            skip = np.array([nm.startswith("Optimizer.") and not nm.startswith("Optimizer.step#") for nm in names],
                            dtype=bool)  # fmt: skip
            order = _np(self.ops.order, np.int64)
            src = np.nonzero(~skip[_np(trace.cpu_name, np.int32)[order]])[0] if len(order) else order
            starts = _np(trace.cpu_ts, np.float64)[order][src]
            durs = _np(trace.cpu_dur, np.float64)[order][src]
        ends = starts + durs
        by_start = np.argsort(starts, kind="stable")
        self.src = to_column("q", src[by_start])  # sorted by start, ties in source order
        self.starts = to_column("d", starts[by_start])
        self.ends = to_column("d", ends[by_start])
        self.longest = float((ends - starts).max()) if len(starts) else 0.0
        self.span = (float(starts.min()), float(ends.max())) if len(starts) else None
        self.forward = self._forward() if forward is None else forward  # given: the whole trace's, read by step

    def _forward(self) -> set[tuple[int, int, int]]:
        """The forward GEMM shapes of the whole trace, which name the backward GEMMs' passes (``_with_passes``): a
        first pass over the kernels a GEMM can be (a GEMM's name, or a name of no class that its operator classes)."""
        trace, todo = self.trace, iter(self.src)
        if trace.on_gpu:
            gemm = [rules.kernel_class(nm) in (rules.GEMM, rules.OTHER) for nm in trace.names]
            kernel = GPU_CAT_NAMES.index("kernel")
            todo = (s for s in self.src if trace.gpu_cat[s] == kernel and gemm[trace.gpu_name[s]])
        forward: set[tuple[int, int, int]] = set()
        for s in todo:
            _, mnk, backward, _ = self._item(s)
            if mnk and not backward:
                forward.add(mnk)
        return forward

    def _item(self, s: int) -> Item:
        """Kernel ``s`` of the trace (a GPU trace) or operator ``s`` in nesting order (a CPU trace), classified."""
        if self.trace.on_gpu:
            return _gpu_item(self.trace.gpu_event(s), self.trace, self.ops)
        ops = self.ops
        op = ops.op(s)
        klass, *_, outer = ops.context(s)
        item = _key(ops, ops.name(outer), klass or rules.OTHER, s)
        iv = item[0]
        iv.start, iv.end, iv.lane, iv.depth = op.ts, op.ts + op.dur, (-1, op.tid), ops.depth[s]
        iv.counted = outer == s
        return item

    def all(self) -> list[Interval]:
        """Every interval of the trace, in the trace's order (GPU events) or nesting order (operators)."""
        return _with_passes([self._item(s) for s in sorted(self.src)], self.forward, self.canon)

    def inside(self, ts: float, dur: float) -> list[Interval]:
        """The intervals that overlap [ts, ts + dur), by start."""
        lo = bisect.bisect_left(self.starts, ts - self.longest)
        hi = bisect.bisect_right(self.starts, ts + dur)
        items = []
        for at in range(lo, hi):  # a long kernel reaches back: most before the step end before it, and are not made
            if self.ends[at] > ts and self.starts[at] < ts + dur:
                items.append(self._item(self.src[at]))
        return _with_passes(items, self.forward, self.canon)

    def spans(self) -> list[tuple[str, float, float]]:
        """Each ProfilerStep#N (on the GPU timeline where the trace has it); none: the whole trace as one step."""
        spans = [step_span(self.trace, *s) for s in sorted(self.trace.steps, key=lambda s: s[1])]
        if not spans and self.span is not None:
            lo, hi = self.span
            spans = [("trace", lo, hi - lo)]
        return spans

    def steps(self) -> list[StepResult]:
        """Each step attributed, one at a time: only its intervals are held."""
        return [self.step(*span) for span in self.spans()]

    def step(self, name: str, ts: float, dur: float) -> StepResult:
        """The step of this span (``spans``), attributed."""
        return _step(self.inside(ts, dur), name, ts, dur)


def step_span(trace: Trace, name: str, ts: float, dur: float) -> tuple[str, float, float]:
    """A step's span from its CPU marker: on the GPU timeline where a GPU trace has it (its ``gpu_user_annotation``),
    else the CPU one."""
    return (name, *trace.gpu_steps.get(name, (ts, dur))) if trace.on_gpu else (name, ts, dur)


CONTEXT_CACHE = 1 << 16  # operators whose context is remembered (``_Ops.context``)


def _np(col: Any, dtype: Any) -> Any:
    """A typed column as a numpy array without a copy (an empty one too)."""
    return np.frombuffer(col, dtype=dtype) if len(col) else np.zeros(0, dtype=dtype)


def intervals(trace: Trace) -> list[Interval]:
    """Every kernel (a GPU trace) or operator (a CPU trace) as a classified interval: the whole trace at once, for
    small traces and tests (``Attribution`` makes them one step at a time)."""
    return Attribution(trace).all()


def _gpu_item(ev: GpuEvent, trace: Trace, ops: _Ops) -> Item:
    lane = (ev.device, ev.stream)
    if ev.cat != "kernel":
        return Interval(ev.ts, ev.ts + ev.dur, lane, 0, Key(rules.MEMCPY, ev.name)), None, False, None
    ext = trace.launch(ev.corr)
    ext = ev.ext if ext is None else ext
    index = ops.by_ext(ext) if ext is not None else None
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
    """Each ProfilerStep#N of the trace, attributed; a trace without step markers is one step, named "trace". Without
    ``items``, one step's intervals at a time (``Attribution``)."""
    if items is None:
        return Attribution(trace).steps()
    spans = [step_span(trace, *s) for s in sorted(trace.steps, key=lambda s: s[1])]
    if not spans:
        if not items:
            return []
        lo, hi = min(iv.start for iv in items), max(iv.end for iv in items)
        spans = [("trace", lo, hi - lo)]
    ordered = sorted(items, key=lambda iv: iv.start)
    starts = [iv.start for iv in ordered]
    longest = max((iv.end - iv.start for iv in ordered), default=0.0)
    out = []
    for name, ts, dur in spans:
        lo = bisect.bisect_left(starts, ts - longest)
        hi = bisect.bisect_right(starts, ts + dur)
        inside = [iv for iv in ordered[lo:hi] if iv.end > ts and iv.start < ts + dur]
        out.append(_step(inside, name, ts, dur))
    return out


def _step(inside: list[Interval], name: str, ts: float, dur: float) -> StepResult:
    """One step from the intervals that overlap it, by start."""
    result = StepResult(name, ts, dur)
    partition(inside, ts, ts + dur, result)
    for iv in inside:
        s, e = max(iv.start, ts), min(iv.end, ts + dur)
        result.busy[iv.key.klass] = result.busy.get(iv.key.klass, 0.0) + (e - s)
        row = result.kernels.setdefault(iv.key, [0.0, 0.0])
        row[0] += iv.counted
    return result


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
