"""Exact FSDP collective sizes of one training step (docs/conventions.md, "FSDP collective sizes"), without torch.

FSDP2 (``fully_shard``, torch ``_fsdp_param.py`` / ``_fsdp_collectives.py``): every parameter is chunked on dim 0
into ``shard`` pieces of ceil(d0 / shard) rows (``torch.chunk``), the 0th chunk size being the padded size every
rank holds. A unit's all-gather sends Σ padded shard numels per rank; its reduce-scatter receives the same count.
FSDP1 (``FlatParameter``, torch ``_flat_param.py``): a unit's parameters are flattened into one buffer; with
``use_orig_params=True`` each parameter starts on a 16-byte boundary (alignment padding in ``param_dtype``) and
the total is padded to a multiple of the shard size; with ``use_orig_params=False`` the flat buffer is chunked
(ceil) without alignment.

Wrapping: one unit per decoder layer and the root (embeddings, final norm, lm_head unless tied). Per step, with
``reshard_after_forward=True``, each layer all-gathers in forward and again in backward; the root is never
resharded after forward when its own ``reshard_after_forward`` is left unset (FSDP2 ``_fsdp_state.py`` and FSDP1
both skip it), so it all-gathers once. Each unit reduce-scatters once. HSDP (``replicate`` > 1) shards within
groups of world_size / replicate contiguous ranks and all-reduces each reduce-scatter output across replicas.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from math import ceil, prod
from typing import Any

from opbench.core.collectives import COLLECTIVES
from opbench.core.dtypes import FLOAT_DTYPES, element_size
from opbench.core.errors import UsageError
from opbench.models import ModelConfig
from opbench.models.params import ROOT, ParamSpec, parameter_shapes, units

ALIGNMENT_BYTES = 16  # FSDP1 _get_aligned_numel: "This alignment constraint comes from TorchInductor"


@dataclass(frozen=True)
class FsdpCollective:
    """One (unit, collective) of a training step.

    ``count`` is the per-rank count an NCCL_DEBUG line shows (AllGather sendcount, ReduceScatter recvcount,
    AllReduce count); ``nccl_tests_bytes`` the nccl-tests ``-b`` size for the same call (total gathered /
    scattered bytes, docs/conventions.md, "Collectives: sizes, counts and bus bandwidth"); ``nranks`` the communicator size.
    """

    unit: str
    collective: str  # opbench name: all_gather | reduce_scatter | all_reduce
    count: int
    dtype: str  # opbench dtype name (bf16, fp32, …)
    nranks: int
    calls_per_step: int
    unit_numel: int = 0  # unpadded parameter elements in the unit
    nnodes: int = 1  # nodes the communicator spans
    redop: str | None = None  # reduction op of ReduceScatter / AllReduce (nccl-tests -o)
    bytes_per_rank: int = field(init=False)
    nccl_tests_bytes: int = field(init=False)
    bytes_per_step: int = field(init=False)
    busbw_bytes_per_step: int = field(init=False)  # bytes_per_step × busbw factor, rounded

    def __post_init__(self) -> None:
        coll = COLLECTIVES[self.collective]
        elt = element_size(self.dtype)
        size = coll.size_bytes(self.count, self.nranks, elt)
        object.__setattr__(self, "bytes_per_rank", self.count * elt)
        object.__setattr__(self, "nccl_tests_bytes", size)
        object.__setattr__(self, "bytes_per_step", size * self.calls_per_step)
        object.__setattr__(
            self, "busbw_bytes_per_step", round(size * self.calls_per_step * coll.busbw_factor(self.nranks))
        )

    @property
    def nccl_op(self) -> str:
        """The op name NCCL logs for this collective (AllGather, …)."""
        return COLLECTIVES[self.collective].nccl_op

    def to_row(self) -> dict[str, Any]:
        return {**asdict(self), "nccl_op": self.nccl_op}


# ---- padding formulas (one function each) --------------------------------------------------------------------


def fsdp2_shard_numel(shape: Sequence[int], shard: int) -> int:
    """FSDP2 padded per-rank numel of one parameter: ceil(d0 / shard) rows × the other dims."""
    return ceil(shape[0] / shard) * prod(shape[1:])


def fsdp1_alignment_numel(param_dtype: str, use_orig_params: bool) -> int:
    """Elements per 16-byte boundary in the forward/backward dtype (0 = no alignment, use_orig_params=False)."""
    return ALIGNMENT_BYTES // element_size(param_dtype) if use_orig_params else 0


def fsdp1_shard_numel(numels: Iterable[int], shard: int, aligned_numel: int) -> int:
    """FSDP1 FlatParameter per-rank numel: aligned starts (if any), total padded to a multiple of ``shard``."""
    total = 0
    for n in numels:
        if aligned_numel and total % aligned_numel:
            total += aligned_numel - total % aligned_numel
        total += n
    return ceil(total / shard)


# ---- the model ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Process groups of (H)SDP: ``shard`` contiguous ranks per shard group, ``replicate`` groups."""

    world_size: int
    replicate: int = 1
    nnodes: int = 1

    @property
    def shard(self) -> int:
        return self.world_size // self.replicate

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nnodes

    def nodes_spanned(self, ranks: Iterable[int]) -> int:
        return len({r // self.ranks_per_node for r in ranks})

    @property
    def shard_group_nodes(self) -> int:
        return self.nodes_spanned(range(self.shard))

    @property
    def replicate_group_nodes(self) -> int:
        return self.nodes_spanned(range(0, self.world_size, self.shard))


def check_layout(world_size: int, replicate: int = 1, nnodes: int = 1) -> Layout:
    """Impossible sizes are user errors (exit 2), not tracebacks."""
    for name, value in (("--world-size", world_size), ("--replicate", replicate), ("--nnodes", nnodes)):
        if not isinstance(value, int) or value < 1:
            raise UsageError(f"must be a positive integer, got {value!r}", field=name)
    if world_size % replicate:
        raise UsageError(f"world size {world_size} is not divisible into {replicate} replicas", field="--replicate")
    if world_size % nnodes:
        raise UsageError(f"world size {world_size} does not split evenly over {nnodes} nodes", field="--nnodes")
    return Layout(world_size, replicate, nnodes)


def check_dtype(name: str, flag: str) -> str:
    if name not in FLOAT_DTYPES:
        raise UsageError(f"unsupported dtype '{name}' (choose from {', '.join(FLOAT_DTYPES)})", field=flag)
    return name


def unit_shard_counts(
    cfg: ModelConfig, shard: int, *, version: int = 2, param_dtype: str = "bf16", use_orig_params: bool = True
) -> dict[str, tuple[int, int]]:
    """unit -> (per-rank padded count, unpadded numel), root first, then layers in order."""
    if version not in (1, 2):
        raise UsageError(f"must be 1 or 2, got {version!r}", field="--fsdp-version")
    aligned = fsdp1_alignment_numel(param_dtype, use_orig_params)
    result: dict[str, tuple[int, int]] = {}
    for unit, specs in units(parameter_shapes(cfg)).items():
        numel = sum(s.numel for s in specs)
        if version == 2:
            count = sum(fsdp2_shard_numel(s.shape, shard) for s in specs)
        else:
            count = fsdp1_shard_numel((s.numel for s in specs), shard, aligned)
        result[unit] = (count, numel)
    return dict(sorted(result.items(), key=lambda kv: kv[0] != ROOT))


def all_gathers_per_step(unit: str, reshard_after_forward: bool, reshard_root: bool = False) -> int:
    """Forward all-gather, plus a backward one when the unit was resharded after forward."""
    resharded = reshard_root if unit == ROOT else reshard_after_forward
    return 2 if resharded else 1


def gradient_redop(version: int, reduce_dtype: str) -> str:
    """FSDP2 reduces fp32/bf16 gradients with NCCL's avg (``_get_gradient_divide_factors``) and fp16 with sum
    plus separate division; FSDP1 always sums and divides around the collective."""
    return "avg" if version == 2 and reduce_dtype in ("fp32", "bf16") else "sum"


def unit_collectives(
    unit: str,
    count: int,
    numel: int,
    layout: Layout,
    *,
    param_dtype: str,
    reduce_dtype: str,
    reshard_after_forward: bool,
    reshard_root: bool = False,
    version: int = 2,
) -> list[FsdpCollective]:
    """The collectives one unit issues per step, given its per-rank shard count (shared by exact and approx)."""
    rows: list[FsdpCollective] = []
    redop = gradient_redop(version, reduce_dtype)
    if layout.shard > 1:  # FSDP skips both collectives on a 1-rank shard group
        nodes = layout.shard_group_nodes
        rows.append(
            FsdpCollective(
                unit,
                "all_gather",
                count,
                param_dtype,
                layout.shard,
                all_gathers_per_step(unit, reshard_after_forward, reshard_root),
                numel,
                nodes,
            )
        )
        rows.append(FsdpCollective(unit, "reduce_scatter", count, reduce_dtype, layout.shard, 1, numel, nodes, redop))
    if layout.replicate > 1:
        rows.append(
            FsdpCollective(
                unit=unit,
                collective="all_reduce",
                count=count,
                dtype=reduce_dtype,
                nranks=layout.replicate,
                calls_per_step=1,
                unit_numel=numel,
                nnodes=layout.replicate_group_nodes,
                redop=redop,
            )
        )
    return rows


def fsdp_collectives(
    cfg: ModelConfig,
    world_size: int,
    *,
    version: int = 2,
    param_dtype: str = "bf16",
    reduce_dtype: str | None = None,
    reshard_after_forward: bool = True,
    replicate: int = 1,
    nnodes: int = 1,
    use_orig_params: bool = True,
    reshard_root: bool = False,
) -> list[FsdpCollective]:
    """Every FSDP collective of one forward+backward step, one entry per (unit, collective).

    ``param_dtype`` is the all-gather dtype (MixedPrecisionPolicy.param_dtype), ``reduce_dtype`` the
    reduce-scatter / all-reduce dtype; None reduces in ``param_dtype``, as FSDP2 does when
    MixedPrecisionPolicy.reduce_dtype is unset (docs/conventions.md, "FSDP collective sizes"). ``use_orig_params`` matters for FSDP1 only; ``reshard_root`` models a
    root wrapped with an explicit ``reshard_after_forward=True`` (it then all-gathers again in backward).
    """
    layout = check_layout(world_size, replicate, nnodes)
    check_dtype(param_dtype, "--param-dtype")
    reduce_dtype = reduce_dtype or param_dtype
    check_dtype(reduce_dtype, "--reduce-dtype")
    counts = unit_shard_counts(
        cfg, layout.shard, version=version, param_dtype=param_dtype, use_orig_params=use_orig_params
    )
    rows: list[FsdpCollective] = []
    for unit, (count, numel) in counts.items():
        rows += unit_collectives(
            unit,
            count,
            numel,
            layout,
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
            reshard_after_forward=reshard_after_forward,
            reshard_root=reshard_root,
            version=version,
        )
    return rows


# ---- summaries ----------------------------------------------------------------------------------------------


def step_totals(collectives: Sequence[FsdpCollective]) -> list[dict[str, Any]]:
    """Per collective and overall: calls, bytes moved (nccl-tests size × calls) and busbw-equivalent bytes."""
    totals: dict[str, dict[str, Any]] = {}
    for c in collectives:
        for key in (c.collective, "total"):
            t = totals.setdefault(
                key, {"collective": key, "calls_per_step": 0, "bytes_per_step": 0, "busbw_bytes_per_step": 0}
            )
            t["calls_per_step"] += c.calls_per_step
            t["bytes_per_step"] += c.bytes_per_step
            t["busbw_bytes_per_step"] += c.busbw_bytes_per_step
    order = ["all_gather", "reduce_scatter", "all_reduce", "total"]
    return [totals[k] for k in order if k in totals]


def unit_range(units_: Sequence[str]) -> str:
    """Compact unit list: 'layers.0-79', 'layers.1,3,5-9'; the root stays 'root'."""
    layers = sorted(int(u.split(".", 1)[1]) for u in units_ if u.startswith("layers."))
    spans: list[list[int]] = []
    for i in layers:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    others = [u for u in units_ if not u.startswith("layers.")]
    return ",".join(others + ([f"layers.{text}"] if layers else []))


def group_rows(
    rows: Sequence[dict[str, Any]], key_fields: Sequence[str], sum_fields: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """Rows of units that agree on ``key_fields`` collapsed into one (unit list compacted, ``units`` counted,
    ``sum_fields`` added up); the root never merges with layers."""
    runs: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        runs.setdefault(tuple(r[k] for k in key_fields) + (r["unit"] == ROOT,), []).append(r)
    out = []
    for members in runs.values():
        row = dict(members[0])
        row["unit"] = unit_range([m["unit"] for m in members])
        row["units"] = len(members)
        for f in sum_fields:
            row[f] = sum(m[f] for m in members)
        out.append(row)
    return out


def grouped(collectives: Sequence[FsdpCollective]) -> list[dict[str, Any]]:
    """Units with identical collectives collapsed into one row (for the console table)."""
    return group_rows(
        [c.to_row() for c in collectives],
        ("collective", "count", "dtype", "nranks", "calls_per_step"),
        ("bytes_per_step", "busbw_bytes_per_step"),
    )


def unique_sizes(collectives: Sequence[FsdpCollective]) -> list[FsdpCollective]:
    """One representative per distinct (collective, -b size, dtype, nranks), in first-seen order."""
    seen: dict[tuple, FsdpCollective] = {}
    for c in collectives:
        seen.setdefault((c.collective, c.nccl_tests_bytes, c.dtype, c.nranks), c)
    return list(seen.values())


__all__ = [
    "FsdpCollective",
    "Layout",
    "ParamSpec",
    "fsdp_collectives",
    "fsdp1_shard_numel",
    "fsdp2_shard_numel",
    "group_rows",
    "grouped",
    "step_totals",
    "unique_sizes",
    "unit_collectives",
    "unit_shard_counts",
]
