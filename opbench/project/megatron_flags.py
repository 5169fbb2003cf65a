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
  Transformer Engine's deterministic attention backward (``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``). On Hopper TE
  keeps cuDNN's fused attention, whose deterministic path (sub-backend 1, sm90+) has no published cost: not
  modelled. On Blackwell (sm100) TE keeps cuDNN only with cuDNN ≥ 9.18.1, no dropout and no bias
  (``common/fused_attn/fused_attn.cpp``; PR #2584); FlashAttention-3 is sm90-only and FlashAttention-4 is turned off
  for dropout (``dot_product_attention/utils.py``), so with attention dropout the step runs FlashAttention-2 with
  ``deterministic=True`` (``fa2_deterministic``, below): its backward splits each (batch, head) into only
  ``ceil(SMs / (b·h))`` pieces (``flash_api.cpp``: ``gridDimx``), at one CTA per SM at head dimension 128 (its
  backward kernel takes ≥ 144 KB of shared memory), so the grid can leave a second wave nearly empty.
"""

from __future__ import annotations

import argparse
import heapq
import math
from dataclasses import replace

from opbench.core.dtypes import element_size
from opbench.core.errors import UsageError
from opbench.core.peaks import by_part

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


# FlashAttention-2's deterministic backward (docs/project.md, "Flags that cost time"). Measured: flash-attention PR
# #1893 on H100 (head dim 128, causal, 8,192 tokens, 16 heads, batch 2, deterministic): forward 306 TFLOP/s, backward
# 8.279 ms (166 TFLOP/s). Its grid there is 5 splits × 32 (batch, head) = 160 CTAs on 132 SMs, one CTA per SM; the
# GPU hands CTAs to SMs in launch order as SMs free up, so that backward took 1,664 blocks of 64 queries × 128 keys
# of one SM's time (``fa2_deterministic_backward_blocks``): one block pair 8.279 ms / 1,664 = 4.98 µs. The kernel uses
# the Ampere-era MMA on any part (per chip no faster on B200: tritonbench PR #171 measured its forward at 361.6
# TFLOP/s there): an SM's rate is taken as H100's.
FA2_DET_REF_SMS = 132
FA2_DET_FWD_TFLOPS = 306.0  # on FA2_DET_REF_SMS SMs; a part's is × its SMs over that
FA2_DET_REF_US = 8279.0  # the reference backward
FA2_DET_HEAD_DIM = 128  # the head dimension the figure and the one-CTA-per-SM occupancy are for
# SMs of the Blackwell parts (sm100) whose TE cannot run cuDNN's deterministic attention with dropout: B200 and
# GB200's GPU 148 (NVIDIA Blackwell datasheets), B300/GB300 (Blackwell Ultra) 160 (NVIDIA technical blog "Inside
# NVIDIA Blackwell Ultra", 2025)
SM100_SMS: list[tuple[str, int]] = [(r"b300|gb300", 160), (r"b200|gb200", 148)]


def sm100_sms(device: str | None) -> int | None:
    """SMs of a Blackwell (sm100) part, None for any other."""
    return by_part(SM100_SMS, device, None)


def fa2_deterministic_backward_blocks(sms: int, batch: int, heads: int, seqlen: int, causal: bool) -> int:
    """One SM's blocks of work until FlashAttention-2's deterministic backward ends: ``G = ceil(sms / (b·h))``
    splits per (batch, head) (``flash_api.cpp``: ``gridDimx``); split ``x`` runs key blocks x, x + G, … (128 keys
    each), block ``j`` over the query blocks (64 each) that see it, ``seqlen/64 − 2j`` of them causal; one CTA per SM
    at head dimension 128, handed to the SM that frees first in launch order (x fastest, then batch, then head)."""
    splits = -(-sms // max(1, batch * heads))
    key_blocks = -(-seqlen // 128)
    query_blocks = -(-seqlen // 64)
    work = [
        sum(max(0, query_blocks - 2 * j) if causal else query_blocks for j in range(x, key_blocks, splits))
        for x in range(splits)
    ]
    free = [0] * sms  # each SM's finish time, a heap
    for _ in range(batch * heads):
        for w in work:
            heapq.heappush(free, heapq.heappop(free) + w)
    return max(free)


FA2_DET_BLOCK_US = FA2_DET_REF_US / fa2_deterministic_backward_blocks(FA2_DET_REF_SMS, 2, 16, 8192, True)


def fa2_deterministic(
    flops_fwd: float, sms: int, batch: int, heads: int, seqlen: int, causal: bool
) -> tuple[float, float]:
    """(forward, backward) seconds of one FlashAttention-2 call with ``deterministic=True`` on ``heads`` local heads
    of head dimension 128: forward at FA2_DET_FWD_TFLOPS per FA2_DET_REF_SMS SMs, backward as its grid runs."""
    fwd = flops_fwd / (FA2_DET_FWD_TFLOPS * 1e12 * sms / FA2_DET_REF_SMS)
    return fwd, fa2_deterministic_backward_blocks(sms, batch, heads, seqlen, causal) * FA2_DET_BLOCK_US * 1e-6
