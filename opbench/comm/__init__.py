"""The collective benchmark (``opbench comm``): nccl-tests semantics under torchrun, srun or self-launch.
The collective vocabulary it shares with trace, fsdp_model and report is ``opbench.core.collectives``."""
