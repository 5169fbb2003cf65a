"""Record the collectives a real FSDP run issues, in NCCL_DEBUG terms, to check the model against them.

FSDP2 (torch ≥ 2.13) calls ``dist.all_gather_single`` / ``dist.reduce_scatter_single`` (the new names of
``all_gather_into_tensor`` / ``reduce_scatter_tensor``) and, for HSDP, ``dist.all_reduce``; FSDP1 calls the same
on GPUs but the list form ``dist.all_gather`` for CPU tensors.
Wrapping those module attributes sees every call on any backend (gloo included), so the sizes can be compared
on a CPU. A call made from inside another wrapped call is recorded once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from opbench.core.dtypes import dtype as opbench_dtype


@dataclass(frozen=True)
class CapturedCall:
    collective: str  # opbench name: all_gather | reduce_scatter | all_reduce
    count: int  # per-rank count as an NCCL_DEBUG line shows it
    dtype: str  # opbench dtype name (bf16, fp32, …)
    nranks: int


# attribute -> (collective, function(args, kwargs) -> (count tensor, group))
def _arg(args: tuple, kwargs: dict, index: int, *names: str):
    for name in names:
        if name in kwargs:
            return kwargs[name]
    return args[index] if len(args) > index else None


_PATCHED = {
    # all-gather: count = per-rank input (sendcount)
    "all_gather_single": ("all_gather", lambda a, k: (_arg(a, k, 1, "input_tensor", "input"), _arg(a, k, 2, "group"))),
    "all_gather_into_tensor": ("all_gather", lambda a, k: (_arg(a, k, 1, "input_tensor"), _arg(a, k, 2, "group"))),
    "all_gather": ("all_gather", lambda a, k: (_arg(a, k, 1, "tensor"), _arg(a, k, 2, "group"))),  # FSDP1 on CPU
    # reduce-scatter: count = per-rank output (recvcount)
    "reduce_scatter_single": (
        "reduce_scatter",
        lambda a, k: (_arg(a, k, 0, "output", "output_tensor"), _arg(a, k, 3, "group")),
    ),
    "reduce_scatter_tensor": ("reduce_scatter", lambda a, k: (_arg(a, k, 0, "output"), _arg(a, k, 3, "group"))),
    "reduce_scatter": ("reduce_scatter", lambda a, k: (_arg(a, k, 0, "output"), _arg(a, k, 3, "group"))),
    # all-reduce: count = the tensor
    "all_reduce": ("all_reduce", lambda a, k: (_arg(a, k, 0, "tensor"), _arg(a, k, 2, "group"))),
}


def _dtype_name(dtype: torch.dtype) -> str:
    return opbench_dtype(str(dtype).removeprefix("torch.")).name


@contextlib.contextmanager
def record_collectives() -> Iterator[list[CapturedCall]]:
    """Within the block, every wrapped torch.distributed collective appends a CapturedCall to the yielded list."""
    calls: list[CapturedCall] = []
    depth = [0]
    originals = {name: getattr(dist, name) for name in _PATCHED if hasattr(dist, name)}

    def wrap(name: str, fn):
        op, locate = _PATCHED[name]

        def wrapper(*args, **kwargs):
            if depth[0] == 0:
                tensor, group = locate(args, kwargs)
                calls.append(CapturedCall(op, tensor.numel(), _dtype_name(tensor.dtype), dist.get_world_size(group)))
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1

        return wrapper

    for name, fn in originals.items():
        setattr(dist, name, wrap(name, fn))
    try:
        yield calls
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
