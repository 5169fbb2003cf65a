"""Build the real Hugging Face model for a ModelConfig, to check the FSDP model against real FSDP.

transformers is an optional (test) dependency: it is imported only inside :func:`build_model`. Nothing here
downloads anything: models come from config objects (``AutoModelForCausalLM.from_config``).
"""

from __future__ import annotations

from typing import Any

from opbench.models import ModelConfig


def hf_config_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    """Keyword arguments of ``AutoConfig.for_model(cfg.architecture, …)`` giving the same dimensions."""
    arch = cfg.architecture
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
        kw["mlp_bias"] = bool(cfg.raw.get("mlp_bias", False))
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
                qkv_bias=bool(cfg.raw.get("qkv_bias", cfg.attention_bias)),
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


def build_model(cfg: ModelConfig, device: str = "cpu", dtype: Any = None, seed: int = 0):
    """The transformers ``*ForCausalLM`` for ``cfg`` (eager attention and experts, so any shape runs on CPU)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = AutoConfig.for_model(
        cfg.architecture, attn_implementation="eager", experts_implementation="eager", **hf_config_kwargs(cfg)
    )
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype or torch.float32)
