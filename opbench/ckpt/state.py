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
from dataclasses import dataclass, field

import torch

from opbench.core.device import torch_dtype

from .spec import (  # noqa: F401  (re-exported: the spec used to live here)
    OPTIMIZER_MOMENTS,
    OPTIMIZERS,
    SYNTHETIC_HIDDEN,
    StateSpec,
    TensorSpec,
    model_state_spec,
    shard_range,
    synthetic_layer,
    synthetic_state_spec,
    tensor_seed,
    with_num_layers,
)


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
