"""Collective communication: nccl-tests conventions, torchrun benchmark, NCCL log and nccl-tests output parsing."""
