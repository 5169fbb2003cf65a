"""How long each piece of a step takes on the target hardware: looked up in opbench CSVs measured there, interpolated
from the nearest measured row, or, where no CSV covers it, estimated from a stated roofline (docs/project.md,
"Rates"). Every answer says which of the three it is and where it came from. Torch-free (pandas reads the CSVs).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from opbench.attention.flops import MATMUL_PASS_MULTIPLIER, attention_flops, hc_bytes, scan_bytes
from opbench.attention.schema import PASSES
from opbench.attention.shapes import AttentionShape
from opbench.cluster.links import Link, intra_link, nic_gbs_of
from opbench.core.cli import MAX_MIB, MAX_WORLD
from opbench.core.collectives import COLLECTIVES
from opbench.core.dtypes import element_size
from opbench.core.errors import UsageError
from opbench.core.outputs import kept_aside
from opbench.core.peaks import H100_BF16_MATMUL_SHARE, Peak, host_cpu, is_gpu_name, lookup_peak
from opbench.core.plausible import UNIT_OF, how_far, part_range
from opbench.core.units import counted
from opbench.gemm.shapes import gemm_bytes, gemm_flops
from opbench.models.layout import CHUNKED, FULL, HC, KDA, LINEAR, MAMBA2, SLIDING

from .moe_rates import A2A_HIDDEN, IMBALANCE, MAX_SECONDS, MIN_SECONDS, MoeRows, flex_rdma_share

MEASURED, INTERPOLATED, ESTIMATED = "measured", "interpolated", "estimated"
# Collectives NCCL/RCCL run as rings (or trees) over every GPU's NIC at once: across nodes their busbw grows with
# the group's ranks per node. All-to-all and send/recv move each rank's bytes through its own NIC.
RAIL_COLLECTIVES = frozenset({"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"})


@dataclass(frozen=True)
class Assumptions:
    """Every figure the projection takes rather than measures, each a flag (docs/project.md states its source)."""

    # of the dense peak, GEMMs no row covers; None: 0.934 of the part's best published matmul in the dtype, the share
    # 0.75 is of H100's bf16 one (default_gemm_efficiency)
    gemm_efficiency: float | None = None
    # of the bf16 peak, attention no row covers; None: 0.45 on an H100 (FA-2/3 forward + backward on Hopper), another
    # part scaled as its best published matmul is (default_attention_efficiency)
    attention_efficiency: float | None = None
    memory_efficiency: float = 0.80  # of HBM peak, streaming (copy) kernels
    link_efficiency: float = 0.80  # of the link peak, a collective's busbw at large sizes
    nic_gbs: float | None = None  # network per GPU per direction; None: the part's (cluster/links.py, NIC_GBS)
    host_link_gbs: float | None = None  # GPU to host memory per direction (activation offloading); None: the part's
    latency_us_intra: float = 10.0  # a collective's fixed cost inside a node
    latency_us_inter: float = 20.0  # ... across nodes
    memory_bandwidth_gbs: float | None = None  # overrides the measured / peak memory bandwidth
    tp_overlap: float = 0.0  # share of TP/SP collectives hidden behind GEMMs (Megatron --tp-comm-overlap: ~0.6-0.9)
    ep_overlap: float = 0.0  # share of the EP all-to-all hidden (shared-expert / batch-level overlap)
    moe_imbalance: float = IMBALANCE  # busiest EP rank's routed tokens / the mean (docs/project.md, "MoE cost model")
    moe_a2a_hidden: float = A2A_HIDDEN  # the most of an all-to-all --moe-a2a-overlap hides (measured: 0.3655)
    cp_overlap: bool = True  # the context-parallel ring overlaps its sends with attention (Megatron/TE do)
    dp_overlap: bool = True  # data-parallel gradient reduction overlaps the last micro-batch's backward
    optimizer_bytes_per_param: float | None = None  # None: by precision (docs/project.md, "Optimizer")
    # what the memory-bound operators move: fused kernels (Megatron-Core/TE, torch.compile), or PyTorch eager op by
    # op as transformers runs them (--validate trains that), at EAGER_MEMORY_EFFICIENCY of the streaming rate
    memory_ops: str = "fused"
    # Calibration: every compute time (GEMM, attention, memory-bound) × this; --validate on one node of the target
    # measures it (what the step spends beyond its kernels' rates: launch gaps, synchronisation, the framework)
    compute_scale: float = 1.0
    # Per-class calibration (--calibration, written by `opbench step --calibrate`): class -> measured / projected
    # time of a profiled step's kernels of that class (calibration.CLASSES); a class not given keeps 1
    calibration: tuple[tuple[str, float], ...] = ()
    # torch.compile of every decoder block (--compile): the blocks' memory-bound time × this, of PyTorch eager's;
    # None: not compiled (torch_compile.py; docs/project.md, "torch.compile")
    compile_memory_time: float | None = None
    # Megatron's flags that cost time (megatron_flags.py; docs/project.md, "Flags that cost time"): the algorithm
    # NCCL's all-reduces are pinned to (NCCL_ALGO), and whether the weight-gradient GEMMs accumulate into the main
    # gradients (--no-gradient-accumulation-fusion: False)
    nccl_algo: str = "default"
    grad_accum_fusion: bool = True
    # --deterministic-mode: Transformer Engine's deterministic attention backward (megatron_flags.fa2_deterministic)
    deterministic_attention: bool = False
    # A kernel's fixed cost in µs, added to each kernel a roofline times (launch, ramp-up, drain: what a tiny
    # kernel takes); None: measured from tiny --results rows, else the vendor's default
    # (KERNEL_US; docs/project.md, "Fixed cost per kernel")
    kernel_us: float | None = None
    # The host's time to issue one operator (Python, autograd, the dispatcher, the launch), µs; None: the part's host
    # CPU's published figure (HOST_US; docs/project.md, "Host-bound steps")
    host_us_per_op: float | None = None


# PyTorch eager's elementwise and reduction kernels on a GPU, of the measured copy rate: on an H200 (torch 2.11)
# transformers' Qwen3-0.6B (bf16, 8,192 tokens) ran its 4,271 kernels that are neither GEMM nor attention in 109.7 ms,
# moving the 272.7 GB --memory-ops eager counts: 2.49 TB/s, 0.60 of the 4.16 TB/s copy (docs/project.md)
EAGER_MEMORY_EFFICIENCY = 0.60
# A kernel's fixed cost by vendor, µs (docs/project.md, "Fixed cost per kernel"): NVIDIA's "Getting Started with CUDA
# Graphs" (developer.nvidia.com/blog/cuda-graphs, 2019) measures 3.8 µs per kernel for short kernels launched back to
# back on a stream (2.9 µs of it the kernel itself, V100, CUDA 10.1). No published AMD figure was found: AMD's is
# NVIDIA's, an estimate. A CPU target has none unless measured or given (--kernel-us).
KERNEL_US = {"nvidia": 3.8, "amd": 3.8}
# Rows whose time is their fixed cost: a GEMM of at most 64³ multiply-adds (0.5 MFLOP: under 1 µs of math on any
# listed part) and a copy of at most 1 MiB (under 1 µs at 1 TB/s); the fastest of each kind counts
TINY_GEMM_MNK, TINY_COPY_BYTES = 64**3, 1 << 20
# The host's time per operator issued, µs, by the part's host CPU (docs/project.md, "Host-bound steps"):
# TransformerEngine issue #2053 (NVIDIA/TransformerEngine, 2025-08-11) measured the CPU time of one torch.nn.Linear
# forward (bf16, hidden 2048, 8,192 tokens; the mean of repeated runs): 13.48 µs on a DGX H100 (Xeon Platinum 8480C),
# 37.08 µs on GB200 (Grace), 33.17 µs on GH200; a TransformerEngine Linear took 99.66 µs on GB200 and 90.53 on GH200
# (2.69× and 2.73× torch's): TE_MODULE_HOST, the host cost of a GEMM Megatron-Core issues through a TE module.
HOST_US = {"x86": 13.48, "grace": 37.08}
TE_MODULE_HOST = 99.66 / 37.08
H100_GEMM_EFFICIENCY = 0.75  # what training's bf16 GEMMs reach of an H100's peak without a measured row


def default_gemm_efficiency(peak: Peak | None, dtype: str) -> float:
    """A GEMM no row covers reaches the same share of the part's best published matmul in ``dtype`` as 0.75 is of
    H100's bf16 one (0.934 of it): 0.75 of an H100's bf16 peak, 0.66 of its FP8 peak, 0.48 of an MI300X's bf16 peak
    (docs/project.md, "Rates"); 0.75 on a part with no published figure; × the part's measured training factor
    (``Peak.training``: GB200 0.846, B200 0.866; docs/project.md, "Parts")."""
    training = peak.training if peak else 1.0  # measured training over best-matmul share (peaks.py; "Parts")
    return training * _as_on_h100(H100_GEMM_EFFICIENCY, peak.matmul_share(dtype) if peak else None)


def _as_on_h100(on_h100: float, share: float | None) -> float:
    """An efficiency set on an H100, carried to a part whose best matmul reaches ``share`` of its peak (None: as is)."""
    return on_h100 * share / H100_BF16_MATMUL_SHARE if share else on_h100


# The chunked scans (gated DeltaNet, KDA, Mamba-2) no measured row covers: their chunk-sized matmuls at the GEMM
# efficiency, plus their minimum HBM traffic at the memory rate (docs/project.md, "Kinds beyond softmax attention")
SCAN_KINDS = (LINEAR, KDA, MAMBA2)
H100_ATTENTION_EFFICIENCY = 0.45  # what training's attention (forward + backward) reaches of an H100's bf16 peak
# Softmax attention at head dimension 64 (or less) of its rate at 128, by pass, on an NVIDIA GPU (docs/project.md,
# "Rates"; no AMD figure was found):
# half the FLOPs per score for the same softmax work. cudnn-frontend's SDPA training benchmark on H200, cuDNN 9.19.1
# (benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn, commits df73764 and afa9f7c), bf16, 4,096 tokens,
# 64 query and 8 KV heads, causal: head dim 128 (its llama3.1 rows, batch 1) forward 591 and backward 474 TFLOP/s;
# head dim 64 (its gpt_oss rows, batch 2, window 1,024) 336 and 289. The 64 rows are windowed, which wastes some
# diagonal tiles: the shares are a lower bound of full causal attention's.
HEAD_DIM_64_SHARE = {"fwd": 336 / 591, "bwd": 289 / 474}
SOFTMAX_KINDS = (FULL, SLIDING, CHUNKED)


def _group_link_gbs(link: Link, nranks: int) -> float:
    """GB/s per direction a rank of an ``nranks``-GPU group inside a node reaches over its links: through a switch
    (NVSwitch) the whole; on a fully connected mesh (AMD's xGMI: one dedicated link per peer, ROCm/rccl PR #1270 and
    issue #1210) only its links to the group's other ranks, ``(nranks − 1) × pair_gbs`` (docs/project.md, "Rates")."""
    return min(link.intra_gbs, max(1, nranks - 1) * link.pair_gbs)


def default_attention_efficiency(peak: Peak | None, dtype: str = "bf16") -> float:
    """0.45 × the part's best bf16 matmul share over H100's: the best published attention kernels reach the same
    0.72-0.74 of their part's best matmul share on H100 (FA3), MI300X and MI355X (AITER's), so attention scales
    across parts as GEMMs do (docs/project.md, "Rates"); 0.45 on a part with no published figure, and in fp32; ×
    the part's training factor, as GEMMs."""
    training = peak.training if peak else 1.0  # as default_gemm_efficiency's
    return training * _as_on_h100(
        H100_ATTENTION_EFFICIENCY, peak.matmul_share("bf16") if peak and dtype in ("bf16", "fp16") else None
    )


@dataclass(frozen=True)
class Timed:
    seconds: float
    source: str  # MEASURED | INTERPOLATED | ESTIMATED
    note: str = ""  # the row it came from, or the roofline it used


@dataclass(frozen=True)
class LeftOut:
    """A row of a --results CSV not used: its file, line (from 1, None when not known), field and why."""

    file: str
    line: int | None
    field: str
    why: str

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file


@dataclass(frozen=True)
class Bound:
    """A number a rate is read from meets the bounds its flag would: finite, whole where it counts something,
    within [low, high] (0 as well where ``zero_ok``); ``default`` fills an empty cell or a missing column."""

    low: float
    high: float
    whole: bool = False
    default: float | None = None
    empty_ok: bool = False  # an empty cell is kept as missing (an attention pass not measured)
    zero_ok: bool = False


MAX_DIM = 1 << 31  # a GEMM dimension (m counts tokens): far beyond any model; keeps 2·m·n·k·groups finite
MAX_GROUPS = 1 << 16  # experts of a grouped GEMM
MAX_SHAPE = 1 << 24  # sequence lengths, heads, head dims, batch: models.config.MAX_CONFIG_INT, as a config's
MIN_GBS, MAX_GBS = 1e-6, 1e6  # bandwidths: 1 kB/s to 1 PB/s (the fastest link is ~1e3 GB/s)
MAX_BYTES = int(MAX_MIB) << 20  # 1 PiB, as --size-mib

CHECKED: dict[str, dict[str, Bound]] = {
    "gemm": {
        **{c: Bound(1, MAX_DIM, whole=True) for c in ("m", "n", "k")},
        "groups": Bound(1, MAX_GROUPS, whole=True, default=1),
        "time_s": Bound(MIN_SECONDS, MAX_SECONDS),
    },
    "attention": {
        **{
            c: Bound(1, MAX_SHAPE, whole=True)
            for c in ("batch_size", "seqlen_q", "seqlen_kv", "num_head_q", "num_head_kv", "head_dim_qk", "head_dim_v")
        },
        "window": Bound(0, MAX_SHAPE, whole=True, default=0),
        **{f"{p}_time": Bound(MIN_SECONDS, MAX_SECONDS, empty_ok=True) for p in PASSES},
    },
    "comm": {
        "size_bytes": Bound(1, MAX_BYTES, whole=True),
        "world_size": Bound(1, MAX_WORLD, whole=True),
        "nranks": Bound(1, MAX_WORLD, whole=True),
        "nnodes": Bound(1, MAX_WORLD, whole=True, default=1),
        "busbw_gbs": Bound(MIN_GBS, MAX_GBS, zero_ok=True),  # 0: a 1-rank row, never used
    },
    "cluster_memory": {"size_bytes": Bound(1, MAX_BYTES, whole=True), "gbs": Bound(MIN_GBS, MAX_GBS)},
}


# Columns a rate reads as text (beside CHECKED's numbers): a row without one is left out, named, never a KeyError
REQUIRED_TEXT: dict[str, tuple[str, ...]] = {
    "gemm": ("dtype",),
    "attention": ("dtype", "backend", "causal"),
    "comm": ("collective",),
}


def _with_columns(frame: pd.DataFrame, columns: Sequence[str], left_out: list[LeftOut]) -> pd.DataFrame:
    """The rows of ``frame`` that have every column in ``columns`` (a file without the column, or an empty cell,
    leaves its rows out, each added to ``left_out`` with its file, line and the column)."""
    if frame.empty:
        return frame
    keep = pd.Series(True, index=frame.index)
    for name in columns:
        missing = frame[name].isna() if name in frame else pd.Series(True, index=frame.index)
        for i in frame.index[missing & keep]:
            row = frame.loc[i]
            line = row["_line"] if "_line" in frame and pd.notna(row["_line"]) else None
            left_out.append(
                LeftOut(
                    str(row["file"]),
                    int(line) if line is not None else None,
                    name,
                    "no such column" if name not in frame else "empty",
                )
            )
        keep &= ~missing
    return frame[keep].reset_index(drop=True)


def _problem(value: object, number: float, b: Bound) -> str:
    """Why one cell fails its bound, or '' when it meets it."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "" if b.empty_ok else "empty"
    if math.isnan(number):
        text = str(value)
        return f"text where a number belongs ({(text if len(text) <= 20 else text[:19] + '…')!r})"
    if not math.isfinite(number):
        return f"not a finite number ({number})"
    if b.whole and not number.is_integer():
        return f"not a whole number ({number:g})"
    if not (b.low <= number <= b.high or (b.zero_ok and number == 0)):
        span = f"{int(b.low):,} to {int(b.high):,}" if b.whole else f"{b.low:g} to {b.high:g}"
        return f"out of range ({number:g}; must be {span}" + (" or 0)" if b.zero_ok else ")")
    return ""


def checked(frame: pd.DataFrame, fields: dict[str, Bound], left_out: list[LeftOut]) -> pd.DataFrame:
    """The rows whose every field in ``fields`` meets its Bound, those fields as numbers; each other row is added
    to ``left_out`` with its file, line and first bad field, never used (no inf or NaN reaches a rate)."""
    from opbench.report.discover import as_numbers

    if frame.empty:
        return frame
    frame = frame.copy()
    bad: dict[int, tuple[str, str]] = {}
    for name, b in fields.items():
        if name not in frame:
            if b.default is not None or b.empty_ok:
                frame[name] = b.default if b.default is not None else math.nan
                continue
            for i in range(len(frame)):
                bad.setdefault(i, (name, "no such column"))
            continue
        raw = frame[name]
        if b.default is not None:
            raw = raw.where(raw.notna(), b.default)
        numbers = as_numbers(raw).astype(float)
        for i, (value, number) in enumerate(zip(raw.tolist(), numbers.tolist())):
            if i not in bad and (why := _problem(value, number, b)):
                bad[i] = (name, why)
        frame[name] = numbers
    for i in sorted(bad):
        row = frame.iloc[i]
        line = row["_line"] if "_line" in frame and pd.notna(row["_line"]) else None
        left_out.append(LeftOut(str(row["file"]), int(line) if line is not None else None, *bad[i]))
    keep = [i not in bad for i in range(len(frame))]
    return frame[keep].reset_index(drop=True)


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty or "status" not in frame:
        return frame
    return frame[frame["status"].astype(str) == "ok"]


class Rates:
    """Look-ups over the rows of ``--results`` folders for one device name and dtype."""

    def __init__(
        self,
        results: Sequence[str | Path],
        device: str | None,
        dtype: str,
        assumptions: Assumptions,
        gpus_per_node: int,
    ) -> None:
        from opbench.report.discover import discover

        frames: dict[str, list[pd.DataFrame]] = {}
        measured_on: list[tuple[str, str]] = []  # (device, file:line) of each file's rate rows, by device
        self.left_out: list[LeftOut] = []  # rows of --results not used for a bad value, by file and line
        self.unread: list[tuple[str, str]] = []  # files of --results that look like results but were not read
        for folder in results:
            if not str(folder).strip():  # '' would read the current folder, whatever it holds
                raise UsageError("an empty path names no folder of results", field="--results")
            try:
                found = discover(folder)
            except UsageError as exc:  # a missing folder or a file: say which flag named it
                raise UsageError(str(exc), field="--results") from None
            self.unread += [
                (f"{folder}/{rel}", why)
                for rel, why in found.skipped
                if kept_aside(rel) is None and "match no opbench benchmark" not in why
            ]
            for f in found.files:
                where = f"{folder}/{f.rel}"
                lines = f.lines if f.lines is not None else [None] * len(f.frame)
                frames.setdefault(f.kind.benchmark, []).append(f.frame.assign(file=where, _line=lines))
                if f.kind.benchmark in (*CHECKED, "moe"):  # moe: opbench moe rows (moe_rates.py)
                    self.left_out += [
                        LeftOut(where, d.line, d.field, f"{d.why} ({d.detail()})" if d.value else d.why)
                        for d in f.dropped
                    ]
                    measured_on += row_devices(f.frame, f.meta, where, lines)

        self.other_dtypes: dict[str, list[str]] = {}  # gemm/attention: dtypes of ok rows not used (not --dtype)

        def kind(name: str, dtypes: Sequence[str] = (dtype,)) -> list[pd.DataFrame]:
            """The usable rows of one benchmark, for each of ``dtypes`` (gemm and attention: only rows of that
            dtype are used; gemm's fp8 rows time the GEMMs --fp8 runs in FP8)."""
            rows = _ok(pd.concat(frames[name], ignore_index=True)) if name in frames else pd.DataFrame()
            rows = _with_columns(rows, REQUIRED_TEXT.get(name, ()), self.left_out)
            if name not in ("gemm", "attention") or rows.empty:
                return [checked(rows, CHECKED[name], self.left_out) for _ in dtypes]
            held = sorted(set(rows["dtype"].astype(str))) if "dtype" in rows else []
            self.other_dtypes[name] = [d for d in held if d != dtype]
            return [
                checked(
                    rows[rows["dtype"].astype(str) == d] if "dtype" in rows else rows.iloc[0:0],
                    CHECKED[name],
                    self.left_out,
                )
                for d in dtypes
            ]

        self.dtype = dtype
        self.a = assumptions
        self._kernel: Timed | None = None
        self.gpus_per_node = gpus_per_node
        measured = one_device(measured_on)
        self.device = device or measured
        self.peak: Peak | None = lookup_peak(self.device) if self.device else None
        self.nic_gbs = self.a.nic_gbs or nic_gbs_of(self.device)  # --nic-gbs, else the part's NIC
        self.asked = bool(results)
        self.read_any = bool(frames)
        # the device --results were measured on when it is not the projection's (--device): its rows are used as
        # measured, which the user should hear
        self.other_devices = [measured] if measured and device and same_device(measured) != same_device(device) else []
        self.gemm, self.gemm_fp8 = kind("gemm", (dtype, "fp8"))
        (self.attention,) = kind("attention")
        (self.comm,) = kind("comm")
        (self.memory_rows,) = kind("cluster_memory")
        self.moe = MoeRows(frames.get("moe", []), dtype)  # opbench moe rows (moe_rates.py)
        self.left_out += [LeftOut(f, line, field, why) for f, line, field, why in self.moe.left_out]
        self.left_out.sort(key=lambda b: (b.file, b.line or 0))
        usable = (self.gemm, self.attention, self.comm, self.memory_rows, self.moe.rows)
        if self.left_out and not any(len(f) for f in usable):
            first = self.left_out[0]
            raise UsageError(
                f"{first.why}; no usable row is left in --results ({len(self.left_out)} row(s) left out)",
                source=first.where(),
                field=first.field or None,
            )
        self._gemm_index = _gemm_index(self.gemm)
        self._gemm_fp8_index = _gemm_index(self.gemm_fp8)
        self.far = self._far_from_any_part()  # notes on rates no real part runs at (docs/project.md, "Rates")

    @property
    def notes(self) -> list[str]:
        """What the user should know about --results: files not read and rows left out for bad numbers, counted,
        the first named."""
        out = []
        if self.asked and not self.read_any:
            out.append("--results holds no rows of an opbench benchmark: every rate is estimated from the peak table")
        if self.other_devices:
            out.append(
                f"--results holds rows measured on {', '.join(self.other_devices)}, not {self.device}: they are used "
                "as they are (give --results measured on the target)"
            )
        out += self.far
        if self.unread:
            files = "; ".join(f"{where}: {why}" for where, why in self.unread[:3])
            more = f"; and {len(self.unread) - 3} more" if len(self.unread) > 3 else ""
            out.append(f"{len(self.unread)} file(s) of --results not read ({files}{more})")
        if not self.left_out:
            return out
        shown = "; ".join(
            f"{b.where()}: " + (f"field '{b.field}': " if b.field else "") + b.why for b in self.left_out[:3]
        )
        more = f"; and {len(self.left_out) - 3} more" if len(self.left_out) > 3 else ""
        return [*out, f"{len(self.left_out)} row(s) of --results left out for bad values ({shown}{more})"]

    # -- how far the rates are from a real part ---------------------------------------------------------------

    def _far_from_any_part(self) -> list[str]:
        """One note per kind of rate (GEMM and attention rows, collectives, memory bandwidth, the rate flags) whose
        rows or flag run slower than any part runs that work, or faster than the target's own peak allows
        (core.plausible.part_range): the worst named, with how far it is from the plausible range. The rows are
        used (they meet the bounds a flag would); the note says a projection built on them is no real part's."""
        part = self.device or "any part"
        out: list[str] = []

        def judge(kind: str, rows: Sequence[tuple[float, float, float | None, str]], what: str, of: str = "") -> None:
            """rows: (work, rate, peak, where) of one kind; a note for the worst of those outside their range."""
            worst: tuple[float, str, float, float, float, str, bool] | None = None
            count = 0
            for work, rate, peak, where in rows:
                low, high = part_range(kind, work, peak)
                far = how_far(rate, low, high)
                if far is not None:
                    count += 1
                    if worst is None or far[0] > worst[0]:
                        worst = (far[0], far[1], rate, low, high, where, math.isinf(work))
            if worst is None:
                return
            factor, side, rate, low, high, where, sustained = worst
            unit = UNIT_OF[kind]
            times = "infinitely far" if math.isinf(factor) else f"{factor:.3g} times"
            span = f"{low:.3g} to {high:.3g} {unit}" + ("" if sustained else " for that work")
            out.append(
                f"{counted(count, what)}{of} at a rate no real part has: {where} at {rate:.3g} {unit} is {times} {side} "
                f"the plausible range for {part} ({span}; docs/conventions.md, 'Plausible numbers'): a projection "
                "built on it is no real part's"
            )

        def peak_of(dtype: object) -> float | None:
            return self.peak.tflops(str(dtype)) if self.peak else None

        def lines(frame: pd.DataFrame) -> list[str]:
            return [f"{f}:{int(n)}" if pd.notna(n) else str(f) for f, n in zip(frame["file"], frame["_line"])]

        gemm: list[tuple[float, float, float | None, str]] = []
        for g in (self.gemm, self.gemm_fp8):
            if g.empty:
                continue
            for m, n, k, groups, t, dtype, where in zip(
                g["m"], g["n"], g["k"], g["groups"], g["time_s"], g["dtype"], lines(g)
            ):
                work = 2.0 * m * n * k * groups / 1e12
                gemm.append((work, work / t, peak_of(dtype), f"{where} ({int(m)}x{int(n)}x{int(k)} in {t:.3g} s)"))
        judge("compute", gemm, "GEMM row", " of --results")
        attention: list[tuple[float, float, float | None, str]] = []
        a = self.attention
        for (_, r), where in zip(a.iterrows(), lines(a) if not a.empty else []):
            kind = str(r["attn_kind"]) if "attn_kind" in r and pd.notna(r["attn_kind"]) else "full"
            for p in PASSES:
                t = r.get(f"{p}_time")
                if t is not None and pd.notna(t):
                    work = attention_flops(_row_shape(r, kind), int(r["batch_size"]), p) / 1e12
                    shape = f"{where} ({p}, seqlen {int(r['seqlen_q'])} in {float(t):.3g} s)"
                    attention.append((work, work / float(t), peak_of(r["dtype"]), shape))
        judge("compute", attention, "attention time", " of --results")
        link = intra_link(self.device or "")
        comm: list[tuple[float, float, float | None, str]] = []
        c = self.comm
        if not c.empty:
            c = c[c["busbw_gbs"] > 0]  # 0: a 1-rank row, never used
            for size, busbw, name, where in zip(c["size_bytes"], c["busbw_gbs"], c["collective"], lines(c)):
                peak = link.intra_gbs if link else None
                comm.append((size / 1e9, float(busbw), peak, f"{where} ({name}, {int(size)} bytes)"))
        judge("link", comm, "collective row", " of --results")
        hbm = self.peak.hbm_tbs * 1e3 if self.peak else None
        mem = self.memory_rows
        memory: list[tuple[float, float, float | None, str]] = []
        if not mem.empty:
            for size, gbs, where in zip(mem["size_bytes"], mem["gbs"], lines(mem)):
                memory.append((size / 1e9, float(gbs), hbm, f"{where} ({int(size)} bytes)"))
        judge("memory", memory, "memory row", " of --results")
        for kind, rate, peak, flag in (
            ("memory", self.a.memory_bandwidth_gbs, hbm, "--memory-bandwidth-gbs"),
            ("link", self.a.nic_gbs, None, "--nic-gbs"),
        ):
            if rate:
                judge(kind, [(math.inf, rate, peak, flag)], "flag")
        return out

    # -- compute ----------------------------------------------------------------------------------------------

    def _peak_tflops(self, what: str, kind: str, dtype: str | None = None) -> float:
        """The dense peak of ``dtype`` (default --dtype), for a ``what`` (a GEMM or attention, named) no measured
        row covers."""
        dtype = dtype or self.dtype
        tflops = self.peak.tflops(dtype) if self.peak else None
        if not tflops:
            others = [d for d in self.other_dtypes.get(kind, []) if d != dtype]
            dtypes = [d for d in others if d != "fp8"]
            flag = f"--dtype {dtypes[0]}" if dtypes else "--fp8 te|torchao (FP8 decoder GEMMs)"
            hint = (
                f"--results holds {kind} rows in {', '.join(others)} only, not {dtype}: pass {flag}, or "
                if others
                else ""
            )
            raise UsageError(
                f"no measured row covers {what} and there is no peak for '{self.device or 'an unnamed device'}' "
                f"({dtype}) in the peak table: {hint}measure on the target (opbench "
                "gemm/attention into a --results folder) or name a --device the table has (docs/conventions.md, "
                "'Peaks')",
                field="--results" if self.asked else "--device",  # nothing measured: the device is what is missing
            )
        return tflops

    def gemm_efficiency(self, dtype: str) -> float:
        """The share of the ``dtype`` peak a GEMM no row covers reaches: --gemm-efficiency, else the part's default."""
        return self.a.gemm_efficiency or default_gemm_efficiency(self.peak, dtype)

    @property
    def attention_efficiency(self) -> float:
        """The share of the bf16 peak attention no row covers reaches: --attention-efficiency, else the part's."""
        return self.a.attention_efficiency or default_attention_efficiency(self.peak, self.dtype)

    def efficiency_note(self, fp8: bool, gemm: bool = True, attention: bool = False) -> str | None:
        """What the default GEMM (and attention) efficiency is on this part and why, where estimated GEMMs or
        attention were used and the figure is not H100's (else None)."""
        if not self.peak:
            return None
        sibling = self.peak.matmul_of
        estimate = (
            f"{self.device} has no published measured matmul of its own: its GEMM and attention rates are datasheet "
            f"estimates ({sibling}'s measured share of its peak; docs/project.md, 'Parts')"
            if sibling and ((gemm and not self.a.gemm_efficiency) or (attention and not self.a.attention_efficiency))
            else None
        )
        parts = []
        if gemm and not self.a.gemm_efficiency:
            dtypes = [self.dtype, "fp8"] if fp8 and self.dtype != "fp8" else [self.dtype]
            parts += [
                f"{e:.2f} of its {d} peak for GEMMs"
                for d, e in ((d, default_gemm_efficiency(self.peak, d)) for d in dtypes)
                if round(e, 2) != H100_GEMM_EFFICIENCY
            ]
        if attention and not self.a.attention_efficiency:
            e = default_attention_efficiency(self.peak, self.dtype)
            parts += (
                [f"{e:.2f} of its {self.dtype} peak for attention"] if round(e, 2) != H100_ATTENTION_EFFICIENCY else []
            )
        if not parts:
            return estimate
        share = ", ".join(
            f"{d} {s:.2f}"
            for d in dict.fromkeys((self.dtype, "fp8" if fp8 else self.dtype))
            if (s := self.peak.matmul_share(d))
        )
        return (
            f"what no row covers runs at {', '.join(parts)} on {self.device}: H100's 0.75 (GEMMs) and 0.45 "
            f"(attention) scaled by its best published matmul's share of the peak ({share}) over H100's bf16 "
            f"{H100_BF16_MATMUL_SHARE:.2f} (docs/project.md, 'Rates'; --gemm-efficiency, --attention-efficiency "
            "set them)" + (f"; {estimate}" if estimate else "")
        )

    def scale(self, klass: str) -> float:
        """What a compute time of ``klass`` (calibration.CLASSES) is multiplied by: --compute-scale, or the
        class's own --calibration factor (the two are never given together)."""
        return self.a.compute_scale * dict(self.a.calibration).get(klass, 1.0)

    def scaled(self, t: Timed, klass: str) -> Timed:
        """``t`` × ``scale(klass)``, the note saying which calibration scaled it."""
        why = f"{klass}, --calibration" if self.a.calibration else "--compute-scale"
        return _scaled(t, self.scale(klass), why)

    def gemm_time(self, m: int, n: int, k: int, groups: int = 1, fp8: bool = False) -> Timed:
        """The GEMM's time (``_gemm_time``) × the calibration's compute scale; ``fp8``: an FP8 GEMM (``--fp8``),
        from `opbench gemm --dtype fp8` rows or the FP8 peak."""
        return self.scaled(self.with_fixed(self._gemm_time(m, n, k, groups, fp8)), "gemm")

    def _gemm_time(self, m: int, n: int, k: int, groups: int = 1, fp8: bool = False) -> Timed:
        """Exact (m, n, k, groups) row; else the measured row nearest in FLOPs (log scale), scaled by FLOPs; else
        FLOPs / (peak · gemm_efficiency) + bytes / memory bandwidth: the operands' one pass through HBM counted
        on top of the math, which makes a narrow GEMM (a TP-split weight, a small K) slower per FLOP than a large
        square one (docs/project.md, "Rates")."""
        index, measured = (self._gemm_fp8_index, self.gemm_fp8) if fp8 else (self._gemm_index, self.gemm)
        hit = index.get((m, n, k, groups))
        if hit:
            return Timed(hit[0], MEASURED, f"{hit[1]}: {m}x{n}x{k}" + (f"x{groups}" if groups > 1 else ""))
        flops = gemm_flops(m, n, k, groups)
        rows = measured[(measured["groups"] > 1) == (groups > 1)] if not measured.empty else measured
        if rows.empty:
            rows = measured
        if not rows.empty:
            row_flops = 2.0 * rows["m"] * rows["n"] * rows["k"] * rows["groups"]
            distance = (row_flops.apply(math.log) - math.log(flops)).abs()
            r = rows.loc[distance.idxmin()]
            rate = 2.0 * r["m"] * r["n"] * r["k"] * r["groups"] / r["time_s"]
            note = f"{r['file']}: {int(r['m'])}x{int(r['n'])}x{int(r['k'])} at {rate / 1e12:.3g} TFLOP/s"
            return Timed(flops / rate, INTERPOLATED, note)
        dtype = "fp8" if fp8 else self.dtype
        name = f"the {m}x{n}x{k}" + (f"x{groups}" if groups > 1 else "") + f" {dtype} GEMM"
        peak = self._peak_tflops(name, "gemm", dtype) * 1e12 * self.gemm_efficiency(dtype)
        moved = gemm_bytes(m, n, k, groups, dtype)
        return Timed(flops / peak + moved / self.memory_bandwidth().seconds, ESTIMATED, "compute + HBM traffic")

    def attention_time(self, shape: AttentionShape, batch: int, pass_: str) -> Timed:
        """The attention pass's time (``_attention_time``) × the calibration's compute scale."""
        kernels = 2 if pass_ == "bwd" else 1  # flash backward: a preprocessing kernel (dO·O) and the main one
        return self.scaled(self.with_fixed(self._attention_time(shape, batch, pass_), kernels), "attention")

    def _attention_time(self, shape: AttentionShape, batch: int, pass_: str) -> Timed:
        """The fastest measured backend on exactly this shape; else the same kind's row nearest in FLOPs, scaled;
        else FLOPs / (peak · attention_efficiency)."""
        flops = attention_flops(shape, batch, pass_)
        col = f"{pass_}_time"
        a = self.attention
        if not a.empty and col in a:
            same_kind = a[(a["attn_kind"].astype(str) == shape.attn_kind) & a[col].notna()] if "attn_kind" in a else a
            keys = {
                "seqlen_q": shape.seqlen_q,
                "seqlen_kv": shape.seqlen_kv,
                "num_head_q": shape.num_head_q,
                "num_head_kv": shape.num_head_kv,
                "head_dim_qk": shape.head_dim_qk,
                "head_dim_v": shape.head_dim_v,
                "batch_size": batch,
            }
            exact = same_kind
            for k, v in keys.items():
                exact = exact[exact[k] == v]
            if not exact.empty:
                r = exact.loc[exact[col].idxmin()]
                return Timed(float(r[col]), MEASURED, f"{r['file']}: {r['backend']}")
            if not same_kind.empty:
                row_flops = same_kind.apply(
                    lambda r: attention_flops(_row_shape(r, shape.attn_kind), int(r["batch_size"]), pass_), axis=1
                )
                distance = (row_flops.apply(math.log) - math.log(flops)).abs()
                i = distance.idxmin()
                r = same_kind.loc[i]
                rate = row_flops[i] / r[col]
                return Timed(flops / rate, INTERPOLATED, f"{r['file']}: {r['backend']} at {rate / 1e12:.3g} TFLOP/s")
        name = (
            f"{shape.attn_kind} attention {pass_} (seqlen {shape.seqlen_q}, {shape.num_head_q} heads, batch {batch}, "
            f"{self.dtype})"
        )
        passes = MATMUL_PASS_MULTIPLIER[pass_]  # backward reads and writes about twice what forward does
        if shape.attn_kind == HC:  # the Sinkhorn mixing: elementwise over the streams, memory-bound
            moved = hc_bytes(shape, batch, element_size(self.dtype)) * passes
            return Timed(moved / self.memory_bandwidth().seconds, ESTIMATED, "hc_bytes at the memory rate")
        if shape.attn_kind in SCAN_KINDS:  # chunk-sized matmuls as a GEMM's, and the scan's traffic
            peak = self._peak_tflops(name, "attention") * 1e12 * self.gemm_efficiency(self.dtype)
            moved = scan_bytes(shape, batch, element_size(self.dtype)) * passes
            return Timed(flops / peak + moved / self.memory_bandwidth().seconds, ESTIMATED, "matmuls + scan traffic")
        peak = self._peak_tflops(name, "attention") * 1e12 * self.attention_efficiency
        small_heads = max(shape.head_dim_qk, shape.head_dim_v) <= 64
        if self.vendor == "nvidia" and shape.attn_kind in SOFTMAX_KINDS and small_heads:
            share = HEAD_DIM_64_SHARE[pass_]
            return Timed(flops / (peak * share), ESTIMATED, f"roofline × {share:.3g} (head dim ≤ 64)")
        return Timed(flops / peak, ESTIMATED, "roofline")

    # -- memory -------------------------------------------------------------------------------------------------

    def memory_bandwidth(self) -> Timed:
        """Bytes per second of a streaming kernel: --memory-bandwidth-gbs, else the median 'copy' rate of the
        largest size measured by opbench cluster, else HBM peak × memory_efficiency. ``seconds`` holds B/s."""
        if self.a.memory_bandwidth_gbs:
            return Timed(self.a.memory_bandwidth_gbs * 1e9, ESTIMATED, "--memory-bandwidth-gbs")
        rows = self.memory_rows
        if not rows.empty:
            copy = rows[rows["kernel"].astype(str) == "copy"] if "kernel" in rows else rows
            copy = copy if not copy.empty else rows
            big = copy[copy["size_bytes"] == copy["size_bytes"].max()]
            return Timed(float(big["gbs"].median()) * 1e9, MEASURED, f"{big['file'].iloc[0]}: copy")
        if self.peak:
            return Timed(self.peak.hbm_tbs * 1e12 * self.a.memory_efficiency, ESTIMATED, "HBM peak")
        raise UsageError(
            f"no measured memory bandwidth and no peak for '{self.device or 'an unnamed device'}': run opbench cluster "
            "--checks memory into a --results folder, or pass --memory-bandwidth-gbs",
            field="--results" if self.asked else "--device",
        )

    def memory_time(self, nbytes: float, eager: bool = False, kernels: int = 1) -> Timed:
        """Memory-bound operators moving ``nbytes`` in ``kernels`` kernels, their fixed cost included, × the
        calibration's compute scale; ``eager``: PyTorch's eager elementwise and reduction kernels, which reach
        EAGER_MEMORY_EFFICIENCY of the streaming rate on a GPU."""
        bw = self.memory_bandwidth()
        if eager and self.on_gpu:
            note = f"{bw.note} × {EAGER_MEMORY_EFFICIENCY} (eager)"
            bw = replace(bw, seconds=bw.seconds * EAGER_MEMORY_EFFICIENCY, note=note)
        timed = self.with_fixed(Timed(nbytes / bw.seconds, bw.source, bw.note), kernels, modelled=True)
        return self.scaled(timed, "memory")

    def kernel_cost(self) -> Timed:
        """A kernel's fixed cost (``seconds``), what a roofline leaves out: --kernel-us; else measured, the mean of the fastest tiny GEMM row
        (m·n·k at most TINY_GEMM_MNK) and the fastest tiny copy row (at most TINY_COPY_BYTES) the --results hold
        (either alone where only one is there); else the vendor's (KERNEL_US); 0 on a CPU (docs/project.md, "Fixed
        cost per kernel")."""
        if self._kernel is None:
            self._kernel = self._kernel_cost()
        return self._kernel

    def _kernel_cost(self) -> Timed:
        if self.a.kernel_us is not None:
            return Timed(self.a.kernel_us * 1e-6, ESTIMATED, "--kernel-us")
        found: list[tuple[float, str]] = []
        g = self.gemm
        if not g.empty:
            tiny = g[(g["m"] * g["n"] * g["k"] * g["groups"]) <= TINY_GEMM_MNK]
            if not tiny.empty:
                r = tiny.loc[tiny["time_s"].astype(float).idxmin()]
                found.append((float(r["time_s"]), f"{r['file']}: {int(r['m'])}x{int(r['n'])}x{int(r['k'])} GEMM"))
        rows = self.memory_rows
        if not rows.empty:
            copy = rows[rows["kernel"].astype(str) == "copy"] if "kernel" in rows else rows
            tiny = copy[copy["size_bytes"] <= TINY_COPY_BYTES]
            if not tiny.empty:
                times = tiny["size_bytes"].astype(float) / (tiny["gbs"].astype(float) * 1e9)
                i = times.idxmin()
                found.append((float(times[i]), f"{tiny.loc[i, 'file']}: {int(tiny.loc[i, 'size_bytes'])} B copy"))
        if found:
            return Timed(sum(t for t, _ in found) / len(found), MEASURED, "; ".join(n for _, n in found))
        vendor = self.vendor
        if vendor:
            return Timed(KERNEL_US[vendor] * 1e-6, ESTIMATED, f"{vendor} default")
        return Timed(0.0, ESTIMATED, "no fixed cost (a CPU: --kernel-us sets one)")

    def host_cost(self) -> Timed:
        """The host's time to issue one operator (``seconds``): --host-us-per-op; else the part's host CPU's published
        figure (HOST_US: x86 DGX hosts, Grace on GB200/GB300/GH200); 0 on a CPU target, where the host is the device
        and an operator's time already holds its issue (docs/project.md, "Host-bound steps")."""
        if self.a.host_us_per_op is not None:
            return Timed(self.a.host_us_per_op * 1e-6, ESTIMATED, "--host-us-per-op")
        if not self.on_gpu:
            return Timed(0.0, ESTIMATED, "none on a CPU (its operators' times hold their issue)")
        cpu = host_cpu(self.device)
        return Timed(HOST_US[cpu] * 1e-6, ESTIMATED, f"{cpu} host, TransformerEngine #2053's torch Linear")

    @property
    def vendor(self) -> str | None:
        """'amd' or 'nvidia' for a GPU target, None for a CPU."""
        if not self.on_gpu:
            return None
        return "amd" if re.search(r"\bmi\d|instinct|radeon|amd", (self.device or "").lower()) else "nvidia"

    def with_fixed(self, t: Timed, kernels: int = 1, modelled: bool = False) -> Timed:
        """``t`` plus the fixed cost of its ``kernels`` kernels where ``t`` is a model's (a roofline has none; a
        measured or interpolated row holds its own, timed back to back); ``modelled``: bytes over a bandwidth, a
        model whatever the bandwidth's source."""
        cost = kernels * self.kernel_cost().seconds
        if not cost or t.seconds == 0 or (t.source != ESTIMATED and not modelled):
            return t
        note = f"{t.note}; + {kernels} kernel(s) × {cost / kernels * 1e6:.3g} µs fixed"
        return Timed(t.seconds + cost, t.source, note)

    @property
    def on_gpu(self) -> bool:
        """Whether the target is a GPU: a part the peak table knows, or one whose name says so (an unlisted GPU); a
        CPU is neither."""
        name = (self.device or "").lower()
        return self.peak is not None or is_gpu_name(name)

    # -- communication ------------------------------------------------------------------------------------------

    def collective_time(self, collective: str, size_bytes: float, nranks: int, inter: bool, per_node: int = 1) -> Timed:
        """nccl-tests conventions: ``size_bytes`` is the per-rank buffer (max of send and receive). busbw comes
        from measured rows of the same collective across nodes (or within one), interpolated over log size, else
        from another collective's rows in that domain, else latency + size·factor / (link peak · efficiency).
        Across nodes a ring collective (all-reduce, all-gather, reduce-scatter, broadcast, reduce) runs one ring
        per NIC of the group on each node: its busbw scales with ``per_node``, the group's ranks on one node
        (docs/project.md, "Rates"); measured rows are scaled from the ranks per node they ran with. An estimated
        all-to-all sends only the share bound off the node through the network."""
        if nranks <= 1 or size_bytes <= 0:
            return Timed(0.0, MEASURED, "no peers")
        factor = COLLECTIVES[collective].busbw_factor(nranks) or 1.0
        rails = inter and collective in RAIL_COLLECTIVES
        rows = self._comm_rows(inter)
        if not rows.empty:
            same = rows[rows["collective"].astype(str) == collective]
            use, source = (same, MEASURED) if not same.empty else (rows, INTERPOLATED)
            busbw_col = use["busbw_gbs"].astype(float)
            scaled = ""
            if rails:  # each row's busbw per NIC it drove, times the NICs this group drives
                row_share = (use["nranks"].astype(int) // use["nnodes"].astype(int)).clip(lower=1)
                busbw_col = busbw_col * per_node / row_share
                if (row_share != per_node).any():
                    scaled = f", scaled to {per_node} rank(s) per node"
            busbw = _interpolate_log(use["size_bytes"].astype(float), busbw_col, size_bytes)
            if busbw and busbw > 0:
                what = collective if not same.empty else f"{use['collective'].iloc[0]} rows"
                note = f"{use['file'].iloc[0]}: {what} busbw {busbw:.3g} GB/s{scaled}"
                exact = (use["size_bytes"] == size_bytes).any() and not scaled
                return Timed(size_bytes * factor / (busbw * 1e9), source if exact else INTERPOLATED, note)
        if inter and collective == "all_to_all" and per_node > 1:
            # each rank sends (n − k)/n of its buffer off the node through its NIC and (k − 1)/n over NVLink/xGMI
            # to the group's k − 1 ranks on its node, at once
            link = intra_link(self.device or "")
            out_bw = self.nic_gbs * self.a.link_efficiency
            n, k = nranks, min(per_node, nranks)
            in_bw = _group_link_gbs(link, k) * self.a.link_efficiency if link is not None else out_bw
            seconds = max(size_bytes * (n - k) / n / (out_bw * 1e9), size_bytes * (k - 1) / n / (in_bw * 1e9))
            note = f"network at {out_bw:.3g} GB/s for {n - k} of {n} peers, {k - 1} on the node"
            return Timed(self.a.latency_us_inter * 1e-6 + seconds, ESTIMATED, note)
        if inter:
            nics = per_node if rails else 1
            bw, latency = self.nic_gbs * nics * self.a.link_efficiency, self.a.latency_us_inter
            link = intra_link(self.device or "")
            if link is not None and nics > 1:  # the rings also cross NVLink/xGMI inside the node
                bw = min(bw, _group_link_gbs(link, per_node) * self.a.link_efficiency)
            what = "network" if nics == 1 else f"network, {nics} NICs per node"
        else:
            link = intra_link(self.device or "")
            if link is None:
                raise UsageError(
                    f"no measured collective rows and no link peak for '{self.device or 'an unnamed device'}': run "
                    "opbench comm into a --results folder, or name a --device the link table has",
                    field="--results",
                )
            bw, latency, what = (
                _group_link_gbs(link, nranks) * self.a.link_efficiency,
                self.a.latency_us_intra,
                link.name,
            )
        return Timed(latency * 1e-6 + size_bytes * factor / (bw * 1e9), ESTIMATED, f"{what} at {bw:.3g} GB/s")

    def flex_dispatch_time(
        self, token_bytes: float, tokens: int, top_k: int, experts: int, ep: int, etp: int, gpus_per_node: int
    ) -> Timed:
        """One dispatch (or combine: the same bytes back) of the flex dispatcher (Megatron's
        --moe-token-dispatcher-type flex: DeepEP or HybridEP) for ``tokens`` tokens of ``token_bytes`` each, routed
        to ``top_k`` of ``experts`` experts spread evenly over ``ep`` groups of ``etp`` GPUs (each expert split over
        its group's GPUs), the ep·etp GPUs in whole nodes of ``gpus_per_node`` or within one: a token goes through
        the RDMA stage once for each node holding one of its experts, its own node included, at the rate DeepEP and
        HybridEP publish counted so (moe_rates.flex_rdma_share), and over NVLink/xGMI once to each other GPU holding
        one (or a shard of one); the two links work at once (docs/project.md, "A step"). Routing is
        balanced: the expected counts of nodes and GPUs a token's top-k distinct experts fall on. Estimated from the
        link rates (opbench comm measures NCCL's all-to-all, not these kernels)."""
        link = intra_link(self.device or "")
        if link is None or "pcie" in link.name.lower():
            raise UsageError(
                f"DeepEP and HybridEP need NVLink or xGMI between a node's GPUs; {self.device or 'this device'} has "
                f"{link.name if link else 'no entry in the link table'}",
                field="--moe-token-dispatcher-type",
            )
        group = ep * etp
        k = min(gpus_per_node, group)  # the group's GPUs on one node
        nodes = group // k

        def hit(groups: int) -> float:  # expected groups (of experts/groups each) a token's experts fall on
            size = experts / groups
            miss = math.prod(max(0.0, experts - size - i) / (experts - i) for i in range(min(top_k, experts)))
            return groups * (1 - miss)

        nvlink_bw = _group_link_gbs(link, k) * self.a.link_efficiency
        nvlink = tokens * token_bytes * etp * hit(ep) * (k - 1) / k / (nvlink_bw * 1e9)
        if nodes == 1:
            return Timed(self.a.latency_us_intra * 1e-6 + nvlink, ESTIMATED, f"flex dispatcher at {nvlink_bw:.3g} GB/s")
        # the RDMA stage carries a token once for each node its experts are on, its own included, at the rate DeepEP
        # and HybridEP publish for that count (docs/project.md, "MoE cost model")
        rdma_bw = self.nic_gbs * flex_rdma_share()
        nodes_hit = hit(nodes)
        network = tokens * token_bytes * nodes_hit / (rdma_bw * 1e9)
        note = f"flex dispatcher: RDMA stage at {rdma_bw:.3g} GB/s for {nodes_hit:.2f} nodes a token, its own included"
        return Timed(self.a.latency_us_inter * 1e-6 + max(network, nvlink), ESTIMATED, note)

    def _comm_rows(self, inter: bool) -> pd.DataFrame:
        c = self.comm
        if c.empty:
            return c
        nodes = c["nnodes"].astype(int)  # checked: whole, 1 to MAX_WORLD (empty: 1)
        per_node = c["world_size"].astype(int) // nodes
        spans = (nodes > 1) & (c["nranks"].astype(int) > per_node)
        picked = c[spans if inter else ~spans]
        return picked[picked["busbw_gbs"] > 0]


def _gemm_index(rows: pd.DataFrame) -> dict[tuple[int, int, int, int], tuple[float, str]]:
    """(m, n, k, groups) → (time, file) of measured GEMM rows; the fastest backend wins."""
    index: dict[tuple[int, int, int, int], tuple[float, str]] = {}
    for r in (rows.sort_values("time_s", ascending=False) if not rows.empty else rows).itertuples():
        index[(int(r.m), int(r.n), int(r.k), int(r.groups))] = (float(r.time_s), str(r.file))
    return index


def _scaled(t: Timed, scale: float, why: str = "--compute-scale") -> Timed:
    return t if scale == 1.0 else Timed(t.seconds * scale, t.source, f"{t.note}, × {scale:g} ({why})")


def _row_shape(r: Any, kind: str) -> AttentionShape:
    shape = AttentionShape(
        "",
        int(r["seqlen_q"]),
        int(r["seqlen_kv"]),
        int(r["num_head_q"]),
        int(r["num_head_kv"]),
        int(r["head_dim_qk"]),
        int(r["head_dim_v"]),
        bool(r["causal"]),
    )

    def count(col: str) -> int:
        return int(r[col]) if col in r and pd.notna(r[col]) else 0

    # DeepSeek-V4's rows: the pooling rate and csa's top-k change their FLOPs, as the kernel's shape did
    sinks = bool(r["sinks"]) if "sinks" in r and pd.notna(r["sinks"]) else False
    return replace(
        shape, attn_kind=kind, window=count("window"), compress=count("compress"), topk=count("topk"), sinks=sinks
    )


def _interpolate_log(sizes: pd.Series, values: pd.Series, x: float) -> float | None:
    """Linear interpolation of ``values`` over log ``sizes`` (median of repeats), clamped at the ends."""
    table = pd.DataFrame({"s": sizes, "v": values}).groupby("s")["v"].median().sort_index()
    if table.empty:
        return None
    xs = [math.log(s) for s in table.index]
    lx = math.log(x)
    if lx <= xs[0]:
        return float(table.iloc[0])
    if lx >= xs[-1]:
        return float(table.iloc[-1])
    for i in range(1, len(xs)):
        if lx <= xs[i]:
            w = (lx - xs[i - 1]) / (xs[i] - xs[i - 1])
            return float(table.iloc[i - 1] * (1 - w) + table.iloc[i] * w)
    return float(table.iloc[-1])


def _line_of(r: Any) -> str:
    """A row's file line for a note ('?' when not known)."""
    line = getattr(r, "_line", None) if not isinstance(r, pd.Series) else r.get("_line")
    return str(int(line)) if line is not None and pd.notna(line) else "?"


def same_device(name: str) -> object:
    """What makes two device names one device: the peak table's entry ('H100' and 'NVIDIA H100 80GB HBM3' are one
    part), else the name itself, case and spacing aside ('AMD EPYC 7B13')."""
    return lookup_peak(name) or " ".join(name.lower().split())


def row_devices(
    frame: pd.DataFrame, meta: dict[str, Any], where: str, lines: Sequence[int | None]
) -> list[tuple[str, str]]:
    """(device, file:line) for the first row of each device in one results file: a row's own ``device`` (cluster
    rows: ``device_name``) cell, else the sidecar's ``device_name``; rows that name none are left out (nothing to
    tell)."""
    sidecar = meta.get("device_name")
    fallback = sidecar.strip() if isinstance(sidecar, str) and sidecar.strip() else None
    column = next((c for c in ("device", "device_name") if c in frame), None)  # cluster rows: device_name
    own = frame[column].tolist() if column else [None] * len(frame)
    found: dict[object, tuple[str, str]] = {}
    for cell, line in zip(own, lines):
        name = cell.strip() if isinstance(cell, str) and cell.strip() else fallback
        if name is not None:
            found.setdefault(same_device(name), (name, f"{where}:{line}" if line is not None else where))
    return list(found.values())


def one_device(measured_on: Sequence[tuple[str, str]]) -> str | None:
    """The one device every row of --results was measured on (None when no row names one); rows of two devices in
    one projection are one line naming both and where each was found: one part's rates with another's mixed in
    would project neither (docs/project.md, "Rates")."""
    by_device: dict[object, tuple[str, str]] = {}
    for name, where in measured_on:
        by_device.setdefault(same_device(name), (name, where))
    if len(by_device) > 1:
        (a, at), (b, bt) = list(by_device.values())[:2]
        more = f" (and {len(by_device) - 2} more)" if len(by_device) > 2 else ""
        raise UsageError(
            f"holds rows measured on two devices, {a!r} ({at}) and {b!r} ({bt}){more}: a projection takes one device's "
            "rates; give --results folders of one device (a row's device is its own 'device' cell, else its sidecar's "
            "device_name)",
            field="--results",
        )
    return next(iter(by_device.values()))[0] if by_device else None
