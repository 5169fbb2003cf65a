"""Pipeline schedules, simulated op by op: when each stage runs each micro-batch's forward and backward, and so how
long a step's pipeline takes, how much of it is bubble, and how many micro-batches' activations a stage holds at
once (docs/project.md, "Pipeline schedules").

Schedules follow Megatron-Core's ordering (``megatron/core/pipeline_parallel/schedules.py``): 1F1B runs
``p − s − 1`` warm-up forwards on stage ``s``, then alternates one forward and one backward, then drains the
backwards; the interleaved schedule gives every stage ``v`` model chunks and orders forwards chunk by chunk in groups
of ``p`` micro-batches. An op starts when its stage is free and its input has arrived (the previous stage's forward,
or the next stage's backward, plus the point-to-point send). Pure Python, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from opbench.core.errors import UsageError


@dataclass(frozen=True)
class StageTimes:
    """One stage's per-micro-batch times (seconds) for one model chunk: forward, backward (recompute included),
    and ``wgrad``, the share of ``bwd`` that is weight gradients (what a zero-bubble schedule defers)."""

    fwd: float
    bwd: float
    wgrad: float = 0.0


SCHEDULES = ("1f1b", "interleaved", "zero-bubble", "interleaved-zero-bubble", "zbv", "v-half", "v-min")
INTERLEAVED = ("interleaved", "interleaved-zero-bubble")  # model chunks (--vpp) as Megatron interleaves them
ZERO_BUBBLE = ("zero-bubble", "interleaved-zero-bubble")  # 1F1B's and the interleaved order, weight gradients deferred
V_SHAPED = ("zbv", "v-half", "v-min")  # two chunks per stage in a V: stage s holds pieces s and 2p − 1 − s
CONTROLLABLE = ("v-half", "v-min")  # the V of "Pipeline Parallelism with Controllable Memory": less memory, more bubble


def piece_of(chunk: int, stage: int, p: int, schedule: str = "1f1b") -> int:
    """The model piece that chunk ``chunk`` of stage ``stage`` runs: ``chunk·p + stage`` (1F1B, interleaved); in a
    V, chunk 0 of stage s is piece s and chunk 1 is piece 2p − 1 − s (the last stage runs the two middle pieces,
    the first stage the first and the last)."""
    if schedule in V_SHAPED:
        return stage if chunk == 0 else 2 * p - 1 - stage
    return chunk * p + stage


@dataclass(frozen=True)
class ScheduleResult:
    total_s: float  # first op's start to last op's end
    busy_s: tuple[float, ...]  # per stage: time spent computing
    bubble_s: float  # the slowest-busy stage's idle time inside the step (what the pipeline adds)
    in_flight: tuple[int, ...]  # per stage: the most micro-batch chunks whose activations it holds at once

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.total_s if self.total_s else 0.0


def _order_1f1b(stage: int, p: int, m: int) -> list[tuple[str, int, int]]:
    """(direction, micro-batch, chunk) in the order stage ``stage`` runs them."""
    warmup = min(p - stage - 1, m)
    ops = [("F", i, 0) for i in range(warmup)]
    f, b = warmup, 0
    while f < m:
        ops.append(("F", f, 0))
        f += 1
        ops.append(("B", b, 0))
        b += 1
    ops += [("B", i, 0) for i in range(b, m)]
    return ops


def _order_zbv(stage: int, p: int, m: int) -> list[tuple[str, int, int]]:
    """ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", section 6; the order torch's ScheduleZBVZeroBubble
    builds): ("F" forward, "B" input gradient, "W" weight gradient, micro-batch, chunk). Stage s runs 2(p − s) − 1
    forwards of chunk 0, then s pairs of chunk-1 and chunk-0 forwards, then p − s rounds of a chunk-1 forward,
    input and weight gradient; in the steady state a chunk-0 forward, its oldest B and W, then the same for chunk 1;
    then it drains. Built for at least 2p − 1 micro-batches and cut to ``m``."""
    n = max(2 * p - 1, m)
    ops: list[tuple[str, int, int]] = []
    count = {("F", 0): 0, ("F", 1): 0, ("B", 0): 0, ("B", 1): 0}

    def run(kind: str, chunk: int, with_w: bool = False) -> None:
        mb = count[(kind, chunk)]
        count[(kind, chunk)] += 1
        ops.append((kind, mb, chunk))
        if with_w:
            ops.append(("W", mb, chunk))

    for _ in range(2 * (p - stage) - 1):
        run("F", 0)
    for _ in range(stage):
        run("F", 1)
        run("F", 0)
    for _ in range(p - stage):
        run("F", 1)
        run("B", 1, with_w=True)
    while count[("F", 1)] < count[("F", 0)] or count[("F", 0)] < n:
        if count[("F", 0)] < n:
            run("F", 0)
        run("B", 0, with_w=True)
        run("F", 1)
        run("B", 1, with_w=True)
    w0, w1 = count[("B", 0)], count[("B", 1)]
    for _ in range(stage):
        run("B", 0)
        run("B", 1)
    for _ in range(p - stage):
        run("B", 0)
        ops.append(("W", w0, 0))
        w0 += 1
    ops += [("W", mb, 1) for mb in range(w1, count[("B", 1)])]
    ops += [("W", mb, 0) for mb in range(w0, count[("B", 0)])]
    return [op for op in ops if op[1] < m]


Op = tuple[str, int, int]  # (direction, micro-batch, chunk)


@lru_cache(maxsize=64)
def _orders_controllable(p: int, m: int, schedule: str) -> tuple[tuple[Op, ...], ...]:
    """V-Half and V-Min (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024, section 4), every stage's
    order as Primus-pipeline builds it (``primus/core/pipeline_parallel/scheduler/algorithms/zbv_greedy.py``, the
    schedules its pipeline blog measured). On a grid of unit time slots, every micro-batch repeats the paper's
    stable pattern 6 slots later: on stage s, V-Min puts chunk 0's forward at s, chunk 1's at 2p − s − 1, their
    input gradients at 2p + g + s (chunk 1) and 4p + g − s − 1 (chunk 0), g = 2 when 3 divides p, else 0; V-Half at
    2s, 3p − s − 2, 3p + g + 2s − 1 and 6p + g − s − 2, g = 3 for even p, else 0. Weight gradients go into the free
    slots, oldest first; then every op moves to the earliest free slot its inputs allow, a forward only where the
    stage stays within the pattern's peak in-flight count; then the cooldown (after the last chunk-1 forward) is
    squeezed again without that limit, its weight gradients placed last. Primus drops weight gradients that find
    no slot in the first placement's window; here they run after it (they must run for the step to be right).
    A stage's order is its ops by slot."""
    pattern = {
        "v-min": lambda s, g: ((("F", 0), s), (("F", 1), 2 * p - s - 1), (("B", 1), 2 * p + g + s),
                               (("B", 0), 4 * p + g - s - 1)),
        "v-half": lambda s, g: ((("F", 0), 2 * s), (("F", 1), 3 * p - s - 2), (("B", 1), 3 * p + g + 2 * s - 1),
                                (("B", 0), 6 * p + g - s - 2)),
    }[schedule]  # fmt: skip
    gap = (2 if p % 3 == 0 else 0) if schedule == "v-min" else (3 if p % 2 == 0 else 0)
    delta = {"F": 1, "B": 0, "W": -1}  # chunk activations held: kept at a forward, freed at its weight gradient
    slots: list[dict[int, tuple[str, int, int]]] = [{} for _ in range(p)]  # stage -> slot -> (kind, chunk, mb)
    when: list[dict[tuple[str, int, int], int]] = [{} for _ in range(p)]  # stage -> (kind, chunk, mb) -> slot
    phase: dict[tuple[int, str, int, int], str] = {}
    for s in range(p):
        for mb in range(m):
            for (kind, chunk), t in pattern(s, gap):
                slots[s][t + 6 * mb] = (kind, chunk, mb)
                when[s][(kind, chunk, mb)] = t + 6 * mb
    # weight gradients into the free slots, oldest first; the phase of every op (cooldown: after the last chunk-1 F)
    held: list[list[int]] = []
    for s in range(p):
        queue: list[tuple[str, int, int]] = []
        now, level, footprint = "warmup", 0, []
        end = max(slots[s]) + 2
        t = 0
        while t <= end or queue:
            if t in slots[s]:
                kind, chunk, mb = slots[s][t]
                phase[(s, kind, chunk, mb)] = now
                queue += [("W", chunk, mb)] if kind == "B" else []
                level += delta[kind]
                if kind == "B" and chunk == 0 and mb == 0:
                    now = "steady"
                elif kind == "F" and chunk == 1 and mb == m - 1:
                    now = "cooldown"
            elif queue:
                op = queue.pop(0)
                slots[s][t], when[s][op], phase[(s, *op)] = op, t, now
                level -= 1
            footprint.append(level)
            t += 1
        held.append(footprint)
    limit = max(max(f) for f in held)

    def earliest(s: int, kind: str, chunk: int, mb: int) -> int:
        t = when[s][(kind, chunk, mb - 1)] if mb > 0 else 0
        if kind == "W":  # after its own input gradient (its slot is taken, so the search starts past it)
            return max(t, when[s][("B", chunk, mb)])
        piece = piece_of(chunk, s, p, "zbv")
        src = piece - 1 if kind == "F" else piece + 1
        if 0 <= src < 2 * p:  # the op of the neighbouring piece that sends this one its input
            t = max(t, when[_v_stage(src, p)][(kind, _v_chunk(src, p), mb)])
        elif kind == "B":  # the last piece's input gradient waits for its own forward
            t = max(t, when[s][("F", chunk, mb)])
        return t + 1

    def move(s: int, t: int, to: int) -> None:
        op = slots[s].pop(t)
        slots[s][to], when[s][op] = op, to

    def squeeze(cooldown: bool) -> None:
        last = max(max(x) for x in slots)
        pending: list[list[tuple[str, int, int]]] = [[] for _ in range(p)]
        for t in range(last + 1):
            for s in range(p):
                if t not in slots[s]:
                    continue
                kind, chunk, mb = op = slots[s][t]
                if cooldown and phase[(s, *op)] != "cooldown":
                    continue  # the cooldown's pass leaves the earlier phases as they are
                if cooldown and kind == "W":
                    pending[s].append(op)
                    del slots[s][t]
                    continue
                start = earliest(s, kind, chunk, mb)
                for i in range(start, t):
                    if i in slots[s]:
                        continue
                    if not cooldown:  # within the peak: an op moved earlier holds (or frees) its chunk sooner
                        if any(held[s][j] + delta[kind] > limit for j in range(i, t)):
                            continue
                        for j in range(i, t):
                            held[s][j] += delta[kind]
                    move(s, t, i)
                    break
        for s in range(p):
            for op in pending[s]:
                i = earliest(s, *op)
                while i in slots[s]:
                    i += 1
                slots[s][i], when[s][op] = op, i

    squeeze(cooldown=False)
    squeeze(cooldown=True)
    return tuple(tuple((kind, mb, chunk) for _, (kind, chunk, mb) in sorted(slots[s].items())) for s in range(p))


def _v_stage(piece: int, p: int) -> int:
    return piece if piece < p else 2 * p - 1 - piece


def _v_chunk(piece: int, p: int) -> int:
    return 0 if piece < p else 1


def _order_interleaved(stage: int, p: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """Megatron's interleaved order: forward k runs chunk (k // p) % v of micro-batch (k // (p·v))·p + k % p;
    backwards run the chunks in reverse. Warm-up: (p − stage − 1)·2 + (v − 1)·p forwards (all of them when that
    exceeds the total)."""
    total = m * v

    def fwd(k: int) -> tuple[str, int, int]:
        return ("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def bwd(k: int) -> tuple[str, int, int]:
        return ("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)
    ops = [fwd(k) for k in range(warmup)]
    f, b = warmup, 0
    while f < total:
        ops.append(fwd(f))
        f += 1
        ops.append(bwd(b))
        b += 1
    ops += [bwd(k) for k in range(b, total)]
    return ops


def simulate(
    stages: list[list[StageTimes]],
    microbatches: int,
    p2p_s: float = 0.0,
    schedule: str = "1f1b",
) -> ScheduleResult:
    """Simulate one step. ``stages[s][c]`` are stage ``s``'s times for its model chunk ``c`` (one chunk for 1F1B,
    ``v`` for interleaved); ``p2p_s`` is the time to send an activation (or its gradient) to the next stage.

    Chunk ``c`` of stage ``s`` is model piece ``c·p + s``: a forward flows s → s+1 and from the last stage's chunk
    c to the first stage's chunk c+1; backwards the reverse.

    Zero-bubble schedules (``ZERO_BUBBLE``, after Qi et al., "Zero Bubble Pipeline Parallelism", 2023: ZB-H1, and
    torch's ScheduleInterleavedZeroBubble) run the same order, but a backward computes the input gradient only
    (``bwd − wgrad``) and leaves its weight gradient pending. A stage runs its oldest pending weight gradient
    where it fits in an idle gap before its next op, or first when the next forward would hold more micro-batches
    than the underlying schedule's first stage does (so the activations peak as that schedule's), and the rest at the
    end."""
    p, m = len(stages), microbatches
    v = len(stages[0])
    if any(len(s) != v for s in stages):
        raise ValueError("every stage needs the same number of model chunks")
    if schedule in INTERLEAVED and v > 1 and m % p:
        raise UsageError(
            f"the interleaved schedule needs micro-batches ({m}) to be a multiple of the pipeline size ({p})",
            field="--microbatches",
        )
    deferred, v_shaped = schedule in ZERO_BUBBLE, schedule in V_SHAPED
    if v_shaped and v != 2:
        raise ValueError("a V-shaped schedule runs two model chunks per stage")
    if schedule in CONTROLLABLE:
        orders = [list(o) for o in _orders_controllable(p, m, schedule)]
    elif v_shaped:
        orders = [_order_zbv(s, p, m) for s in range(p)]
    else:
        orders = [_order_interleaved(s, p, m, v) if v > 1 else _order_1f1b(s, p, m) for s in range(p)]
    stage_of = {piece_of(c, s, p, schedule): s for s in range(p) for c in range(v)}
    # a deferring stage may hold as many micro-batch chunks as the underlying schedule's first stage does (ZB-H1:
    # the same peak as 1F1B's, reached on every stage)
    limit = in_flight(p, m, v, schedule)
    last_piece = p * v - 1
    done: dict[tuple[str, int, int], float] = {}  # (direction, micro-batch, piece) -> end time
    free = [0.0] * p
    busy = [0.0] * p
    held, most = [0] * p, [0] * p
    pending: list[list[float]] = [[] for _ in range(p)]  # per stage: weight gradients not yet run, oldest first
    nxt = [0] * p
    remaining = sum(len(o) for o in orders)

    def run_pending(s: int) -> None:
        t = pending[s].pop(0)
        free[s] += t
        busy[s] += t
        held[s] -= 1

    while remaining:
        progressed = False
        for s in range(p):
            while nxt[s] < len(orders[s]):
                kind, mb, chunk = orders[s][nxt[s]]
                times = stages[s][chunk]
                if kind == "W":  # a V schedule's weight gradient: after its own input gradient, nothing waits on it
                    free[s] += times.wgrad
                    busy[s] += times.wgrad
                    held[s] -= 1
                    nxt[s] += 1
                    remaining -= 1
                    progressed = True
                    continue
                piece = piece_of(chunk, s, p, schedule)
                if kind == "F":
                    dep = ("F", mb, piece - 1) if piece > 0 else None
                else:
                    dep = ("B", mb, piece + 1) if piece < last_piece else ("F", mb, piece)
                if dep is not None and dep not in done:
                    break
                ready = done[dep] if dep is not None else 0.0
                if dep is not None and stage_of[dep[2]] != s:  # crossing to another stage costs a send
                    ready += p2p_s
                if kind == "B":
                    ready = max(ready, done[("F", mb, piece)])
                if kind == "F":
                    while pending[s] and held[s] >= limit[s]:  # keep the underlying schedule's activations
                        run_pending(s)
                while pending[s] and free[s] + pending[s][0] <= ready:  # fill the idle gap
                    run_pending(s)
                start = max(free[s], ready)
                t = times.fwd if kind == "F" else times.bwd - (times.wgrad if deferred or v_shaped else 0.0)
                free[s] = start + t
                busy[s] += t
                done[(kind, mb, piece)] = free[s]
                if kind == "F":
                    held[s] += 1
                elif deferred:
                    pending[s].append(times.wgrad)
                elif not v_shaped:  # (a V schedule frees the chunk at its W)
                    held[s] -= 1
                most[s] = max(most[s], held[s])
                nxt[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked")  # an ordering bug, never an input problem
    for s in range(p):
        while pending[s]:
            run_pending(s)
    total = max(free)
    return ScheduleResult(total, tuple(busy), total - max(busy), tuple(most))


def estimate(
    stages: list[list[StageTimes]], microbatches: int, p2p_s: float = 0.0, schedule: str = "1f1b"
) -> ScheduleResult:
    """A closed form of ``simulate`` for screening many layouts: the slowest stage's pace for all but one
    chunk round, plus one chunk round through every stage, plus the sends of filling and draining. Exact
    for equal stages and free sends ((m + p − 1)·(F + B) for 1F1B, (v·m + p − 1)·(F + B)/v interleaved; a
    zero-bubble schedule fills 2·(p − 1)·W/v of that bubble with deferred weight gradients W, as ZB-H1's
    (p − 1)·(F + B − W) bubble); in-flight counts are Megatron's (1F1B: p − s; interleaved: 2·(p − s − 1) +
    (v − 1)·p + 1; zero-bubble: stage 0's on every stage)."""
    if schedule in V_SHAPED:  # no closed form: simulated (the search tries it only when --schedule asks)
        return simulate(stages, microbatches, p2p_s, schedule)
    p, m, v = len(stages), microbatches, len(stages[0])
    per_stage = [sum(c.fwd + c.bwd for c in s) for s in stages]  # one micro-batch through all of a stage's chunks
    busy = tuple(m * t for t in per_stage)
    # the slowest stage sets the pace; filling and draining pass each stage's work once, a chunk (1/v) at a time
    bubble = (sum(per_stage) - max(per_stage)) / v
    if schedule in ZERO_BUBBLE:
        slowest = max(range(p), key=lambda s: per_stage[s])
        bubble = max(0.0, bubble - 2 * (p - 1) * sum(c.wgrad for c in stages[slowest]) / v)
    total = m * max(per_stage) + bubble + 2 * (p - 1) * p2p_s
    return ScheduleResult(total, busy, total - max(busy), in_flight(p, m, v, schedule))


def in_flight(p: int, m: int, v: int = 1, schedule: str = "1f1b") -> tuple[int, ...]:
    """Micro-batch chunks each stage holds activations for at its peak, by Megatron's warm-up counts (1F1B:
    p − s; interleaved: 2(p − s − 1) + (v − 1)p + 1); a zero-bubble schedule holds the first stage's count on every
    stage, ZB-V 2p chunks (p micro-batches' worth, as 1F1B's first stage); V-Half and V-Min as their orders hold
    them (a chunk from its forward to its weight gradient)."""
    if schedule in CONTROLLABLE:
        return tuple(_peak_held(order) for order in _orders_controllable(p, m, schedule))
    if schedule in V_SHAPED:
        return (min(2 * p, 2 * m),) * p
    if v == 1:
        counts = tuple(min(p - s, m) for s in range(p))
    else:
        counts = tuple(min(2 * (p - s - 1) + (v - 1) * p + 1, m * v) for s in range(p))
    return (max(counts),) * p if schedule in ZERO_BUBBLE else counts


def _peak_held(order: tuple[Op, ...]) -> int:
    """The most chunks an order holds activations for at once: one from its forward to its weight gradient."""
    level = most = 0
    for kind, _, _ in order:
        level += {"F": 1, "B": 0, "W": -1}[kind]
        most = max(most, level)
    return most
