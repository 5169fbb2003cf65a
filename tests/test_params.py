"""opbench.models.params against the real transformers models: every name, shape and the registration order.

Small configs use odd sizes (hidden 35, ffn 37, vocab 67, 3 experts…) so that FSDP padding is exercised when the
same configs are sharded in tests/test_fsdp_real.py. Models are built from config objects; nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from opbench.core.errors import UsageError  # noqa: E402
from opbench.models import load_model_configs  # noqa: E402
from opbench.models.config import parse_model_config  # noqa: E402
from opbench.models.hf import build_model  # noqa: E402
from opbench.models.params import parameter_shapes, units  # noqa: E402

_DENSE = dict(
    hidden_size=35,
    intermediate_size=37,
    num_attention_heads=5,
    num_key_value_heads=1,
    head_dim=6,
    vocab_size=67,
    num_hidden_layers=2,
)
_MLA = dict(
    {k: v for k, v in _DENSE.items() if k != "head_dim"},  # MLA: head dims are its own, kv heads = heads
    num_key_value_heads=5,
    kv_lora_rank=13,
    qk_nope_head_dim=6,
    qk_rope_head_dim=4,
    v_head_dim=5,
    n_routed_experts=3,
    num_experts_per_tok=2,
    moe_intermediate_size=11,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
)

# name -> (model_type, HF config kwargs). Dense and MoE, tied and untied, with and without biases.
SMALL_HF_CONFIGS: dict[str, tuple[str, dict]] = {
    "llama_bias": ("llama", dict(_DENSE, attention_bias=True, mlp_bias=True)),
    "llama_tied": ("llama", dict(_DENSE, tie_word_embeddings=True)),
    "mistral": ("mistral", dict(_DENSE)),
    "mixtral": ("mixtral", dict(_DENSE, intermediate_size=13, num_local_experts=3, num_experts_per_tok=2)),
    "qwen2": ("qwen2", dict(_DENSE)),
    "qwen2_moe": (
        "qwen2_moe",
        dict(
            _DENSE,
            num_experts=3,
            num_experts_per_tok=2,
            moe_intermediate_size=11,
            shared_expert_intermediate_size=13,
            decoder_sparse_step=2,
        ),
    ),
    "qwen3_tied": ("qwen3", dict(_DENSE, tie_word_embeddings=True)),
    "qwen3_moe": (
        "qwen3_moe",
        dict(_DENSE, num_experts=3, num_experts_per_tok=2, moe_intermediate_size=11, mlp_only_layers=[0]),
    ),
    "deepseek_v2": ("deepseek_v2", dict(_MLA, q_lora_rank=None, n_shared_experts=2)),
    "deepseek_v3": ("deepseek_v3", dict(_MLA, q_lora_rank=17, n_shared_experts=1)),
    # newer layouts (tests/test_architectures.py has them all): sinks and expert biases, linear attention, Conv1D
    "gpt_oss": (
        "gpt_oss",
        dict(_DENSE, intermediate_size=13, num_local_experts=3, num_experts_per_tok=2, sliding_window=4),
    ),
    "qwen3_next": (
        "qwen3_next",
        dict(
            _DENSE,
            num_experts=3,
            num_experts_per_tok=2,
            moe_intermediate_size=11,
            shared_expert_intermediate_size=13,
            linear_num_key_heads=1,
            linear_num_value_heads=2,
            linear_key_head_dim=6,
            linear_value_head_dim=5,
            full_attention_interval=2,
        ),
    ),
    "gpt2": ("gpt2", dict(n_embd=35, n_head=5, n_inner=37, n_layer=2, n_positions=64, vocab_size=67)),
}


def hf_config(name: str):
    model_type, kwargs = SMALL_HF_CONFIGS[name]
    return transformers.AutoConfig.for_model(
        model_type, attn_implementation="eager", experts_implementation="eager", **kwargs
    )


def write_hf_config(name: str, directory) -> str:
    """A full config.json, as a user would have it next to a checkpoint."""
    path = directory / f"{name}.json"
    hf_config(name).to_json_file(str(path), use_diff=False)
    return str(path)


def hf_named_shapes(model) -> list[tuple[str, tuple[int, ...]]]:
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def predicted(cfg) -> list[tuple[str, tuple[int, ...]]]:
    return [(s.name, s.shape) for s in parameter_shapes(cfg)]


@pytest.mark.parametrize("name", sorted(SMALL_HF_CONFIGS))
def test_small_configs_match_named_parameters(name, tmp_path):
    (cfg,) = load_model_configs(write_hf_config(name, tmp_path))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config(name))
    assert predicted(cfg) == hf_named_shapes(model)


def test_tied_embeddings_have_no_lm_head(tmp_path):
    (tied,) = load_model_configs(write_hf_config("llama_tied", tmp_path))
    names = [s.name for s in parameter_shapes(tied)]
    assert "lm_head.weight" not in names and names.count("model.embed_tokens.weight") == 1
    root = [s.name for s in units(parameter_shapes(tied))["root"]]
    assert root == ["model.embed_tokens.weight", "model.norm.weight"]


def test_units_root_first_then_layers(tmp_path):
    (cfg,) = load_model_configs(write_hf_config("deepseek_v3", tmp_path))
    grouped = units(parameter_shapes(cfg))
    assert list(grouped) == ["root", "layers.0", "layers.1"]
    dense, moe = ([s.name.split(".", 3)[3] for s in grouped[u]] for u in ("layers.0", "layers.1"))
    assert "mlp.gate_proj.weight" in dense and "mlp.experts.gate_up_proj" not in dense
    assert {
        "mlp.experts.gate_up_proj",
        "mlp.gate.weight",
        "mlp.shared_experts.up_proj.weight",
        "self_attn.q_a_layernorm.weight",
        "self_attn.kv_a_layernorm.weight",
    } <= set(moe)
    assert not any("e_score_correction_bias" in n for n in moe)  # a buffer, not a parameter


@pytest.mark.parametrize("cfg", load_model_configs(), ids=lambda c: c.name)
def test_builtin_configs_match_transformers_on_meta(cfg):
    assert predicted(cfg) == hf_named_shapes(build_model(cfg, device="meta"))


def test_known_totals():
    by_name = {c.name: c for c in load_model_configs()}
    total = {n: sum(s.numel for s in parameter_shapes(by_name[n])) for n in ("Llama3.1_8B", "DeepSeek_V3")}
    assert total["Llama3.1_8B"] == 8_030_261_248
    assert round(total["DeepSeek_V3"] / 1e9) == 671


def test_missing_layer_count_is_a_usage_error():
    cfg = parse_model_config(
        {"model": "NoLayers", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100},
        "cfg.json",
    )
    with pytest.raises(UsageError, match="field 'num_hidden_layers'"):
        parameter_shapes(cfg)


def test_hf_config_json_is_read_without_network(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = write_hf_config("qwen2_moe", tmp_path)
    data = json.loads(open(path).read())
    assert data["model_type"] == "qwen2_moe"
    (cfg,) = load_model_configs(path)
    assert cfg.is_moe_layer(1) and not cfg.is_moe_layer(0)  # decoder_sparse_step=2
