"""torch.compile of every decoder block (``--compile``: torchtitan's ``compile`` of each TransformerBlock), as opbench
projects it (docs/project.md, "torch.compile").

Compile changes two things in a step, and neither is a guess of the whole step's speed:

- **Memory-bound time.** Inductor fuses a block's elementwise and reduction operators (norms, rotary, the SwiGLU
  product, residual adds) into fewer kernels; GEMMs and attention stay the library kernels eager calls (cuBLAS /
  oneDNN, SDPA). The projection keeps PyTorch eager's byte count and times (``--memory-ops eager``) and multiplies
  the blocks' memory-bound time by ``compile_memory_time``. Measured: ``--validate --compile`` trains the model
  eager and compiled here and prints the factor the two steps imply, to pass as ``--compile-memory-time``. Default:
  ``COMPILE_MEMORY_TIME``, torchtitan's published compile/eager ratio taken apart (below).
- **Activations.** Inductor's partitioner (``min_cut_rematerialization_partition``) saves a fused region's inputs
  and recomputes its elementwise intermediates in backward: a compiled block keeps neither RMSNorm's fp32 input copy
  nor its x·rsqrt, nor silu's output (``memory.activation_parts(compiled=True)``). Structural, not fitted: on
  tiny-llama (fp32, CPU) the compiled step saved exactly the bytes this removes fewer (7,168 a token a layer).

The loss and the final norm stay eager, as torchtitan compiles the blocks only (its 2024-12 benchmarks).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from .rates import Assumptions, Timed

# torchtitan, benchmarks/llama3_h100_202412_torchtitan.md, Table 1 (Llama-3.1-8B, 8 H100, FSDP, local batch 2 ×
# 8,192, per-op selective checkpointing): FSDP 5,762 tokens/s/GPU and 82.4 GiB; FSDP + torch.compile 6,667 and 77.0
TORCHTITAN_8B_EAGER_TPS, TORCHTITAN_8B_COMPILE_TPS = 5762, 6667
TORCHTITAN_8B_EAGER_GIB, TORCHTITAN_8B_COMPILE_GIB = 82.4, 77.0
# The blocks' memory-bound time under compile, of eager's. Taken apart from that row: compile saves 1 − 5,762/6,667
# = 13.6 % of the eager step; GEMMs, attention and FSDP's collectives are the same kernels either way, so all of it
# is the blocks' memory-bound work, which the projection of that row (--memory-ops eager, H100, 2026-11-29) puts at
# 35.2 % of the eager step (recomputed forwards included): compile leaves 1 − 13.6/35.2 of it. Checked by
# tests/test_project_flags.py (the row projected with --compile is 1.157× its eager projection); re-derive it there
# when the projection of that row moves.
COMPILE_MEMORY_TIME = 0.614


def compiled(a: Assumptions, timed: Timed) -> Timed:
    """A decoder block's memory-bound time under ``--compile`` (unchanged without it)."""
    factor = a.compile_memory_time
    if factor is None:
        return timed
    return replace(timed, seconds=timed.seconds * factor, note=f"{timed.note} × {factor:.3g} (torch.compile)")


def implied_memory_time(eager_s: float, compiled_s: float, memory_s: float) -> float | None:
    """The ``--compile-memory-time`` two measured steps imply: the compiled step saved ``eager_s − compiled_s``, all of
    it from the blocks' memory-bound work, projected at ``memory_s`` of the eager step. None when that work is
    nothing; below 0 or above 1 is what was measured (noise or a slower compiled step), shown as is."""
    if memory_s <= 0:
        return None
    return 1 - (eager_s - compiled_s) / memory_s


def compile_factor(args: argparse.Namespace) -> float | None:
    """``--compile``'s factor: ``--compile-memory-time`` where given (one ``--validate --compile`` measured; it
    implies ``--compile``), else ``COMPILE_MEMORY_TIME``; None without either."""
    given = getattr(args, "compile_memory_time", None)
    if given is not None:
        return float(given)
    return COMPILE_MEMORY_TIME if getattr(args, "compile", False) else None
