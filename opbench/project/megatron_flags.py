"""Megatron-LM flags that cost time, each as the effect its source documents (docs/project.md, "Flags that cost
time"): ``--no-gradient-accumulation-fusion``, ``--nccl-algo`` (NCCL_ALGO) and ``--deterministic-mode``.

- **Gradient accumulation fusion** (Megatron's default; ``--no-gradient-accumulation-fusion`` turns it off): with it,
  a linear layer's weight-gradient GEMM accumulates into the parameter's main gradient in its epilogue (Transformer
  Engine's ``fuse_wgrad_accumulation``, Megatron's ``wgrad_gemm_accum_fp32``), inside the GEMM's time. Without it
  the GEMM writes a 16-bit gradient and Megatron's backward hook adds it into the main gradient
  (``megatron/core/distributed/distributed_data_parallel.py``: ``param.main_grad.add_(param.grad.data)``): per
  micro-batch, a memory-bound pass reading the gradient (e bytes) and reading and writing the main gradient (2 × 4
  bytes fp32, 2 × 2 with ``--grad-dtype bf16``) over every weight of the rank's linear layers.
- **NCCL's algorithm** (``--nccl-algo``, as NCCL_ALGO pins it): an all-reduce pinned to Ring or Tree takes what NCCL's
  own tuning model (``src/graph/tuning.cc`` of NCCL 2.30, Simple protocol, the one training's sizes use) gives that
  algorithm over what it gives the one NCCL would choose of the two; opbench's all-reduce time × that ratio. Only the
  all-reduce has a Ring/Tree choice; NVLS, CollNet and PAT are not in this model, so ``default`` is the better of
  Ring and Tree, and pinning Ring where NCCL would pick NVLS (NVSwitch nodes) costs nothing here.
- **Deterministic mode** (``--deterministic-mode``; ``megatron/training/determinism.py``): NCCL_ALGO=Ring unless the
  launcher set Ring or CollNet (Tree is refused), no ``--cross-entropy-loss-fusion`` and no TP communication overlap
  (refused here as there), cuBLAS's fixed workspace (``CUBLAS_WORKSPACE_CONFIG=:4096:8``: no cost modelled) and
  Transformer Engine's deterministic attention backward (``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``): its cost has no
  published figure and is not modelled (the projection says so).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

from opbench.core.dtypes import element_size
from opbench.core.errors import UsageError

from .rates import Assumptions, Timed

NCCL_ALGOS = ("default", "ring", "tree")
# NCCL 2.30.7, src/graph/tuning.cc (ncclTunerConstantsDefaults, Simple protocol; µs): base latency of Tree and Ring,
# and per-hop latencies over NVLink, PCI and the network
NCCL_BASE_US = {"tree": 8.4, "ring": 8.4}
NCCL_HOP_US = {
    "nvlink": {"tree": 4.0, "ring": 3.4},
    "pci": {"tree": 4.0, "ring": 5.7},
    "net": {"tree": 14.0, "ring": 14.0},
}
NCCL_NET_OVERHEAD_US = 1.0 * 3  # getNetOverhead (x86 Intel: 1 µs; AMD: 2) × 3 for Simple: a ring's floor per hop
NCCL_RING_PLATEAU = 1.4  # an inter-node ring all-reduce's latency × this on Ampere and later ("plateau effect")
NCCL_TREE_BW = 0.92  # a tree all-reduce's busbw of the graph's, before the per-size correction below
# treeCorrectionFactor[Simple]: a tree all-reduce's bandwidth × this at 64 B · 2^i (i = 0 … 23), 1 beyond
NCCL_TREE_CORRECTION = (0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7,
                        0.7, 0.8, 0.9, 0.9, 0.9)  # fmt: skip
# Megatron's ARG_VALUES_REQUIRED_FOR_DETERMINISM and the NCCL_ALGO tokens it accepts (megatron/training/determinism.py)
DETERMINISTIC_NCCL = ("default", "ring")


def nccl_allreduce_us(algo: str, size_bytes: float, nranks: int, nnodes: int, busbw_gbs: float, nvlink: bool) -> float:
    """One all-reduce of ``size_bytes`` per rank by NCCL's tuning model (ncclTopoTuneModel, ncclTopoGetAlgoTime),
    Ring or Tree, over ``nnodes`` nodes whose rings reach ``busbw_gbs``: latency + size / algorithm bandwidth."""
    ppn = nranks // nnodes
    intra = NCCL_HOP_US["nvlink" if nvlink else "pci"][algo]
    inter = NCCL_HOP_US["net"][algo]
    if algo == "ring":
        steps, inter_steps = 2 * (nranks - 1), 2 * (nnodes - 1)
        if nnodes > 1:
            intra = max(intra, NCCL_NET_OVERHEAD_US)
        latency = NCCL_BASE_US[algo] + (steps - inter_steps) * intra + inter_steps * inter
        latency *= NCCL_RING_PLATEAU if nnodes > 1 else 1.0
        algbw = busbw_gbs * nranks / steps
    else:
        latency = NCCL_BASE_US[algo] + 2 * ((ppn - 1) * intra + int(math.log2(nnodes)) * inter)
        log_size = int(math.log2(max(1.0, size_bytes / 64)))
        correction = NCCL_TREE_CORRECTION[log_size] if log_size < len(NCCL_TREE_CORRECTION) else 1.0
        algbw = busbw_gbs * NCCL_TREE_BW * 0.5 * correction
    return latency + size_bytes / (algbw * 1e3)


def pinned_allreduce(
    a: Assumptions, timed: Timed, size_bytes: float, nranks: int, inter: bool, per_node: int, nvlink: bool = True
) -> Timed:
    """``timed``, opbench's all-reduce, under ``--nccl-algo``: × NCCL's model of the pinned algorithm over the one
    NCCL would choose (1 with ``default``), at the bus bandwidth ``timed`` reaches."""
    algo = a.nccl_algo
    if algo == "default" or nranks <= 1 or timed.seconds <= 0 or size_bytes <= 0:
        return timed
    nnodes = max(1, nranks // max(1, per_node)) if inter else 1
    busbw = size_bytes * 2 * (nranks - 1) / nranks / timed.seconds / 1e9
    model = {x: nccl_allreduce_us(x, size_bytes, nranks, nnodes, busbw, nvlink) for x in ("ring", "tree")}
    factor = model[algo] / min(model.values())
    if factor == 1.0:
        return timed
    return replace(timed, seconds=timed.seconds * factor, note=f"{timed.note}; NCCL_ALGO={algo} × {factor:.3g}")


def unfused_accumulation_bytes(linear_weights: int, dtype: str, main_grad_bytes: int) -> int:
    """Bytes one micro-batch's unfused gradient accumulation moves (``main_grad.add_(grad)``): each weight's 16-bit
    (or fp32) gradient read, its main gradient read and written."""
    return linear_weights * (element_size(dtype) + 2 * main_grad_bytes)


def nccl_algo(args: argparse.Namespace) -> str:
    """The NCCL algorithm the step's all-reduces run: ``--nccl-algo``; ring under ``--deterministic-mode`` (which
    sets NCCL_ALGO=Ring), whose refusal of Tree is ``flag_problems``'s."""
    given = getattr(args, "nccl_algo", "default")
    return "ring" if getattr(args, "deterministic_mode", False) and given == "default" else given


def flag_problems(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(flag, why) for what Megatron itself refuses with these flags (megatron/training/determinism.py, and
    arguments.py for FSDP2 without gradient-accumulation fusion)."""
    out: list[tuple[str, str]] = []
    if getattr(args, "deterministic_mode", False):
        if getattr(args, "nccl_algo", "default") not in DETERMINISTIC_NCCL:
            out.append(("--nccl-algo", "Megatron's --deterministic-mode accepts NCCL_ALGO Ring (or CollNet), not Tree"))
        if getattr(args, "cross_entropy_loss_fusion", False):
            out.append(("--cross-entropy-loss-fusion", "Megatron's --deterministic-mode requires it off"))
        if getattr(args, "tp_overlap", 0.0) > 0:
            out.append(("--tp-overlap", "Megatron's --deterministic-mode requires TP communication overlap off"))
    megatron = getattr(args, "deterministic_mode", False) or not getattr(args, "gradient_accumulation_fusion", True)
    if getattr(args, "validate", False) and (megatron or getattr(args, "nccl_algo", "default") != "default"):
        flag = next(
            name
            for name, on in (
                ("--deterministic-mode", getattr(args, "deterministic_mode", False)),
                ("--no-gradient-accumulation-fusion", not getattr(args, "gradient_accumulation_fusion", True)),
                ("--nccl-algo", True),
            )
            if on
        )
        out.append(
            (flag, "--validate trains transformers' model with torch, not Megatron: project it without --validate")
        )
    if not getattr(args, "gradient_accumulation_fusion", True) and getattr(args, "fsdp", False):
        out.append(
            (
                "--no-gradient-accumulation-fusion",
                "Megatron's fusion accumulates into its main gradients; under --fsdp (torch's FSDP2, which Megatron "
                "runs without it) there is none to turn off",
            )
        )
    return out


def check_flags(args: argparse.Namespace) -> None:
    """The first of ``flag_problems``, as one line."""
    for flag, why in flag_problems(args):
        raise UsageError(why, field=flag)
