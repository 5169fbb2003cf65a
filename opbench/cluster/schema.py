"""The CSV schemas of ``opbench cluster``: one file per check. No torch import."""

from opbench.core.schema import Schema

# Every per-rank row says which GPU it is: the host, the launcher's node, the rank, and the device's own id.
IDENTITY = ("host", "node", "rank", "local_rank", "device_name", "device_id")
VERDICT = ("vs_median_pct", "outlier", "status", "error")
# vs_median_pct is (x / median - 1) · 100: below 0 for a slow GPU (docs/conventions.md, "Plausible numbers")
VERDICT_KINDS = {"vs_median_pct": "deviation"}

COMPUTE = Schema(
    benchmark="cluster_compute",
    title="Cluster: GEMM throughput per GPU",
    version=1,
    columns=(
        *IDENTITY,
        "gemm",
        "m",
        "n",
        "k",
        "dtype",
        "time_s",
        "time_iqr_rel",
        "tflops",
        "pct_of_peak",
        "pct_of_best_matmul",
        "max_rel_err",
        *VERDICT,
    ),
    keys=("node", "local_rank", "gemm", "dtype"),
    metrics={"tflops": "TFLOP/s"},
    signature=("node", "local_rank", "gemm", "tflops"),
    file_hint=r"^cluster_compute$",
    units={"time_s": "s", "pct_of_peak": "%", "pct_of_best_matmul": "%", "vs_median_pct": "%"},
    kinds=VERDICT_KINDS,
)

MEMORY = Schema(
    benchmark="cluster_memory",
    title="Cluster: device-memory bandwidth per GPU",
    version=1,
    columns=(
        *IDENTITY,
        "kernel",
        "size_bytes",
        "bytes_moved",
        "time_s",
        "time_iqr_rel",
        "gbs",
        "pct_of_peak",
        *VERDICT,
    ),
    keys=("node", "local_rank", "kernel", "size_bytes"),
    metrics={"gbs": "GB/s"},
    signature=("node", "local_rank", "kernel", "gbs"),
    file_hint=r"^cluster_memory$",
    units={"size_bytes": "B", "bytes_moved": "B", "time_s": "s", "pct_of_peak": "%", "vs_median_pct": "%"},
    kinds={**VERDICT_KINDS, "time_iqr_rel": "ratio"},
)

TELEMETRY = Schema(
    benchmark="cluster_telemetry",
    title="Cluster: GPU clocks, temperature, power and throttling",
    version=1,
    columns=(
        *IDENTITY,
        "phase",
        "source",
        "sm_clock_mhz",
        "mem_clock_mhz",
        "temperature_c",
        "power_w",
        "power_limit_w",
        "throttle",
        "throttle_flagged",
        "error",
    ),
    keys=("node", "local_rank", "phase"),
    metrics={"sm_clock_mhz": "MHz"},
    signature=("node", "local_rank", "phase", "throttle"),
    file_hint=r"^cluster_telemetry$",
    units={"mem_clock_mhz": "MHz", "temperature_c": "°C", "power_w": "W", "power_limit_w": "W"},
)

COMM = Schema(
    benchmark="cluster_comm",
    title="Cluster: collectives inside nodes, across nodes and over the world",
    version=1,
    columns=(
        "scope",
        "group",
        "nodes",
        "nranks",
        "collective",
        "dtype",
        "size_bytes",
        "count",
        "iters",
        "time_us",
        "slowest_p95_us",
        "slowest_rank",
        "slowest_share",
        "rank_spread_us",
        "algbw_gbs",
        "busbw_gbs",
        "link_peak_gbs",
        "pct_of_link_peak",
        *VERDICT,
    ),
    keys=("scope", "group", "collective", "dtype", "size_bytes"),
    metrics={"busbw_gbs": "GB/s"},
    signature=("scope", "group", "collective", "busbw_gbs", "slowest_rank"),
    file_hint=r"^cluster_comm$",
    units={
        "size_bytes": "B",
        "time_us": "µs",
        "slowest_p95_us": "µs",
        "rank_spread_us": "µs",
        "algbw_gbs": "GB/s",
        "link_peak_gbs": "GB/s",
        "pct_of_link_peak": "%",
        "vs_median_pct": "%",
    },
    kinds={**VERDICT_KINDS, "rank_spread_us": "time_part", "slowest_share": "fraction"},
)

PAIRS = Schema(
    benchmark="cluster_pairs",
    title="Cluster: point-to-point bandwidth between nodes (and GPUs)",
    version=1,
    columns=(
        "scope",
        "src",
        "dst",
        "round",
        "nranks",
        "size_bytes",
        "iters",
        "time_us",
        "gbs_per_gpu",
        "gbs_total",
        "link_peak_gbs",
        "pct_of_link_peak",
        *VERDICT,
    ),
    keys=("scope", "src", "dst", "size_bytes"),
    metrics={"gbs_per_gpu": "GB/s"},
    signature=("scope", "src", "dst", "gbs_per_gpu"),
    file_hint=r"^cluster_pairs$",
    units={
        "size_bytes": "B",
        "time_us": "µs",
        "gbs_total": "GB/s",
        "link_peak_gbs": "GB/s",
        "pct_of_link_peak": "%",
        "vs_median_pct": "%",
    },
    kinds=VERDICT_KINDS,
)

SCHEMAS = {"compute": COMPUTE, "memory": MEMORY, "telemetry": TELEMETRY, "comm": COMM, "pairs": PAIRS}


def file_name(kind: str) -> str:
    return f"cluster_{kind}.csv"
