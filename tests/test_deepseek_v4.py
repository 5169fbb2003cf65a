"""DeepSeek-V4's operators against transformers' own layers on real tensors (outputs and gradients), their FLOP
formulas against the masks they compute, its GEMM rows under TP/EP/CP, its attention plan, and its router in
``opbench moe`` (docs/models.md, "DeepSeek-V4"). The parameters and a forward's FLOPs of the whole model are
checked with every other architecture in tests/test_architectures.py."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

transformers = pytest.importorskip("transformers")
v4 = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")

from opbench.attention.flops import attention_flops, compressed_keys, hc_flops  # noqa: E402
from opbench.attention.operators import (  # noqa: E402
    compress_kv,
    compressed_attention,
    hyper_connection,
    indexer_reference,
    indexer_scores,
    pooled_visible,
    stand_in_topk,
)
from opbench.attention.schema import backends_for  # noqa: E402
from opbench.attention.shapes import AttentionShape, model_attention_shapes  # noqa: E402
from opbench.core.errors import UsageError  # noqa: E402
from opbench.gemm.shapes import ModelParallel, gemm_shapes  # noqa: E402
from opbench.models import load_model_configs  # noqa: E402

# every layer kind: sliding, CSA (rate 4, top-4 of the indexer), HCA (rate 8); 2 streams, 2 output groups
SMALL = dict(
    hidden_size=64,
    num_attention_heads=4,
    head_dim=32,
    vocab_size=256,
    q_lora_rank=48,
    o_groups=2,
    o_lora_rank=16,
    index_n_heads=2,
    index_head_dim=16,
    index_topk=4,
    hc_mult=2,
    hc_sinkhorn_iters=3,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    sliding_window=6,
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
    num_hidden_layers=3,
    attn_implementation="eager",
)
SEQ = 40  # 10 CSA and 5 HCA windows


def _config(**kw):
    return transformers.AutoConfig.for_model("deepseek_v4", **{**SMALL, **kw})


def _randomise(module: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.5) + (1.0 if p.dim() == 1 else 0))


def _sliding_mask(s: int, window: int) -> torch.Tensor:
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    return torch.zeros(s, s).masked_fill(~((j <= i) & (i - j < window)), float("-inf"))[None, None]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("layer", [0, 1, 2], ids=["sliding", "csa", "hca"])
def test_compressed_attention_matches_transformers_layer(layer):
    """transformers' DeepseekV4Attention against the same projections (its own modules) around opbench's
    operators: the compressor's pooling (``compress_kv``), then the attention over the window's raw keys and the
    pooled keys with sinks (``compressed_attention``; CSA's top-k from transformers' own indexer). Output and the
    gradients of the input and of every parameter agree to fp32 rounding."""
    cfg = _config()
    attn = v4.DeepseekV4Attention(cfg, layer)
    _randomise(attn, layer)
    rope = v4.DeepseekV4RotaryEmbedding(cfg)
    g = torch.Generator().manual_seed(10 + layer)
    x = torch.randn(1, SEQ, cfg.hidden_size, generator=g)
    pos = torch.arange(SEQ)[None]
    pe = {k: rope(x, position_ids=pos, layer_type=k) for k in ("main", "compress")}
    dy = torch.randn(1, SEQ, cfg.hidden_size, generator=g)

    x_hf = x.clone().requires_grad_()
    out_hf, _ = attn(x_hf, position_embeddings=pe, position_ids=pos, attention_mask=_sliding_mask(SEQ, 6))
    out_hf.backward(dy)
    ref_grads = {n: p.grad.clone() for n, p in attn.named_parameters() if p.grad is not None}
    attn.zero_grad()

    x_me = x.clone().requires_grad_()
    b, d, heads = 1, cfg.head_dim, cfg.num_attention_heads
    cos, sin = pe[attn.rope_layer_type]
    q_res = attn.q_a_norm(attn.q_a_proj(x_me))
    q = attn.q_b_norm(attn.q_b_proj(q_res).view(b, SEQ, heads, d).transpose(1, 2))
    q = v4.apply_rotary_pos_emb(q, cos, sin).transpose(1, 2)
    kv = attn.kv_norm(attn.kv_proj(x_me)).view(b, SEQ, 1, d).transpose(1, 2)
    kv = v4.apply_rotary_pos_emb(kv, cos, sin).transpose(1, 2)
    comp, rate, idx = attn.compressor, 1, None
    pooled = kv.new_zeros(b, 0, d)
    if comp is not None:
        rate = comp.compress_rate
        pooled = comp.kv_norm(
            compress_kv(comp.kv_proj(x_me), comp.gate_proj(x_me), comp.position_bias, rate, layer == 1)
        )
        at = (torch.arange(pooled.shape[1]) * rate)[None]
        c_cos, c_sin = comp.rotary_emb(pooled, position_ids=at, layer_type="compress")
        pooled = v4.apply_rotary_pos_emb(pooled.unsqueeze(1), c_cos, c_sin).squeeze(1)
        if layer == 1:
            idx = comp.indexer(x_me, q_res, pos, None, layer)
    out = compressed_attention(q, kv, pooled, attn.sinks, cfg.sliding_window, rate, idx)
    out = v4.apply_rotary_pos_emb(out.transpose(1, 2), cos, -sin).transpose(1, 2)
    out = attn.o_b_proj(attn.o_a_proj(out.reshape(b, SEQ, cfg.o_groups, -1)).flatten(2))
    out.backward(dy)

    assert _rel(out, out_hf) < 1e-5
    assert _rel(x_me.grad, x_hf.grad) < 1e-5
    for n, p in attn.named_parameters():
        if n not in ref_grads:  # the top-k is a selection: no gradient reaches the indexer in either
            assert "indexer" in n and p.grad is None, n
            continue
        assert _rel(p.grad, ref_grads[n]) < 1e-5, n


def test_compressed_indexer_scores_match_transformers_scorer():
    """The indexer kind over pooled keys (``indexer_scores`` with ``compress``) scores what transformers'
    DeepseekV4IndexerScorer scores on the visible keys, and picks the same top-k."""
    cfg = _config()
    scorer = v4.DeepseekV4IndexerScorer(cfg)
    _randomise(scorer, 3)
    g = torch.Generator().manual_seed(4)
    heads, dim, n = cfg.index_n_heads, cfg.index_head_dim, SEQ // 4
    q, k, x = torch.randn(1, SEQ, heads, dim, generator=g), torch.randn(1, n, dim, generator=g), torch.randn(1, SEQ, 64)
    ref = scorer(q, k, x)  # [B, S, T], every key scored
    w = scorer.weights_proj(x) * heads**-0.5
    mine = indexer_scores(q, k[:, :, None], w, compress=4, seqlen_kv=SEQ)
    oracle = indexer_reference(q.double(), k[:, :, None].double(), w.double(), compress=4, seqlen_kv=SEQ)
    visible = pooled_visible(SEQ, n, 4)
    assert _rel(mine[0][visible], ref[0][visible]) < 1e-5
    assert _rel(oracle[0][visible].float(), ref[0][visible]) < 1e-5
    assert not mine[0][~visible].any()


def test_hyper_connection_matches_transformers():
    """``hyper_connection`` (after the hc GEMM) against transformers' DeepseekV4HyperConnection and the decoder
    layer's mixing, post·y + combᵀ·X: the collapsed block input, the new streams and every gradient."""
    cfg = _config(hc_mult=4, hc_sinkhorn_iters=20)
    hc = v4.DeepseekV4HyperConnection(cfg)
    _randomise(hc, 5)
    g = torch.Generator().manual_seed(6)
    streams = torch.randn(2, 7, 4, cfg.hidden_size, generator=g)
    y = torch.randn(2, 7, cfg.hidden_size, generator=g)
    dout = torch.randn(2, 7, 5, cfg.hidden_size, generator=g)

    xs, ys = streams.clone().requires_grad_(), y.clone().requires_grad_()
    post, comb, collapsed = hc(xs)
    ref = torch.cat([collapsed.unsqueeze(2), post.unsqueeze(-1) * ys.unsqueeze(-2) + comb.transpose(-1, -2) @ xs], 2)
    ref.backward(dout)
    ref_grads = [xs.grad, ys.grad, hc.fn.grad.clone(), hc.base.grad.clone(), hc.scale.grad.clone()]
    hc.zero_grad()

    xm, ym = streams.clone().requires_grad_(), y.clone().requires_grad_()
    mixes = torch.nn.functional.linear(hc.input_norm(xm.flatten(2)), hc.fn)  # the hc_attn / hc_ffn GEMM row
    out = hyper_connection(xm, mixes, hc.base, hc.scale, ym, cfg.hc_sinkhorn_iters, cfg.hc_eps)
    out.backward(dout)
    assert _rel(out, ref) < 1e-5
    for got, want in zip([xm.grad, ym.grad, hc.fn.grad, hc.base.grad, hc.scale.grad], ref_grads):
        assert _rel(got, want) < 1e-5


@pytest.mark.parametrize(
    ("kind", "rate", "topk", "sq", "skv"),
    [("csa", 4, 5, 96, 96), ("hca", 8, 0, 96, 96), ("csa", 4, 5, 32, 96), ("indexer", 4, 5, 96, 96)],
)
def test_flop_formula_counts_the_keys_the_operator_sees(kind, rate, topk, sq, skv):
    """``compressed_keys`` (the FLOP formula's key count) is the number of keys the operator's own masks let
    through: the window's raw keys plus the pooled ones (csa: the top-k picked), for the last CP rank too
    (seq_q < seq_kv)."""
    window = 7
    shape = AttentionShape("m", sq, skv, 4, 1, 16, 16 if kind != "indexer" else 1, True, kind, window)
    shape = replace(shape, compress=rate, topk=topk, window=topk if kind == "indexer" else window)
    n, off = skv // rate, skv - sq
    pooled = pooled_visible(sq, n, rate, offset=off)
    if kind == "csa":
        idx = stand_in_topk(sq, n, rate, topk, offset=off)
        pooled = torch.zeros(sq, n + 1, dtype=torch.bool).scatter_(1, torch.where(idx < 0, n, idx), True)[:, :n]
    t, j = torch.arange(sq)[:, None] + off, torch.arange(skv)[None, :]
    raw = 0 if kind == "indexer" else int(((j <= t) & (j > t - window)).sum())
    assert compressed_keys(shape) == raw + int(pooled.sum())
    assert attention_flops(shape, 1) == pytest.approx(
        2 * 4 * (raw + int(pooled.sum())) * (shape.head_dim_qk + shape.head_dim_v)
    )


def _write(tmp_path, **kw):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(transformers.AutoConfig.for_model("deepseek_v4", **kw).to_dict()))
    (cfg,) = load_model_configs(str(path))
    return cfg


@pytest.fixture(scope="module")
def default_v4(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("v4"))


def test_gemm_rows_under_ep_and_cp(default_v4):
    """Megatron-Core's split: attention and compressor GEMMs whole on every rank, the grouped output projection as
    o_groups GEMMs, hyper-connections on the rank's tokens, experts by EP; CP divides every row's tokens."""
    cfg = default_v4
    rows = {r.layer: r for r in gemm_shapes(cfg, seqlen=4096, passes=["fwd"])}
    assert (rows["v4_out_a"].m, rows["v4_out_a"].n, rows["v4_out_a"].k, rows["v4_out_a"].groups) == (
        4096,
        1024,
        4096,
        8,
    )
    assert (rows["v4_q_up"].n, rows["v4_kv"].n, rows["hc_attn"].n, rows["hc_attn"].k) == (32768, 512, 24, 16384)
    assert rows["hc_head"].layer_count == 1 and rows["hc_attn"].layer_count == 43
    compress = {r.n: r.layer_count for r in gemm_shapes(cfg, seqlen=4096, passes=["fwd"]) if r.layer == "compress_kv"}
    assert compress == {2 * 512: 23, 4 * 512: 20}  # hca: kv and gate; csa: two series of each
    ep = {r.layer: r for r in gemm_shapes(cfg, seqlen=4096, par=ModelParallel(ep=8), passes=["fwd"])}
    assert ep["expert_gate_up"].groups == 32 and ep["expert_gate_up"].m == 4096 * 8 * 6 // 256
    cp = {r.layer: r for r in gemm_shapes(cfg, seqlen=4096, par=ModelParallel(cp=2), passes=["fwd"])}
    assert cp["v4_q_down"].m == 2048 and cp["hc_ffn"].m == 2048


def test_tensor_parallel_is_refused_as_megatron_does(default_v4):
    with pytest.raises(UsageError, match="TP 1"):
        gemm_shapes(default_v4, seqlen=4096, par=ModelParallel(tp=2), passes=["fwd"])


def test_attention_plan_at_4096_tokens(default_v4):
    """The default config (43 layers: HCA, HCA, then CSA and HCA alternating) plans two hyper-connection sites per
    layer, 23 hca and 20 csa layers with their indexer, each on its own backend; CP keeps the last rank's keys."""
    shapes = {s.attn_kind: s for s in model_attention_shapes(default_v4, seqlen=4096)}
    assert {k: s.layer_count for k, s in shapes.items()} == {"hc": 86, "hca": 23, "indexer": 20, "csa": 20}
    csa = shapes["csa"]
    assert (csa.num_head_q, csa.num_head_kv, csa.head_dim_qk, csa.window, csa.compress, csa.topk, csa.sinks) == (
        64,
        1,
        512,
        128,
        4,
        512,
        True,
    )
    assert shapes["hc"].num_head_q == 4 and shapes["hc"].head_dim_qk == 4096 and shapes["hc"].window == 20
    assert backends_for("csa") == backends_for("hca") == ("v4_torch",) and backends_for("hc") == ("hc_torch",)
    assert hc_flops(shapes["hc"], 1) == 2 * 4096 * 16 * 4096
    cp = {s.attn_kind: s for s in model_attention_shapes(default_v4, seqlen=4096, cp=4)}
    assert (cp["csa"].seqlen_q, cp["csa"].seqlen_kv, cp["hc"].seqlen_q) == (1024, 4096, 1024)


def test_v4_config_fields_are_checked(tmp_path):
    with pytest.raises(UsageError, match="scoring_func"):
        _write(tmp_path, scoring_func="relu")
    with pytest.raises(UsageError, match="o_groups"):
        _write(tmp_path, o_groups=7)


def test_moe_router_matches_transformers(tmp_path):
    """``opbench moe`` reads a deepseek_v4 config's router: sqrtsoftplus scores, the correction bias for the
    choice only, never group-limited, renormalised × 1.5: the experts and weights of DeepseekV4TopKRouter."""
    from opbench.moe import block as B
    from opbench.moe.spec import block_spec

    cfg = _write(tmp_path, hidden_size=64, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    spec = block_spec(cfg)
    assert spec.router.scoring == "sqrtsoftplus" and not spec.router.grouped and spec.shared_intermediate == 32
    g = torch.Generator().manual_seed(7)
    w = B.make_weights(spec, torch.float32, torch.device("cpu"), g, std=0.3)
    w.correction_bias.copy_(torch.randn(8, generator=g) * 0.1)
    ref = v4.DeepseekV4TopKRouter(_config(hidden_size=64, n_routed_experts=8, num_experts_per_tok=2))
    with torch.no_grad():
        ref.weight.copy_(w.router)
        ref.e_score_correction_bias.copy_(w.correction_bias)
    x = torch.randn(32, 64, generator=g)
    _, ref_w, ref_idx = ref(x)
    my_w, my_idx = B.route(B.router_scores(x, w, spec.router), w, spec.router)
    ref_sorted, order = ref_idx.sort(dim=-1)
    mine_sorted, my_order = my_idx.sort(dim=-1)
    assert torch.equal(ref_sorted, mine_sorted)
    torch.testing.assert_close(my_w.gather(1, my_order), ref_w.gather(1, order))


def test_shapes_file_rows_of_the_new_kinds():
    """A shapes file may carry csa/hca/hc rows; csa needs its compress rate and top-k (one line naming the field)."""
    from opbench.attention.shapes import parse_shape

    row = dict(model="m", seqlen_q=64, seqlen_kv=64, num_head_q=4, num_head_kv=1, head_dim_qk=32, head_dim_v=32)
    row.update(causal=True, attn_kind="csa", window=8, sinks=True)
    shape = parse_shape({**row, "compress": 4, "topk": 4}, "shapes.json[0]")
    assert (shape.compress, shape.topk) == (4, 4)
    with pytest.raises(UsageError, match="compress"):
        parse_shape(row, "shapes.json[0]")
    with pytest.raises(UsageError, match="topk"):
        parse_shape({**row, "compress": 4}, "shapes.json[0]")


def test_attention_dry_run_from_a_config(tmp_path):
    """`opbench attention --dry-run` on a deepseek_v4 config.json at 4096 tokens: each kind on its own backends
    (the softmax ones are not offered for csa, hca or hc), with the FLOPs of flops.py."""
    import pandas as pd

    from opbench.attention.__main__ import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(transformers.AutoConfig.for_model("deepseek_v4", num_hidden_layers=4).to_dict()))
    out = tmp_path / "plan.csv"
    argv = ["--model-config-path", str(path), "--seqlen", "4096", "--max-seqlen", "0", "--dry-run"]
    assert main([*argv, "--report-csv-path", str(out)]) == 0
    plan = pd.read_csv(out.with_suffix(".plan.csv"))
    assert {k: set(g.backend) for k, g in plan.groupby("attn_kind")} == {
        "hc": {"hc_torch"},
        "hca": {"v4_torch"},
        "csa": {"v4_torch"},
        "indexer": {"indexer_torch"},
    }
    csa = plan[plan.attn_kind == "csa"].iloc[0]
    assert (csa.seqlen_q, csa.compress, csa.topk, csa.layer_count) == (4096, 4, 512, 1)
    # per query: its 128-token window (fewer for the first 127) and up to 512 of the ⌊(p+1)/4⌋ pooled keys
    window = 128 * 4096 - 127 * 128 // 2
    pooled = sum(min(512, (p + 1) // 4) for p in range(4096))
    assert csa.fwd_flops == pytest.approx(2 * 64 * (window + pooled) * 1024, rel=1e-5)  # the CSV keeps 6 digits
