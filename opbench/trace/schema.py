"""CSV schemas of ``opbench trace`` (summary, per rank, per communicator, FSDP comparison) and of
``opbench nccl-tests``. No torch import."""

from opbench.core.schema import Schema

TRACE = Schema(
    benchmark="trace",
    title="NCCL trace summary",
    version=2,  # 2: dtype holds opbench names (bf16)
    columns=(
        "op",
        "collective",
        "count",
        "datatype",
        "dtype",
        "redop",
        "nranks",
        "calls",
        "bytes",
        "nccl_tests_bytes",
        "total_bytes",
        "note",
    ),
    keys=("op", "count", "datatype", "redop", "nranks"),
    metrics={"calls": "calls"},
    signature=("op", "count", "datatype", "dtype", "redop", "nranks", "calls", "bytes", "nccl_tests_bytes"),
    file_hint=r"trace|nccl|sizes",
    units={"bytes": "B", "nccl_tests_bytes": "B", "total_bytes": "B"},
)

TRACE_PER_RANK = Schema(
    benchmark="trace_per_rank",
    title="NCCL trace per rank",
    version=1,
    columns=("rank", "host", "pid", "device", "globalrank", "op", "calls", "bytes", "distinct_sizes"),
    keys=("host", "pid", "device", "op"),
    metrics={"bytes": "B"},
    signature=("host", "pid", "device", "op", "calls", "bytes", "distinct_sizes"),
    file_hint=r"per_rank",
)

TRACE_PER_COMM = Schema(
    benchmark="trace_per_comm",
    title="NCCL trace per communicator",
    version=1,
    columns=("comm", "commid", "nranks", "ranks_logged", "calls", "bytes", "ops"),
    keys=("comm", "nranks"),
    metrics={},
    signature=("comm", "nranks", "ranks_logged", "calls", "bytes", "ops"),
    units={"bytes": "B"},
    file_hint=r"per_comm",
)

TRACE_FSDP = Schema(
    benchmark="trace_fsdp",
    title="NCCL trace vs FSDP model",
    # 2: collective holds opbench names; 3: redop/log_redop, matched = count, dtype and reduction agree;
    # 4: expected_log_calls (calls per step × steps × ranks), matched also needs log_calls == expected_log_calls
    version=4,
    columns=(
        "unit",
        "collective",
        "count",
        "dtype",
        "redop",
        "nranks",
        "calls_per_step",
        "nccl_tests_bytes",
        "expected_log_calls",
        "log_calls",
        "log_dtype",
        "log_redop",
        "matched",
        "steps_in_log",
    ),
    keys=("unit", "collective", "dtype", "nranks"),
    metrics={},
    signature=("unit", "collective", "count", "calls_per_step", "log_calls", "matched"),
    file_hint=r"fsdp",
    units={"nccl_tests_bytes": "B"},
)

NCCL_TESTS = Schema(
    benchmark="nccl_tests",
    title="nccl-tests / rccl-tests",
    version=2,  # 2: -I per-iteration summary (*_iter_*) and note (values left empty: not finite or out of range)
    columns=(
        "collective",
        "size_bytes",
        "count",
        "type",
        "redop",
        "root",
        "oop_time_us",
        "oop_algbw_gbs",
        "oop_busbw_gbs",
        "oop_wrong",
        "ip_time_us",
        "ip_algbw_gbs",
        "ip_busbw_gbs",
        "ip_wrong",
        "avg_busbw",
        "nranks",
        "wrong_kind",
        "source",
        "oop_iter_min_us",
        "oop_iter_max_us",
        "oop_iter_p99_us",
        "oop_iter_cv_pct",
        "ip_iter_min_us",
        "ip_iter_max_us",
        "ip_iter_p99_us",
        "ip_iter_cv_pct",
        "note",
    ),
    keys=("collective", "size_bytes", "type", "redop", "nranks"),
    metrics={"oop_busbw_gbs": "GB/s", "ip_busbw_gbs": "GB/s"},
    signature=("size_bytes", "count", "type", "oop_time_us", "oop_busbw_gbs", "ip_time_us", "ip_busbw_gbs"),
    file_hint=r"nccl|rccl",
    units={
        "size_bytes": "B",
        "oop_time_us": "µs",
        "ip_time_us": "µs",
        "oop_algbw_gbs": "GB/s",
        "ip_algbw_gbs": "GB/s",
        "avg_busbw": "GB/s",
        "oop_iter_min_us": "µs",
        "oop_iter_max_us": "µs",
        "oop_iter_p99_us": "µs",
        "oop_iter_cv_pct": "%",
        "ip_iter_min_us": "µs",
        "ip_iter_max_us": "µs",
        "ip_iter_p99_us": "µs",
        "ip_iter_cv_pct": "%",
    },
)
