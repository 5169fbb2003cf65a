"""The CSV schema of ``opbench comm`` (one ``<collective>_benchmark.csv`` per collective). No torch import."""

from opbench.core.schema import Schema

SCHEMA = Schema(
    benchmark="comm", title="Collectives", version=1,
    columns=("collective", "backend", "world_size", "nnodes", "nranks", "dtype", "redop", "root", "size_bytes",
             "count", "inplace", "pattern", "iters", "trials", "time_us", "time_us_max", "time_us_trial_min",
             "time_us_trial_max", "algbw_gbs", "busbw_gbs", "wrong", "source", "status", "error"),
    keys=("collective", "backend", "world_size", "nnodes", "dtype", "redop", "source", "size_bytes", "inplace"),
    metrics={"busbw_gbs": "GB/s"},
    signature=("collective", "backend", "world_size", "size_bytes", "count", "inplace", "time_us", "algbw_gbs",
               "busbw_gbs"),
    file_hint=r"_benchmark$",
    units={"size_bytes": "B", "time_us": "µs", "algbw_gbs": "GB/s", "time_us_max": "µs", "time_us_trial_min": "µs", "time_us_trial_max": "µs"},
)
