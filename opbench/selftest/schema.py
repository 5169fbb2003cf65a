"""The CSV schema of ``opbench selftest`` (``selftest.csv``). No torch import."""

from opbench.core.schema import Schema

SCHEMA = Schema(
    benchmark="selftest",
    title="Self-test",
    version=1,
    columns=(
        "area",  # gemm, attention, comm, ckpt
        "backend",
        "device",
        "dtype",
        "available",
        "correct",  # empty when the backend could not run
        "max_error",  # relative error against the reference (wrong elements for comm)
        "tolerance",
        "tflops",
        "gbs",
        "seconds",  # wall time of the whole check
        "status",  # ok, unsupported (not available here), error (wrong answer or crash)
        "error",  # why not available / what was wrong / how it ran
    ),
    keys=("area", "backend", "device", "dtype"),
    metrics={"tflops": "TFLOPS", "gbs": "GB/s"},
    units={"seconds": "s"},
)
