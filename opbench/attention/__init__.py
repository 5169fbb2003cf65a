"""Attention benchmark: model-derived shapes, FLOP convention, backends (SDPA kernels, flash-attn, Triton, eager)."""
