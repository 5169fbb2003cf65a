"""The CSV schema of ``opbench gemm`` (``benchmark_gemm_<model>.csv``). No torch import."""

from opbench.core.schema import Schema

SCHEMA = Schema(
    benchmark="gemm", title="GEMM", version=1,
    columns=("model", "layer", "pass", "mbs", "m", "n", "k", "groups", "transA", "transB", "dtype", "backend", "impl",
             "time_s", "time_min_s", "time_p10_s", "time_p90_s", "time_max_s", "time_std_s", "iters", "tflops",
             "bandwidth_gbs", "pct_of_peak", "max_rel_err", "status", "error", "seqlen", "tp", "ep", "cp", "device"),
    keys=("model", "layer", "pass", "mbs", "m", "n", "k", "groups", "dtype", "backend", "tp", "ep", "cp"),
    metrics={"tflops": "TFLOP/s"},
    signature=("model", "layer", "pass", "m", "n", "k", "groups", "backend", "time_s", "tflops", "pct_of_peak",
               "status"),
    file_hint=r"^benchmark_gemm_",
    units={"time_s": "s", "pct_of_peak": "%", "bandwidth_gbs": "GB/s", "time_min_s": "s", "time_p10_s": "s", "time_p90_s": "s", "time_max_s": "s", "time_std_s": "s"},
)
