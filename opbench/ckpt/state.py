"""A synthetic training state with real tensor shapes, sharded over ranks, with contents that can be re-derived.

Why synthetic: a checkpoint benchmark needs the bytes and the tensor layout of a real trainer's state, not a
trained model. The layout follows FSDP2 / the distributed optimizer: every tensor is split along dim 0 into
``world_size`` chunks (``torch.chunk`` semantics, the same as DTensor ``Shard(0)``), and each rank holds its
chunk of the parameters (param dtype), fp32 master weights and the optimizer moments (fp32).

Contents are uniform random numbers seeded by (tensor key, rank), and each tensor's CRC-32 is taken when it is
built, so every load is checked byte-for-byte against what was saved.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from math import prod

import torch

from opbench.core.device import torch_dtype
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


def deterministic_tensor(shape: Sequence[int], dtype: str, seed: int, device: torch.device) -> torch.Tensor:
    """Uniform(-1, 1) values from a generator seeded per tensor; fp32 is drawn then cast so every dtype and
    device gets the same recipe."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = torch.empty(tuple(shape), dtype=torch.float32, device=device).uniform_(-1.0, 1.0, generator=gen)
    return out if dtype == "fp32" else out.to(torch_dtype(dtype))


def checksum(t: torch.Tensor) -> int:
    """CRC-32 of the tensor's bytes (moved to host memory when it lives on a GPU)."""
    host = t.detach().contiguous().cpu()
    if host.numel() == 0:
        return 0
    return zlib.crc32(host.view(-1).view(torch.uint8).numpy().tobytes())


@dataclass
class ShardedState:
    """This rank's shards of every tensor, their checksums, and DTensor views of them for DCP."""

    spec: StateSpec
    rank: int
    world: int
    device: torch.device
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    checksums: dict[str, int] = field(default_factory=dict)
    _dtensors: dict[str, torch.Tensor] | None = None

    @classmethod
    def build(cls, spec: StateSpec, rank: int, world: int, device: torch.device) -> ShardedState:
        state = cls(spec, rank, world, device)
        state.regenerate()
        return state

    @property
    def local_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def regenerate(self) -> None:
        """(Re)create every local shard from its seed; used at build time and after a failed verification."""
        for t in self.spec.tensors:
            local = deterministic_tensor(
                t.local_shape(self.rank, self.world), t.dtype, tensor_seed(t.key, self.rank), self.device
            )
            if t.key in self.tensors:
                self.tensors[t.key].copy_(local)
            else:
                self.tensors[t.key] = local
            self.checksums[t.key] = checksum(local)

    def dcp_state_dict(self) -> dict[str, torch.Tensor]:
        """DTensors (Shard(0) over a 1-D mesh of all ranks) sharing memory with the local shards, so DCP writes a
        resharding-capable checkpoint exactly as FSDP2 does, and loads in place."""
        if self._dtensors is None:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import DTensor, Shard

            mesh = init_device_mesh(self.device.type, (self.world,))
            self._dtensors = {}
            for t in self.spec.tensors:
                stride = torch.empty(t.shape, device="meta").stride()
                self._dtensors[t.key] = DTensor.from_local(
                    self.tensors[t.key], mesh, [Shard(0)], run_check=False, shape=torch.Size(t.shape), stride=stride
                )
        return dict(self._dtensors)

    def scramble(self) -> None:
        """Zero every shard before an in-place load, so a load that skips a tensor cannot pass verification."""
        for t in self.tensors.values():
            t.zero_()

    def verify(self, loaded: Mapping[str, torch.Tensor]) -> list[str]:
        """Problems found comparing loaded local tensors with what was saved; empty means every byte matches."""
        problems = []
        for key, expected in self.checksums.items():
            got = loaded.get(key)
            if got is None:
                problems.append(f"rank {self.rank}: '{key}' missing after load")
                continue
            want = tuple(self.tensors[key].shape)
            if tuple(got.shape) != want or got.dtype != self.tensors[key].dtype:
                problems.append(
                    f"rank {self.rank}: '{key}' loaded as {got.dtype} {tuple(got.shape)}, "
                    f"saved {self.tensors[key].dtype} {want}"
                )
            elif checksum(got) != expected:
                problems.append(f"rank {self.rank}: '{key}' contents differ from what was saved (CRC-32)")
        return problems
