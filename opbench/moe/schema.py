"""The CSV schema of ``opbench moe`` (``benchmark_moe_<model>.csv``). No torch import."""

from opbench.core.schema import Schema

# The expert-GEMM backends, for the CLI's help and checks without importing torch; backends.py registers exactly these.
BACKEND_NAMES = ("torch_loop", "grouped_mm", "te_grouped")

# Phases in the order a forward pass runs them. The first group does not depend on the expert-GEMM backend and is
# timed once per routing (backend "eager"); the second is timed per backend. "experts" is gate_up + activation + down,
# "block" the whole MoE block.
COMMON_PHASES = ("router", "topk", "permute", "activation", "shared", "unpermute_combine")
BACKEND_PHASES = ("gate_up", "down", "experts", "block")
PHASES = (
    "router",
    "topk",
    "permute",
    "gate_up",
    "activation",
    "down",
    "experts",
    "shared",
    "unpermute_combine",
    "block",
)
# --ep N (ep.py): over the EP group; dispatch/combine are the all-to-all-v token exchanges (backward: the reverse ones).
EP_PHASES = ("dispatch", "experts", "combine", "block")
PASSES = ("fwd", "bwd")
COMMON_BACKEND = "eager"

SCHEMA = Schema(
    benchmark="moe",
    title="MoE block",
    version=1,
    columns=(
        "model",
        "routing",
        "backend",
        "phase",
        "pass",
        "mbs",
        "seqlen",
        "tokens",
        "hidden",
        "experts",
        "top_k",
        "expert_intermediate",
        "shared_intermediate",
        "dtype",
        "capacity_factor",
        "capacity",
        "tokens_min",
        "tokens_mean",
        "tokens_max",
        "imbalance",
        "tokens_dropped",
        "gemm_rows",
        "flops",
        "time_s",
        "time_min_s",
        "time_p10_s",
        "time_p90_s",
        "time_max_s",
        "time_std_s",
        "time_iqr_rel",
        "iters",
        "tflops",
        "host_s",
        "max_rel_err",
        "impl",
        "status",
        "error",
        "note",
        "seed",
        "device",
        "ep",
    ),
    keys=("model", "routing", "backend", "phase", "pass", "mbs", "seqlen", "dtype", "capacity_factor"),
    metrics={"time_s": "s", "tflops": "TFLOP/s"},
    signature=("model", "routing", "backend", "phase", "pass", "time_s", "imbalance", "status"),
    file_hint=r"^benchmark_moe_",
    units={
        "host_s": "s",
        "time_min_s": "s",
        "time_p10_s": "s",
        "time_p90_s": "s",
        "time_max_s": "s",
        "time_std_s": "s",
    },
    kinds={"time_std_s": "time_part", "time_iqr_rel": "ratio"},
)
