"""Turn each benchmark's rows into the few columns a reader needs, in a useful order.

Every kind has one declarative ``TableSpec``: the columns shown (the schema's own, or display columns derived
from them here) and how rows are ordered (least efficient first for GEMM and checkpoints, top bytes first for
traces). Which columns identify a row across runs (``--compare``) and which metrics are compared as
this / other come from the benchmark's declared schema; tests/test_report.py fails when the two disagree. Rows whose ``status`` is not ``ok`` never reach the main
table; they are returned separately so the report lists them with their error.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from opbench.core.collectives import collective_from_path
from opbench.core.dtypes import lookup as lookup_dtype
from opbench.core.schema import Schema
from opbench.core.units import human_bytes

from .discover import IMPLAUSIBLE, SCHEMAS, Discovery
from .identity import is_measured, missing_identity

Order = Callable[[pd.DataFrame], list[tuple[str, bool]]]


@dataclass(frozen=True)
class TableSpec:
    columns: tuple[str, ...]  # shown, in this order (absent ones are left out)
    derived: tuple[str, ...] = ()  # display columns made here from the schema's (DERIVE)
    key_map: tuple[tuple[str, str], ...] = ()  # schema key -> derived column compared across runs instead
    order: Order = lambda frame: []  # (column, ascending) pairs
    optional: tuple[str, ...] = ()  # shown only when they vary
    sparse: tuple[str, ...] = ()  # shown only when some row has a value
    split: str | None = None  # one table per value of this column
    about: str = ""  # one line under the section title: what the order means


@dataclass
class Table:
    title: str | None
    frame: pd.DataFrame  # display columns, sorted, at most --top rows
    hidden: int = 0  # rows beyond --top


@dataclass
class Section:
    kind: Schema
    files: list[str]
    tables: list[Table]
    failed: pd.DataFrame  # rows with status != ok: keys + status + error
    ok: pd.DataFrame  # all ok rows with derived columns (plots use these)
    notes: list[str] = field(default_factory=list)
    other_ok: pd.DataFrame | None = None  # --compare: the other run's ok rows of this kind, prepared alike


def _by(*cols: str, ascending: bool = True) -> Order:
    return lambda frame: [(c, ascending) for c in cols]


def _gemm_order(frame: pd.DataFrame) -> list[tuple[str, bool]]:
    """Least efficient first: % of peak where the device's peak is known, else TFLOPS."""
    metric = "pct_of_peak" if frame.get("pct_of_peak", pd.Series(dtype=float)).notna().any() else "tflops"
    return [(metric, True)]


_SHAPE = (
    "model",
    "batch_size",
    "seqlen_q",
    "seqlen_kv",
    "num_head_q",
    "num_head_kv",
    "head_dim_qk",
    "head_dim_v",
    "causal",
    "attn_kind",
    "window",
    "sinks",
    "dtype",
)

# opbench cluster: every per-GPU row says which GPU it is; host, model and UUID only matter when they differ.
_GPU = ("node", "local_rank", "rank", "host", "device_name", "device_id")
_GPU_OPTIONAL = ("host", "device_name")
_GPU_SPARSE = ("device_id",)  # the GPU's UUID, empty on a CPU
_READINGS = ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w", "power_limit_w")

SPECS: dict[str, TableSpec] = {
    "gemm": TableSpec(
        columns=(
            "model",
            "layer",
            "pass",
            "mbs",
            "m",
            "n",
            "k",
            "groups",
            "tp",
            "ep",
            "cp",
            "dtype",
            "backend",
            "time_ms",
            "tflops",
            "pct_of_peak",
        ),
        derived=("time_ms",),
        order=_gemm_order,
        optional=("groups", "tp", "ep", "cp"),
        about="Least efficient first: by % of peak where the device's peak is known, else by TFLOPS.",
    ),
    "attention": TableSpec(
        columns=(
            "model",
            "batch_size",
            "seqlen q/kv",
            "heads q/kv",
            "head_dim qk/v",
            "causal",
            "attn_kind",
            "window",
            "sinks",
            "tp",
            "cp",
            "dtype",
            "backend",
            "fwd_ms",
            "fwd_tflops",
            "bwd_ms",
            "bwd_tflops",
            "fwdbwd_ms",
        ),
        derived=("seqlen q/kv", "heads q/kv", "head_dim qk/v", "fwd_ms", "bwd_ms", "fwdbwd_ms"),
        order=lambda f: [(c, True) for c in _SHAPE] + [("fwd_tflops", False)],
        optional=("attn_kind", "window", "sinks", "tp", "cp"),
        about="Per shape, the fastest forward backend first. Times are medians; TFLOPS as docs/conventions.md "
        "counts them (causal masks count the visible half).",
    ),
    "moe": TableSpec(
        columns=(
            "model",
            "routing",
            "phase",
            "pass",
            "backend",
            "mbs",
            "seqlen",
            "tokens",
            "experts",
            "top_k",
            "dtype",
            "capacity_factor",
            "imbalance",
            "tokens_dropped",
            "time_ms",
            "tflops",
        ),
        derived=("time_ms",),
        order=_by("model", "routing", "phase", "pass", "backend"),
        optional=("mbs", "seqlen", "tokens", "experts", "top_k", "capacity_factor", "tokens_dropped"),
        about="Per routing, phase and pass, each expert-GEMM backend (phases that do not depend on it are timed "
        "once, backend eager); imbalance is the busiest expert's tokens over the mean.",
    ),
    "comm": TableSpec(
        columns=(
            "backend",
            "world_size",
            "nnodes",
            "dtype",
            "redop",
            "source",
            "cycle",
            "size",
            "size_bytes",
            "count",
            "inplace",
            "time_us",
            "time_us_max",
            "algbw_gbs",
            "busbw_gbs",
            "wrong",
            "tests_busbw_gbs",
            "busbw_vs_tests",
        ),
        derived=("size", "tests_busbw_gbs", "busbw_vs_tests"),
        order=_by("backend", "world_size", "nnodes", "dtype", "source", "cycle", "size_bytes", "inplace"),
        optional=("nnodes", "redop", "source", "cycle", "wrong"),
        sparse=("tests_busbw_gbs", "busbw_vs_tests"),
        split="collective",
        about="busbw per message size (nccl-tests semantics); tests_busbw_gbs is nccl-tests / rccl-tests' busbw "
        "for the same collective, size and variant when their parsed output is in the folder.",
    ),
    "nccl_tests": TableSpec(
        columns=(
            "type",
            "redop",
            "nranks",
            "size",
            "size_bytes",
            "count",
            "oop_time_us",
            "oop_busbw_gbs",
            "oop_wrong",
            "ip_time_us",
            "ip_busbw_gbs",
            "ip_wrong",
            "file",
        ),
        derived=("size",),
        order=_by("type", "redop", "nranks", "size_bytes"),
        optional=("redop", "nranks", "oop_wrong", "ip_wrong", "file"),
        split="collective",
        about="Parsed nccl-tests / rccl-tests output (oop = out-of-place, ip = in-place).",
    ),
    "fsdp": TableSpec(
        columns=(
            "model",
            "mode",
            "fsdp_version",
            "world_size",
            "replicate",
            "unit",
            "units",
            "collective",
            "count",
            "dtype",
            "nranks",
            "calls_per_step",
            "bytes_per_rank",
            "nccl_tests_bytes",
            "size",
            "bytes_per_step",
        ),
        derived=("units", "size"),
        optional=("mode", "fsdp_version", "world_size", "replicate", "units"),
        about="Per-rank NCCL counts per FSDP unit; identical layers are one row; nccl_tests_bytes is the -b value.",
    ),
    "trace": TableSpec(
        columns=(
            "op",
            "count",
            "dtype",
            "redop",
            "nranks",
            "calls",
            "bytes",
            "nccl_tests_bytes",
            "total_bytes",
            "total",
            "note",
        ),
        derived=("total",),
        order=lambda f: [("total_bytes" if "total_bytes" in f else "bytes", False)],
        optional=("note",),
        about="Distinct collectives of the logged job, most bytes first.",
    ),
    "trace_per_rank": TableSpec(
        columns=("rank", "host", "pid", "device", "globalrank", "op", "calls", "bytes", "distinct_sizes"),
        order=_by("bytes", ascending=False),
        optional=("rank", "globalrank"),
        about="Calls and bytes per logging process, most bytes first.",
    ),
    "trace_per_comm": TableSpec(
        columns=("comm", "nranks", "ranks_logged", "calls", "bytes", "ops"),
        order=_by("bytes", ascending=False),
        about="Calls and bytes per NCCL communicator, most bytes first.",
    ),
    "trace_fsdp": TableSpec(
        columns=(
            "unit",
            "collective",
            "count",
            "dtype",
            "redop",
            "nranks",
            "calls_per_step",
            "expected_log_calls",
            "log_calls",
            "log_dtype",
            "log_redop",
            "matched",
        ),
        order=_by("matched"),
        sparse=("redop", "log_redop"),
        about="Logged FSDP collectives against the FSDP model's prediction, mismatches first.",
    ),
    "ckpt": TableSpec(
        columns=(
            "model",
            "method",
            "async_type",
            "storage",
            "world_size",
            "thread_count",
            "async_save",
            "single_file_per_rank",
            "sync_files",
            "drop_cache",
            "num_saved",
            "size",
            "save_block_time",
            "save_total_time",
            "load_time",
            "save_bandwidth_mib_per_s",
            "load_bandwidth_mib_per_s",
            "pct_of_raw_save",
            "pct_of_raw_load",
            "slowest_save_rank",
            "accurate",
            "verified",
        ),
        derived=("size", "storage_kind"),
        key_map=(("storage", "storage_kind"),),
        optional=(
            "async_type",
            "single_file_per_rank",
            "sync_files",
            "drop_cache",
            "pct_of_raw_save",
            "pct_of_raw_load",
            "slowest_save_rank",
        ),
        order=_by("save_bandwidth_mib_per_s"),
        about="Slowest save first; bandwidths are MiB/s (Primus calls them *_in_mbps), times are seconds.",
    ),
    "selftest": TableSpec(
        columns=("area", "backend", "device", "dtype", "correct", "max_error", "tolerance", "tflops", "gbs"),
        order=_by("area", "backend"),
        sparse=("tflops", "gbs"),
        about="Backends that ran and gave the right answer; wrong and unavailable ones are listed below it.",
    ),
    "cluster_compute": TableSpec(
        columns=(
            *_GPU,
            "m",
            "n",
            "k",
            "dtype",
            "time_ms",
            "tflops",
            "pct_of_peak",
            "pct_of_best_matmul",
            "vs_median_pct",
            "outlier",
            "max_rel_err",
        ),
        derived=("time_ms",),
        order=_gemm_order,
        optional=(*_GPU_OPTIONAL, "dtype", "outlier"),
        sparse=(*_GPU_SPARSE, "pct_of_peak", "pct_of_best_matmul"),
        split="gemm",
        about="One table per GEMM, slowest GPU first (by % of peak where the device's peak is known, else by "
        "TFLOPS); vs_median_pct is the GPU against its peers' median. The heatmap places every GPU at its node and "
        "local rank; a GPU without a result is a blank cell. The pass/fail verdict and its findings are in "
        "cluster_summary.md beside the CSVs.",
    ),
    "cluster_memory": TableSpec(
        columns=(*_GPU, "size", "time_ms", "gbs", "pct_of_peak", "vs_median_pct", "outlier"),
        derived=("size", "time_ms"),
        order=_by("size_bytes", "gbs"),
        optional=(*_GPU_OPTIONAL, "outlier"),
        sparse=(*_GPU_SPARSE, "pct_of_peak"),
        split="kernel",
        about="One table per STREAM kernel (copy, triad), slowest GPU first; gbs counts the bytes read and written.",
    ),
    "cluster_telemetry": TableSpec(
        columns=(*_GPU, "phase", "source", *_READINGS, "throttle", "throttle_flagged", "error"),
        order=_by("throttle_flagged", "node", "local_rank"),
        optional=_GPU_OPTIONAL,
        sparse=(*_GPU_SPARSE, "source", *_READINGS, "throttle", "throttle_flagged", "error"),
        about="Each GPU's clocks, temperature and power before and after the checks; GPUs with a throttle reason "
        "that costs performance (throttle_flagged) first. Where a reading is empty, error says why.",
    ),
    "cluster_comm": TableSpec(
        columns=(
            "scope",
            "group",
            "nodes",
            "nranks",
            "dtype",
            "size",
            "size_bytes",
            "count",
            "time_us",
            "algbw_gbs",
            "busbw_gbs",
            "pct_of_link_peak",
            "vs_median_pct",
            "outlier",
            "slowest_rank",
            "slowest_share",
            "rank_spread_us",
        ),
        derived=("size",),
        order=_by("scope", "size_bytes", "busbw_gbs"),
        optional=("dtype", "outlier"),
        sparse=("pct_of_link_peak",),
        split="collective",
        about="busbw per group inside each node (intra), across nodes per rail (inter) and over all ranks (world); "
        "per scope and size the slowest group first. time_us is the slowest rank's median; slowest_rank is the "
        "rank last most often (slowest_share of the iterations), rank_spread_us how far the slow ranks' medians "
        "sit above the typical rank's.",
    ),
    "cluster_pairs": TableSpec(
        columns=(
            "src",
            "dst",
            "nranks",
            "size",
            "size_bytes",
            "time_us",
            "gbs_per_gpu",
            "gbs_total",
            "pct_of_link_peak",
            "vs_median_pct",
            "outlier",
        ),
        derived=("size",),
        order=_by("size_bytes", "gbs_per_gpu"),
        optional=("nranks", "outlier"),
        sparse=("pct_of_link_peak",),
        split="scope",
        about="Point-to-point bandwidth per ordered pair, slowest first: node to node (inter, every GPU of src "
        "sending to its peer on dst at once) and GPU to GPU inside a node (gpu, with --gpu-pairs). The heatmaps "
        "put src in rows and dst in columns; a pair not measured is a blank cell.",
    ),
    "project": TableSpec(
        columns=(
            "model",
            "rank",
            "layout",
            "world_size",
            "global_batch",
            "seqlen",
            "step_time_s",
            "tokens_per_s",
            "mfu",
            "compute_s",
            "exposed_comm_s",
            "bubble_s",
            "optimizer_s",
            "mem_total_gib",
            "fits",
            "estimated_share",
        ),
        order=_by("model", "rank"),
        optional=("model", "rank", "world_size", "global_batch", "seqlen"),
        sparse=("rank", "mfu"),
        about="Projected steps (opbench project), best first in a search; estimated_share is the part of the step "
        "timed from the peak table rather than from measured rows. The bars split each step by where it goes.",
    ),
    "project_validate": TableSpec(
        columns=("model", "layout", "world_size", "quantity", "projected", "measured", "ratio"),
        order=_by("model", "world_size"),
        optional=("model",),
        about="The projection against real training steps on the machine that ran opbench project --validate.",
    ),
    "step": TableSpec(
        columns=(
            "trace",
            "rank",
            "item",
            "measured_s",
            "share",
            "exposed_s",
            "overlapped_s",
            "projected_s",
            "measured_over_projected",
            "note",
        ),  # fmt: skip
        optional=("trace",),
        sparse=("exposed_s", "overlapped_s", "projected_s", "measured_over_projected", "note"),
        about="A profiled step cut into line items (opbench step): the classes add up to the step; beside the "
        "projection of the same layout where one was asked for.",
    ),
    "step_kernels": TableSpec(
        columns=(
            "trace",
            "rank",
            "class",
            "kind",
            "name",
            "m",
            "n",
            "k",
            "dtype",
            "bytes",
            "calls",
            "time_s",
            "share",
            "tflops",
            "measured_over_projected",
        ),  # fmt: skip
        order=lambda frame: [("rank", True), ("time_s", False)],
        optional=("trace",),
        sparse=("m", "n", "k", "dtype", "bytes", "tflops", "measured_over_projected"),
        about="Each kernel (a CPU trace: each operator) of a profiled step, most time first.",
    ),
    "step_timeline": TableSpec(
        columns=("trace", "rank", "step", "lane", "class", "start_s", "end_s"),
        order=_by("rank", "lane", "start_s"),
        optional=("trace", "step"),
        about="One step's pieces per stream (the lane 'step': the step's own cut, one line item per instant), "
        "seconds from the step's start; the picture below draws them.",
    ),
}
assert set(SPECS) == set(SCHEMAS)
ALWAYS_DERIVED = ("file",)  # Discovery.frame adds the file each row came from


def keys_of(kind: str) -> tuple[str, ...]:
    """The schema's key columns, with the spec's substitutes (ckpt compares storage kinds, not paths)."""
    swap = dict(SPECS[kind].key_map)
    return tuple(swap.get(k, k) for k in SCHEMAS[kind].keys)


def metrics_of(kind: str) -> tuple[str, ...]:
    return tuple(SCHEMAS[kind].metrics)


# ---- small helpers -----------------------------------------------------------------------------------------


def ok_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "ok"] if "status" in frame else frame


def failed_rows(frame: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Rows that were not measured (unsupported, oom, error, planned …), with what identifies them."""
    if "status" not in frame:
        return frame.iloc[0:0]
    spec = SPECS[kind]
    bad = frame[frame["status"] != "ok"]
    keys = tuple(
        c for c in SCHEMAS[kind].keys if c in bad and (c not in spec.optional or bad[c].nunique(dropna=True) > 1)
    )
    cols = [*keys, *(c for c in ("status", "error", "file") if c in bad)]
    return bad[cols].assign(status=bad["status"].fillna("(missing)"))


def _joined(frame: pd.DataFrame, a: str, b: str) -> pd.Series:
    """'16/8' from two integer columns (keeps wide shape tables narrow)."""
    return frame[a].map(cell) + "/" + frame[b].map(cell)


def _storage_kind(url: object) -> str:
    match = re.match(r"^([a-z][a-z0-9+.-]*)://", str(url))
    return match.group(1) if match else "local"


# ---- derived columns ---------------------------------------------------------------------------------------


def _with_time_ms(f: pd.DataFrame) -> pd.DataFrame:
    return f.assign(time_ms=f["time_s"] * 1e3)


def _derive_attention(f: pd.DataFrame) -> pd.DataFrame:
    out = f.assign(
        **{
            "seqlen q/kv": _joined(f, "seqlen_q", "seqlen_kv"),
            "heads q/kv": _joined(f, "num_head_q", "num_head_kv"),
            "head_dim qk/v": _joined(f, "head_dim_qk", "head_dim_v"),
        }
    )
    for p in ("fwd", "bwd", "fwdbwd"):
        if f"{p}_time" in f:
            out[f"{p}_ms"] = f[f"{p}_time"] * 1e3
    return out


def _with_size(f: pd.DataFrame, column: str) -> pd.DataFrame:
    return f.assign(size=f[column].map(human_bytes)) if column in f else f


def _derive_trace(f: pd.DataFrame) -> pd.DataFrame:
    return f.assign(total=f["total_bytes"].map(human_bytes)) if "total_bytes" in f else f


def _derive_fsdp(f: pd.DataFrame) -> pd.DataFrame:
    """Identical layers collapse into one row (``layers.0-79``), as the FSDP console table does."""
    from opbench.fsdp_model.model import unit_range

    same = [c for c in f.columns if c not in ("unit", "unit_numel", "file", "bytes_per_step", "busbw_bytes_per_step")]
    rows = []
    for _, group in f.assign(_root=f["unit"] == "root").groupby(same + ["_root"], sort=False, dropna=False):
        row = group.iloc[0].drop("_root").to_dict()
        row.update(unit=unit_range([str(u) for u in group["unit"]]), units=len(group))
        if "bytes_per_step" in group:
            row["bytes_per_step"] = group["bytes_per_step"].sum()
        rows.append(row)
    return _with_size(pd.DataFrame(rows), "nccl_tests_bytes")


def _derive_nccl_tests(f: pd.DataFrame) -> pd.DataFrame:
    known = f["collective"] if "collective" in f else pd.Series(None, index=f.index, dtype=object)
    guessed = f.apply(lambda r: collective_from_path(r.get("source", ""), r.get("file", "")), axis=1)
    return _with_size(f, "size_bytes").assign(collective=known.where(known.notna(), guessed).fillna("(unknown)"))


def _dtype_enum(name: object) -> float:
    found = lookup_dtype(str(name))
    return found.nccl_enum if found is not None else math.nan


def attach_tests(comm: pd.DataFrame, tests: pd.DataFrame) -> pd.DataFrame:
    """nccl-tests / rccl-tests busbw beside opbench's, matched on collective + size (+ dtype when both name
    one): in-place rows take the tests' in-place busbw, out-of-place rows the out-of-place one."""
    if comm.empty or tests.empty or "collective" not in tests:
        return comm
    t = tests.assign(_dt=tests["type"].map(_dtype_enum))
    long = pd.concat(
        [
            t.assign(inplace=flag, tests_busbw_gbs=t[col])
            for flag, col in ((True, "ip_busbw_gbs"), (False, "oop_busbw_gbs"))
        ]
    )
    long = long.dropna(subset=["tests_busbw_gbs"])
    long = long.assign(collective=long["collective"].astype(str))  # a hand-made '2' must not stop the merge
    left = comm.assign(
        _dt=comm["dtype"].map(_dtype_enum),
        inplace=comm["inplace"].astype(bool),
        collective=comm["collective"].astype(str),
    )
    keys = ["collective", "size_bytes", "inplace"] + (["_dt"] if long["_dt"].notna().all() else [])
    long = long.drop_duplicates(keys, keep="last")[keys + ["tests_busbw_gbs"]]
    merged = left.merge(long, on=keys, how="left").drop(columns="_dt")
    merged["busbw_vs_tests"] = merged["busbw_gbs"] / merged["tests_busbw_gbs"]
    return merged


DERIVE: dict[str, Callable[[pd.DataFrame], pd.DataFrame]] = {
    "gemm": _with_time_ms,
    "moe": _with_time_ms,
    "attention": _derive_attention,
    "comm": lambda f: _with_size(f, "size_bytes"),
    "nccl_tests": _derive_nccl_tests,
    "trace": _derive_trace,
    "fsdp": _derive_fsdp,
    "ckpt": lambda f: _with_size(f, "iter_folder_size").assign(storage_kind=f["storage"].map(_storage_kind)),
    "cluster_compute": _with_time_ms,
    "cluster_memory": lambda f: _with_time_ms(_with_size(f, "size_bytes")),
    "cluster_comm": lambda f: _with_size(f, "size_bytes"),
    "cluster_pairs": lambda f: _with_size(f, "size_bytes"),
}


def prepared(found: Discovery, kind: str) -> pd.DataFrame:
    """ok rows of one kind with the derived display columns (and nccl-tests busbw beside comm rows)."""
    frame = ok_rows(found.frame(kind))
    if frame.empty:
        return frame
    frame = DERIVE.get(kind, lambda f: f)(frame.reset_index(drop=True))
    if kind == "comm":
        frame = attach_tests(frame, prepared(found, "nccl_tests"))
    return frame


def fsdp_step_totals(ok: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Calls and bytes per training step by collective (sums of the per-unit rows)."""
    if "bytes_per_step" not in ok:
        return []
    calls = ok.assign(_calls=ok["calls_per_step"] * ok.get("units", 1))
    group = [c for c in ("model", "mode", "fsdp_version", "world_size", "replicate", "collective") if c in ok]
    totals = calls.groupby(group, sort=False, dropna=False).agg(
        calls_per_step=("_calls", "sum"), bytes_per_step=("bytes_per_step", "sum")
    )
    totals = totals.reset_index()
    totals["size_per_step"] = totals["bytes_per_step"].map(human_bytes)
    shown = [
        c
        for c in totals
        if c not in ("mode", "fsdp_version", "world_size", "replicate") or totals[c].nunique(dropna=True) > 1
    ]
    return [("Per training step", totals[shown])]


EXTRA_TABLES: dict[str, Callable[[pd.DataFrame], list[tuple[str, pd.DataFrame]]]] = {"fsdp": fsdp_step_totals}


# ---- --compare ---------------------------------------------------------------------------------------------


def _key_text(value: object) -> str:
    """One canonical text per key value, so 1, 1.0 and '1' match and a missing value matches a missing one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer():
        return str(int(float(value)))
    return str(value)


def compare(this: pd.DataFrame, other: pd.DataFrame, kind: str) -> tuple[pd.DataFrame, int]:
    """Add ``<metric>_other`` and ``<metric>_ratio`` (this / other) for rows matched on the schema's keys;
    returns the frame and how many of the other run's rows found no partner."""
    keys = [k for k in keys_of(kind) if k in this or k in other]
    metrics = [m for m in metrics_of(kind) if m in this and m in other]
    if this.empty or not metrics:
        return this, 0
    kcols = [f"_k_{k}" for k in keys]
    right = keyed(other, keys).drop_duplicates(kcols, keep="last")[kcols + metrics]
    right = right.rename(columns={m: f"{m}_other" for m in metrics})
    merged = keyed(this, keys).merge(right, on=kcols, how="left")
    for m in metrics:
        merged[f"{m}_ratio"] = merged[m] / merged[f"{m}_other"].where(merged[f"{m}_other"] != 0)
    unmatched = len(right) - int(right.merge(keyed(this, keys)[kcols].drop_duplicates(), on=kcols).shape[0])
    return merged.drop(columns=kcols), unmatched


def keyed(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The frame with one ``_k_<key>`` column of canonical key text per key, for matching rows across runs."""
    cols = {f"_k_{k}": (frame[k] if k in frame else pd.Series("", index=frame.index)).map(_key_text) for k in keys}
    return frame.assign(**cols)


def compare_columns(kind: str, frame: pd.DataFrame) -> tuple[str, ...]:
    """The spec's columns with each compared metric followed by its other-run value and ratio."""
    out: list[str] = []
    for c in SPECS[kind].columns:
        out.append(c)
        if c in metrics_of(kind) and f"{c}_ratio" in frame:
            out += [f"{c}_other", f"{c}_ratio"]
    return tuple(out)


# ---- tables ------------------------------------------------------------------------------------------------


def visible_columns(frame: pd.DataFrame, columns: tuple[str, ...], spec: TableSpec) -> list[str]:
    """Columns present in the frame; optional ones only when they vary, sparse ones only when filled somewhere."""
    return [
        c
        for c in columns
        if c in frame
        and (c not in spec.optional or frame[c].nunique(dropna=True) > 1)
        and (c not in spec.sparse or frame[c].notna().any())
    ]


def with_identity(frame: pd.DataFrame, kind: str, shown: list[str]) -> list[str]:
    """The shown columns plus every identity column (identity.IDENTITY) whose values differ among the rows but
    that the spec left out, each before the first measured column: two rows that are different measurements
    never look like duplicates."""
    extra = missing_identity(SCHEMAS[kind], frame, shown)
    if not extra:
        return shown
    at = next((i for i, c in enumerate(shown) if is_measured(SCHEMAS[kind], c)), len(shown))
    return [*shown[:at], *extra, *shown[at:]]


def sorted_table(
    frame: pd.DataFrame,
    spec: TableSpec,
    columns: tuple[str, ...],
    title: str | None,
    top: int | None,
    kind: str | None = None,
) -> Table:
    order = [(c, asc) for c, asc in spec.order(frame) if c in frame]
    if order:
        frame = frame.sort_values(
            [c for c, _ in order], ascending=[a for _, a in order], kind="stable", na_position="last"
        )
    visible = visible_columns(frame, columns, spec)
    shown = frame[with_identity(frame, kind, visible) if kind is not None else visible]
    hidden = max(0, len(shown) - top) if top else 0
    return Table(title, shown.head(top) if top else shown, hidden)


def build_section(found: Discovery, kind: str, top: int | None, other: Discovery | None = None) -> Section | None:
    files = [f.rel for f in found.of_kind(kind)]
    if not files:
        return None
    spec = SPECS[kind]
    ok = prepared(found, kind)
    section = Section(SCHEMAS[kind], files, [], failed_rows(found.frame(kind), kind), ok)
    aside = sum(d.why == IMPLAUSIBLE for f in found.of_kind(kind) for d in f.dropped)
    if aside:  # never silently: how many, and where each is named
        section.notes.append(
            f"{aside} row(s) set aside: a value outside its plausible range (docs/conventions.md, 'Plausible "
            "numbers'); each is named under Rows left out."
        )
    columns = spec.columns
    if other is not None and metrics_of(kind):
        if other.of_kind(kind):
            section.other_ok = prepared(other, kind)
            ok, unmatched = compare(ok, section.other_ok, kind)
            columns = compare_columns(kind, ok)
            if unmatched:
                section.notes.append(f"{unmatched} row(s) of the other run have no match in this run.")
        else:
            section.notes.append("The other run has no results of this kind to compare with.")
    if ok.empty:
        section.notes.append("No successful rows.")
        return section
    if spec.split and spec.split in ok:
        for value, part in ok.groupby(spec.split, sort=True):
            section.tables.append(sorted_table(part, spec, columns, str(value), top, kind))
    else:
        section.tables.append(sorted_table(ok, spec, columns, None, top, kind))
    section.tables += [Table(title, frame) for title, frame in EXTRA_TABLES.get(kind, lambda f: [])(ok)]
    noisy = noisy_rows(ok, kind)
    if not noisy.empty:
        section.notes.append(
            f"{len(noisy)} row(s) are noisy: their spread (IQR / median) stayed above the stop rule's limit "
            "until the time budget ran out; rerun them on a quieter machine or with a larger --budget."
        )
        section.tables.append(Table("Noisy rows", noisy))
    return section


def noisy_rows(ok: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Measured rows whose note says the timing was noisy (core.timing), with what identifies them."""
    if "note" not in ok:
        return ok.iloc[0:0]
    bad = ok[ok["note"].astype(str).str.contains("noisy", na=False)]
    keys = [c for c in SCHEMAS[kind].keys if c in bad and bad[c].nunique(dropna=True) > 1]
    return bad[[*(keys or [c for c in SCHEMAS[kind].keys if c in bad][:3]), "note"]]


def build_sections(found: Discovery, top: int | None = None, other: Discovery | None = None) -> list[Section]:
    """One section per kind present, in SCHEMAS order."""
    return [s for kind in SCHEMAS if (s := build_section(found, kind, top, other)) is not None]


# ---- cell formatting ---------------------------------------------------------------------------------------


def cell(value: object) -> str:
    """4 significant digits for floats (whole numbers and values from 10⁴ to 10²⁰ without exponent), integers in
    full up to 20 digits, ``inf``/``-inf`` as such, empty for a missing value (never a fake zero)."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, numbers.Integral):
        whole = int(value)
        if abs(whole) < 10**20:
            return str(whole)
        try:  # an integer of hundreds of digits (a Python int from a hand-made CSV): 4 significant digits
            return f"{float(whole):.4g}"
        except OverflowError:
            return "-1e308+" if whole < 0 else "1e308+"
    if isinstance(value, numbers.Real):
        v = float(value)
        if math.isnan(v):  # a NaN of another float type (numpy float32)
            return ""
        if not math.isfinite(v) or abs(v) >= 1e20:  # inf, and no 300-digit cell for 1e300 from a hand-made CSV
            return f"{v:.4g}"
        return f"{v:.0f}" if v.is_integer() or abs(v) >= 1e4 else f"{v:.4g}"
    return str(value)
