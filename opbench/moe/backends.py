"""The routed experts' grouped GEMM, three ways: ``y_e = x_e · W_eᵀ`` for each expert's rows ``x_e``.

- ``torch_loop``: a Python loop over experts, one eager ``F.linear`` each (transformers' eager experts).
- ``grouped_mm``: one ``torch._grouped_mm(x, Wᵀ, offs=…)`` (what transformers' grouped_mm experts and torchtitan
  run; on CPU torch 2.13 has a reference kernel, on H100/B200 bf16 a CUTLASS one).
- ``te_grouped``: Transformer Engine's ``GroupedLinear`` (``transformer_engine.pytorch``), GPU only; imported only
  when asked for, and a machine without a GPU or without TE gets an ``unsupported`` row saying which.

``build(name, weights…)`` returns the callable or raises ``Unsupported`` with the reason.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from opbench.core.sweep import Unsupported

from .block import GroupedLinear, Routed
from .schema import BACKEND_NAMES


def torch_loop(x: torch.Tensor, w: torch.Tensor, routed: Routed) -> torch.Tensor:
    parts = [F.linear(chunk, w[e]) for e, chunk in enumerate(x.split(routed.counts)) if chunk.shape[0]]
    if not parts:
        return x.new_zeros((0, w.shape[1]))
    return torch.cat(parts)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, routed: Routed) -> torch.Tensor:
    return torch._grouped_mm(x, w.transpose(-2, -1), offs=routed.offsets)


def grouped_mm_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when torch._grouped_mm runs here (probed on a tiny 2-expert case, forward and backward)."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch._grouped_mm is absent in torch {torch.__version__}"
    try:
        x = torch.randn(8, 16, device=device, dtype=dtype, requires_grad=True)
        w = torch.randn(2, 16, 16, device=device, dtype=dtype, requires_grad=True)
        offs = torch.tensor([3, 8], device=device, dtype=torch.int32)
        y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        y.backward(torch.randn_like(y))
    except (RuntimeError, NotImplementedError) as exc:
        return "torch._grouped_mm fails here: " + " ".join(str(exc).split())[:160]
    return None


def te_reason(device: torch.device) -> str | None:
    """None when Transformer Engine's GroupedLinear can run here; never imports TE on a machine without a GPU."""
    if device.type != "cuda":
        return f"needs a CUDA GPU and Transformer Engine (GroupedLinear); this run is on {device.type}"
    if importlib.util.find_spec("transformer_engine") is None:
        return "transformer_engine is not installed (pip install transformer_engine[pytorch])"
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a broken TE install is a reason, not a crash
        return "transformer_engine.pytorch does not import: " + " ".join(str(exc).split())[:160]
    return None


def te_grouped(weights: list[torch.Tensor]) -> GroupedLinear:
    """GroupedLinear modules for the given [E, N, K] weights (gate_up, down), their weights copied in; the callable
    picks the module by weight shape. Its parameters are TE's own: gradients go to them, not to ``weights``."""
    import transformer_engine.pytorch as te

    modules: dict[tuple[int, ...], torch.nn.Module] = {}
    for w in weights:
        e, n, k = w.shape
        mod = te.GroupedLinear(e, k, n, bias=False, params_dtype=w.dtype, device=w.device)
        with torch.no_grad():
            for i in range(e):
                getattr(mod, f"weight{i}").copy_(w[i])
        modules[tuple(w.shape)] = mod

    def run(x: torch.Tensor, w: torch.Tensor, routed: Routed) -> torch.Tensor:
        return modules[tuple(w.shape)](x, routed.counts)

    return run


def unsupported_reason(name: str, device: torch.device, dtype: torch.dtype) -> str | None:
    if name == "grouped_mm":
        return grouped_mm_reason(device, dtype)
    if name == "te_grouped":
        return te_reason(device)
    return None


def build(
    name: str, device: torch.device, dtype: torch.dtype, weights: list[torch.Tensor]
) -> tuple[GroupedLinear, str]:
    """(the grouped linear, what it runs); raises Unsupported with the reason."""
    reason = unsupported_reason(name, device, dtype)
    if reason:
        raise Unsupported(reason)
    if name == "torch_loop":
        return torch_loop, "F.linear per expert (Python loop, eager)"
    if name == "grouped_mm":
        kernel = "CPU reference kernel" if device.type == "cpu" else "CUTLASS/CK grouped kernel or fallback, by arch"
        return grouped_mm, f"torch._grouped_mm ({kernel})"
    if name == "te_grouped":
        return te_grouped(weights), "transformer_engine.pytorch.GroupedLinear"
    raise ValueError(f"unknown backend {name}; known: {', '.join(BACKEND_NAMES)}")
