"""The CSV schema of ``opbench attention`` (``attention_benchmark.csv``). No torch import."""

from opbench.core.schema import Schema

PASSES = ("fwd", "bwd", "fwdbwd")
# The backends' names, for the CLI's help and checks without importing torch; backends.py registers exactly these.
# Softmax attention (full, sliding, chunked, sparse kinds) runs on the first group; gated DeltaNet layers (kind
# "linear"), DeepSeek-V3.2's indexer (kind "indexer") and Mamba-2's scan (kind "mamba2") are other operators with
# their own implementations.
SOFTMAX_BACKENDS = (
    "math",
    "sdpa",
    "sdpa_flash",
    "sdpa_efficient",
    "sdpa_cudnn",
    "sdpa_math",
    "flash_attn",
    "triton",
)
LINEAR_BACKENDS = ("gdn_torch", "gdn_fla")
INDEXER_BACKENDS = ("indexer_torch",)
MAMBA2_BACKENDS = ("mamba2_torch", "mamba2_ssm")
KDA_BACKENDS = ("kda_torch", "kda_fla")  # Kimi Delta Attention (kind "kda", Kimi Linear)
# DeepSeek-V4's compressed attention (kinds "csa", "hca") and hyper-connection mixing (kind "hc")
V4_BACKENDS, HC_BACKENDS = ("v4_torch",), ("hc_torch",)
BACKEND_NAMES: tuple[str, ...] = (*SOFTMAX_BACKENDS, *LINEAR_BACKENDS, *INDEXER_BACKENDS, *MAMBA2_BACKENDS)
BACKEND_NAMES += (*KDA_BACKENDS, *V4_BACKENDS, *HC_BACKENDS)


def backends_for(kind: str) -> tuple[str, ...]:
    """The backends that implement an attention kind's operator."""
    own = {"linear": LINEAR_BACKENDS, "indexer": INDEXER_BACKENDS, "mamba2": MAMBA2_BACKENDS, "kda": KDA_BACKENDS}
    own.update(csa=V4_BACKENDS, hca=V4_BACKENDS, hc=HC_BACKENDS)
    return own.get(kind, SOFTMAX_BACKENDS)


# Per pass: the median time and its spread (the timing harness' Stats), calls timed, TFLOP/s from the median.
STAT_SUFFIXES = {
    "time": "median",
    "time_min": "min",
    "time_p10": "p10",
    "time_p90": "p90",
    "time_max": "max",
    "time_std": "std",
    "time_iqr_rel": "iqr_rel",
    "iters": "iters",
}
PASS_COLUMNS = tuple(f"{p}_{s}" for p in PASSES for s in (*STAT_SUFFIXES, "tflops"))
SHAPE_COLUMNS = (
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
    "compress",
    "topk",
    "layer_count",
    "dtype",
    "backend",
    "fwd_flops",
)

SCHEMA = Schema(
    benchmark="attention",
    title="Attention",
    # 2: <pass>_time_iqr_rel, noisy passes in note; 3: attn_kind, window, sinks, layer_count (compress, topk added
    # later: new columns, no change of meaning)
    version=3,
    columns=(
        *SHAPE_COLUMNS,
        *PASS_COLUMNS,
        "max_abs_err",
        "max_rel_err",
        "grad_max_abs_err",
        "grad_max_rel_err",
        "status",
        "error",
        "note",
        "tp",
        "cp",
        "device",
    ),
    keys=(
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
        "compress",
        "topk",
        "dtype",
        "backend",
        "tp",
        "cp",
    ),
    metrics={"fwd_tflops": "TFLOP/s", "bwd_tflops": "TFLOP/s"},
    signature=(
        "seqlen_q",
        "seqlen_kv",
        "num_head_q",
        "num_head_kv",
        "head_dim_qk",
        "head_dim_v",
        "backend",
        "fwd_time",
        "fwd_tflops",
        "bwd_time",
        "bwd_tflops",
        "status",
    ),
    file_hint=r"attn|attention",
    # every <pass>_time* column is seconds (the CSV and the console header say so), save the IQR: a fraction
    units={
        "fwd_flops": "FLOP",
        "fwdbwd_tflops": "TFLOP/s",
        **{c: "s" for c in PASS_COLUMNS if "_time" in c and not c.endswith("_iqr_rel")},
    },
    # a spread may be 0 (docs/conventions.md, "Plausible numbers")
    kinds={
        **{c: "time_part" for c in PASS_COLUMNS if c.endswith("_time_std")},
        **{c: "ratio" for c in PASS_COLUMNS if c.endswith("_iqr_rel")},
    },
)
