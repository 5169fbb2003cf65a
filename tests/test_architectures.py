"""Every supported architecture against the real transformers model, built on the meta device (nothing is
allocated or downloaded): opbench's parameter list equals ``named_parameters()`` (names, shapes, order), and a
forward under ``torch.utils.flop_counter.FlopCounterMode`` does exactly the GEMM FLOPs opbench's GEMM rows add up
to, and exactly the attention FLOPs of opbench's attention operators as transformers computes them (dense, the mask
applied after the scores: docs/models.md, "Checked against transformers").

A new architecture joins by its entry in opbench/models/architectures.py; ``SUPPORTED`` parametrises the tests
below, and ``VARIANTS`` adds configs that exercise its flags.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from opbench.attention.flops import (  # noqa: E402
    attention_flops,
    gated_deltanet_flops,
    hc_flops,
    kda_flops,
    mamba2_flops,
    visible_keys,
)
from opbench.attention.reference import visible_mask  # noqa: E402
from opbench.attention.shapes import AttentionShape, model_attention_shapes  # noqa: E402
from opbench.core.errors import UsageError  # noqa: E402
from opbench.gemm.shapes import gemm_shapes  # noqa: E402
from opbench.models import load_model_configs  # noqa: E402
from opbench.models.architectures import HF_LAYER_TYPES, SUPPORTED, decoder_layers  # noqa: E402
from opbench.models.config import ALIASES  # noqa: E402
from opbench.models.layout import FULL, HC, INDEXER, KDA, LINEAR, MAMBA2  # noqa: E402
from opbench.models.params import parameter_shapes  # noqa: E402

# transformers' default DeepSeek-V2 config routes to None experts per token; its released models use 6. Its
# default Nemotron config leaves num_key_value_heads None, which its attention cannot build (5.x): one per head
DEFAULT_FIXES = {"deepseek_v2": {"num_experts_per_tok": 6}, "nemotron": {"num_key_value_heads": 48}}
# Per-layer lists transformers derives from other fields; a config.json from before 5.x does not carry them
DERIVED_LISTS = ("layer_types", "mlp_layer_types", "moe_layers", "no_rope_layers", "indexer_types")
# What those older configs say instead, which transformers consumes without keeping (Qwen3-Next's interval,
# GLM-5's indexer schedule)
CONSUMED = {"full_attention_interval", "index_topk_freq", "index_skip_topk_offset", "index_topk_pattern"}
CONSUMED.add("compress_ratios")  # DeepSeek-V4's legacy per-layer 0 / 4 / 128 list

_SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256)
_FALCON = dict(hidden_size=64, num_attention_heads=4, vocab_size=256, num_hidden_layers=2)
# (model_type, config kwargs): configs that switch each architecture's layout flags
VARIANTS: dict[str, tuple[str, dict]] = {
    # every NemotronH block kind (Mamba-2, attention, squared-ReLU MLP, MoE), biases on, 2 groups of 4 heads,
    # chunks of 16: the FLOP check's 3840 tokens are 240 chunks
    "nemotron_h_every_block": (
        "nemotron_h",
        dict(
            _SMALL,
            intermediate_size=96,
            mamba_num_heads=8,
            mamba_head_dim=8,
            ssm_state_size=16,
            n_groups=2,
            conv_kernel=3,
            chunk_size=16,
            use_bias=True,
            mlp_bias=True,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            moe_shared_expert_intermediate_size=48,
            hybrid_override_pattern="M*-EM",
        ),
    ),
    "falcon_40b_layout": ("falcon", dict(_FALCON, new_decoder_architecture=True, num_kv_heads=2, bias=True)),
    "falcon_sequential": ("falcon", dict(_FALCON, parallel_attn=False, multi_query=False)),
    "falcon_one_norm": (
        "falcon",
        dict(_FALCON, new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1),
    ),
    "gpt2_inner": ("gpt2", dict(n_embd=64, n_head=4, n_layer=2, n_inner=96, n_positions=128, vocab_size=256)),
    "gpt_neox_nobias": ("gpt_neox", dict(_SMALL, intermediate_size=96, attention_bias=False, num_hidden_layers=2)),
    "starcoder2_sliding": (
        "starcoder2",
        dict(_SMALL, intermediate_size=96, use_bias=False, sliding_window=16, num_hidden_layers=2),
    ),
    "nemotron_biases": (
        "nemotron",
        dict(_SMALL, intermediate_size=96, attention_bias=True, mlp_bias=True, num_hidden_layers=2),
    ),
    "olmo2_bias": ("olmo2", dict(_SMALL, intermediate_size=96, attention_bias=True, num_hidden_layers=2)),
    "phi3_gqa": (
        "phi3",
        dict(_SMALL, intermediate_size=96, sliding_window=32, num_hidden_layers=2, pad_token_id=0, eos_token_id=1),
    ),
    "gemma3_pattern": (
        "gemma3_text",
        dict(_SMALL, intermediate_size=96, sliding_window=8, sliding_window_pattern=3, num_hidden_layers=5),
    ),
    "qwen2_window": (
        "qwen2",
        dict(
            _SMALL,
            intermediate_size=96,
            use_sliding_window=True,
            sliding_window=16,
            max_window_layers=1,
            num_hidden_layers=3,
        ),
    ),
    "glm4_qk_norm": (
        "glm4_moe",
        dict(
            _SMALL,
            intermediate_size=96,
            use_qk_norm=True,
            attention_bias=True,
            first_k_dense_replace=2,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_shared_experts=2,
            num_hidden_layers=3,
        ),
    ),
    "ernie_interval": (
        "ernie4_5_moe",
        dict(
            _SMALL,
            intermediate_size=96,
            use_bias=True,
            moe_layer_interval=2,
            moe_layer_start_index=1,
            moe_layer_end_index=-1,
            moe_num_experts=4,
            moe_k=2,
            moe_intermediate_size=32,
            moe_num_shared_experts=0,
            num_hidden_layers=5,
        ),
    ),
    "qwen3_next_sparse_step": (
        "qwen3_next",
        dict(
            _SMALL,
            intermediate_size=96,
            decoder_sparse_step=2,
            mlp_only_layers=[3],
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=8,
            full_attention_interval=2,
            num_hidden_layers=4,
        ),
    ),
    "deepseek_v32_small": (
        "deepseek_v32",
        dict(
            _SMALL,
            num_key_value_heads=4,
            intermediate_size=96,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            kv_lora_rank=32,
            q_lora_rank=48,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            index_topk=8,
            index_n_heads=2,
            index_head_dim=16,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=2,
            num_hidden_layers=3,
        ),
    ),
    "llama4_interleaved": (
        "llama4_text",
        dict(
            _SMALL,
            intermediate_size=32,
            intermediate_size_mlp=96,
            num_local_experts=4,
            num_experts_per_tok=1,
            interleave_moe_layer_step=2,
            attention_chunk_size=16,
            no_rope_layer_interval=2,
            num_hidden_layers=4,
        ),
    ),
    "gpt_oss_small": (
        "gpt_oss",
        dict(
            _SMALL,
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=8,
            num_hidden_layers=3,
        ),
    ),
    "olmo3_pattern": (
        "olmo3",
        dict(_SMALL, intermediate_size=96, attention_bias=True, sliding_window=8, num_hidden_layers=5),
    ),
    "olmo3_no_window": ("olmo3", dict(_SMALL, intermediate_size=96, sliding_window=None, num_hidden_layers=4)),
    "smollm3_nope_sliding": (
        "smollm3",
        dict(
            _SMALL,
            intermediate_size=96,
            use_sliding_window=True,
            sliding_window=16,
            no_rope_layer_interval=2,
            pad_token_id=0,
            attention_bias=True,
            mlp_bias=True,
            num_hidden_layers=4,
        ),
    ),
    "minimax_m2_small": (
        "minimax_m2",
        dict(_SMALL, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=2),
    ),
    "mimo_v2_flash_small": (
        "mimo_v2_flash",
        dict(
            _SMALL,
            head_dim=24,
            v_head_dim=16,
            intermediate_size=96,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            attention_bias=True,
            sliding_window_size=8,
            num_hidden_layers=7,
        ),
    ),
    "glm_moe_dsa_shared_indexer": (
        "glm_moe_dsa",
        dict(
            _SMALL,
            num_key_value_heads=4,
            intermediate_size=96,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_shared_experts=2,
            kv_lora_rank=32,
            q_lora_rank=48,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=24,
            index_topk=8,
            index_n_heads=2,
            index_head_dim=16,
            attention_bias=True,
            index_topk_freq=2,
            index_skip_topk_offset=1,
            first_k_dense_replace=1,
            num_hidden_layers=4,
        ),
    ),
    "glm_moe_dsa_pattern": (
        "glm_moe_dsa",
        dict(
            _SMALL,
            num_key_value_heads=4,
            intermediate_size=96,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            kv_lora_rank=32,
            q_lora_rank=48,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            index_topk=8,
            index_n_heads=2,
            index_head_dim=16,
            index_topk_pattern="FSSF",
            first_k_dense_replace=2,
            num_hidden_layers=4,
        ),
    ),
    "qwen3_5_interval": (
        "qwen3_5_text",
        dict(
            _SMALL,
            intermediate_size=96,
            attention_bias=True,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=8,
            linear_conv_kernel_dim=3,
            full_attention_interval=2,
            num_hidden_layers=4,
        ),
    ),
    "qwen3_5_moe_small": (
        "qwen3_5_moe_text",
        dict(
            _SMALL,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=8,
            full_attention_interval=3,
            num_hidden_layers=3,
        ),
    ),
    # every Kimi Linear layer kind: KDA and MLA mixers (MLA with q LoRA and biases), dense and MoE MLPs, two
    # shared experts; the KDA layers from the checkpoint's own linear_attn_config (1-indexed full_attn_layers)
    "kimi_linear_every_layer": (
        "kimi_linear",
        dict(
            _SMALL,
            num_key_value_heads=4,
            intermediate_size=96,
            num_experts=4,
            num_experts_per_token=2,
            moe_intermediate_size=32,
            num_shared_experts=2,
            kv_lora_rank=32,
            q_lora_rank=48,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=24,
            attention_bias=True,
            first_k_dense_replace=2,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            linear_attn_config=dict(
                num_heads=2, head_dim=16, short_conv_kernel_size=3, full_attn_layers=[2, 4], kda_layers=[1, 3]
            ),
            num_hidden_layers=4,
        ),
    ),
    # every DeepSeek-V4 layer kind (sliding, CSA, HCA) from the legacy compress_ratios list, hash-routed and top-k
    # layers, 2 streams, 2 output groups: the FLOP check's 3840 tokens close 960 CSA and 30 HCA windows
    "deepseek_v4_every_layer": (
        "deepseek_v4",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            head_dim=32,
            vocab_size=256,
            q_lora_rank=48,
            o_groups=2,
            o_lora_rank=16,
            index_n_heads=2,
            index_head_dim=16,
            index_topk=8,
            hc_mult=2,
            hc_sinkhorn_iters=3,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            sliding_window=16,
            compress_ratios=[0, 4, 128, 4],
            num_hash_layers=2,
            num_hidden_layers=4,
        ),
    ),
    # every Gemma 4 feature: KV shared by the last 2 of 8 layers (a sliding and a full one), keys as
    # values in full layers with their own head_dim and KV heads, double-wide MLPs in the shared layers, MoE beside
    # the dense MLP, per-layer embeddings of 8
    "gemma4_every_feature": (
        "gemma4_text",
        dict(
            _SMALL,
            intermediate_size=96,
            num_hidden_layers=8,
            num_kv_shared_layers=2,
            attention_k_eq_v=True,
            num_global_key_value_heads=1,
            global_head_dim=32,
            use_double_wide_mlp=True,
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=32,
            sliding_window=16,
            vocab_size_per_layer_input=128,
            hidden_size_per_layer_input=8,
            attention_bias=True,
        ),
    ),
    "gemma4_no_ple": (
        "gemma4_text",
        dict(_SMALL, intermediate_size=96, num_hidden_layers=6, hidden_size_per_layer_input=0, global_head_dim=24),
    ),
    "longcat_flash_biases": (
        "longcat_flash",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            vocab_size=256,
            ffn_hidden_size=96,
            num_layers=2,
            n_routed_experts=4,
            zero_expert_num=4,
            moe_topk=2,
            expert_ffn_hidden_size=32,
            q_lora_rank=48,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            head_dim=8,
            v_head_dim=16,
            attention_bias=True,
            router_bias=True,
        ),
    ),
}


def hf_named_shapes(model) -> list[tuple[str, tuple[int, ...]]]:
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def meta_model(hf_cfg):
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(hf_cfg)


def write_config(path, hf_cfg, derived: bool = True, consumed: dict | None = None) -> str:
    """The config as a config.json; without ``derived`` the per-layer lists transformers computes are left out,
    as in configs written before transformers 5 (which give ``consumed`` instead), so opbench derives them."""
    d = hf_cfg.to_dict()
    if not derived:
        for key in DERIVED_LISTS:
            d.pop(key, None)
        d.update(consumed or {})
    path.write_text(json.dumps(d))
    return str(path)


# Layer types whose operator is not HF_LAYER_TYPES' (NemotronH's "linear_attention" is Mamba-2; its MLP and MoE
# layers have no sequence mixer)
HF_KINDS = {"nemotron_h": {"linear_attention": MAMBA2, "full_attention": FULL}}
HF_KINDS["kimi_linear"] = {"linear_attention": KDA, "full_attention": FULL}  # its linear layers are KDA


def check_against_hf(hf_cfg, tmp_path, kwargs: dict) -> list[tuple[str, tuple[int, ...]]]:
    """opbench's parameter list of the config equals transformers' model's; returns that list."""
    expected = hf_named_shapes(meta_model(hf_cfg))
    names = HF_KINDS.get(hf_cfg.model_type, HF_LAYER_TYPES)
    hf_kinds = [names.get(t) for t in getattr(hf_cfg, "layer_types", None) or []]
    consumed = {k: v for k, v in kwargs.items() if k in CONSUMED}
    for derived in (True, False):
        path = write_config(tmp_path / f"config_{derived}.json", hf_cfg, derived, consumed)
        (cfg,) = load_model_configs(path)
        assert [(s.name, s.shape) for s in parameter_shapes(cfg)] == expected, f"derived lists given: {derived}"
        if hf_kinds:  # each layer's attention operator is the kind transformers builds
            kinds = [lay.attention[-1].kind if lay.attention else None for lay in decoder_layers(cfg)]
            windowless = {
                "sliding": getattr(hf_cfg, "sliding_window", 1),
                "chunked": getattr(hf_cfg, "attention_chunk_size", 1),
            }
            assert kinds == [FULL if k in windowless and not windowless[k] else k for k in hf_kinds]
    return expected


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_default_config_matches_named_parameters(model_type, tmp_path, record):
    kwargs = DEFAULT_FIXES.get(model_type, {})
    hf_cfg = transformers.AutoConfig.for_model(model_type, **kwargs)
    count = sum(math.prod(shape) for _, shape in check_against_hf(hf_cfg, tmp_path, kwargs))
    record(
        f"architecture {model_type}: default config's parameters {count / 1e9:.3f} B, names and shapes as transformers'"
    )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_matches_named_parameters(variant, tmp_path):
    model_type, kwargs = VARIANTS[variant]
    check_against_hf(transformers.AutoConfig.for_model(model_type, **kwargs), tmp_path, kwargs)


# The dimensions a config.json must give (opbench refuses to guess them); every other shape field may be left out.
REQUIRED_DIMS = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_fields_a_config_leaves_out_take_transformers_defaults(model_type, tmp_path):
    """A config.json with its model_type, a layer count and only the dimensions opbench requires: every shape
    field it leaves out (KV heads, expert counts and widths, MLA ranks, dense layers) takes transformers' default
    for that model_type (``Architecture.hf_defaults``), so the parameters are those transformers builds from the
    same file, not a Llama's or a dense model's."""
    fixes = DEFAULT_FIXES.get(model_type, {})
    full = transformers.AutoConfig.for_model(model_type, **fixes).to_dict()
    given = {"model_type": model_type, "n_layer" if "n_layer" in full else "num_hidden_layers": 4, **fixes}
    path = tmp_path / "config.json"
    for _ in range(len(REQUIRED_DIMS) + 1):
        path.write_text(json.dumps(given))
        try:
            (cfg,) = load_model_configs(str(path))
            break
        except UsageError as exc:
            missing = re.search(r"field '(\w+)': missing", str(exc))
            assert missing is not None and missing.group(1) in REQUIRED_DIMS, str(exc)
            key = next(k for k in ALIASES[missing.group(1)] if full.get(k) is not None)
            given[key] = full[key]
    hf_cfg = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in given.items() if k != "model_type"})
    assert [(s.name, s.shape) for s in parameter_shapes(cfg)] == hf_named_shapes(meta_model(hf_cfg)), given


def test_gpt2_ignores_the_kv_heads_and_head_dim_it_does_not_have(tmp_path):
    """transformers' GPT-2 gives every head its own k and v of n_embd / n_head whatever else a config.json says;
    opbench read `num_key_value_heads` and `head_dim` from such a file and sized c_attn for 2 KV heads of 64."""
    given = {"model_type": "gpt2", "n_embd": 256, "n_head": 8, "n_layer": 2, "vocab_size": 1000}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**given, "num_key_value_heads": 2, "head_dim": 64}))
    (cfg,) = load_model_configs(str(path))
    hf_cfg = transformers.AutoConfig.from_pretrained(str(tmp_path))
    assert (cfg.num_key_value_heads, cfg.head_dim) == (8, 32)
    assert [(s.name, s.shape) for s in parameter_shapes(cfg)] == hf_named_shapes(meta_model(hf_cfg))


# Layers per FLOP check: enough for every kind of layer (Gemma 3's sixth is full; DeepSeek-V3's fourth is MoE).
FLOP_LAYERS = {"gemma3_text": 6, "deepseek_v3": 4, "deepseek_v32": 4, "llama4_text": 4, "qwen3_next": 4}
FLOP_LAYERS.update(olmo3=4, smollm3=4, glm_moe_dsa=4, qwen3_5_text=4, qwen3_5_moe_text=4, kimi_linear=5)
FLOP_LAYERS.update(gemma4_text=6)
FLOP_LAYERS.update(deepseek_v4=4)  # HCA, HCA, HCA, CSA
# Tokens: a multiple of every default config's experts / top-k, so balanced routing is whole rows per expert,
# and not of the linear-attention chunk (64), so its padding is counted too.
FLOP_TOKENS = 3840


def _module_flops(counts, root: str, name: str) -> int:
    return sum(counts.get(f"{root}.{name}" if name else root, {}).values())


# VARIANTS whose forward FLOPs are checked too
FLOP_VARIANTS: tuple[str, ...] = ("nemotron_h_every_block",)
FLOP_VARIANTS += ("smollm3_nope_sliding", "mimo_v2_flash_small", "glm_moe_dsa_shared_indexer", "qwen3_5_moe_small")
FLOP_VARIANTS += ("kimi_linear_every_layer", "gemma4_every_feature")
FLOP_VARIANTS += ("deepseek_v4_every_layer",)


def _deepseek_v4_torch_flops(s: AttentionShape) -> float:
    """What FlopCounterMode counts of DeepSeek-V4's eager operators: csa and hca score every query against all raw
    keys (the window is a mask) and every pooled key, T + ⌊T/m⌋ (the top-k too is a mask); the compressed indexer
    scores every pooled key, its per-head weighting elementwise (opbench's formula counts it as a matmul of width
    1, as for DeepSeek-V3.2); a hyper-connection site is its comb·X matmul, ``hc_flops``."""
    if s.attn_kind == HC:
        return hc_flops(s, 1)
    keys = s.seqlen_kv // s.compress + (0 if s.attn_kind == INDEXER else s.seqlen_kv)
    width = s.head_dim_qk + (0 if s.attn_kind == INDEXER else s.head_dim_v)
    return 2.0 * s.num_head_q * s.seqlen_q * keys * width


def _mamba2_torch_flops(s: AttentionShape) -> float:
    """What FlopCounterMode counts of transformers' torch Mamba-2 scan (``mamba2_chunk_scan``), from opbench's
    formula: transformers repeats B and C to every head before C·Bᵀ (2·C²·N per head, not per group), and passes the
    states on as one dense einsum over the chunk-decay matrix, 2·(chunks + 1)²·P·N per head, where the formula
    counts the sequential update, 2·N·P per head and chunk."""
    c, n, p, h, g = s.window, s.head_dim_qk, s.head_dim_v, s.num_head_q, s.num_head_kv
    chunks = -(-s.seqlen_q // c)
    return mamba2_flops(s, 1) + chunks * (2 * c * c * n * (h - g) - 2 * n * p * h) + 2 * (chunks + 1) ** 2 * p * n * h


def _kda_torch_flops(s: AttentionShape) -> float:
    """What FlopCounterMode counts of transformers' torch KDA (``chunk_kimi_delta_attention``), from opbench's
    formula: it builds the two C×C matrices K_β·Kᵀ and Q·Kᵀ (with the per-channel decay) elementwise and sums them,
    uncounted (−4·C²·d_k), does no triangular solve but multiplies by the inverted matrix, counted (+2·C²·(d_k + d_v));
    per head and chunk. With d_k = d_v, as in every KDA layer, that is the formula without its solves."""
    c, dk, dv = s.window, s.head_dim_qk, s.head_dim_v
    chunks = -(-s.seqlen_q // c)
    return kda_flops(s, 1, with_solve=False) + chunks * s.num_head_q * (2 * c * c * (dk + dv) - 4 * c * c * dk)


@pytest.mark.parametrize("model_type", [*SUPPORTED, *FLOP_VARIANTS])
def test_forward_flops_match_gemm_and_attention_rows(model_type, tmp_path, record):
    from torch.utils.flop_counter import FlopCounterMode

    case = model_type
    model_type, given = VARIANTS.get(model_type, (model_type, {}))
    if model_type == "longcat_flash":
        pytest.skip("its expert loop is data-dependent, no meta forward: test_longcat_flash_forward_flops checks it")
    kwargs = {"num_hidden_layers": FLOP_LAYERS.get(model_type, 2), **DEFAULT_FIXES.get(model_type, {}), **given}
    (cfg,) = load_model_configs(
        write_config(tmp_path / "config.json", transformers.AutoConfig.for_model(model_type, **kwargs))
    )
    # gpt-oss's and MiMo-V2-Flash's sinks have no SDPA path
    impl = "eager" if model_type in ("gpt_oss", "mimo_v2_flash", "deepseek_v4") else "sdpa"
    hf_cfg = transformers.AutoConfig.for_model(
        model_type, attn_implementation=impl, experts_implementation="batched_mm", **kwargs
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.bfloat16)
    t = FLOP_TOKENS
    with FlopCounterMode(display=False) as counter:
        model(input_ids=torch.zeros(1, t, dtype=torch.long, device="meta"))
    counts, root = counter.get_flop_counts(), type(model).__name__
    # a module's count includes its children's: one holding nn.Linear children is left to them (Kimi's forget gate,
    # whose own (1, 1, heads, 1) A_log is no weight matrix, holds its f_a/f_b projections)
    weight_modules = [
        n
        for n, m in model.named_modules()
        if any(p.dim() >= 2 for p in m.parameters(recurse=False))
        and not isinstance(m, (torch.nn.Embedding, torch.nn.Conv1d))
        and not any(isinstance(c, torch.nn.Linear) for c in m.modules() if c is not m)
    ]
    gemm_counted = sum(_module_flops(counts, root, n) for n in weight_modules)

    # opbench's GEMM rows; lm_head at the real vocabulary (opbench pads it to 128·tp as Megatron does)
    rows = gemm_shapes(cfg, seqlen=t, passes=["fwd"])
    # transformers' Llama 4 runs every expert on every token and weights by the router: E / top_k × the work
    dense_moe = cfg.n_routed_experts / cfg.num_experts_per_tok if model_type == "llama4_text" else 1
    gemm_expected = sum(
        r.flops * r.layer_count * (dense_moe if r.layer.startswith("expert_") else 1)
        for r in rows
        if r.layer != "lm_head"
    )
    gemm_expected += 2 * t * cfg.vocab_size * cfg.hidden_size
    assert gemm_counted == gemm_expected

    # Attention as transformers computes it: every score, the mask applied afterwards (opbench's rows count the
    # visible keys: attention_flops of the shape as it is). Linear attention: the chunk algorithm's matmuls
    # without the triangular solves (not counted by torch) and the causal conv over T + K − 1 outputs.
    attention_expected, conv = 0.0, 0
    for s in model_attention_shapes(cfg, seqlen=t):
        if s.attn_kind == LINEAR:
            attention_expected += gated_deltanet_flops(s, 1, with_solve=False) * s.layer_count
            x = cfg.extra
            kernel = x["linear_conv_kernel_dim"]
            channels = 2 * x["linear_num_key_heads"] * x["linear_key_head_dim"]
            channels += x["linear_num_value_heads"] * x["linear_value_head_dim"]
            conv += 2 * (t + kernel - 1) * channels * kernel * s.layer_count
        elif s.attn_kind == MAMBA2:  # the scan, and its causal conv over x, B and C (T + K − 1 outputs)
            attention_expected += _mamba2_torch_flops(s) * s.layer_count
            kernel, channels = cfg.extra["conv_kernel"], s.num_head_q * s.head_dim_v + 2 * s.num_head_kv * s.head_dim_qk
            conv += 2 * (t + kernel - 1) * channels * kernel * s.layer_count
        elif s.compress or s.attn_kind == HC:  # DeepSeek-V4: csa, hca, the compressed indexer, hyper-connections
            attention_expected += _deepseek_v4_torch_flops(s) * s.layer_count
        elif s.attn_kind == KDA:  # the scan, and the short conv over q, k and v (T + K − 1 outputs)
            attention_expected += _kda_torch_flops(s) * s.layer_count
            kernel, channels = cfg.extra["linear_conv_kernel_dim"], 3 * s.num_head_q * s.head_dim_qk
            conv += 2 * (t + kernel - 1) * channels * kernel * s.layer_count
        else:
            attention_expected += attention_flops(replace(s, causal=False, attn_kind=FULL), 1) * s.layer_count
    assert _module_flops(counts, root, "") - gemm_counted - conv == attention_expected
    record(
        f"architecture {case}: {kwargs['num_hidden_layers']} layers at {t} tokens, GEMM FLOPs "
        f"{gemm_counted:.4g} and attention FLOPs {attention_expected:.4g}, as transformers' forward counts them"
    )


def test_longcat_flash_forward_flops(tmp_path):
    """LongCat-Flash's experts loop over the experts hit (data-dependent: no meta forward), so a small model runs
    on the CPU. Every GEMM but the routed experts' equals opbench's rows exactly (the router's logits GEMM is the
    router module's own F.linear); the experts do 6·h·F FLOPs per token-slot routed to a real expert and none for
    a zero-computation expert; opbench's expert rows are that under balanced routing over all E + Z experts,
    top_k·E/(E+Z) real experts per token; attention is both MLA sublayers'."""
    from torch.utils.flop_counter import FlopCounterMode

    e, z, top_k, h, ffn, t = 4, 2, 3, 64, 32, 96
    hf_cfg = transformers.AutoConfig.for_model(
        "longcat_flash",
        attn_implementation="sdpa",
        hidden_size=h,
        num_attention_heads=4,
        vocab_size=256,
        ffn_hidden_size=96,
        num_layers=2,
        n_routed_experts=e,
        zero_expert_num=z,
        moe_topk=top_k,
        expert_ffn_hidden_size=ffn,
        q_lora_rank=48,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        head_dim=8,  # the rotary embedding's width: LongCat's configs set it to qk_rope_head_dim
        v_head_dim=16,
    )
    (cfg,) = load_model_configs(write_config(tmp_path / "config.json", hf_cfg))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    picked: list[torch.Tensor] = []
    for name, module in model.named_modules():
        if name.endswith("mlp.router"):
            module.register_forward_hook(lambda mod, args, out: picked.append(out[2]))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=torch.randint(0, 256, (1, t)))
    counts, root = counter.get_flop_counts(), type(model).__name__
    experts = [n for n, _ in model.named_modules() if n.endswith("mlp.experts")]
    others = [
        n
        for n, m in model.named_modules()
        if (any(p.dim() >= 2 for p in m.parameters(recurse=False)) or n.endswith("mlp.router"))
        and not isinstance(m, torch.nn.Embedding)
        and not n.endswith(("mlp.experts", "router.classifier"))
    ]
    real = sum(int((idx < e).sum()) for idx in picked)
    assert len(picked) == 2 and sum(_module_flops(counts, root, n) for n in experts) == real * 6 * h * ffn

    rows = gemm_shapes(cfg, seqlen=t, passes=["fwd"])
    expected = sum(r.flops * r.layer_count for r in rows if r.layer != "lm_head" and not r.layer.startswith("expert_"))
    assert sum(_module_flops(counts, root, n) for n in others) == expected + 2 * t * cfg.vocab_size * h
    routed_rows = sum(r.flops * r.layer_count for r in rows if r.layer.startswith("expert_"))
    assert routed_rows == 2 * t * top_k * e // (e + z) * 6 * h * ffn  # 2 layers, 2 real experts per token

    gemms = sum(_module_flops(counts, root, n) for n in experts + others)
    shapes = model_attention_shapes(cfg, seqlen=t)
    assert [s.layer_count for s in shapes] == [4]  # two MLA sublayers in each of the 2 layers
    attention = sum(attention_flops(replace(s, causal=False, attn_kind=FULL), 1) * s.layer_count for s in shapes)
    assert _module_flops(counts, root, "") - gemms == attention


def test_longcat_flash_fractional_real_experts_are_refused(tmp_path):
    """top-2 over 4 real and 2 zero-computation experts routes 4/3 real experts per token: no whole GEMM row."""
    d = transformers.AutoConfig.for_model("longcat_flash", num_layers=2).to_dict()
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**d, "n_routed_experts": 4, "zero_expert_num": 2, "moe_topk": 2}))
    with pytest.raises(UsageError, match="field 'zero_expert_num'.*fractional 1.33333 real experts per token"):
        load_model_configs(path)


def test_rows_say_which_kind_each_layer_is(tmp_path):
    (cfg,) = load_model_configs(
        write_config(tmp_path / "config.json", transformers.AutoConfig.for_model("gpt_oss", num_hidden_layers=24))
    )
    shapes = model_attention_shapes(cfg, seqlen=4096)
    assert [(s.attn_kind, s.window, s.sinks, s.layer_count) for s in shapes] == [
        ("sliding", 128, True, 12),
        ("full", 0, True, 12),
    ]
    sliding, full = shapes
    # a 128-key window: 4096·128 − 128·127/2 visible pairs per head, against 4096²/2 for the full layer
    assert visible_keys(sliding) * 4096 == 4096 * 128 - 128 * 127 // 2
    assert attention_flops(sliding, 1) / attention_flops(full, 1) == pytest.approx((4096 * 128 - 8128) / 4096**2 * 2)


@pytest.mark.parametrize(
    "sq,skv,kind,window",
    [
        (64, 64, "sliding", 9),
        (40, 64, "sliding", 16),
        (64, 64, "chunked", 16),
        (50, 50, "chunked", 16),
        (30, 80, "chunked", 32),
        (64, 64, "sparse", 12),
        (20, 64, "sparse", 100),
        (64, 64, "sliding", 64),
    ],
)
def test_windowed_flops_count_the_mask(sq, skv, kind, window):
    """The closed forms in flops.visible_keys equal the keys the reference mask lets each row see."""
    shape = AttentionShape("t", sq, skv, 1, 1, 1, 1, True, kind, window)
    mask = visible_mask(sq, skv, kind=kind, window=window)
    assert visible_keys(shape) * sq == pytest.approx(float(mask.sum()))
    if kind == "sparse":  # top-k picks min(k, causal keys) per row
        causal = visible_mask(sq, skv)
        assert torch.equal(mask.sum(1), causal.sum(1).clamp(max=window))


UNKNOWN = {"model_type": "bloom", "hidden_size": 64, "n_head": 4, "n_layer": 2, "vocab_size": 256}


@pytest.mark.parametrize(
    "tool,args",
    [
        ("gemm", ["--dry-run"]),
        ("attention", ["--dry-run"]),
        ("fsdp", ["--world-size", "8"]),
        ("ckpt", ["--dry-run"]),
        ("comm", ["--dry-run"]),
        ("cluster", ["--plan"]),
    ],
)
def test_unknown_model_type_is_refused_by_every_tool(tool, args, tmp_path):
    path = tmp_path / "bloom"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(UNKNOWN))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "opbench",
            tool,
            "--model-config-path",
            str(path),
            *args,
            "--report-dir-path",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert "model_type 'bloom' is not an architecture opbench models exactly" in lines[0]
    assert "supported: llama, mistral" in lines[0] and "gpt_oss" in lines[0]


def test_no_model_type_is_guessed_and_says_so(tmp_path, capsys):
    from opbench.models import select_models

    path = tmp_path / "m.json"
    path.write_text(
        json.dumps(
            [
                {
                    "model": "Llama-ish",
                    "hidden_size": 64,
                    "intermediate_size": 96,
                    "num_attention_heads": 4,
                    "vocab_size": 256,
                }
            ]
        )
    )
    (cfg,) = select_models(load_model_configs(path), "Llama-ish")
    assert cfg.architecture == "llama"
    assert "no model_type, so the architecture is guessed from the name and fields: 'llama'" in capsys.readouterr().err


def test_model_folder_and_config_json_are_named_after_the_folder(tmp_path):
    folder = tmp_path / "Gemma-3-1B"
    folder.mkdir()
    write_config(folder / "config.json", transformers.AutoConfig.for_model("gemma3_text", num_hidden_layers=2))
    (by_folder,) = load_model_configs(folder)
    (by_file,) = load_model_configs(folder / "config.json")
    assert by_folder.name == by_file.name == "Gemma-3-1B"
    with pytest.raises(UsageError, match="is a directory without a config.json"):
        load_model_configs(tmp_path)


def test_multimodal_config_reads_its_language_model(tmp_path):
    text = transformers.AutoConfig.for_model("gemma3_text", num_hidden_layers=2).to_dict()
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gemma3", "text_config": text, "vision_config": {}}))
    (cfg,) = load_model_configs(path)
    assert cfg.architecture == "gemma3_text" and cfg.num_hidden_layers == 2
    assert any("its language model (text_config, gemma3_text) is modelled" in n for n in cfg.notes)


@pytest.mark.parametrize(
    "wrapper,text", [("qwen3_5", "qwen3_5_text"), ("qwen3_5_moe", "qwen3_5_moe_text"), ("gemma4", "gemma4_text")]
)
def test_qwen3_5_wrapper_config_reads_its_text_model(wrapper, text, tmp_path):
    """Qwen3.5's released config.json is the multimodal wrapper; its text_config is the language model, whose
    parameters are those of transformers' text-only causal LM built from the same text config."""
    hf_cfg = transformers.AutoConfig.for_model(wrapper, text_config=dict(num_hidden_layers=4))
    (cfg,) = load_model_configs(write_config(tmp_path / "config.json", hf_cfg))
    assert cfg.architecture == text and cfg.num_hidden_layers == 4
    expected = hf_named_shapes(meta_model(hf_cfg.text_config))
    assert [(s.name, s.shape) for s in parameter_shapes(cfg)] == expected


def test_huge_config_field_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**UNKNOWN, "model_type": "gpt2", "hidden_size": 10**30}))
    with pytest.raises(UsageError, match="field 'hidden_size': 1e\\+30 is out of range"):
        load_model_configs(path)


def test_builtin_and_model_folders_are_one_spelling_in_comm(run, tmp_path):
    """--model-config-path takes 'builtin', a file or a model folder in every tool, comm and cluster included."""
    folder = tmp_path / "tiny"
    folder.mkdir()
    write_config(folder / "config.json", transformers.AutoConfig.for_model("gpt_oss", num_hidden_layers=2))
    for path in ("builtin", str(folder)):
        model = ["--model", "Llama3.1_8B"] if path == "builtin" else ["--seqlen", "1024"]
        r = run("opbench", "comm", "--dry-run", "--nproc-per-node", "8", "--tp", "8", "--model-config-path", path,
                *model)  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert "all_reduce_perf" in r.stdout  # the TP all-reduce of the model's activations is planned


def test_gemma4_per_layer_embeddings_are_gemm_rows_and_a_gather(tmp_path):
    """Gemma 4's per-layer embeddings (PLE): the projection of the input embedding to every layer's slice is one
    GEMM per step (``ple_model_proj``, listed with layer 0), each layer's gate and projection are GEMM rows
    (``ple_gate``, ``ple_proj``), and the table lookup is a gather of layers × PLE width per token, counted with
    the token embedding's in project's embedding work (read and write in forward, an fp32 scatter-add backward)."""
    from opbench.project.plan import Plan
    from opbench.project.rates import Assumptions, Rates
    from opbench.project.workload import embedding_work

    kwargs = dict(num_hidden_layers=6, hidden_size_per_layer_input=256)
    (cfg,) = load_model_configs(
        write_config(tmp_path / "config.json", transformers.AutoConfig.for_model("gemma4_text", **kwargs))
    )
    rows = {r.layer: r for r in gemm_shapes(cfg, seqlen=4096, passes=["fwd"])}
    h, d, layers = cfg.hidden_size, 256, 6
    assert (rows["ple_model_proj"].n, rows["ple_model_proj"].k, rows["ple_model_proj"].layer_count) == (6 * d, h, 1)
    assert (rows["ple_gate"].n, rows["ple_gate"].k, rows["ple_gate"].layer_count) == (d, h, layers)
    assert (rows["ple_proj"].n, rows["ple_proj"].k, rows["ple_proj"].layer_count) == (h, d, layers)
    plain = replace(cfg, extra={**cfg.extra, "ple_dim": 0})
    assert not any(r.layer.startswith("ple_") for r in gemm_shapes(plain, seqlen=4096, passes=["fwd"]))

    rates = Rates([], "H100", "bf16", Assumptions(), 8)
    plan = Plan(world=8, seqlen=4096, global_batch=8)
    fixed = rates.kernel_cost().seconds  # one kernel's fixed cost, on top of bytes / bandwidth
    with_ple, without = embedding_work(cfg, plan, rates), embedding_work(plain, plan, rates)
    for ple, base in ((with_ple.fwd, without.fwd), (with_ple.bwd, without.bwd)):
        (ple_item,), (base_item,) = ple, base
        ratio = (ple_item.timed.seconds - fixed) / (base_item.timed.seconds - fixed)
        assert ratio == pytest.approx((h + layers * d) / h)


def test_gemma4_config_json_with_global_head_fields(tmp_path):
    """A Gemma 4 config.json as the Hub writes it gives ``global_head_dim`` and ``num_global_key_value_heads`` (not
    the ``per_layer_config`` transformers derives from them): the full layers take both, as transformers builds."""
    _, kwargs = VARIANTS["gemma4_every_feature"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gemma4_text", **kwargs}))
    (cfg,) = load_model_configs(path)
    expected = hf_named_shapes(meta_model(transformers.AutoConfig.for_model("gemma4_text", **kwargs)))
    assert [(s.name, s.shape) for s in parameter_shapes(cfg)] == expected
    full = [lay.attention[0] for lay in decoder_layers(cfg) if lay.attention[0].kind == FULL]
    assert [(op.heads_kv, op.head_dim_qk) for op in full] == [(1, 32), (1, 32)]


@pytest.mark.parametrize(
    "model_type,given,match",
    [
        ("gemma4_text", {"num_kv_shared_layers": 3}, "field 'num_kv_shared_layers': 3 of 8 layers reuse KV"),
        ("gemma4_text", {"use_bidirectional_attention": "all"}, "field 'use_bidirectional_attention'"),
        ("gemma4_text", {"enable_moe_block": True}, "field 'num_experts': missing"),
        ("kimi_linear", {"linear_attn_config": [1]}, "field 'linear_attn_config': must be an object"),
    ],
)
def test_kimi_linear_and_gemma4_refuse_what_they_cannot_build(model_type, given, match, tmp_path):
    """One line naming the field: a KV-shared layer whose kind no earlier layer computes (layers 5–7 of the
    default pattern s s s s s f s f read a full layer's KV that layers 0–4 do not make), a bidirectional encoder,
    MoE without experts, a malformed checkpoint sub-config."""
    base = {"model_type": model_type, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, "vocab_size": 256, "num_hidden_layers": 8, **given}))
    with pytest.raises(UsageError, match=match):
        load_model_configs(path)


def test_every_decoder_transformers_ships_is_described_or_refused_by_name(tmp_path):
    """Every causal-LM ``model_type`` transformers ships is either one opbench describes (and the parametrised
    tests above check it against transformers' own model) or refused in one line that names it: none is laid out
    as something else. A new release's decoders land here refused until an entry in architectures.py describes
    them, and then these tests check the entry automatically."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from opbench.models.architectures import TEXT_CONFIG_WRAPPERS

    refused = []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if model_type in SUPPORTED or model_type in TEXT_CONFIG_WRAPPERS:
            continue
        path = tmp_path / f"{model_type}.json"
        fields = dict(model_type=model_type, hidden_size=64, num_attention_heads=4, num_key_value_heads=4)
        path.write_text(json.dumps(dict(fields, num_hidden_layers=2, vocab_size=256, intermediate_size=128)))
        with pytest.raises(UsageError) as e:
            load_model_configs(path)
        message = str(e.value)
        assert f"model_type '{model_type}' is not an architecture opbench models exactly" in message
        assert "\n" not in message
        refused.append(model_type)
    # transformers 5.24 ships 196 causal LMs; most are refused, and every described one is among them
    assert len(refused) + sum(t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES for t in SUPPORTED) >= 100
