"""Attention shapes, FLOP convention and input validation (no kernels run here)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from opbench.attention.__main__ import main
from opbench.attention.flops import attention_flops, visible_kv
from opbench.attention.shapes import (
    BUILTIN_SHAPES,
    AttentionShape,
    cap_seqlen,
    load_attention_shapes,
    model_attention_shapes,
)
from opbench.core.errors import UsageError, run_cli
from opbench.models import load_model_configs, select_models


def shape(sq=128, skv=128, hq=8, hkv=8, dqk=64, dv=64, causal=True, model="m") -> AttentionShape:
    return AttentionShape(model, sq, skv, hq, hkv, dqk, dv, causal)


def brute_force_visible(sq: int, skv: int) -> float:
    """Mean visible keys per row of a bottom-right causal mask, counted."""
    return sum(min(skv, max(0, i + skv - sq + 1)) for i in range(sq)) / sq


def test_flops_non_causal_and_causal_square():
    s = shape(sq=1024, skv=1024, hq=32, dqk=128, dv=128, causal=False)
    assert attention_flops(s, 2) == 2 * 2 * 32 * 1024 * 1024 * 256
    assert attention_flops(shape(sq=1024, skv=1024, hq=32, dqk=128, dv=128), 2) == 2 * 2 * 32 * 1024 * 1024 * 256 / 2
    assert attention_flops(s, 2, "bwd") == 2.5 * attention_flops(s, 2)
    assert attention_flops(s, 2, "fwdbwd") == 3.5 * attention_flops(s, 2)


def test_flops_causal_unequal_lengths_bottom_right():
    # 512 queries at the end of 2048 keys: rows see 1537..2048 keys, mean 1792.5 (the convention: (1536+2048)/2)
    assert visible_kv(512, 2048, True) == (1536 + 2048) / 2 == 1792
    assert brute_force_visible(512, 2048) == pytest.approx(1792.5)
    s = shape(sq=512, skv=2048, hq=16, hkv=2, dqk=192, dv=128)
    assert attention_flops(s, 3) == 2 * 3 * 16 * 512 * 1792 * (192 + 128)
    # equal lengths: convention (0 + s)/2 vs counted (s+1)/2
    assert visible_kv(4096, 4096, True) == 2048
    assert visible_kv(100, 300, False) == 300
    # more queries than keys: the first 1536 of 2048 rows see nothing, the last 512 a triangle (counted: 64.1)
    assert visible_kv(2048, 512, True) == 512 * 512 / 2 / 2048 == 64
    assert brute_force_visible(2048, 512) == pytest.approx(64.125)


def test_gqa_does_not_change_flops():
    assert attention_flops(shape(hkv=1), 1) == attention_flops(shape(hkv=8), 1)


def model_attention_shape(cfg, **kw):
    """The single attention operator of a model whose layers all attend alike."""
    (shape,) = model_attention_shapes(cfg, **kw)
    return shape


def test_model_shapes_dense_gqa_and_mla():
    cfgs = {c.name: c for c in load_model_configs()}
    llama = model_attention_shape(cfgs["Llama3.1_70B"])
    assert (llama.seqlen_q, llama.num_head_q, llama.num_head_kv, llama.head_dim_qk, llama.head_dim_v) == (
        8192,
        64,
        8,
        128,
        128,
    )
    mla = model_attention_shape(cfgs["DeepSeek_V3"])
    assert (mla.num_head_q, mla.num_head_kv, mla.head_dim_qk, mla.head_dim_v) == (128, 128, 192, 128)
    assert model_attention_shape(cfgs["Qwen3_0.6B"]).head_dim_qk == 128  # head_dim ≠ hidden/heads (1024/16)


def test_model_shapes_tp_cp_and_impossible_sizes():
    cfg = select_models(load_model_configs(), "Llama3.1_70B")[0]
    s = model_attention_shape(cfg, seqlen=16384, tp=8, cp=4)
    assert (s.seqlen_q, s.seqlen_kv, s.num_head_q, s.num_head_kv) == (4096, 4096, 8, 1)
    with pytest.raises(UsageError, match="--tp.*not divisible by --tp 16|num_key_value_heads 8"):
        model_attention_shape(cfg, tp=16)
    with pytest.raises(UsageError, match="seqlen 8192 .* --cp 3"):
        model_attention_shape(cfg, cp=3)


def test_shipped_shapes_match_builtin_models():
    shipped = load_attention_shapes()
    derived = [replace(model_attention_shape(c), layer_count=None) for c in load_model_configs()]
    assert shipped == derived
    names = {s.model for s in shipped}
    assert {"Llama2_7B", "Llama3.1_405B", "Mixtral_8x22B", "DeepSeek_V3", "Qwen3_32B"} <= names
    assert json.loads(BUILTIN_SHAPES.read_text())[0].keys() == {
        "model",
        "seqlen_q",
        "seqlen_kv",
        "num_head_q",
        "num_head_kv",
        "head_dim_qk",
        "head_dim_v",
        "causal",
    }


def test_cap_seqlen_keeps_ratio():
    assert cap_seqlen(shape(sq=2048, skv=8192), 256) == shape(sq=64, skv=256)
    assert cap_seqlen(shape(sq=100, skv=100), 256) == shape(sq=100, skv=100)
    assert cap_seqlen(shape(sq=4096, skv=4096), 0) == shape(sq=4096, skv=4096)


GOOD = {
    "model": "X",
    "seqlen_q": 64,
    "seqlen_kv": 64,
    "num_head_q": 4,
    "num_head_kv": 2,
    "head_dim_qk": 32,
    "head_dim_v": 32,
    "causal": True,
}


@pytest.mark.parametrize(
    "content, field, words",
    [
        (None, None, "file not found"),
        ('[{"model": ', None, "malformed JSON at line 1"),
        ("[]", None, "empty"),
        ('{"shapes": 3}', "model", "missing"),
        (json.dumps([{k: v for k, v in GOOD.items() if k != "seqlen_kv"}]), "seqlen_kv", "missing"),
        (json.dumps([{**GOOD, "num_head_q": -4}]), "num_head_q", "must be positive"),
        (json.dumps([{**GOOD, "head_dim_v": 12.5}]), "head_dim_v", "must be an integer"),
        (json.dumps([GOOD, {**GOOD, "num_head_q": 6, "num_head_kv": 4}]), "num_head_kv", "not a multiple"),
        (json.dumps([{**GOOD, "causal": "yes"}]), "causal", "true or false"),
        (json.dumps([{**GOOD, "head_dim": 32}]), "head_dim", "unknown field"),
    ],
)
def test_bad_shapes_json_is_one_clear_line(tmp_path, capsys, content, field, words):
    path = tmp_path / "shapes.json"
    if content is not None:
        path.write_text(content)
    code = run_cli(
        main, ["--shapes-json-path", str(path), "--report-csv-path", str(tmp_path / "o.csv")], prog="opbench attention"
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("opbench attention: error: ") and str(path) in err and words in err
    if field:
        assert f"field '{field}'" in err
    assert not (tmp_path / "o.csv").exists()  # nothing written before the input is known to be good


SHIPPED_SHAPES = Path(__file__).resolve().parent.parent / "shapes" / "attention_shapes.json"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--backends", "sdpa,cutlass"], "--backends"),
        (["--passes", "fwd,dgrad"], "--passes"),
        ([f"--shapes-json-path={SHIPPED_SHAPES}", "--tp", "2"], "field '--tp': applies to shapes derived"),
        (["--model", "NoSuchModel"], "NoSuchModel"),
        (["--model-config-path", "builtin", "--model", "Llama2_70B", "--tp", "16"], "--tp"),
    ],
)
def test_bad_flags_exit_2(tmp_path, capsys, argv, words):
    assert run_cli(main, [*argv, "--report-csv-path", str(tmp_path / "o.csv")], prog="opbench attention") == 2
    assert words in capsys.readouterr().err


def test_dry_run_writes_planned_rows(tmp_path):
    import pandas as pd

    out = tmp_path / "plan.csv"
    assert (
        main(
            [
                "--model-config-path",
                "builtin",
                "--model",
                "DeepSeek_V2_Lite,Qwen3_8B",
                "--tp",
                "2",
                "--cp",
                "2",
                "--batch-sizes",
                "1,2",
                "--backends",
                "math,triton",
                "--dry-run",
                "--max-seqlen",
                "0",
                "--report-csv-path",
                str(out),
            ]
        )
        == 0
    )
    df = pd.read_csv(out.with_suffix(".plan.csv"))  # a dry run's plan has a file of its own
    assert len(df) == 2 * 2 * 2 and set(df.status) == {"planned"}
    mla = df[df.model == "DeepSeek_V2_Lite"].iloc[0]
    assert (mla.seqlen_q, mla.num_head_q, mla.num_head_kv, mla.head_dim_qk, mla.head_dim_v) == (2048, 8, 8, 192, 128)
    assert mla.batch_size == 1 and mla.fwd_flops == pytest.approx(2 * 8 * 2048 * 1024 * (192 + 128), rel=1e-5)
    assert df.fwd_time.isna().all()


def test_seqlen_tp_cp_without_a_source_derive_from_the_builtin_configs(tmp_path):
    """`opbench attention --model Qwen3_8B --seqlen 256 --tp 2` (as `opbench gemm --model` is called): the shapes
    come from the built-in config at that length and TP (it refused: --seqlen applied to configs only)."""
    import pandas as pd

    out = tmp_path / "plan.csv"
    argv = ["--model", "Qwen3_8B", "--seqlen", "256", "--tp", "2", "--backends", "sdpa", "--report-csv-path", str(out)]
    assert main([*argv, "--dry-run", "--device", "cpu"]) == 0
    plan = pd.read_csv(out.with_suffix(".plan.csv"))
    assert set(plan.seqlen_q) == {256} and set(plan.num_head_q) == {16}  # Qwen3-8B: 32 query heads over tp 2


def test_a_cpu_dry_run_plans_the_lengths_a_cpu_run_measures(tmp_path):
    import pandas as pd

    out = tmp_path / "plan.csv"
    args = [
        "--model-config-path",
        "builtin",
        "--model",
        "Qwen3_8B",
        "--backends",
        "sdpa",
        "--report-csv-path",
        str(out),
    ]
    assert main([*args, "--dry-run", "--device", "cpu"]) == 0
    assert set(pd.read_csv(out.with_suffix(".plan.csv")).seqlen_q) == {128}  # as the run would, not 4096


def _user_shapes(tmp_path, seqlen: int):
    """A user's shapes file with one small causal MHA shape of ``seqlen`` tokens."""
    path = tmp_path / "mine.json"
    shape = {"model": "mine", "seqlen_q": seqlen, "seqlen_kv": seqlen, "num_head_q": 2, "num_head_kv": 2}
    path.write_text(json.dumps([{**shape, "head_dim_qk": 32, "head_dim_v": 32, "causal": True}]))
    return path


def test_a_users_shapes_are_measured_at_their_lengths_on_cpu(tmp_path, capsys):
    """Only the built-in shapes are scaled down on a CPU: a shapes file's 256 tokens run as 256."""
    import pandas as pd

    shapes = _user_shapes(tmp_path, 256)
    out = tmp_path / "o.csv"
    argv = ["--shapes-json-path", str(shapes), "--backends", "math", "--passes", "fwd", "--report-csv-path", str(out)]
    assert main(argv) == 0
    row = pd.read_csv(out).iloc[0]
    assert (row.seqlen_q, row.seqlen_kv, row.status) == (256, 256, "ok") and row.fwd_time > 0
    assert "scaled down" not in capsys.readouterr().err
    assert main(["--model-config-path", "builtin", "--model", "Llama3.1_8B", *argv[2:]]) == 0  # built-in: scaled
    assert (
        pd.read_csv(out).iloc[0].seqlen_q == 128 and "built-in shapes' seqlens scaled down" in capsys.readouterr().err
    )


def test_noisy_passes_are_noted_with_their_spread(tmp_path):
    import pandas as pd

    shapes = _user_shapes(tmp_path, 64)
    out = tmp_path / "o.csv"
    argv = ["--shapes-json-path", str(shapes), "--backends", "math", "--passes", "fwd,bwd", "--quick"]
    assert main([*argv, "--max-spread", "0", "--report-csv-path", str(out)]) == 0  # nothing is that steady
    row = pd.read_csv(out).iloc[0]
    assert row.status == "ok" and "noisy fwd: IQR" in row.note and "noisy bwd: IQR" in row.note
    assert row.fwd_time_iqr_rel > 0 and row.bwd_time_iqr_rel > 0


def test_nemotron_h_mamba2_rows_split_heads_and_groups_over_tp(tmp_path):
    """NemotronH's default blocks (M, E, *, -): one mamba2 row (128 heads of 64, 8 groups of state 128, chunk 128)
    and one full-attention row; --tp splits Mamba-2's heads and groups as Megatron-Core's MambaMixer does (both
    must divide), and --seqlen caps leave its chunk size alone."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "nemotron_h", "hidden_size": 4096, "num_attention_heads": 32,
                                "intermediate_size": 21504, "vocab_size": 131072}))  # fmt: skip
    (cfg,) = load_model_configs(path)
    ssd, attn = model_attention_shapes(cfg, seqlen=4096)
    got = (ssd.attn_kind, ssd.num_head_q, ssd.num_head_kv, ssd.head_dim_qk, ssd.head_dim_v, ssd.window)
    assert got == ("mamba2", 128, 8, 128, 64, 128)
    assert (attn.attn_kind, attn.num_head_q, attn.num_head_kv, attn.head_dim_qk) == ("full", 32, 8, 128)
    assert ssd.layer_count == attn.layer_count == 1
    ssd8 = model_attention_shapes(cfg, seqlen=4096, tp=8)[0]
    assert (ssd8.num_head_q, ssd8.num_head_kv) == (16, 1)
    assert attention_flops(ssd8, 1) * 8 == attention_flops(ssd, 1)  # every rank its heads' and groups' share
    with pytest.raises(UsageError, match="n_groups 8 of .* not divisible by --tp 16"):
        model_attention_shapes(cfg, seqlen=4096, tp=16)
    assert cap_seqlen(ssd, 256).window == 128
