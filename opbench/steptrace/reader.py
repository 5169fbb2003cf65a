"""Read a Kineto trace (``torch.profiler``'s ``export_chrome_trace`` / ``tensorboard_trace_handler`` JSON, plain or
gzipped) one event at a time, keeping only what attribution needs.

A trace of a real job is gigabytes, most of it Python stack frames and flow arrows; loading it whole (``json.load``,
what HolisticTraceAnalysis does through pandas) needs several times its size in memory. Here the file is read in
pieces and ``json.JSONDecoder.raw_decode`` (the standard library's C scanner) decodes the ``traceEvents`` array one
element at a time: memory is one piece of the file plus what is kept (CPU operators, kernels, launches, step
markers) in typed columns, ~40 bytes an event (``Trace``; docs/step.md, "Reading large traces"). Names of both
vendors' runtimes are recognised (HolisticTraceAnalysis issue #219: ROCm traces name their launches
``hipLaunchKernel`` / ``hipExtModuleLaunchKernel`` and put kernels on stream 0, which filters that assume CUDA's
launch names or a non-zero stream drop). Under a memory budget a trace is read by step instead, as many
consecutive steps per pass as fit (``step_windows`` finds the steps by a text search, ``read(keep=Window)`` keeps
their events; docs/step.md, "Under a memory budget: steps per pass"). No torch import.
"""

from __future__ import annotations

import bisect
import gzip
import io
import json
import math
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from opbench.core.errors import UsageError, describe_os_error

from .rules import COMM, GEMM, op_class

CHUNK_CHARS = 4 << 20  # characters read at a time: the reader's memory, besides the records it keeps
MAX_VALUE_CHARS = 256 << 20  # one JSON value longer than this is no trace event: the file is refused, not held

# Kineto categories (libkineto/src/output_json.cpp; ActivityType names); "cuda_runtime" holds the HIP runtime's
# launches on ROCm too, and "cuda_driver" the driver API's (cuLaunchKernel, hipModuleLaunchKernel)
CPU_CATS = frozenset({"cpu_op", "user_annotation"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "runtime"})
GPU_ANNOTATION = "gpu_user_annotation"
STEP_PREFIX = "ProfilerStep#"


@dataclass(slots=True)
class CpuOp:
    """A CPU operator or annotation span (µs). ``dims``/``types``: its ``Input Dims`` / ``Input type`` (with
    ``record_shapes=True``); ``comm``: the record_param_comms arguments of a collective."""

    name: str
    tid: int
    ts: float
    dur: float
    ext: int | None
    dims: list[Any] | None = None
    types: list[Any] | None = None
    strides: list[Any] | None = None  # a matmul's ``Input Strides``: which operand is transposed tells dgrad from wgrad
    comm: dict[str, Any] | None = None


@dataclass(slots=True)
class GpuEvent:
    """A kernel, copy or memset on a GPU stream (µs)."""

    name: str
    cat: str
    device: int
    stream: int
    ts: float
    dur: float
    corr: int | None
    ext: int | None


NONE = -(1 << 63)  # an absent id in an integer column (an id outside int64 is taken as absent too)
GPU_CAT_NAMES = ("kernel", "gpu_memcpy", "gpu_memset")  # a GPU event's ``cat``, by its code in ``Trace.gpu_cat``


def _id(value: int | None) -> int:
    return value if value is not None and NONE < value < (1 << 63) else NONE


def _opt(value: int) -> int | None:
    return None if value == NONE else value


def to_column(code: str, values: Any) -> array[Any]:
    """A numpy array as a typed column, copied once (``array(code, values.tobytes())`` copies twice: the peak of a
    large trace)."""
    out: array[Any] = array(code)
    out.frombytes(np.ascontiguousarray(values, dtype=out.typecode).data.cast("B"))
    return out


@dataclass
class Trace:
    """What one rank's trace holds that attribution uses, in typed columns (the stdlib ``array``): a kept event costs
    its columns' bytes (about 40 to 60), not a Python object of each field (about 400 bytes, docs/step.md "Reading
    large traces"). Names are held once each in ``names`` and referred to by position; ``cpu_op(i)`` /
    ``gpu_event(i)`` give one event as an object when it is needed."""

    path: str
    rank: int | None = None
    names: list[str] = field(default_factory=list)
    name_ids: dict[str, int] = field(default_factory=dict)
    cpu_name: array[int] = field(default_factory=lambda: array("i"))
    cpu_tid: array[int] = field(default_factory=lambda: array("q"))
    cpu_ts: array[float] = field(default_factory=lambda: array("d"))
    cpu_dur: array[float] = field(default_factory=lambda: array("d"))
    cpu_ext: array[int] = field(default_factory=lambda: array("q"))  # NONE where absent
    cpu_args: array[int] = field(default_factory=lambda: array("i"))  # index into ``args``, -1 for none
    args: list[tuple[Any, Any, Any, Any]] = field(default_factory=list)  # distinct (dims, types, strides, comm)
    args_ids: dict[str, int] = field(default_factory=dict)
    gpu_name: array[int] = field(default_factory=lambda: array("i"))
    gpu_cat: array[int] = field(default_factory=lambda: array("b"))  # index into GPU_CAT_NAMES
    gpu_device: array[int] = field(default_factory=lambda: array("q"))
    gpu_stream: array[int] = field(default_factory=lambda: array("q"))
    gpu_ts: array[float] = field(default_factory=lambda: array("d"))
    gpu_dur: array[float] = field(default_factory=lambda: array("d"))
    gpu_corr: array[int] = field(default_factory=lambda: array("q"))
    gpu_ext: array[int] = field(default_factory=lambda: array("q"))
    launch_corr: array[int] = field(default_factory=lambda: array("q"))  # sorted once read (``_index_launches``)
    launch_ext: array[int] = field(default_factory=lambda: array("q"))
    steps: list[tuple[str, float, float]] = field(default_factory=list)  # (ProfilerStep#N, ts, dur), CPU side
    gpu_steps: dict[str, tuple[float, float]] = field(default_factory=dict)  # the same on the GPU timeline
    events: int = 0  # traceEvents read
    kept: int = 0
    device_names: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    on_gpu: bool = False  # a kernel was read
    markers_seen: int = 0  # CPU step markers in the whole file, kept or not (a windowed read's check of the search)
    args_bytes: int = 0  # an estimate of the distinct arguments' bytes (their tuples, lists and repr keys)

    def nbytes(self) -> int:
        """The kept events' bytes: the typed columns, ~200 bytes per distinct name (the string and its table
        entries) and the distinct arguments' estimate (``args_bytes``: 2.5 bytes per character of their repr
        plus 200: a matmul's tuple of lists and its repr key measure ~1,200 bytes under tracemalloc)."""
        cols = sum(len(v) * v.itemsize for v in vars(self).values() if isinstance(v, array))
        return cols + 200 * len(self.names) + sum(map(len, self.names)) + self.args_bytes

    def name_id(self, name: str) -> int:
        got = self.name_ids.get(name)
        if got is None:
            got = self.name_ids[name] = len(self.names)
            self.names.append(name)
        return got

    def cpu_op(self, i: int) -> CpuOp:
        at = self.cpu_args[i]
        dims, types, strides, comm = self.args[at] if at >= 0 else (None, None, None, None)
        return CpuOp(self.names[self.cpu_name[i]], self.cpu_tid[i], self.cpu_ts[i], self.cpu_dur[i],
                     _opt(self.cpu_ext[i]), dims, types, strides, comm)  # fmt: skip

    def gpu_event(self, i: int) -> GpuEvent:
        return GpuEvent(self.names[self.gpu_name[i]], GPU_CAT_NAMES[self.gpu_cat[i]], self.gpu_device[i],
                        self.gpu_stream[i], self.gpu_ts[i], self.gpu_dur[i], _opt(self.gpu_corr[i]),
                        _opt(self.gpu_ext[i]))  # fmt: skip

    @property
    def cpu_ops(self) -> list[CpuOp]:
        """Every CPU operator as an object: a whole-trace list, for small traces and tests."""
        return [self.cpu_op(i) for i in range(len(self.cpu_name))]

    @property
    def gpu(self) -> list[GpuEvent]:
        """Every GPU event as an object: a whole-trace list, for small traces and tests."""
        return [self.gpu_event(i) for i in range(len(self.gpu_name))]

    def launch(self, corr: int | None) -> int | None:
        """The ``External id`` of the runtime launch with correlation ``corr`` (the last one read, as a mapping
        would keep), None if there is none or it has none."""
        if corr is None:
            return None
        at = bisect.bisect_right(self.launch_corr, corr) - 1
        return _opt(self.launch_ext[at]) if at >= 0 and self.launch_corr[at] == corr else None

    def _index_launches(self) -> None:
        """Sort the launches by correlation (a stable sort: of equal ones the last read stays last), for
        ``launch``'s binary search; Kineto writes them in order, so this is mostly a check."""
        corr = self.launch_corr
        keys = np.frombuffer(corr, dtype=np.int64)
        if len(keys) < 2 or bool(np.all(keys[1:] >= keys[:-1])):
            return
        order = np.argsort(keys, kind="stable")
        for name in ("launch_corr", "launch_ext"):
            col = np.frombuffer(getattr(self, name), dtype=np.int64)[order]
            setattr(self, name, to_column("q", col))


def _open_text(path: str) -> TextIO:
    try:
        raw = open(path, "rb")
    except OSError as exc:
        raise UsageError(f"cannot read trace: {describe_os_error(exc)}", source=path) from None
    buffered = io.BufferedReader(raw)
    stream: Any = gzip.GzipFile(fileobj=buffered, mode="rb") if buffered.peek(2)[:2] == b"\x1f\x8b" else buffered
    return io.TextIOWrapper(stream, encoding="utf-8", errors="replace")


class _Scanner:
    """JSON values decoded one at a time from a file read in pieces."""

    def __init__(self, fh: TextIO, path: str):
        self.fh, self.path = fh, path
        self.buf, self.pos, self.eof = "", 0, False
        self.decoder = json.JSONDecoder()
        self.read_chars = 0

    def _more(self) -> bool:
        if self.eof:
            return False
        try:
            piece = self.fh.read(CHUNK_CHARS)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise UsageError(f"cannot read trace: {describe_os_error(exc)}", source=self.path) from None
        if not piece:
            self.eof = True
            return False
        self.read_chars += len(piece)
        self.buf = self.buf[self.pos :] + piece
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next non-blank character ('' at the end of the file)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._more():
                return ""

    def take(self, char: str) -> None:
        got = self.peek()
        if got != char:
            raise UsageError(
                f"not a Kineto trace: expected '{char}' at character {self.read_chars - len(self.buf) + self.pos}, "
                f"found {got!r}"
                if got
                else "not a Kineto trace: the file ends early",
                source=self.path,
            )
        self.pos += 1

    def value(self) -> Any:
        """The next JSON value; more of the file is read until it is whole."""
        self.peek()
        while True:
            try:
                obj, end = self.decoder.raw_decode(self.buf, self.pos)
                if end < len(self.buf) or self.eof:  # a number at the piece's end may go on in the next one
                    self.pos = end
                    return obj
            except json.JSONDecodeError as exc:
                if self.eof:
                    raise UsageError(
                        f"not valid JSON: {exc.msg} (the trace may be cut short)", source=self.path
                    ) from None
            if len(self.buf) - self.pos > MAX_VALUE_CHARS:
                raise UsageError(
                    f"one JSON value is longer than {MAX_VALUE_CHARS >> 20} MiB: not a Kineto trace", source=self.path
                )
            self._more()


def events(path: str, meta: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Each element of the top-level ``traceEvents`` array, in file order; the other top-level keys go into ``meta``
    (small: device properties, distributed info). Memory stays one piece of the file."""
    with _open_text(path) as fh:
        scan = _Scanner(fh, path)
        scan.take("{")
        if scan.peek() == "}":
            return
        while True:
            key = scan.value()
            scan.take(":")
            if key == "traceEvents":
                scan.take("[")
                if scan.peek() == "]":
                    scan.pos += 1
                else:
                    while True:
                        item = scan.value()
                        if isinstance(item, dict):
                            yield item
                        sep = scan.peek()
                        if sep == "]":
                            scan.pos += 1
                            break
                        scan.take(",")
            else:
                value = scan.value()
                if meta is not None:
                    meta[str(key)] = value
            sep = scan.peek()
            if sep == "}":
                return
            scan.take(",")


@dataclass
class StepMarkers:
    """The ``ProfilerStep#N`` markers of a trace as ``read`` records them (``Trace.steps``, ``Trace.gpu_steps``),
    found by ``step_windows`` without decoding the other events."""

    steps: list[tuple[str, float, float]] = field(default_factory=list)  # CPU side, in file order
    gpu_steps: dict[str, tuple[float, float]] = field(default_factory=dict)  # gpu_user_annotation, the last of a name
    chars: int = 0  # characters scanned


STEP_TAIL_CHARS = 1 << 16  # of a piece kept for the next: a marker's event begins within this before its name


def _marker(obj: Any) -> tuple[str, str, float, float] | None:
    """(cat, name, ts, dur) of a step marker event, by ``read``'s own tests; None for anything else."""
    if not isinstance(obj, dict) or obj.get("ph") != "X":
        return None
    name, cat = obj.get("name"), obj.get("cat")
    ts, dur = _num(obj.get("ts")), _num(obj.get("dur"))
    if not isinstance(name, str) or not name.startswith(STEP_PREFIX) or ts is None or dur is None or dur < 0:
        return None
    if cat in CPU_CATS or cat == GPU_ANNOTATION:
        return str(cat), name, ts, dur
    return None


def step_windows(path: str) -> StepMarkers:
    """The step markers of a trace by a text search, not a parse: each ``ProfilerStep#`` in the raw text (read in
    pieces of ``CHUNK_CHARS``, gz or plain) has its enclosing event decoded alone (the nearest ``{`` before it that
    decodes to an object spanning it) and kept if ``read`` would keep it (``_marker``). 29 to 45 times faster than
    ``read`` on the synthetic traces of docs/step.md ("Under a memory budget"); memory is a piece of the file. An event cut by a piece's end
    is decoded once the next piece is in: each occurrence is handled once, by its position in the file."""
    out = StepMarkers()
    decoder = json.JSONDecoder()
    buf, base, done = "", 0, 0  # the text in hand, its offset in the file, occurrences before ``done`` handled
    with _open_text(path) as fh:
        eof = False
        while not eof:
            try:
                piece = fh.read(CHUNK_CHARS)
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                raise UsageError(f"cannot read trace: {describe_os_error(exc)}", source=path) from None
            eof = not piece
            out.chars += len(piece)
            buf += piece
            keep_from = max(0, len(buf) - STEP_TAIL_CHARS)
            at = buf.find(STEP_PREFIX, max(0, done - base))
            while at >= 0:
                got, wait, past = _decode_marker(decoder, buf, at, eof)
                if wait >= 0:  # its event goes on in the next piece: keep it from its start
                    keep_from = min(keep_from, wait)
                    break
                done = base + past
                if got is not None:
                    cat, name, ts, dur = got
                    if cat == GPU_ANNOTATION:
                        out.gpu_steps[name] = (ts, dur)
                    else:
                        out.steps.append((name, ts, dur))
                at = buf.find(STEP_PREFIX, past)
            buf, base = buf[keep_from:], base + keep_from
    return out


@dataclass(frozen=True)
class Window:
    """What a windowed ``read`` keeps for one step (µs): its CPU marker; GPU events overlapping ``gpu`` (the step's
    GPU span, else its CPU one: as ``attribute.Attribution.spans`` takes it); CPU operators and launches overlapping
    ``cpu``, from the previous step's CPU start (a kernel of this step may have been launched during it) to the
    later of the step's CPU and GPU ends. Overlap is inclusive of the ends: an event kept needlessly changes
    nothing (it is in the whole trace too). A window of several consecutive steps (``group``) has the first's
    marker in ``name``, ``ts``, ``dur`` and the others' in ``more``."""

    name: str
    ts: float
    dur: float
    cpu: tuple[float, float]
    gpu: tuple[float, float]
    more: tuple[tuple[str, float, float], ...] = ()  # (name, ts, dur) of a group's other steps

    @property
    def markers(self) -> tuple[tuple[str, float, float], ...]:
        """The CPU markers of the window's steps, first to last."""
        return ((self.name, self.ts, self.dur), *self.more)


def windows(marks: StepMarkers) -> list[Window]:
    """One window per CPU step marker, in ``Attribution.spans``' order (by start, ties in file order)."""
    out: list[Window] = []
    prev = -math.inf  # the first step: from the trace's start
    for name, ts, dur in sorted(marks.steps, key=lambda s: s[1]):
        gts, gdur = marks.gpu_steps.get(name, (ts, dur))
        out.append(Window(name, ts, dur, (prev, max(ts + dur, gts + gdur)), (gts, gts + gdur)))
        prev = ts
    return out


def group(wins: list[Window]) -> Window:
    """One window keeping what each of ``wins`` (consecutive in ``windows``' order) keeps: its CPU range from the
    lowest lower bound (the first's: the step before it) to the highest upper end, its GPU range from the earliest
    GPU start to the latest GPU end, every step's marker. A pass over it attributes all of them (what lies between
    their ranges is kept needlessly: it changes nothing)."""
    first = wins[0]
    cpu = (min(w.cpu[0] for w in wins), max(w.cpu[1] for w in wins))
    gpu = (min(w.gpu[0] for w in wins), max(w.gpu[1] for w in wins))
    return Window(first.name, first.ts, first.dur, cpu, gpu, tuple(m for w in wins for m in w.markers)[1:])


def unlaunched(trace: Trace) -> int:
    """Kept kernels whose correlation id names no kept launch: a window that started too late for them (a GPU more
    than a step behind its CPU) reads its steps again from earlier (``summary``)."""
    if not len(trace.gpu_corr):
        return 0
    corr = np.frombuffer(trace.gpu_corr, dtype=np.int64)
    kernel = np.frombuffer(trace.gpu_cat, dtype=np.int8) == GPU_CAT_NAMES.index("kernel")
    want = corr[kernel & (corr != NONE)]
    have = np.frombuffer(trace.launch_corr, dtype=np.int64) if len(trace.launch_corr) else np.zeros(0, np.int64)
    if not len(have):
        return int(len(want))
    at = np.clip(np.searchsorted(have, want), 0, len(have) - 1)
    return int(np.count_nonzero(have[at] != want))


class OverBudget(Exception):
    """Raised by ``read`` when the kept events' estimated memory passes its budget: the caller reads by step."""

    def __init__(self, events: int, need: float):
        super().__init__(f"~{need / (1 << 20):.1f} MiB needed after {events:,} events")
        self.events, self.need = events, need


MARKER_TRIES = 256  # ``{`` tried back from a marker's name (nested arguments before it); a miss is caught by
# the windowed read's count of every marker (``Trace.markers_seen``), which falls back to the whole read
BUDGET_EVERY = 1 << 16  # events read between two looks at the kept columns' size
WORK_FACTOR = 2.5  # ``nbytes`` (~37 B a kept event) to what read and attribution take (~96 B measured, docs/step.md)


def _decode_marker(decoder: json.JSONDecoder, buf: str, at: int, eof: bool) -> tuple[Any, int, int]:
    """For the ``ProfilerStep#`` at ``at``: the marker (``_marker``) or None; -1, or where to resume once more text
    is in (an object that may be cut by the end of ``buf``); where to search on (past its event: a second
    occurrence in the same event is the same event)."""
    start = at
    for _ in range(MARKER_TRIES):  # the event's own ``{``, or nested objects' (``args`` before the name) first
        start = buf.rfind("{", max(0, at - STEP_TAIL_CHARS), start)
        if start < 0:
            break
        try:
            obj, end = decoder.raw_decode(buf, start)
        except json.JSONDecodeError:
            if not eof and len(buf) - start < STEP_TAIL_CHARS:
                return None, start, at
            continue  # a ``{`` inside a string: the event's own is further back
        if end > at:
            got = _marker(obj)
            if got is not None or not isinstance(obj, dict) or "ph" in obj:
                return got, -1, end
    return None, -1, at + 1


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _num(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


COMM_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size", "Process Group Name",
             "Process Group Description", "Process Group Ranks", "In split size", "Out split size")  # fmt: skip


def read(path: str, keep: Window | None = None, budget: int | None = None) -> Trace:
    """One rank's trace: the CPU operators, GPU events, launches and step spans; everything else is passed over.
    With ``keep``, only what its steps' attribution can use (``Window``); every event is still read (whether the
    trace has kernels, its warnings and counts are the whole file's). With ``budget`` (bytes), ``OverBudget`` once
    the kept events' estimated memory (``Trace.nbytes`` × ``WORK_FACTOR``) passes it, looked at every
    ``BUDGET_EVERY`` events."""
    meta: dict[str, Any] = {}
    trace = Trace(path)
    bad = 0
    shaped: dict[int, bool] = {}  # name -> whether its Input Dims are kept (a matmul's or a collective's)
    cpu_lo, cpu_hi = keep.cpu if keep is not None else (-math.inf, math.inf)
    gpu_lo, gpu_hi = keep.gpu if keep is not None else (-math.inf, math.inf)
    markers = set(keep.markers) if keep is not None else set()
    marker_names = {m[0] for m in markers}
    for ev in events(path, meta):
        trace.events += 1
        if budget is not None and not trace.events % BUDGET_EVERY and trace.nbytes() * WORK_FACTOR > budget:
            raise OverBudget(trace.events, trace.nbytes() * WORK_FACTOR)
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        ts, dur = _num(ev.get("ts")), _num(ev.get("dur"))
        name = ev.get("name")
        if ts is None or dur is None or dur < 0 or not isinstance(name, str):
            bad += 1
            continue
        if cat == "kernel":
            trace.on_gpu = True  # the whole file's answer, kept or not: it decides what a step is cut from
        elif cat in CPU_CATS and name.startswith(STEP_PREFIX):
            trace.markers_seen += 1
        if keep is not None:
            if cat in GPU_CATS:
                if ts > gpu_hi or ts + dur < gpu_lo:
                    continue
            elif cat == GPU_ANNOTATION:
                if name not in marker_names:
                    continue
            elif name.startswith(STEP_PREFIX) and cat in CPU_CATS:
                if (name, ts, dur) not in markers:
                    continue
            elif ts > cpu_hi or ts + dur < cpu_lo:
                continue
        args = ev.get("args")
        args = args if isinstance(args, dict) else {}
        if cat in CPU_CATS:
            if name.startswith(STEP_PREFIX):
                trace.steps.append((name, ts, dur))
                trace.kept += 1
                continue
            nid = trace.name_id(name)  # a name repeated thousands of times is held once
            trace.cpu_name.append(nid)
            trace.cpu_tid.append(_id(_int(ev.get("tid")) or 0))
            trace.cpu_ts.append(ts)
            trace.cpu_dur.append(dur)
            trace.cpu_ext.append(_id(_int(args.get("External id"))))
            dims = types = strides = comm = None
            if "Input Dims" in args and shaped.setdefault(nid, op_class(name) in (GEMM, COMM)):
                dims, types, strides = args.get("Input Dims"), args.get("Input type"), args.get("Input Strides")
            if name == "record_param_comms" or "Collective name" in args:
                comm = {k: args[k] for k in COMM_ARGS if k in args}
            at = -1
            if dims is not None or types is not None or strides is not None or comm is not None:
                got = (dims, types, strides, comm)  # matmuls' and collectives' only; a layer's shapes repeat: held once
                key = repr(got)
                at = trace.args_ids.setdefault(key, len(trace.args))
                if at == len(trace.args):
                    trace.args.append(got)
                    trace.args_bytes += 200 + 5 * len(key) // 2
            trace.cpu_args.append(at)
            trace.kept += 1
        elif cat in GPU_CATS:
            trace.gpu_name.append(trace.name_id(name))
            trace.gpu_cat.append(GPU_CAT_NAMES.index(cat))
            trace.gpu_device.append(_id(_int(args.get("device")) or 0))
            trace.gpu_stream.append(_id(_int(args.get("stream", ev.get("tid"))) or 0))
            trace.gpu_ts.append(ts)
            trace.gpu_dur.append(dur)
            trace.gpu_corr.append(_id(_int(args.get("correlation"))))
            trace.gpu_ext.append(_id(_int(args.get("External id"))))
            trace.kept += 1
        elif cat in RUNTIME_CATS:
            corr = _int(args.get("correlation"))
            if corr is not None and _id(corr) != NONE:
                trace.launch_corr.append(corr)
                trace.launch_ext.append(_id(_int(args.get("External id"))))
                trace.kept += 1
        elif cat == GPU_ANNOTATION and name.startswith(STEP_PREFIX):
            trace.gpu_steps[name] = (ts, dur)
    trace._index_launches()
    if bad:
        trace.warnings.append(f"{bad} complete event(s) without a name, a time or a duration skipped")
    trace.rank = (
        _int((meta.get("distributedInfo") or {}).get("rank")) if isinstance(meta.get("distributedInfo"), dict) else None
    )
    props = meta.get("deviceProperties")
    if isinstance(props, list):
        trace.device_names = [str(p.get("name")) for p in props if isinstance(p, dict) and p.get("name")]
    if trace.events == 0:
        raise UsageError("no traceEvents: not a Kineto trace (torch.profiler's export_chrome_trace)", source=path)
    return trace
