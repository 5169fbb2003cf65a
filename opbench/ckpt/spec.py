"""What a checkpoint holds, as shapes and bytes only (no torch): the sharded training state's tensor list.

The CLI plans, validates and dry-runs from these specs without importing torch; ``state.ShardedState`` builds
the tensors. Layout as FSDP2 / the distributed optimizer keep it: every tensor is split along dim 0 into
``world_size`` chunks (each rank holds its chunk of the parameters, fp32 master weights and optimizer moments).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from math import prod

from opbench.core.dtypes import element_size
from opbench.core.errors import UsageError

OPTIMIZERS = ("adam", "sgd")
# Per-parameter optimizer tensors (fp32), named like torch.distributed.checkpoint's optimizer state dict.
OPTIMIZER_MOMENTS = {"adam": ("exp_avg", "exp_avg_sq"), "sgd": ("momentum_buffer",)}
# Candidate hidden sizes for --size-mb states: the largest whose decoder layer fits four times is used.
SYNTHETIC_HIDDEN = (8192, 4096, 2048, 1024, 512, 256)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the full (unsharded) state."""

    key: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * element_size(self.dtype)

    def local_shape(self, rank: int, world: int) -> tuple[int, ...]:
        return (shard_range(self.shape[0], rank, world)[1], *self.shape[1:])


@dataclass(frozen=True)
class StateSpec:
    """The whole state a run saves: what it models (for the CSV) and every tensor."""

    label: str
    tensors: tuple[TensorSpec, ...]
    optimizer: str | None = None
    param_dtype: str = "fp32"
    master_weights: bool = False
    num_layers: int | None = None

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def local_bytes(self, rank: int, world: int) -> int:
        return sum(prod(t.local_shape(rank, world)) * element_size(t.dtype) for t in self.tensors)


def shard_range(dim0: int, rank: int, world: int) -> tuple[int, int]:
    """(start, length) of ``rank``'s dim-0 chunk: chunks of ceil(dim0/world) rows, the last ones short or empty
    (torch.chunk and DTensor Shard(0) split this way)."""
    size = -(-dim0 // world)
    start = min(rank * size, dim0)
    return start, max(0, min(size, dim0 - start))


def model_state_spec(
    cfg, optimizer: str = "adam", param_dtype: str = "bf16", master_weights: bool | None = None
) -> StateSpec:
    """Parameters of ``cfg`` (HF names and shapes from opbench.models.params) plus master weights and moments."""
    from opbench.models.params import parameter_shapes

    if optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer '{optimizer}' (choose from {', '.join(OPTIMIZERS)})", field="--optimizer")
    if master_weights is None:
        master_weights = param_dtype != "fp32"
    tensors: list[TensorSpec] = []
    for p in parameter_shapes(cfg):
        tensors.append(TensorSpec(f"model.{p.name}", tuple(p.shape), param_dtype))
        if master_weights:
            tensors.append(TensorSpec(f"optim.state.{p.name}.master_param", tuple(p.shape), "fp32"))
        for moment in OPTIMIZER_MOMENTS[optimizer]:
            tensors.append(TensorSpec(f"optim.state.{p.name}.{moment}", tuple(p.shape), "fp32"))
    return StateSpec(cfg.name, tuple(tensors), optimizer, param_dtype, master_weights, cfg.num_hidden_layers)


def synthetic_layer(prefix: str, hidden: int) -> list[tuple[str, tuple[int, ...]]]:
    """A Llama-style decoder layer: four attention projections, a gated MLP (ffn = 8/3·hidden, multiple of 256)
    and two norms; gives --size-mb states the mix of tensor sizes a real model has."""
    ffn = -(-(8 * hidden // 3) // 256) * 256
    attn: list[tuple[str, tuple[int, ...]]] = [
        (f"{prefix}.self_attn.{p}_proj.weight", (hidden, hidden)) for p in "qkvo"
    ]
    mlp = [
        (f"{prefix}.mlp.gate_proj.weight", (ffn, hidden)),
        (f"{prefix}.mlp.up_proj.weight", (ffn, hidden)),
        (f"{prefix}.mlp.down_proj.weight", (hidden, ffn)),
    ]
    norms = [(f"{prefix}.input_layernorm.weight", (hidden,)), (f"{prefix}.post_attention_layernorm.weight", (hidden,))]
    return attn + mlp + norms


def synthetic_state_spec(total_bytes: int, dtype: str = "bf16") -> StateSpec:
    """``total_bytes`` (across all ranks) of tensors in ``dtype``: whole decoder layers, then an embedding-like
    (rows, hidden) tensor and a 1-D tail for the remainder, so the sum is exact to the element."""
    elt = element_size(dtype)
    if total_bytes < elt:
        raise UsageError(f"must hold at least one {dtype} element", field="--size-mb")

    def layer_bytes(h: int) -> int:
        return sum(prod(s) for _, s in synthetic_layer("x", h)) * elt

    hidden = next((h for h in SYNTHETIC_HIDDEN if 4 * layer_bytes(h) <= total_bytes), SYNTHETIC_HIDDEN[-1])
    shapes: list[tuple[str, tuple[int, ...]]] = []
    left = total_bytes
    while layer_bytes(hidden) <= left:
        shapes += synthetic_layer(f"model.layers.{len(shapes) // 9}", hidden)
        left -= layer_bytes(hidden)
    if left // (hidden * elt):
        shapes.append(("model.embed_tokens.weight", (left // (hidden * elt), hidden)))
        left -= shapes[-1][1][0] * hidden * elt
    if left // elt:
        shapes.append(("model.tail.weight", (left // elt,)))
    label = f"synthetic_{total_bytes / 2**20:g}MiB"
    return StateSpec(label, tuple(TensorSpec(k, s, dtype) for k, s in shapes), None, dtype, False, None)


def with_num_layers(cfg, num_layers: int | None):
    """The config with its decoder layer count overridden (--num-layers), so a big model fits a small machine."""
    return cfg if num_layers is None else replace(cfg, num_hidden_layers=num_layers)


def tensor_seed(key: str, rank: int) -> int:
    return zlib.crc32(f"{key}@rank{rank}".encode())
