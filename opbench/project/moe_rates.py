"""A MoE layer's rates (docs/project.md, "MoE cost model"): ``opbench moe`` rows of the layer's shape where
``--results`` has them (by phase, interpolated in tokens, never extrapolated), else the cost model's causes: grouped
GEMMs at an efficiency their reduction width sets (fitted to DeepGEMM's published table), the load imbalance of the
busiest expert-parallel rank, and the share of the all-to-all Megatron's overlap was measured to hide. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from opbench.core.peaks import is_gpu_name

# DeepGEMM's published GEMM table (github.com/deepseek-ai/DeepGEMM README.md at commit 78cacf7, 2025-02-26: FP8
# E4M3, H800 SXM5, NVCC 12.8): (groups, rows per group M, N, K, TFLOP/s). Normal GEMMs, then grouped ones in the
# contiguous layout (training's), then the masked layout.
DEEPGEMM_H800_FP8 = (
    (1, 64, 2112, 7168, 206), (1, 64, 24576, 1536, 289), (1, 64, 32768, 512, 219), (1, 64, 7168, 16384, 336),
    (1, 64, 4096, 7168, 287), (1, 64, 7168, 2048, 295), (1, 128, 2112, 7168, 352), (1, 128, 24576, 1536, 535),
    (1, 128, 32768, 512, 358), (1, 128, 7168, 16384, 645), (1, 128, 4096, 7168, 533), (1, 128, 7168, 2048, 510),
    (1, 4096, 2112, 7168, 1058), (1, 4096, 24576, 1536, 990), (1, 4096, 32768, 512, 590),
    (1, 4096, 7168, 16384, 1358), (1, 4096, 4096, 7168, 1304), (1, 4096, 7168, 2048, 1025),
    (4, 8192, 4096, 7168, 1297), (4, 8192, 7168, 2048, 1099), (8, 4096, 4096, 7168, 1288), (8, 4096, 7168, 2048, 1093),
    (1, 1024, 4096, 7168, 1233), (1, 1024, 7168, 2048, 925), (2, 512, 4096, 7168, 1040), (2, 512, 7168, 2048, 916),
    (4, 256, 4096, 7168, 932), (4, 256, 7168, 2048, 815),
)  # fmt: skip
H800_HBM_TBS, H800_FP8_TFLOPS = 3.35, 1979.0
# The table's rows of 256 rows a group or more (the ones not bound by streaming the weights) fit
#   time = flops / (R · K / (K + K0)) + bytes / (0.8 · HBM)
# best at K0 = 270 (R = 1,620 TFLOP/s; median |error| 2.4 %, the worst 37 %, a masked layout's 256 rows): a tile's
# fixed cost (prologue, epilogue) is worth 270 steps of its K loop. ``fit_k0`` redoes the fit; tests/test_project_moe.py checks it gives this constant.
K0_FP8 = 270
K_REFERENCE = 8192  # the reduction width of the large dense GEMMs the default GEMM efficiency is set for


def fit_k0(rows: Sequence[tuple[int, int, int, int, float]] = DEEPGEMM_H800_FP8, min_rows: int = 256) -> int:
    """K0 of the fit above over ``rows`` with at least ``min_rows`` rows a group: a grid search (K0 by 10, R by 10
    TFLOP/s) minimising the median |log error|, no solver needed."""
    use = [r for r in rows if r[1] >= min_rows]
    bw = H800_HBM_TBS * 1e12 * 0.8

    def error(k0: float, rate: float) -> float:
        errs = []
        for g, m, n, k, tflops in use:
            flops = 2.0 * m * n * k * g
            moved = (m * k + k * n + 2 * m * n) * g  # FP8 operands, bf16 output
            t = flops / (rate * 1e12 * k / (k + k0)) + moved / bw
            errs.append(abs(math.log(flops / t / 1e12 / tflops)))
        return sorted(errs)[len(errs) // 2]

    best = min(((error(k0, r), k0) for k0 in range(0, 1001, 10) for r in range(1200, 2001, 10)), key=lambda x: x[0])
    return best[1]


def k_share(k: int, fp8: bool) -> float:
    """The share of a large GEMM's rate (reduction width K_REFERENCE) a GEMM reducing over ``k`` reaches: a tile's
    fixed cost is K0 steps of its K loop (DeepGEMM's FP8 table); a bf16 K step takes twice an FP8 one (half the
    peak), so in bf16 the same fixed time is K0/2 steps. 1 at K_REFERENCE and beyond."""
    k0 = K0_FP8 if fp8 else K0_FP8 / 2
    return min(1.0, (k / (k + k0)) / (K_REFERENCE / (K_REFERENCE + k0)))


# The share of each all-to-all Megatron's --overlap-moe-expert-parallel-comm hid in a measured run: Nsight on
# Qwen3-30B-A3B, bf16, 16 H100, EP 16, HybridEP (Megatron-Bridge skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md,
# commit 067f987: 36.55 % of the communication hidden, the step 24.71 -> 20.99 s). --moe-a2a-hidden sets it.
A2A_HIDDEN = 0.3655
# What the flex dispatcher's internode kernels reach, as DeepEP and HybridEP publish it: GB/s of "RDMA bytes" a GPU
# sends (dispatch) or receives (combine), a token counted once for every node its experts are on, its own node
# included (DeepEP tests/test_internode.py, num_rdma_token_sent over all nodes; HybridEP tests/utils.py,
# count_rdma_send_from_routing_map: "To align with the implementation in the DeepEP, we do not set the local node
# map to zeros"), one 400 Gb/s NIC (50 GB/s) a GPU. (ranks, dispatch, combine):
FLEX_RDMA_PUBLISHED = {
    # github.com/deepseek-ai/DeepEP docs/legacy.md: H800 + ConnectX-7, DeepSeek-V3 shape (4,096 tokens, hidden 7,168,
    # top-4 groups of nodes, top-8 experts), FP8 dispatch, BF16 combine, 24 SMs
    "DeepEP, H800": ((16, 43.0, 43.0), (32, 58.0, 57.0), (64, 51.0, 50.0)),
    # DeepEP docs/README_Hybrid-EP.md, "H100 Platform": 4,096 tokens, hidden 7,168, top-8 of 8 local experts a rank,
    # uniform random routing, 16 SMs, the Torch API's time (launch included), BF16 dispatch and combine
    "HybridEP, H100": ((16, 54.47, 53.35), (32, 47.36, 52.53), (64, 41.24, 46.57)),
}
FLEX_PUBLISHED_NIC_GBS = 50.0


def flex_rdma_share() -> float:
    """The flex dispatcher's RDMA-stage rate as a share of the NIC's peak: the median of the published figures
    (FLEX_RDMA_PUBLISHED) over the NIC they ran on, 1.01. Counted as they count it (every node a token's experts are
    on, its own included), this is half the network rate the link model gave a token over two nodes: the own
    node's copies go through the same RDMA stage (its sender warps, its receive buffer and the NVLink forwarding
    after it) as the other nodes'."""
    rates = sorted(r for rows in FLEX_RDMA_PUBLISHED.values() for _, d, c in rows for r in (d, c))
    mid = len(rates) // 2
    return (rates[mid - 1] + rates[mid]) / 2 / FLEX_PUBLISHED_NIC_GBS


# The busiest expert-parallel rank's tokens over the mean: 1, as published benchmarks force balanced routing
# (Megatron-Bridge docs/performance-summary-archive.md: "In MoE training benchmarks, we force-balance the token
# distribution among experts and all benchmarks are token-dropless"; its performance configs set
# moe_router_force_load_balancing for MoE models). A real training run's routing is not balanced: give
# --moe-imbalance from its logged tokens per expert (or opbench moe's imbalance column for a logged histogram).
IMBALANCE = 1.0

# opbench moe phases the projection reads, and which tokens each runs on
TOKEN_PHASES = ("router", "topk", "permute", "unpermute_combine")  # the rank's own tokens
EXPERT_PHASES = ("gate_up", "activation", "down")  # the tokens its experts get, per expert as in the row
NUMERIC = ("tokens", "hidden", "experts", "top_k", "expert_intermediate", "time_s")
MIN_SECONDS, MAX_SECONDS = 1e-12, 1e6  # a timed kernel takes more than a picosecond and less than 11 days


@dataclass(frozen=True)
class MoeShape:
    """What sets a MoE block's per-expert work: hidden size, experts, top-k and one expert's width (split by etp)."""

    hidden: int
    experts: int
    top_k: int
    width: int

    def __str__(self) -> str:
        return f"hidden {self.hidden}, {self.experts} experts, top-{self.top_k}, expert width {self.width}"


@dataclass(frozen=True)
class PhaseTime:
    seconds: float
    exact: bool  # False: interpolated between two token counts
    note: str
    host: float | None = None  # the row's host_s (its call's issue time on a GPU); None: not measured
    per_expert: bool = False  # its backend issues a call per expert (its host time follows the experts it runs)


# opbench moe backends that issue one call (or one C++ loop) per expert: a rank running E/ep of the row's E experts
# issues E/ep of them. torch._grouped_mm issues one call for all of them.
PER_EXPERT_BACKENDS = ("torch_loop", "te_grouped")


def _host_of(row: pd.Series) -> float | None:
    """A row's ``host_s`` where it is a GPU row's own figure (MoeRows bounds it): opbench moe takes it from an idle
    device without waiting (core.timing.issue_time); on a CPU it writes the whole call's time there, which is no
    host issue beside the device's. None otherwise: the projection then counts the phase's operators."""
    value = row.get("host_s", math.nan)
    if not is_gpu_name(str(row.get("device", ""))) or not math.isfinite(value) or value == row.get("time_s"):
        return None  # a CPU's row writes its time there (runner.py), whatever its device's name says
    return float(value)


class MoeRows:
    """The usable rows of ``benchmark_moe_*.csv`` in ``--results`` for one dtype: balanced routing, no capacity
    drop, status ok. Rows with a bad number are left out (``left_out``: file, line, field, why)."""

    def __init__(self, frames: Sequence[pd.DataFrame], dtype: str) -> None:
        self.left_out: list[tuple[str, int | None, str, str]] = []
        rows = pd.concat(list(frames), ignore_index=True) if frames else pd.DataFrame()
        if not rows.empty:
            rows = rows[rows.get("status", pd.Series("ok", index=rows.index)).astype(str).str.startswith("ok")]
            rows = rows[rows.get("dtype", pd.Series(dtype, index=rows.index)).astype(str) == dtype]
            rows = rows[rows.get("routing", pd.Series("", index=rows.index)).astype(str) == "balanced"]
            if "capacity_factor" in rows:
                rows = rows[pd.to_numeric(rows["capacity_factor"], errors="coerce").isna()]
            keep = pd.Series(True, index=rows.index)

            def leave_out(bad: pd.Series, col: str, why: str) -> None:
                for i in rows.index[bad & keep]:
                    r = rows.loc[i]
                    line = int(r["_line"]) if "_line" in r and pd.notna(r["_line"]) else None
                    self.left_out.append((str(r.get("file", "")), line, col, why))

            for col in NUMERIC:
                values = pd.to_numeric(rows[col], errors="coerce") if col in rows else pd.Series(math.nan, rows.index)
                bad = ~(values.apply(lambda v: math.isfinite(v) and v > 0))
                leave_out(bad, col, "not a positive number")
                keep &= ~bad
                rows = rows.assign(**{col: values})
            # times bounded like the other benchmarks' (rates.CHECKED); host_s may be empty (not measured) or absent
            for col in ("time_s", "host_s"):
                raw = rows[col] if col in rows else pd.Series(math.nan, rows.index)
                values = pd.to_numeric(raw, errors="coerce")
                given = raw.notna() & (raw.astype(str).str.strip() != "")  # text where a number belongs is bad too
                bad = given & ~values.apply(lambda v: MIN_SECONDS <= v <= MAX_SECONDS)
                leave_out(bad, col, f"not a number within [{MIN_SECONDS:g}, {MAX_SECONDS:g}] s")
                keep &= ~bad
                rows = rows.assign(**{col: values})
            rows = rows[keep]
        self.rows = rows
        self.shapes = sorted(
            {
                MoeShape(int(r.hidden), int(r.experts), int(r.top_k), int(r.expert_intermediate))
                for r in rows.itertuples()
            },
            key=str,
        )

    def __bool__(self) -> bool:
        return not self.rows.empty

    def phase_time(self, shape: MoeShape, phase: str, pass_: str, tokens: int) -> PhaseTime | str:
        """Seconds of ``phase``'s ``pass_`` for ``tokens`` tokens of ``shape``: the fastest backend at each
        measured token count, that row at an exact count, else linear in tokens between the two counts around it.
        A string says why there is none (another shape; tokens outside the measured ones: never extrapolated)."""
        r = self.rows
        same = r[
            (r["hidden"] == shape.hidden)
            & (r["experts"] == shape.experts)
            & (r["top_k"] == shape.top_k)
            & (r["expert_intermediate"] == shape.width)
        ]
        if same.empty:
            held = "; ".join(str(s) for s in self.shapes[:3]) + ("; …" if len(self.shapes) > 3 else "")
            return f"benchmark_moe rows are for {held}, not this layer's {shape}: not used"
        rows = same[(same["phase"].astype(str) == phase) & (same["pass"].astype(str) == pass_)]
        if rows.empty:
            return f"no benchmark_moe row of phase {phase} {pass_} for {shape}"
        best = rows.loc[rows.groupby("tokens")["time_s"].idxmin()].sort_values("tokens")
        counts = best["tokens"].astype(int).tolist()
        times = best["time_s"].astype(float).tolist()
        hosts = [_host_of(r) for _, r in best.iterrows()]
        per_expert = [str(r.get("backend", "")) in PER_EXPERT_BACKENDS for _, r in best.iterrows()]
        files = best["file"].astype(str).tolist() if "file" in best else [""] * len(counts)
        if tokens in counts:
            i = counts.index(tokens)
            return PhaseTime(times[i], True, f"{files[i]}: {phase} {pass_} at {tokens} tokens", hosts[i], per_expert[i])
        if not counts[0] < tokens < counts[-1]:
            return (
                f"benchmark_moe rows of {shape} cover {counts[0]}-{counts[-1]} tokens, not {tokens}: not extrapolated"
            )
        j = next(i for i, c in enumerate(counts) if c > tokens)
        w = (tokens - counts[j - 1]) / (counts[j] - counts[j - 1])
        seconds = times[j - 1] + w * (times[j] - times[j - 1])
        note = f"{files[j]}: {phase} {pass_} between {counts[j - 1]} and {counts[j]} tokens"
        low, high = hosts[j - 1], hosts[j]
        host = None if low is None or high is None else low + w * (high - low)
        return PhaseTime(seconds, False, note, host, per_expert[j - 1] or per_expert[j])
