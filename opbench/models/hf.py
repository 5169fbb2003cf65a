"""Build the real Hugging Face model for a ModelConfig: the reference the layouts, FSDP sizes and projections are
checked against, and what ``opbench project --validate`` trains.

transformers is an optional (test) dependency: it is imported only inside :func:`hf_config`. Nothing here
downloads anything: models come from config objects (``AutoModelForCausalLM.from_config``).
"""

from __future__ import annotations

from typing import Any

from opbench.core.errors import UsageError

from .config import ModelConfig

# Keys of a config.json that are about the file, not the model.
_NOT_KWARGS = ("model", "name", "model_type", "architectures", "transformers_version", "_name_or_path")
# Per-layer lists in a config.json, cut to the layer count when --num-layers shortens a model.
_PER_LAYER = ("layer_types", "mlp_layer_types", "no_rope_layers", "layers_block_type")  # the last: NemotronH's


def hf_config_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    """Keyword arguments of ``AutoConfig.for_model(cfg.architecture, …)`` giving the same model: a config.json's
    own fields (its layer count as ``cfg`` says), or for a Primus-schema entry its dimensions in transformers' names."""
    arch = cfg.architecture
    if cfg.from_hf:
        own = {k: v for k, v in cfg.raw.items() if k not in _NOT_KWARGS}
        n = cfg.num_hidden_layers
        if n is not None:
            for key in ("num_hidden_layers", "num_layers", "n_layer"):
                if key in own:
                    own[key] = n
            for key in _PER_LAYER:
                if isinstance(own.get(key), list):
                    own[key] = own[key][:n]
            if isinstance(own.get("hybrid_override_pattern"), str):  # NemotronH's legacy spelling of its blocks
                own["hybrid_override_pattern"] = own["hybrid_override_pattern"][:n]
            if isinstance(own.get("per_layer_config"), dict):  # Gemma 4's per-layer overrides, keyed by index
                own["per_layer_config"] = {k: v for k, v in own["per_layer_config"].items() if int(k) < n}
            if isinstance(own.get("moe_layers"), list):
                own["moe_layers"] = [i for i in own["moe_layers"] if i < n]
        return own
    if arch not in PRIMUS_BUILDABLE:
        raise UsageError(
            f"building the real '{arch}' model needs its Hugging Face config.json, not a Primus-schema entry",
            source=cfg.source or cfg.name,
        )
    kw: dict[str, Any] = dict(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        vocab_size=cfg.vocab_size,
        num_hidden_layers=cfg.num_hidden_layers,
        tie_word_embeddings=cfg.tie_word_embeddings,
    )
    if not cfg.is_mla:
        kw["head_dim"] = cfg.head_dim
    if arch in ("llama", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3"):
        kw["attention_bias"] = cfg.attention_bias
    if arch in ("llama", "deepseek_v2"):
        kw["mlp_bias"] = bool(cfg.extra.get("mlp_bias", False))
    if arch == "mixtral":
        kw.update(
            num_local_experts=cfg.n_routed_experts,
            num_experts_per_tok=cfg.num_experts_per_tok,
            intermediate_size=cfg.expert_intermediate_size,
        )
    elif arch in ("qwen2_moe", "qwen3_moe"):
        kw.update(
            num_experts=cfg.n_routed_experts,
            num_experts_per_tok=cfg.num_experts_per_tok,
            moe_intermediate_size=cfg.expert_intermediate_size,
            decoder_sparse_step=cfg.decoder_sparse_step,
            mlp_only_layers=list(cfg.mlp_only_layers),
        )
        if arch == "qwen2_moe":
            kw.update(
                shared_expert_intermediate_size=cfg.shared_intermediate_size,
                qkv_bias=bool(cfg.extra.get("qkv_bias", True)),
            )
    elif arch in ("deepseek_v2", "deepseek_v3"):
        kw.update(
            q_lora_rank=cfg.q_lora_rank,
            kv_lora_rank=cfg.kv_lora_rank,
            qk_nope_head_dim=cfg.qk_nope_head_dim,
            qk_rope_head_dim=cfg.qk_rope_head_dim,
            v_head_dim=cfg.v_head_dim,
            n_group=1,
            topk_group=1,
        )
        if cfg.is_moe:
            kw.update(
                n_routed_experts=cfg.n_routed_experts,
                num_experts_per_tok=cfg.num_experts_per_tok,
                moe_intermediate_size=cfg.expert_intermediate_size,
                n_shared_experts=cfg.n_shared_experts,
                first_k_dense_replace=cfg.first_k_dense_replace,
            )
        else:
            kw.update(first_k_dense_replace=cfg.num_hidden_layers)
    return kw


PRIMUS_BUILDABLE = (
    "llama",
    "mixtral",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "mistral",
    "qwen2",
)


def hf_config(cfg: ModelConfig, attn_implementation: str = "eager", experts_implementation: str = "eager") -> Any:
    """The transformers config object for ``cfg``."""
    from transformers import AutoConfig

    return AutoConfig.for_model(
        cfg.architecture,
        attn_implementation=attn_implementation,
        experts_implementation=experts_implementation,
        **hf_config_kwargs(cfg),
    )


def build_model(cfg: ModelConfig, device: str = "cpu", dtype: Any = None, seed: int = 0, **impl: str):
    """The transformers ``*ForCausalLM`` for ``cfg`` (eager attention and experts by default, so any shape runs on
    CPU; ``impl``: attn_implementation / experts_implementation)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf_cfg = hf_config(cfg, **impl)
    # A training step keeps no generation cache (Megatron and torchtitan have none; transformers' default would
    # make one per forward, and on Qwen3-Next with only linear-attention layers it cannot).
    hf_cfg.use_cache = False
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype or torch.float32)


def decoder_layer_list(model: Any, cfg: ModelConfig) -> Any:
    """The model's ``nn.ModuleList`` of decoder layers (``model.layers``, ``transformer.h``, ``gpt_neox.layers``):
    what FSDP wraps one unit at a time."""
    from .architectures import architecture

    return model.get_submodule(architecture(cfg).layers_prefix)
