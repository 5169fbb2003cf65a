"""The CSV schema of ``opbench ckpt`` (``ckpt_benchmark.csv``), Primus' metric names. No torch import."""

from opbench.core.schema import Schema

SCHEMA = Schema(
    benchmark="ckpt", title="Checkpoint", version=1,
    columns=("model", "num_layers", "optimizer", "param_dtype", "state_bytes",
             "method", "storage", "world_size", "thread_count", "async_save", "async_type",
             "single_file_per_rank", "sync_files", "drop_cache", "num_saved", "num_loaded",
             "save_block_time", "save_total_time", "load_time",
             "save_block_time_max", "save_total_time_min", "save_total_time_max", "load_time_min", "load_time_max",
             "iter_folder_size", "save_bandwidth_in_mbps", "load_bandwidth_in_mbps",
             "accurate", "verified", "status", "error"),
    keys=("model", "method", "async_type", "storage", "world_size", "thread_count", "async_save",
          "single_file_per_rank", "sync_files", "drop_cache"),
    metrics={"save_bandwidth_in_mbps": "MiB/s", "load_bandwidth_in_mbps": "MiB/s"},
    signature=("method", "storage", "world_size", "thread_count", "save_block_time", "save_total_time", "load_time",
               "iter_folder_size", "save_bandwidth_in_mbps", "load_bandwidth_in_mbps"),
    file_hint="ckpt",
    units={"save_block_time": "s", "save_total_time": "s", "load_time": "s", "state_bytes": "B",
           "iter_folder_size": "B", "save_block_time_max": "s", "save_total_time_min": "s",
           "save_total_time_max": "s", "load_time_min": "s", "load_time_max": "s"},
)
