"""GEMM shape expansion against hand-computed expectations (docs/conventions.md, "GEMM shapes of a training step")."""

import json

import pytest

from opbench.core.errors import UsageError
from opbench.gemm.shapes import ModelParallel, gemm_shapes, padded_vocab
from opbench.models import load_model_configs, select_models


def model(name):
    return select_models(load_model_configs(), name)[0]


def fwd(shapes):
    return {s.layer: (s.m, s.n, s.k, s.groups) for s in shapes if s.pass_ == "fwd"}


def test_llama31_8b_dense_no_tp():
    shapes = gemm_shapes(model("Llama3.1_8B"), [1], 512)
    assert fwd(shapes) == {
        "qkv": (512, (32 + 2 * 8) * 128, 4096, 1),  # 6144
        "attn_out": (512, 4096, 4096, 1),
        "mlp_gate_up": (512, 2 * 14336, 4096, 1),
        "mlp_down": (512, 4096, 14336, 1),
        "lm_head": (512, 128256, 4096, 1),
    }
    assert len(shapes) == 5 * 3


def test_passes_layouts():
    shapes = {s.pass_: s for s in gemm_shapes(model("Llama2_7B"), [2], 1024, layers=["mlp_down"])}
    T = 2 * 1024
    assert (shapes["fwd"].m, shapes["fwd"].n, shapes["fwd"].k) == (T, 4096, 11008)
    assert (shapes["dgrad"].m, shapes["dgrad"].n, shapes["dgrad"].k) == (T, 11008, 4096)
    assert (shapes["wgrad"].m, shapes["wgrad"].n, shapes["wgrad"].k) == (4096, 11008, T)
    assert (shapes["fwd"].trans_a, shapes["fwd"].trans_b) == (False, True)  # NT
    assert (shapes["dgrad"].trans_a, shapes["dgrad"].trans_b) == (False, False)  # NN
    assert (shapes["wgrad"].trans_a, shapes["wgrad"].trans_b) == (True, False)  # TN


def test_llama3_70b_tp8_and_vocab_padding():
    got = fwd(gemm_shapes(model("Llama3.1_70B"), [1], 8192, ModelParallel(tp=8)))
    assert got["qkv"] == (8192, (8 + 2 * 1) * 128, 8192, 1)  # 64/8 q heads, 8/8 kv heads
    assert got["attn_out"] == (8192, 8192, 1024, 1)
    assert got["mlp_gate_up"] == (8192, 2 * 3584, 8192, 1)
    assert got["mlp_down"] == (8192, 8192, 3584, 1)
    # 128256 padded to a multiple of 128·8 = 1024 → 129024, split 8 ways.
    assert padded_vocab(128256, 8) == 129024
    assert got["lm_head"] == (8192, 129024 // 8, 8192, 1)


def test_qwen3_attn_out_k_differs_from_hidden():
    got = fwd(gemm_shapes(model("Qwen3_32B"), [1], 4096, ModelParallel(tp=2)))
    assert got["attn_out"] == (4096, 5120, 64 * 128 // 2, 1)  # 4096 ≠ hidden 5120
    assert got["qkv"] == (4096, (32 + 2 * 4) * 128, 5120, 1)


def test_context_parallel_divides_tokens():
    got = fwd(gemm_shapes(model("Llama2_7B"), [1], 4096, ModelParallel(cp=4)))
    assert got["qkv"][0] == 1024


def test_mixtral_moe_with_ep():
    # T = 4096, top-2 of 8 experts, ep=4: each rank holds 2 experts; each expert sees T·ep·top_k/E = 4096 rows.
    shapes = gemm_shapes(model("Mixtral_8x7B"), [1], 4096, ModelParallel(ep=4))
    got = fwd(shapes)
    assert "mlp_gate_up" not in got  # Mixtral has no dense MLP layers
    assert got["router"] == (4096, 8, 4096, 1)
    assert got["expert_gate_up"] == (4096, 2 * 14336, 4096, 2)
    assert got["expert_down"] == (4096, 4096, 14336, 2)
    # rows across a rank's groups == T·top_k
    assert got["expert_gate_up"][0] * got["expert_gate_up"][3] == 4096 * 2
    wgrad = {s.layer: (s.m, s.n, s.k, s.groups) for s in shapes if s.pass_ == "wgrad"}
    assert wgrad["expert_down"] == (4096, 14336, 4096, 2)


def test_moe_without_ep_is_balance_seq():
    got = fwd(gemm_shapes(model("Qwen3_30B_A3B"), [1], 4096))
    assert got["expert_gate_up"] == (4096 * 8 // 128, 2 * 768, 2048, 128)  # 256 rows per expert
    assert got["attn_out"] == (4096, 2048, 32 * 128, 1)


def test_deepseek_v3_mla_dense_first_and_shared():
    got = fwd(gemm_shapes(model("DeepSeek_V3"), [1], 4096, ModelParallel(tp=4, ep=8)))
    assert got["mla_q_down"] == (4096, 1536, 7168, 1)
    assert got["mla_q_up"] == (4096, 32 * (128 + 64), 1536, 1)
    assert got["mla_kv_down"] == (4096, 512 + 64, 7168, 1)
    assert got["mla_kv_up"] == (4096, 32 * (128 + 128), 512, 1)
    assert got["attn_out"] == (4096, 7168, 32 * 128, 1)
    assert got["mlp_gate_up"] == (4096, 2 * 18432 // 4, 7168, 1)  # dense first_k layers
    # Megatron: etp defaults to tp = 4; the router sees T/tp = 1024 tokens; rows = 1024·4·8·8/256 = 1024
    assert got["expert_gate_up"] == (1024, 2 * 2048 // 4, 7168, 32)
    assert got["shared_gate_up"] == (4096, 2 * 2048 // 4, 7168, 1)  # 1 shared expert × 2048, TP-split, all T
    assert got["router"] == (1024, 256, 7168, 1)
    assert "qkv" not in got and "mla_q" not in got


def test_moe_under_tp_follows_megatron_core_mixtral_worked_example():
    """Mixtral-8x7B, seqlen 4096, mbs 1, tp 4, ep 2 (docs/conventions.md, "MoE under tensor parallelism")."""
    got = fwd(gemm_shapes(model("Mixtral_8x7B"), [1], 4096, ModelParallel(tp=4, ep=2)))
    assert got["router"] == (1024, 8, 4096, 1)  # T/tp: sequence parallel
    assert got["expert_gate_up"] == (2048, 7168, 4096, 4)  # etp = tp = 4: 4·2·1024·2/8 rows, N = 2·14336/4
    assert got["expert_down"] == (2048, 4096, 3584, 4)
    assert got["qkv"][0] == 4096 and got["lm_head"][0] == 4096  # dense layers unchanged (all-gathered T)
    not_split = fwd(gemm_shapes(model("Mixtral_8x7B"), [1], 4096, ModelParallel(tp=4, ep=2, etp=1)))
    assert not_split["expert_gate_up"] == (512, 28672, 4096, 4)  # 1·2·1024·2/8 rows, experts whole
    assert not_split["router"] == (1024, 8, 4096, 1)


def test_moe_under_tp_dense_first_and_shared_experts():
    """DeepSeek-V2-Lite (a dense first layer, 2 shared experts) and Qwen3-30B-A3B (no shared) at tp 2, ep 4."""
    ds = fwd(gemm_shapes(model("DeepSeek_V2_Lite"), [2], 2048, ModelParallel(tp=2, ep=4)))
    t = 2 * 2048
    assert ds["mlp_gate_up"] == (t, 2 * 10944 // 2, 2048, 1)  # the dense first layer: an ordinary TP MLP
    assert ds["shared_gate_up"] == (t, 2 * 2 * 1408 // 2, 2048, 1)  # shared experts: TP MLP on all T tokens
    assert ds["router"] == (t // 2, 64, 2048, 1)
    assert ds["expert_gate_up"] == (-(-(t // 2) * 2 * 4 * 6 // 64), 2 * 1408 // 2, 2048, 16)  # 768 rows
    qw = fwd(gemm_shapes(model("Qwen3_30B_A3B"), [1], 4096, ModelParallel(tp=2, ep=8, etp=1)))
    assert qw["expert_gate_up"] == (2048 * 8 * 8 // 128, 2 * 768, 2048, 16) and "shared_gate_up" not in qw


def test_moe_under_tp_validation_names_the_flag():
    with pytest.raises(UsageError, match="--tp"):  # 3 tokens cannot be split over 2 sequence-parallel ranks
        gemm_shapes(model("Mixtral_8x7B"), [1], 3, ModelParallel(tp=2, ep=1, etp=1), layers=["router"])
    with pytest.raises(UsageError, match="--etp"):  # 14336 is not divisible by 3
        gemm_shapes(model("Mixtral_8x7B"), [1], 4096, ModelParallel(etp=3))


def test_deepseek_v2_lite_single_q_projection():
    got = fwd(gemm_shapes(model("DeepSeek_V2_Lite"), [1], 2048))
    assert got["mla_q"] == (2048, 16 * 192, 2048, 1)
    assert "mla_q_down" not in got
    assert got["shared_gate_up"] == (2048, 2 * 2 * 1408, 2048, 1)


def test_mbs_list_and_layer_filter():
    shapes = gemm_shapes(model("Llama2_7B"), [1, 2], 128, layers=["qkv"], passes=["fwd"])
    assert [(s.mbs, s.m) for s in shapes] == [(1, 128), (2, 256)]


@pytest.mark.parametrize(
    "par,field",
    [
        (ModelParallel(tp=3), "--tp"),
        (ModelParallel(ep=3), "--ep"),
        (ModelParallel(cp=3), "--cp"),
        (ModelParallel(tp=0), "--tp"),
    ],
)
def test_impossible_parallel_sizes(par, field):
    cfg = model("Mixtral_8x7B")
    with pytest.raises(UsageError, match=field):
        gemm_shapes(cfg, [1], 4096, par)


def test_missing_seqlen(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "vocab_size": 100,
            }
        )
    )
    (cfg,) = load_model_configs(p)
    with pytest.raises(UsageError, match="pass --seqlen"):
        gemm_shapes(cfg, [1])


def test_an_fp8_gemm_moves_its_operands_in_one_byte_and_writes_c_in_bf16():
    """torch._scaled_mm's out_dtype is bf16: C's bytes are 2 per element (they were counted at fp8's 1)."""
    from opbench.gemm.shapes import gemm_bytes

    m, n, k = 4096, 1024, 8192
    assert gemm_bytes(m, n, k, 1, "fp8") == m * k + k * n + 2 * m * n
    assert gemm_bytes(m, n, k, 8, "bf16") == 8 * 2 * (m * k + k * n + m * n)
