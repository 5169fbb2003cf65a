"""Every parameter of a decoder-only model, named and shaped exactly as Hugging Face transformers builds it.

Why: FSDP pads each parameter separately (FSDP2) or each unit's flat buffer (FSDP1), and a checkpoint holds
every tensor by name, so "layer weights" in aggregate is not enough. The names, shapes and registration order
below follow the transformers 5.x modeling files (``modeling_llama.py``, ``modeling_mistral.py``,
``modeling_mixtral.py``, ``modeling_qwen2.py``, ``modeling_qwen2_moe.py``, ``modeling_qwen3.py``,
``modeling_qwen3_moe.py``, ``modeling_deepseek_v2.py``, ``modeling_deepseek_v3.py``) and are checked against
``model.named_parameters()`` of real models in ``tests/test_params.py``. Buffers (rotary tables, DeepSeek-V3's
``e_score_correction_bias``) are not parameters and are not listed.

transformers 5.x stores routed experts fused, one 3-D tensor per projection:
``mlp.experts.gate_up_proj`` (experts, 2·ffn, hidden) and ``mlp.experts.down_proj`` (experts, hidden, ffn).
This module needs no torch and no transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from opbench.core.errors import UsageError

from .config import ModelConfig

ROOT = "root"


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: its fully-qualified HF name, shape, and FSDP unit ('root' or 'layers.<i>')."""

    name: str
    shape: tuple[int, ...]
    unit: str

    @property
    def numel(self) -> int:
        return prod(self.shape)


Named = list[tuple[str, tuple[int, ...]]]


def _linear(name: str, out_features: int, in_features: int, bias: bool) -> Named:
    """nn.Linear registers weight (out, in) then bias (out,)."""
    params: Named = [(f"{name}.weight", (out_features, in_features))]
    if bias:
        params.append((f"{name}.bias", (out_features,)))
    return params


def _norm(name: str, size: int) -> Named:
    return [(f"{name}.weight", (size,))]


def _gated_mlp(prefix: str, hidden: int, ffn: int, bias: bool) -> Named:
    return (
        _linear(f"{prefix}.gate_proj", ffn, hidden, bias)
        + _linear(f"{prefix}.up_proj", ffn, hidden, bias)
        + _linear(f"{prefix}.down_proj", hidden, ffn, bias)
    )


def _fused_experts(prefix: str, experts: int, hidden: int, ffn: int) -> Named:
    return [
        (f"{prefix}.experts.gate_up_proj", (experts, 2 * ffn, hidden)),
        (f"{prefix}.experts.down_proj", (experts, hidden, ffn)),
    ]


def _attention_biases(cfg: ModelConfig) -> tuple[bool, bool]:
    """(q/k/v bias, o_proj bias) as each architecture's modeling file decides them."""
    arch = cfg.architecture
    if arch in ("mistral", "mixtral"):
        return False, False  # hard-coded bias=False
    if arch == "qwen2":
        return True, False  # q/k/v bias=True always, o_proj bias=False
    if arch == "qwen2_moe":
        return bool(cfg.raw.get("qkv_bias", cfg.attention_bias)), False
    return cfg.attention_bias, cfg.attention_bias  # llama, qwen3(_moe): one flag for all four


def _standard_attention(cfg: ModelConfig, p: str) -> Named:
    qkv_bias, o_bias = _attention_biases(cfg)
    h, q, kv = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    params = (
        _linear(f"{p}.q_proj", q, h, qkv_bias)
        + _linear(f"{p}.k_proj", kv, h, qkv_bias)
        + _linear(f"{p}.v_proj", kv, h, qkv_bias)
        + _linear(f"{p}.o_proj", h, q, o_bias)
    )
    if cfg.architecture in ("qwen3", "qwen3_moe") or cfg.qk_norm:
        params += _norm(f"{p}.q_norm", cfg.head_dim) + _norm(f"{p}.k_norm", cfg.head_dim)
    return params


def _mla_attention(cfg: ModelConfig, p: str) -> Named:
    """DeepSeek multi-head latent attention (q LoRA optional; kv always compressed)."""
    h, heads, bias = cfg.hidden_size, cfg.num_attention_heads, cfg.attention_bias
    nope, rope, v = cfg.qk_nope_head_dim or 0, cfg.qk_rope_head_dim or 0, cfg.v_head_dim or 0
    qk_head = nope + rope
    if cfg.q_lora_rank is None:
        params = _linear(f"{p}.q_proj", heads * qk_head, h, False)
    else:
        params = (
            _linear(f"{p}.q_a_proj", cfg.q_lora_rank, h, bias)
            + _norm(f"{p}.q_a_layernorm", cfg.q_lora_rank)
            + _linear(f"{p}.q_b_proj", heads * qk_head, cfg.q_lora_rank, False)
        )
    kv_rank = cfg.kv_lora_rank or 0
    params += (
        _linear(f"{p}.kv_a_proj_with_mqa", kv_rank + rope, h, bias)
        + _norm(f"{p}.kv_a_layernorm", kv_rank)
        + _linear(f"{p}.kv_b_proj", heads * (nope + v), kv_rank, False)
        + _linear(f"{p}.o_proj", h, heads * v, bias)
    )
    return params


def _moe(cfg: ModelConfig, p: str) -> Named:
    """Router, fused experts and shared experts in each architecture's registration order."""
    h, e, ffn = cfg.hidden_size, cfg.n_routed_experts, cfg.expert_intermediate_size
    router = _linear(f"{p}.gate", e, h, False)
    experts = _fused_experts(p, e, h, ffn)
    arch = cfg.architecture
    if arch == "mixtral":
        return router + experts
    if arch == "qwen2_moe":
        return (
            router
            + experts
            + _gated_mlp(f"{p}.shared_expert", h, cfg.shared_intermediate_size, False)
            + _linear(f"{p}.shared_expert_gate", 1, h, False)
        )
    if arch == "qwen3_moe":
        return experts + router
    if arch in ("deepseek_v2", "deepseek_v3"):
        shared = cfg.expert_intermediate_size * cfg.n_shared_experts  # HF: moe_intermediate_size × n_shared
        return experts + router + _gated_mlp(f"{p}.shared_experts", h, shared, _mlp_bias(cfg))
    raise UsageError(
        f"architecture '{arch}' has no mixture-of-experts layout in transformers",
        source=cfg.source or cfg.name,
        field="n_routed_experts",
    )


def _mlp_bias(cfg: ModelConfig) -> bool:
    """Only Llama and DeepSeek-V2 read ``mlp_bias``; the others hard-code bias=False."""
    return cfg.architecture in ("llama", "deepseek_v2") and bool(cfg.raw.get("mlp_bias", False))


def layer_parameters(cfg: ModelConfig, index: int) -> Named:
    """(name, shape) of decoder layer ``index``, names relative to the layer (``self_attn.q_proj.weight``)."""
    attn = _mla_attention(cfg, "self_attn") if cfg.is_mla else _standard_attention(cfg, "self_attn")
    if cfg.is_moe_layer(index):
        mlp = _moe(cfg, "mlp")
    else:
        mlp = _gated_mlp("mlp", cfg.hidden_size, cfg.intermediate_size, _mlp_bias(cfg))
    return attn + mlp + _norm("input_layernorm", cfg.hidden_size) + _norm("post_attention_layernorm", cfg.hidden_size)


def parameter_shapes(cfg: ModelConfig) -> list[ParamSpec]:
    """All parameters in ``model.named_parameters()`` order; tied embeddings list no ``lm_head.weight``."""
    if cfg.num_hidden_layers is None:
        raise UsageError(
            "missing; needed to list every decoder layer's parameters",
            source=cfg.source or cfg.name,
            field="num_hidden_layers",
        )
    h = cfg.hidden_size
    specs = [ParamSpec("model.embed_tokens.weight", (cfg.vocab_size, h), ROOT)]
    for i in range(cfg.num_hidden_layers):
        unit = f"layers.{i}"
        specs += [ParamSpec(f"model.{unit}.{name}", shape, unit) for name, shape in layer_parameters(cfg, i)]
    specs.append(ParamSpec("model.norm.weight", (h,), ROOT))
    if not cfg.tie_word_embeddings:
        specs.append(ParamSpec("lm_head.weight", (cfg.vocab_size, h), ROOT))
    return specs


def units(specs: list[ParamSpec]) -> dict[str, list[ParamSpec]]:
    """Parameters grouped by FSDP unit, in first-appearance order (root first, then layers.0, layers.1, …)."""
    grouped: dict[str, list[ParamSpec]] = {}
    for spec in specs:
        grouped.setdefault(spec.unit, []).append(spec)
    return grouped
