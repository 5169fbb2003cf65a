"""Which sizes the collective benchmark runs, and over which rank groups — pure functions, no torch.

A ``CommCase`` is one collective at one nccl-tests size (``-b`` value: total buffer bytes per rank, docs/conventions.md, "Collectives: sizes, counts and bus bandwidth")
on groups of ``group_size`` ranks. Sizes come from an nccl-tests style sweep, an explicit list, a model's
parallel layout (TP/SP activations, EP routed tokens, PP activations) or an NCCL debug log; ``source`` says
which, so a row in the CSV can always be traced back to where its size came from.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opbench.core.collectives import COLLECTIVES, alltoallv_size_elements
from opbench.core.dtypes import BY_ENUM, element_size
from opbench.core.errors import UsageError
from opbench.core.units import one_line

from .splits import DIRECTIONS, SplitSpec

if TYPE_CHECKING:
    from opbench.models import ModelConfig
    from opbench.moe.routing import Routing
    from opbench.trace.analyze import TraceSize  # the log's record: collective, count, dtype_enum, nranks, …

# The collectives this benchmark runs (core.collectives also knows `reduce`, which the torchrun driver does not time).
RUNNABLE = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v", "send_recv", "broadcast")


@dataclass(frozen=True)
class CommCase:
    """One collective at one size. ``group_size`` None = the whole world; ``group_stride`` spaces a group's
    ranks (1 = neighbours, as Megatron's TP groups; world/pp = one rank per pipeline stage)."""

    collective: str
    size_bytes: int  # requested nccl-tests -b value
    dtype: str  # opbench dtype name (fp32, bf16, …)
    source: str
    group_size: int | None = None
    group_stride: int = 1
    redop: str = "sum"
    splits: SplitSpec | None = None  # all_to_all_v: the traffic pattern (comm/splits.py)


def count_for(case: CommCase, nranks: int) -> int:
    """Per-rank NCCL count for the case's size on ``nranks`` ranks (nccl-tests rounds down); all_to_all_v: the mean
    per-peer count of its matrix, nccl-tests' ``paramcount``."""
    if case.splits is not None:
        return sum(map(sum, case.splits.matrix(nranks))) // (nranks * nranks)
    return COLLECTIVES[case.collective].count_for_size(case.size_bytes, nranks, element_size(case.dtype))


def actual_size(case: CommCase, nranks: int) -> int:
    """The size nccl-tests prints for this case: max(send, recv) bytes after rounding the count down; all_to_all_v:
    the busiest rank's (core.collectives.alltoallv_size_elements)."""
    if case.splits is not None:
        return alltoallv_size_elements(case.splits.matrix(nranks)) * element_size(case.dtype)
    return COLLECTIVES[case.collective].size_bytes(count_for(case, nranks), nranks, element_size(case.dtype))


def sweep_bytes(minbytes: int, maxbytes: int, stepbytes: int, stepfactor: int) -> list[int]:
    """nccl-tests' size loop: from -b to -e, multiplying by -f when it is > 1, else adding -i."""
    if minbytes < 1:
        raise UsageError(f"must be at least 1 byte, got {minbytes}", field="--minbytes")
    if maxbytes < minbytes:
        raise UsageError(f"maxbytes {maxbytes} is smaller than minbytes {minbytes}", field="--maxbytes")
    if stepfactor < 1:
        raise UsageError(f"must be at least 1, got {stepfactor}", field="--stepfactor")
    if stepfactor == 1 and stepbytes < 1:
        raise UsageError(f"must be at least 1 when --stepfactor is 1, got {stepbytes}", field="--stepbytes")
    if stepfactor == 1 and (maxbytes - minbytes) // stepbytes + 1 > MAX_SWEEP_SIZES:
        raise UsageError(
            f"-b {minbytes} to -e {maxbytes} in steps of {stepbytes} B is {(maxbytes - minbytes) // stepbytes + 1:,} "
            f"sizes, more than {MAX_SWEEP_SIZES:,}; use a larger -i or -f 2",
            field="--stepbytes",
        )
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        size = size * stepfactor if stepfactor > 1 else size + stepbytes
    return sizes


MAX_SWEEP_SIZES = 10_000  # nccl-tests' own sweeps have tens of sizes; millions would take days and plan for minutes


def cases_for_sizes(
    collectives: Sequence[str],
    sizes: Iterable[int],
    dtype: str,
    source: str,
    redop: str = "sum",
    patterns: Sequence[SplitSpec] = (),
) -> list[CommCase]:
    """Every collective at every size, collective-major (one CSV per collective fills in order). all_to_all_v runs
    each of ``patterns`` at each size: a size is what each rank dispatches, ``tokens·top_k·hidden·elt``, so the
    pattern's tokens per rank are ``size // (top_k·hidden·elt)`` (0: the row says less than one token)."""
    sizes = list(sizes)
    out = []
    for c in collectives:
        if c != "all_to_all_v":
            out += [CommCase(c, s, dtype, source, redop=redop) for s in sizes]
            continue
        for p in patterns:
            for s in sizes:
                per_token = p.top_k * p.hidden * element_size(dtype)
                split = SplitSpec(p.routing, s // per_token, p.top_k, p.hidden, p.experts, p.direction)
                out.append(CommCase(c, s, dtype, f"{source} {split.label}", splits=split))
    return out


# -- groups ---------------------------------------------------------------------------------------------
def group_layout(world_size: int, size: int, stride: int = 1) -> list[list[int]]:
    """Disjoint rank groups of ``size`` ranks spaced ``stride`` apart, covering the world.

    rank = a + stride·(j + size·b) with a < stride, j < size: fixing (a, b) and varying j gives one group.
    stride 1 gives neighbours [0..size), [size..2·size), …; stride world/size gives one rank per block.
    """
    if size < 1 or stride < 1 or world_size % (size * stride):
        raise UsageError(
            f"groups of {size} ranks {stride} apart do not tile a world of {world_size} ranks", field="group"
        )
    blocks = world_size // (size * stride)
    return [[a + stride * (j + size * b) for j in range(size)] for b in range(blocks) for a in range(stride)]


def _check_divides(value: int, world_size: int, flag: str) -> None:
    if value < 1:
        raise UsageError(f"must be positive, got {value}", field=flag)
    if world_size % value:
        raise UsageError(f"{value} does not divide the world size {world_size}", field=flag)


# -- model-derived sizes ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CommGroups:
    """Sizes of the TP, EP and PP groups a model's traffic runs over; each defaults to the whole world."""

    tp: int
    ep: int
    pp: int

    @classmethod
    def resolve(cls, world_size: int, tp: int | None, ep: int | None, pp: int | None) -> CommGroups:
        p = cls(tp or world_size, ep or world_size, pp or world_size)
        for value, flag in ((p.tp, "--tp"), (p.ep, "--ep"), (p.pp, "--pp")):
            _check_divides(value, world_size, flag)
        return p

    def ep_stride(self, world_size: int) -> int:
        """Megatron orders ranks tp-cp-ep-dp-pp, so an EP group's ranks are tp apart when TP×EP fits."""
        return self.tp if world_size % (self.tp * self.ep) == 0 else 1


def model_cases(
    model: ModelConfig,
    collectives: Sequence[str],
    world_size: int,
    par: CommGroups,
    mbs: int,
    seqlen: int | None,
    dtype: str,
    routings: Sequence[Routing] = (),
) -> list[CommCase]:
    """The activation-sized collectives of one training step of ``model`` (docs/conventions.md, "GEMM shapes of a training step" tokens T = mbs·seq).

    TP all-reduce of the layer output (T·hidden, over tp ranks); SP all-gather / reduce-scatter of the same
    activations (size = the gathered T·hidden, count = T·hidden/tp per rank); EP all-to-all of a rank's routed
    tokens (T/tp·top_k·hidden, MoE models only) and, as all_to_all_v, the token dispatch and the combine of each
    of ``routings`` (default balanced) over the model's experts (comm/splits.py); PP send/recv of activations
    (T·hidden between stages). A dimension of size 1 has no traffic and yields no case.
    """
    seq = seqlen or model.seqlen
    if not seq:
        raise UsageError(f"model {one_line(model.name)} has no seqlen; pass --seqlen", field="--seqlen")
    if mbs < 1:
        raise UsageError(f"must be positive, got {mbs}", field="--mbs")
    tokens, hidden = mbs * seq, model.hidden_size
    elt = element_size(dtype)
    act = f"mbs·seq·hidden={mbs}·{seq}·{hidden}"
    plan: dict[str, tuple[int, int, int, str]] = {}  # collective -> (elements, group, stride, label)
    extra: list[CommCase] = []  # all_to_all_v: one case per routing and direction
    if par.tp > 1:
        plan["all_reduce"] = (tokens * hidden, par.tp, 1, f"TP all-reduce {act} tp={par.tp}")
        plan["all_gather"] = (tokens * hidden, par.tp, 1, f"SP all-gather {act} tp={par.tp}")
        plan["reduce_scatter"] = (tokens * hidden, par.tp, 1, f"SP reduce-scatter {act} tp={par.tp}")
    if par.ep > 1 and model.is_moe:
        # MoE with tp > 1 runs with sequence parallelism, so a rank dispatches its own T/tp tokens, top_k
        # copies each (docs/conventions.md, "MoE under tensor parallelism"), as gemm's MoE rows assume.
        if tokens % par.tp and ("all_to_all" in collectives or "all_to_all_v" in collectives):
            raise UsageError(
                f"mbs·seqlen = {tokens} tokens do not split over tp={par.tp} (MoE under TP needs sequence parallelism)",
                field="--seqlen",
            )
        k = model.num_experts_per_tok
        local = (
            f"mbs·seq/tp·top_k·hidden={mbs}·{seq}/{par.tp}·{k}·{hidden}"
            if par.tp > 1
            else f"mbs·seq·top_k·hidden={mbs}·{seq}·{k}·{hidden}"
        )
        plan["all_to_all"] = (
            tokens // par.tp * k * hidden,
            par.ep,
            par.ep_stride(world_size),
            f"EP all-to-all {local} ep={par.ep}",
        )
        if "all_to_all_v" in collectives:
            extra = ep_v_cases(model, tokens // par.tp, par, world_size, dtype, routings, local)
    if par.pp > 1:
        plan["send_recv"] = (tokens * hidden, par.pp, world_size // par.pp, f"PP send/recv {act} pp={par.pp}")
    return [
        CommCase(c, plan[c][0] * elt, dtype, f"{model.name}: {plan[c][3]}", plan[c][1], plan[c][2])
        for c in collectives
        if c in plan
    ] + extra


def ep_v_cases(
    model: ModelConfig,
    tokens: int,
    par: CommGroups,
    world_size: int,
    dtype: str,
    routings: Sequence[Routing],
    what: str,
) -> list[CommCase]:
    """all_to_all_v of a MoE model: per routing, the dispatch of a rank's ``tokens`` (top_k copies each) to the EP
    ranks owning their experts, and the combine back (its transpose)."""
    from opbench.moe.routing import parse_routing

    if model.n_routed_experts % par.ep:
        raise UsageError(
            f"{model.name}'s {model.n_routed_experts} experts do not split over ep={par.ep} (placed contiguously)",
            field="--ep",
        )
    out = []
    for routing in routings or [parse_routing("balanced")]:
        for direction in DIRECTIONS:
            split = SplitSpec(
                routing, tokens, model.num_experts_per_tok, model.hidden_size, model.n_routed_experts, direction
            )
            split.matrix(par.ep)  # experts that do not split over ep, or a histogram of another length: refused here
            source = f"{model.name}: EP {direction} {what} {routing.label} ep={par.ep}"
            size = tokens * split.top_k * split.hidden * element_size(dtype)
            out.append(CommCase("all_to_all_v", size, dtype, source, par.ep, par.ep_stride(world_size), splits=split))
    return out


# -- sizes from an NCCL log ---------------------------------------------------------------------------------
def trace_cases(
    sizes: Iterable[TraceSize], collectives: Sequence[str], world_size: int, label: str
) -> tuple[list[CommCase], list[str]]:
    """Replay logged calls at their per-rank count and datatype. A call logged on n ranks runs on groups of
    n ranks when n divides the world, else on the whole world with the same per-rank count (the source says
    so). Returns (cases, notes about what was left out)."""
    cases, notes = [], []
    for t in sizes:
        if t.collective not in RUNNABLE:
            notes.append(f"{t.collective} count {t.count} ({t.calls} calls): not timed by this benchmark")
            continue
        if t.collective not in collectives:
            continue
        group = t.nranks if 0 < t.nranks <= world_size and world_size % t.nranks == 0 else world_size
        where = f"{label} nranks={t.nranks} calls={t.calls}" + ("" if group == t.nranks else f", run on {group}")
        redop = t.redop if t.redop in ("sum", "prod", "max", "min", "avg") else "sum"
        if t.redop and t.redop != redop:
            where += f", {t.redop} timed as sum"
        dtype = BY_ENUM[t.dtype_enum].name
        size = COLLECTIVES[t.collective].size_bytes(t.count, group, element_size(dtype))
        cases.append(CommCase(t.collective, size, dtype, where, group, 1, redop))
    cases.sort(key=lambda c: RUNNABLE.index(c.collective))  # stable: keeps the log's order within one
    return cases, notes
