"""Config loading: Primus list/object, HF config.json normalisation, and one-line errors for bad input."""

import json

import pytest

from opbench.core.errors import UsageError
from opbench.gemm.shapes import gemm_shapes
from opbench.models import load_model_configs, select_models
from opbench.models.params import layer_parameters


def write(tmp_path, name, obj):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return p


def test_builtin_list_has_required_models():
    names = {c.name for c in load_model_configs()}
    for required in [
        "Llama2_7B",
        "Llama2_70B",
        "Llama3.1_8B",
        "Llama3.1_70B",
        "Llama3.1_405B",
        "Mixtral_8x7B",
        "Mixtral_8x22B",
        "DeepSeek_V2_Lite",
        "DeepSeek_V2",
        "DeepSeek_V3",
        "Qwen3_8B",
        "Qwen3_30B_A3B",
    ]:
        assert required in names


def test_hf_llama_without_head_dim_and_kv_heads(tmp_path):
    p = write(
        tmp_path,
        "my-llama.json",
        {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_attention_heads": 32,
            "vocab_size": 32000,
            "num_hidden_layers": 32,
            "max_position_embeddings": 4096,
        },
    )
    (cfg,) = load_model_configs(p)
    assert cfg.name == "my-llama"  # file stem
    assert cfg.head_dim == 128 and cfg.num_key_value_heads == 32 and cfg.seqlen is None
    assert not cfg.is_moe and not cfg.is_mla and not cfg.tie_word_embeddings


def test_hf_model_name_override(tmp_path):
    p = write(
        tmp_path,
        "config.json",
        {
            "model_type": "qwen3",
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
            "tie_word_embeddings": True,
        },
    )
    (cfg,) = load_model_configs(p, model_name="Qwen3-0.6B")
    assert cfg.name == "Qwen3-0.6B" and cfg.tie_word_embeddings and cfg.head_dim == 128
    assert "self_attn.q_norm.weight" in dict(layer_parameters(cfg, 0))  # Qwen3's per-head q/k norms


@pytest.mark.parametrize(
    "obj,arch,experts,top_k,expert_inter,shared",
    [
        (
            {"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 14336},
            "mixtral",
            8,
            2,
            14336,
            0,
        ),
        (
            {
                "model_type": "qwen3_moe",
                "num_experts": 128,
                "num_experts_per_tok": 8,
                "moe_intermediate_size": 768,
                "intermediate_size": 6144,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
            },
            "qwen3_moe",
            128,
            8,
            768,
            0,
        ),
        (
            {
                "model_type": "qwen2_moe",
                "num_experts": 60,
                "num_experts_per_tok": 4,
                "moe_intermediate_size": 1408,
                "shared_expert_intermediate_size": 5632,
                "intermediate_size": 5632,
            },
            "qwen2_moe",
            60,
            4,
            1408,
            5632,
        ),
        (
            {
                "model_type": "deepseek_v3",
                "n_routed_experts": 256,
                "num_experts_per_tok": 8,
                "moe_intermediate_size": 2048,
                "n_shared_experts": 1,
                "intermediate_size": 18432,
                "first_k_dense_replace": 3,
                "kv_lora_rank": 512,
                "q_lora_rank": 1536,
                "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64,
                "v_head_dim": 128,
            },
            "deepseek_v3",
            256,
            8,
            2048,
            2048,
        ),
    ],
)
def test_hf_moe_variants_normalised(tmp_path, obj, arch, experts, top_k, expert_inter, shared):
    base = {"hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 1000, "num_hidden_layers": 4}
    (cfg,) = load_model_configs(write(tmp_path, "m.json", {**base, **obj}))
    assert cfg.architecture == arch
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok) == (experts, top_k)
    assert cfg.expert_intermediate_size == expert_inter
    assert cfg.shared_intermediate_size == shared


def test_dense_first_layers_detected():
    (ds,) = select_models(load_model_configs(), "DeepSeek_V3")
    assert [ds.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert "mlp_gate_up" in {s.layer for s in gemm_shapes(ds, passes=["fwd"])}
    (mx,) = select_models(load_model_configs(), "Mixtral_8x7B")
    assert "mlp_gate_up" not in {s.layer for s in gemm_shapes(mx, passes=["fwd"])}


def test_single_primus_object(tmp_path):
    p = write(
        tmp_path,
        "one.json",
        {
            "model": "Tiny",
            "seqlen": 128,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "vocab_size": 100,
        },
    )
    (cfg,) = load_model_configs(p)
    assert cfg.name == "Tiny" and cfg.seqlen == 128


@pytest.mark.parametrize(
    "content,expect",
    [
        ('[{"model": "A", ', "malformed JSON at line 1"),
        (json.dumps([{"model": "A", "hidden_size": 64}]), "field 'num_attention_heads': missing"),
        (
            json.dumps(
                [{"model": "A", "hidden_size": -64, "num_attention_heads": 4, "intermediate_size": 8, "vocab_size": 10}]
            ),
            "field 'hidden_size': must be positive, got -64",
        ),
        (
            json.dumps(
                [
                    {
                        "model": "A",
                        "hidden_size": 64,
                        "num_attention_heads": 4,
                        "num_key_value_heads": 3,
                        "intermediate_size": 8,
                        "vocab_size": 10,
                    }
                ]
            ),
            "not a multiple of 3 KV heads",
        ),
        (json.dumps([]), "the model list is empty"),
        (  # an HF config derives head_dim = hidden // heads: 4 // 8 is 0
            json.dumps(
                {
                    "model_type": "llama",
                    "hidden_size": 4,
                    "num_attention_heads": 8,
                    "num_key_value_heads": 8,
                    "intermediate_size": 8,
                    "vocab_size": 10,
                    "num_hidden_layers": 2,
                }
            ),  # fmt: skip
            "field 'head_dim': hidden_size 4 over 8 heads leaves a head_dim of 0",
        ),
        (
            json.dumps(
                {
                    "model_type": "llama",
                    "hidden_size": 64,
                    "num_attention_heads": 4,
                    "intermediate_size": 8,
                    "vocab_size": 10,
                    "num_hidden_layers": 1 << 24,
                }
            ),  # fmt: skip
            "field 'num_hidden_layers': 16777216 layers is more than 4,096",
        ),
        (json.dumps("x"), "expected a list of models"),
    ],
)
def test_bad_configs_name_file_and_field(tmp_path, content, expect):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(UsageError) as exc:
        load_model_configs(p)
    assert str(p) in str(exc.value) and expect in str(exc.value)


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_a_device_or_a_pipe_is_refused_unread(tmp_path, special):
    """/dev/zero would fill memory and a FIFO with no writer would wait forever: neither is read."""
    import os

    path = tmp_path / "config.fifo"
    if special == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(special)
    with pytest.raises(UsageError, match="is not a regular file"):
        load_model_configs(path)


def test_missing_file(tmp_path):
    with pytest.raises(UsageError, match="file not found"):
        load_model_configs(tmp_path / "nope.json")


def test_a_hugging_face_id_says_opbench_reads_a_local_config_and_how_to_fetch_it(tmp_path, monkeypatch):
    """`--model-config-path Qwen/Qwen3-8B` (a Hub id, no such path here): one error naming the flag, that opbench
    reads a local config.json, and the command that fetches one; a missing path that is not id-shaped, or whose
    folder exists, is still 'file not found'; a local owner/name folder with a config.json is read as usual."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as exc:
        load_model_configs("Qwen/Qwen3-8B")
    assert str(exc.value) == (
        "field '--model-config-path': 'Qwen/Qwen3-8B' is not a file or folder here; it looks like a Hugging Face "
        "model id: opbench reads a local config.json (no network) — fetch it with `hf download Qwen/Qwen3-8B "
        "config.json --local-dir Qwen3-8B` and pass --model-config-path Qwen3-8B"
    )
    for not_an_id in ("Qwen3-8B", "cfg/model.json", "/Qwen/Qwen3-8B", "a/b/c"):
        with pytest.raises(UsageError, match="file not found") as exc:
            load_model_configs(not_an_id)
        assert "Hugging Face" not in str(exc.value)
    (tmp_path / "Qwen").mkdir()  # the owner is a folder here: a typo of a local path, not an id
    with pytest.raises(UsageError, match="file not found"):
        load_model_configs("Qwen/Qwen3-8B")
    (tmp_path / "meta-llama" / "Llama-3.1-8B").mkdir(parents=True)  # an id-shaped folder that exists is read
    llama = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4}
    llama |= {"vocab_size": 1000, "num_hidden_layers": 2}
    write(tmp_path / "meta-llama" / "Llama-3.1-8B", "config.json", llama)
    (cfg,) = load_model_configs("meta-llama/Llama-3.1-8B")
    assert cfg.name == "Llama-3.1-8B"


@pytest.mark.parametrize("tool", ["gemm", "attention", "ckpt", "comm", "fsdp", "cluster", "project"])
def test_every_tool_says_it_of_a_hub_id_in_one_line(run, tool):
    extra = {"fsdp": ["--world-size", "8"], "project": ["--world-size", "8"], "comm": ["--dry-run"]}
    r = run("opbench", tool, "--model-config-path", "Qwen/Qwen3-8B", "--model", "x", *extra.get(tool, []))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert f"opbench {tool}: error: field '--model-config-path': 'Qwen/Qwen3-8B' is not a file or folder" in r.stderr
    assert "`hf download Qwen/Qwen3-8B config.json --local-dir Qwen3-8B`" in r.stderr


def test_unknown_model_lists_available():
    with pytest.raises(UsageError) as exc:
        select_models(load_model_configs(), "Llama9")
    assert "'Llama9'" in str(exc.value) and "Llama3.1_8B" in str(exc.value)


def test_builtin_keyword_and_none_load_the_shipped_list():
    assert [c.name for c in load_model_configs("builtin")] == [c.name for c in load_model_configs()]


# A DeepSeek-V2-Lite entry as Primus' model_configs.json writes it: its DeepSeek keys, no first_k_dense_replace.
PRIMUS_DEEPSEEK = {
    "model": "Deepseek_V2_Lite",
    "seqlen": 4096,
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 192,
    "vocab_size": 102400,
    "kv_lora_rank": 512,
    "moe_intermediate_size": 1408,
    "num_experts_per_tok": 6,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}
GUESSED = "no model_type, so the architecture is guessed from the name and fields: "
PRIMUS_LLAMA = {
    "model": "Llama2_7B",
    "seqlen": 4096,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "vocab_size": 32000,
}


def test_primus_deepseek_without_first_k_dense_replace_warns_once_when_chosen(tmp_path, capsys):
    path = tmp_path / "model_configs.json"
    path.write_text(json.dumps([PRIMUS_LLAMA, PRIMUS_DEEPSEEK]))
    configs = load_model_configs(str(path))
    assert select_models(configs, "Llama2_7B")[0].name == "Llama2_7B"
    # Primus' entries carry no model_type: the guess is said, and nothing about the DeepSeek entry not chosen
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"warning: {path}[0]: model 'Llama2_7B': {GUESSED}'llama'"]
    (ds,) = select_models(configs, "deepseek_v2_lite")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and f"{GUESSED}'deepseek_v2'" in err[0]
    assert "model 'Deepseek_V2_Lite': no first_k_dense_replace" in err[1] and str(path) in err[1]
    assert ds.first_k_dense_replace == 0 and ds.is_moe


def test_primus_names_resolve_to_the_builtin_models():
    configs = load_model_configs(None)
    chosen = select_models(configs, "Mistral_8x7B,MISTRAL_8x22B,Deepseek_V2_Lite,deepseek_v3,llama3.1_8b")
    assert [c.name for c in chosen] == [
        "Mixtral_8x7B",
        "Mixtral_8x22B",
        "DeepSeek_V2_Lite",
        "DeepSeek_V3",
        "Llama3.1_8B",
    ]
    assert chosen[0].n_routed_experts == 8  # the real MoE model, not Primus' dense stand-in


def test_primus_deepseek_rows_have_no_dense_mlp_and_say_why(run, tmp_path):
    path = tmp_path / "model_configs.json"
    path.write_text(json.dumps([PRIMUS_DEEPSEEK]))
    r = run(
        "opbench.gemm",
        "--model-config-path",
        str(path),
        "--model",
        "Deepseek_V2_Lite",
        "--dry-run",
        "--report-dir-path",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("warning:") == 2 and GUESSED in r.stderr and "first_k_dense_replace" in r.stderr
    layers = {
        line.split(",")[1]
        for line in (tmp_path / "benchmark_gemm_Deepseek_V2_Lite.plan.csv").read_text().splitlines()[1:]
    }
    assert "mlp_gate_up" not in layers and {"expert_gate_up", "shared_gate_up", "mla_kv_down"} <= layers


def test_primus_dense_mistral_entry_warns_that_it_is_timed_dense(tmp_path, capsys):
    """Primus' model_configs.json lists Mistral_8x7B with dense keys only: it loads, and says what that means."""
    entry = {**PRIMUS_LLAMA, "model": "Mistral_8x7B", "intermediate_size": 14336, "num_key_value_heads": 8}
    path = tmp_path / "model_configs.json"
    path.write_text(json.dumps([entry]))
    (cfg,) = select_models(load_model_configs(str(path)), "Mistral_8x7B")
    err = capsys.readouterr().err.strip().splitlines()
    assert not cfg.is_moe and len(err) == 2 and f"{GUESSED}'mistral'" in err[0] and "timed as a dense model" in err[1]
    # any MoE model_type left without its experts says so too (a Qwen3-MoE entry was timed dense without a word)
    path.write_text(json.dumps([{**PRIMUS_LLAMA, "model": "q", "model_type": "qwen3_moe"}]))
    (cfg,) = select_models(load_model_configs(str(path)), "q")
    err = capsys.readouterr().err.strip().splitlines()
    assert not cfg.is_moe and err == [f"warning: {path}[0]: model 'q': no expert fields (n_routed_experts/"
                                      "num_local_experts), so this qwen3_moe model is timed as a dense one"]  # fmt: skip


# --- bad per-architecture fields: one line naming the file and the field, exit 2, in every tool ------------------

TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256}
TINY_MLA = {
    **TINY,
    "num_key_value_heads": 4,
    "intermediate_size": 96,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "num_hidden_layers": 3,
}


def gpt_oss_20b(**changes):
    with open("examples/configs/gpt-oss-20b/config.json") as f:
        return {**json.load(f), **changes}


# (config, the field the one error line names, what it says): each used to give a traceback or be taken silently
BAD_FIELDS = {
    "gpt_oss_zero_experts": (
        gpt_oss_20b(num_local_experts=0),
        "num_local_experts",
        "must be at least 1 for a MoE model (gpt_oss), got 0",
    ),
    "gpt_oss_zero_top_k": (
        gpt_oss_20b(num_experts_per_tok=0),
        "num_experts_per_tok",
        "must be at least 1",
    ),
    "gpt_oss_top_k_above_experts": (gpt_oss_20b(num_local_experts=2), "num_experts_per_tok", "top-k 4 exceeds 2"),
    "qwen2_linear_layers": (
        {**TINY, "model_type": "qwen2", "intermediate_size": 96, "num_hidden_layers": 4},
        "layer_types",
        "'linear_attention' is not among qwen2's layer_types (full_attention, sliding_attention)",
    ),
    "deepseek_v32_bogus_mlp_layer_types": (
        {**TINY_MLA, "model_type": "deepseek_v32", "mlp_layer_types": ["bogus"]},
        "mlp_layer_types",
        "'bogus' is not among deepseek_v32's mlp_layer_types (dense, sparse)",
    ),
    "deepseek_v32_short_mlp_layer_types": (
        {**TINY_MLA, "model_type": "deepseek_v32", "mlp_layer_types": ["dense", "sparse"]},
        "mlp_layer_types",
        "has 2 entries for 3 layers",
    ),
}
BAD_FIELDS["qwen2_linear_layers"][0]["layer_types"] = ["linear_attention"] * 4


@pytest.mark.parametrize("case", sorted(BAD_FIELDS))
def test_bad_model_field_is_one_line_naming_it_in_every_tool(run, tmp_path, case):
    cfg, field, says = BAD_FIELDS[case]
    path = write(tmp_path, "config.json", cfg)
    common = ["--model-config-path", str(path), "--report-dir-path", str(tmp_path / "out")]
    for tool in (
        ["gemm", "--dry-run", "--seqlen", "512"],
        ["attention", "--dry-run", "--seqlen", "512"],
        ["project", "--world-size", "8", "--device", "H100", "--seqlen", "512"],
        ["ckpt", "--dry-run"],
    ):
        r = run("opbench", *tool, *common)
        lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("warning:")]
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (tool, r.stderr)
        assert str(path) in lines[0] and f"field '{field}': {says}" in lines[0], (tool, lines[0])


@pytest.mark.parametrize(
    "model_type,field,extra",
    [
        ("mixtral", "num_local_experts", {}),
        ("qwen2_moe", "num_experts", {}),
        ("qwen3_moe", "num_experts", {}),
        ("qwen3_next", "num_experts", {}),
        ("deepseek_v3", "n_routed_experts", {"kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8}),
        ("glm4_moe", "n_routed_experts", {}),
        ("ernie4_5_moe", "moe_num_experts", {}),
        ("llama4_text", "num_local_experts", {}),
        ("gpt_oss", "num_local_experts", {}),
    ],
)
def test_moe_expert_count_below_one_is_refused_by_its_field(tmp_path, model_type, field, extra):
    obj = {**TINY, "model_type": model_type, "intermediate_size": 96, "num_hidden_layers": 2, "v_head_dim": 16}
    p = write(tmp_path, "config.json", {**obj, **extra, field: 0, "num_experts_per_tok": 1})
    with pytest.raises(UsageError, match=f"field '{field}': must be at least 1 for a MoE model \\({model_type}\\)"):
        load_model_configs(p)
    (cfg,) = load_model_configs(write(tmp_path, "ok.json", {**obj, **extra, field: 2, "num_experts_per_tok": 1}))
    assert cfg.n_routed_experts == 2


@pytest.mark.parametrize(
    "model_type,layer_types",
    [
        ("llama", ["linear_attention", "full_attention"]),
        ("mistral", ["chunked_attention", "sliding_attention"]),
        ("gemma3_text", ["indexed_attention", "full_attention"]),
        ("qwen3_next", ["sliding_attention", "linear_attention"]),
        ("llama4_text", ["linear_attention", "chunked_attention"]),
    ],
)
def test_layer_types_an_architecture_does_not_build_are_refused(tmp_path, model_type, layer_types):
    obj = {**TINY, "model_type": model_type, "intermediate_size": 96, "num_hidden_layers": 2}
    with pytest.raises(UsageError, match=f"field 'layer_types': '{layer_types[0]}' is not among {model_type}'s"):
        load_model_configs(write(tmp_path, "config.json", {**obj, "layer_types": layer_types}))
    with pytest.raises(UsageError, match="field 'layer_types': has 1 entries for 2 layers"):
        load_model_configs(write(tmp_path, "config.json", {**obj, "layer_types": ["full_attention"]}))


def test_gpt_oss_config_without_expert_counts_takes_transformers_defaults(tmp_path):
    cfg = gpt_oss_20b()
    del cfg["num_local_experts"], cfg["num_experts_per_tok"]
    (c,) = load_model_configs(write(tmp_path, "config.json", cfg))
    assert (c.n_routed_experts, c.num_experts_per_tok) == (128, 4)  # GptOssConfig's defaults
    primus = {**TINY, "model": "oss", "architecture": "gpt_oss", "intermediate_size": 96}
    with pytest.raises(UsageError, match="field 'n_routed_experts': missing: every gpt_oss layer routes"):
        load_model_configs(write(tmp_path, "primus.json", primus))


def test_primus_entry_with_zero_experts_is_dense_not_guessed_moe(tmp_path):
    entry = {**TINY, "model": "Tiny", "intermediate_size": 96, "n_routed_experts": 0}
    (cfg,) = load_model_configs(write(tmp_path, "m.json", [entry]))
    assert cfg.architecture == "llama" and not cfg.is_moe


def test_linear_attention_flops_never_divide_by_zero():
    """A linear shape without a chunk size (window 0) is chunked as the kernels chunk, LINEAR_CHUNK."""
    from opbench.attention.flops import gated_deltanet_flops
    from opbench.attention.shapes import AttentionShape
    from opbench.models.layout import LINEAR, LINEAR_CHUNK

    def flops(window: int) -> float:
        return gated_deltanet_flops(AttentionShape("m", 512, 512, 4, 2, 16, 8, True, LINEAR, window), 1)

    assert flops(0) == flops(LINEAR_CHUNK) > 0
