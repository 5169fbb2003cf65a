"""FSDP communication model: exact FSDP2 / FSDP1 collective sizes per training step, and the nccl-tests /
rccl-tests lines that reproduce them. Pure Python (no torch) so it is instant and runs anywhere."""

from .model import FsdpCollective, fsdp_collectives, step_totals, unique_sizes

__all__ = ["FsdpCollective", "fsdp_collectives", "step_totals", "unique_sizes"]
