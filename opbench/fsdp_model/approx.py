"""Primus' approximate FSDP model, kept to show how far it is from the exact one.

AMD Primus ``benchmark_fsdp.py`` sizes a decoder layer's all-gather as (layer weights) // world_size with
layer weights = 3·hidden·ffn + 2·hidden·heads·head_dim + 2·hidden·kv_heads·head_dim: the weight matrices only —
no norms, no biases, no per-parameter padding, and no root unit (embeddings, final norm, lm_head). Here
"layer weights" is the sum of the layer's matrices (parameters of 2+ dims), which is Primus' expression for
Llama-style dense layers and extends it to MoE/MLA layers. For Llama-3-70B at 8 ranks: 106954752, where real
FSDP sends 106956800 (docs/conventions.md, "FSDP collective sizes").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opbench.models import ModelConfig
from opbench.models.params import ROOT, parameter_shapes, units

from .model import FsdpCollective, check_dtype, check_layout, group_rows, step_totals, unit_collectives


def layer_weights(specs) -> int:
    """Primus' 'layer weight': elements of the weight matrices, norms and biases left out."""
    return sum(s.numel for s in specs if len(s.shape) >= 2)


def approx_collectives(
    cfg: ModelConfig,
    world_size: int,
    *,
    param_dtype: str = "bf16",
    reduce_dtype: str | None = None,
    reshard_after_forward: bool = True,
    replicate: int = 1,
    nnodes: int = 1,
    **_ignored: Any,
) -> list[FsdpCollective]:
    """Decoder layers only, count = layer weights // shard size (floor, as Primus)."""
    layout = check_layout(world_size, replicate, nnodes)
    check_dtype(param_dtype, "--param-dtype")
    reduce_dtype = reduce_dtype or param_dtype  # FSDP2's default, as fsdp_collectives
    check_dtype(reduce_dtype, "--reduce-dtype")
    rows: list[FsdpCollective] = []
    for unit, specs in units(parameter_shapes(cfg)).items():
        if unit == ROOT:
            continue
        weights = layer_weights(specs)
        rows += unit_collectives(
            unit,
            weights // layout.shard,
            weights,
            layout,
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
            reshard_after_forward=reshard_after_forward,
        )
    return rows


def compare(exact: Sequence[FsdpCollective], approx: Sequence[FsdpCollective]) -> list[dict[str, Any]]:
    """Exact vs approximate count per (unit, collective), identical units grouped; units the approximation
    lacks (the root) show approx_count 0."""
    approx_count = {(c.unit, c.collective): c.count for c in approx}
    rows = []
    for c in exact:
        a = approx_count.get((c.unit, c.collective), 0)
        rows.append(
            {
                "unit": c.unit,
                "collective": c.collective,
                "exact_count": c.count,
                "approx_count": a,
                "missing_elements": c.count - a,
                "missing_pct": 100.0 * (c.count - a) / c.count if c.count else 0.0,
            }
        )
    return group_rows(rows, ("collective", "exact_count", "approx_count"))


def compare_totals(exact: Sequence[FsdpCollective], approx: Sequence[FsdpCollective]) -> list[dict[str, Any]]:
    """Bytes moved per step, exact vs approximate, per collective and overall."""
    a = {t["collective"]: t for t in step_totals(approx)}
    rows = []
    for t in step_totals(exact):
        approx_bytes = a.get(t["collective"], {}).get("bytes_per_step", 0)
        rows.append(
            {
                "collective": t["collective"],
                "exact_bytes_per_step": t["bytes_per_step"],
                "approx_bytes_per_step": approx_bytes,
                "missing_pct": 100.0 * (t["bytes_per_step"] - approx_bytes) / t["bytes_per_step"]
                if t["bytes_per_step"]
                else 0.0,
            }
        )
    return rows
