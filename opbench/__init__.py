"""opbench: operator microbenchmarks for large-model training (GEMM, attention, collectives, FSDP, checkpoints)."""

__version__ = "0.1.0"
