"""GEMM benchmark: model configs → the GEMMs of a training step (fwd/dgrad/wgrad, TP/EP/CP, MoE, MLA) → timed CSVs."""
