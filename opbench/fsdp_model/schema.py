"""The CSV schema of ``opbench fsdp`` (one row per model, unit and collective). No torch import."""

from opbench.core.schema import Schema

SCHEMA = Schema(
    benchmark="fsdp",
    title="FSDP collectives",
    version=2,  # 2: collective holds opbench names, nccl_op added
    columns=(
        "model",
        "mode",
        "fsdp_version",
        "world_size",
        "replicate",
        "unit",
        "collective",
        "nccl_op",
        "count",
        "dtype",
        "redop",
        "nranks",
        "nnodes",
        "calls_per_step",
        "bytes_per_rank",
        "nccl_tests_bytes",
        "bytes_per_step",
        "busbw_bytes_per_step",
        "unit_numel",
        "exact_count",
    ),
    keys=("model", "mode", "fsdp_version", "world_size", "replicate", "unit", "collective", "dtype", "nranks"),
    metrics={"count": "elements"},
    signature=("unit", "collective", "count", "dtype", "bytes_per_rank", "calls_per_step", "nccl_tests_bytes"),
    file_hint="fsdp",
    units={
        "bytes_per_step": "B",
        "bytes_per_rank": "B",
        "nccl_tests_bytes": "B",
        "busbw_bytes_per_step": "B",
        "unit_numel": "elements",
    },
)
