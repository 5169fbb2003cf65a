"""opbench moe: the block's truth on CPU (grouped GEMMs = a per-expert loop; the whole block = transformers' own MoE
layers, values and gradients), routing distributions, capacity drops, the CLI's dry run and its one-line errors."""

import csv
import json

import numpy as np
import pytest
import torch
from transformers import DeepseekV3Config, Qwen2MoeConfig, Qwen3MoeConfig
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from opbench.core.cli import main as opbench_main
from opbench.core.errors import UsageError
from opbench.models import load_model_configs
from opbench.moe import backends
from opbench.moe import block as B
from opbench.moe.routing import (
    apportion,
    assign,
    capacity,
    dropped,
    load,
    load_histogram,
    parse_routing,
    target_counts,
)
from opbench.moe.spec import block_spec

CPU = torch.device("cpu")
TINY = dict(hidden_size=64, num_experts_per_tok=2, moe_intermediate_size=32, num_hidden_layers=1, vocab_size=128)
TINY_ATTN = dict(num_attention_heads=4, num_key_value_heads=4, intermediate_size=128)


def qwen3_config(**kw):
    return Qwen3MoeConfig(**TINY, **TINY_ATTN, num_experts=8, norm_topk_prob=True, **kw)


def qwen2_config(**kw):
    return Qwen2MoeConfig(**TINY, **TINY_ATTN, num_experts=8, shared_expert_intermediate_size=48, **kw)


def deepseek_config(**kw):
    mla = dict(q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    moe = dict(n_routed_experts=8, n_group=4, topk_group=2, n_shared_experts=1, first_k_dense_replace=0)
    return DeepseekV3Config(**{**TINY, **TINY_ATTN, **mla, **moe, **kw})


def write_config(tmp_path, hf, name="m"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf.to_dict()))
    return folder


def spec_of(tmp_path, hf):
    return block_spec(load_model_configs(write_config(tmp_path, hf))[0])


# --- grouped GEMM = per-expert loop -----------------------------------------------------------------------------


@pytest.mark.parametrize("counts", [[5, 0, 9, 2], [0, 0, 16, 0], [4, 4, 4, 4]])
def test_grouped_mm_equals_the_loop_values_and_gradients(counts):
    g = torch.Generator().manual_seed(0)
    e, n, k = len(counts), 32, 16
    idx = torch.repeat_interleave(torch.arange(e), torch.tensor(counts))[:, None]
    routed = B.plan_rows(idx, e, None)
    x = torch.randn(sum(counts), k, generator=g)
    w = torch.randn(e, n, k, generator=g)
    dy = torch.randn(sum(counts), n, generator=g)
    results = []
    for fn in (backends.torch_loop, backends.grouped_mm):
        xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = fn(xl, wl, routed)
        y.backward(dy)
        results.append((y.detach(), xl.grad, wl.grad))
    for got, ref in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


# --- the whole block = transformers' MoE layer ------------------------------------------------------------------


def copy_weights(ref, w, g):
    with torch.no_grad():
        ref.gate.weight.copy_(w.router)
        ref.experts.gate_up_proj.copy_(w.gate_up)
        ref.experts.down_proj.copy_(w.down)
        if hasattr(ref.gate, "e_score_correction_bias"):  # a non-zero aux-loss-free bias, so the test sees it
            w.correction_bias.copy_(torch.randn(w.correction_bias.shape, generator=g) * 0.1)
            ref.gate.e_score_correction_bias.copy_(w.correction_bias)
        shared = getattr(ref, "shared_experts", None) or getattr(ref, "shared_expert", None)
        if w.shared_gate_proj is not None:
            shared.gate_proj.weight.copy_(w.shared_gate_proj)
            shared.up_proj.weight.copy_(w.shared_up_proj)
            shared.down_proj.weight.copy_(w.shared_down_proj)
        if w.shared_expert_gate is not None:
            ref.shared_expert_gate.weight.copy_(w.shared_expert_gate)


def grads_of(ref):
    names = {"gate.weight": "router", "experts.gate_up_proj": "gate_up", "experts.down_proj": "down"}
    for shared in ("shared_experts", "shared_expert"):
        names.update({f"{shared}.{p}.weight": f"shared_{p}" for p in ("gate_proj", "up_proj", "down_proj")})
    names["shared_expert_gate.weight"] = "shared_expert_gate"
    return {mine: p.grad for name, p in ref.named_parameters() if (mine := names.get(name)) is not None}


@pytest.mark.parametrize(
    "hf, module",
    [
        (qwen3_config(), Qwen3MoeSparseMoeBlock),
        (deepseek_config(), DeepseekV3MoE),
        (qwen2_config(), Qwen2MoeSparseMoeBlock),
    ],
    ids=["qwen3_moe", "deepseek_v3_group_limited", "qwen2_moe_gated_shared"],
)
@pytest.mark.parametrize("backend", ["torch_loop", "grouped_mm"])
def test_block_equals_transformers(tmp_path, hf, module, backend, record):
    spec = spec_of(tmp_path, hf)
    if spec.architecture == "deepseek_v3":
        assert spec.router.grouped and spec.router.correction_bias and spec.shared_intermediate == 32
    g = torch.Generator().manual_seed(1)
    w = B.make_weights(spec, torch.float32, CPU, g, std=0.2)
    ref = module(hf).float()
    copy_weights(ref, w, g)
    x = torch.randn(1, 48, spec.hidden, generator=g)
    dy = torch.randn(1, 48, spec.hidden, generator=g)
    x_ref = x.clone().requires_grad_()
    out_ref = ref(x_ref)
    out_ref.backward(dy)

    linear, _ = backends.build(backend, CPU, torch.float32, [])
    x_me = x[0].clone().requires_grad_()
    out = B.forward(x_me, w, spec, linear)
    out.backward(dy[0])

    errs = {"out": B.rel_err(out, out_ref[0]), "dx": B.rel_err(x_me.grad, x_ref.grad[0])}
    for name, ref_grad in grads_of(ref).items():
        mine = getattr(w, name).grad
        assert ref_grad.abs().max() > 0, name  # a gradient that is zero on both sides would prove nothing
        errs["d" + name] = B.rel_err(mine, ref_grad)
    record(f"moe vs transformers {spec.architecture} {backend}: " + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    assert max(errs.values()) < 1e-5, errs


def test_gpt_oss_block_equals_transformers(tmp_path, record):
    """gpt-oss: top-k of biased logits, softmax over the k, interleaved clamped SwiGLU, expert biases."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    hf = GptOssConfig(
        hidden_size=64, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=4, head_dim=16, vocab_size=128,
    )  # fmt: skip
    spec = spec_of(tmp_path, hf)
    assert spec.router.scoring == "logits" and spec.expert_bias and spec.activation == "gpt_oss"
    g = torch.Generator().manual_seed(4)
    w = B.make_weights(spec, torch.float32, CPU, g, std=1.0)  # large enough that the clamp at 7 bites
    ref = GptOssMLP(hf).float()
    with torch.no_grad():
        ref.router.weight.copy_(w.router)
        ref.router.bias.copy_(w.router_bias)
        ref.experts.gate_up_proj.copy_(w.gate_up.transpose(1, 2))
        ref.experts.gate_up_proj_bias.copy_(w.gate_up_bias)
        ref.experts.down_proj.copy_(w.down.transpose(1, 2))
        ref.experts.down_proj_bias.copy_(w.down_bias)
    x = torch.randn(1, 40, spec.hidden, generator=g)
    dy = torch.randn(1, 40, spec.hidden, generator=g)
    x_ref = x.clone().requires_grad_()
    out_ref = ref(x_ref)[0]
    out_ref.backward(dy)
    x_me = x[0].clone().requires_grad_()
    out = B.forward(x_me, w, spec, backends.grouped_mm)
    out.backward(dy[0])
    errs = {
        "out": B.rel_err(out, out_ref[0]),
        "dx": B.rel_err(x_me.grad, x_ref.grad[0]),
        "dgate_up": B.rel_err(w.gate_up.grad.transpose(1, 2), ref.experts.gate_up_proj.grad),
        "dgate_up_bias": B.rel_err(w.gate_up_bias.grad, ref.experts.gate_up_proj_bias.grad),
        "drouter_bias": B.rel_err(w.router_bias.grad, ref.router.bias.grad),
    }
    record("moe vs transformers gpt_oss grouped_mm: " + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    assert max(errs.values()) < 1e-5, errs


def test_sqrtsoftplus_scoring_matches_deepseek_v4_router(tmp_path):
    """A config whose scoring_func says sqrtsoftplus (DeepSeek-V4's) is routed with it: without groups, the same
    experts and weights as transformers' DeepseekV4TopKRouter."""
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4TopKRouter

    hf = deepseek_config(n_group=1, topk_group=1)
    hf.scoring_func = "sqrtsoftplus"
    hf.routed_scaling_factor = 1.5
    spec = spec_of(tmp_path, hf)
    assert spec.router.scoring == "sqrtsoftplus" and not spec.router.grouped
    g = torch.Generator().manual_seed(5)
    w = B.make_weights(spec, torch.float32, CPU, g, std=0.3)
    w.correction_bias.copy_(torch.randn(8, generator=g) * 0.1)
    ref = DeepseekV4TopKRouter(DeepseekV4Config(hidden_size=64, num_experts_per_tok=2, n_routed_experts=8))
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


def test_group_limited_routing_stays_in_the_chosen_groups(tmp_path):
    spec = spec_of(tmp_path, deepseek_config())
    g = torch.Generator().manual_seed(2)
    w = B.make_weights(spec, torch.float32, CPU, g, std=0.5)
    scores = B.router_scores(torch.randn(64, spec.hidden, generator=g), w, spec.router)
    groups = B.select(scores, w, spec.router) // (spec.experts // spec.router.n_group)
    assert all(len(set(row)) <= spec.router.topk_group for row in groups.tolist())


# --- routing distributions --------------------------------------------------------------------------------------


def test_zipf_counts_decrease_and_sum():
    counts, note = target_counts(parse_routing("zipf:1.2"), 256, 2, 8)
    assert sum(counts) == 512 and note == ""
    assert counts == sorted(counts, reverse=True) and counts[0] > 2 * counts[-1]
    flat, _ = target_counts(parse_routing("zipf:0"), 256, 2, 8)
    assert flat == [64] * 8


@pytest.mark.parametrize("ratio", [1.0, 1.5, 2.0, 3.3, 4.0])
def test_max_mean_hits_its_target(ratio):
    counts, _ = target_counts(parse_routing(f"max-mean:{ratio}"), 256, 2, 8)
    mean = sum(counts) / 8
    assert sum(counts) == 512
    assert abs(max(counts) / mean - ratio) <= 0.5 / mean  # within one copy's rounding


def test_max_mean_beyond_what_tokens_allow_is_refused():
    with pytest.raises(UsageError, match="E/k = 4"):
        target_counts(parse_routing("max-mean:5"), 256, 2, 8)


def test_histogram_is_reproduced_exactly(tmp_path):
    hist = [100, 0, 37, 75, 100, 60, 40, 100]
    path = tmp_path / "tokens_per_expert.json"
    path.write_text(json.dumps(hist))
    counts, note = target_counts(load(parse_routing(f"histogram:{path}")), 256, 2, 8)
    assert counts == hist and note == ""
    idx = assign(counts, 256, 2, seed=3)
    assert np.bincount(idx.ravel(), minlength=8).tolist() == hist
    assert all(len(set(row)) == 2 for row in idx.tolist())  # no token picks an expert twice


def test_histogram_csv_and_scaling(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("layer,tokens\n0,10\n0,30\n0,20\n0,40\n")
    assert load_histogram(str(path)) == (10, 30, 20, 40)
    counts, note = target_counts(load(parse_routing(f"histogram:{path}")), 50, 2, 4)
    assert counts == [10, 30, 20, 40] and note == ""
    counts, note = target_counts(load(parse_routing(f"histogram:{path}")), 100, 2, 4)
    assert counts == [20, 60, 40, 80] and "scaled" in note


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[1, 2, -3]", "entry 2"),
        ("[[1, 2]]", "entry 0"),
        ("a,b\n1,2\n", "name the counts column"),
        ("x\n1\nfoo\n", "'foo'"),
    ],
)
def test_bad_histogram_is_one_line_naming_file_and_field(tmp_path, text, needle):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UsageError, match=needle) as info:
        load_histogram(str(path))
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_seeded_routing_is_reproducible():
    counts, _ = target_counts(parse_routing("zipf:1"), 64, 2, 8)
    assert (assign(counts, 64, 2, 7) == assign(counts, 64, 2, 7)).all()
    assert not (assign(counts, 64, 2, 7) == assign(counts, 64, 2, 8)).all()


def test_apportion_caps_at_the_token_count():
    counts = apportion([100.0, 1.0, 1.0, 1.0], total=40, cap=20)
    assert counts[0] == 20 and sum(counts) == 40 and max(counts) <= 20


# --- capacity ---------------------------------------------------------------------------------------------------


def test_dropped_tokens_under_a_capacity_factor_are_counted_right():
    counts = [30, 14, 10, 10]  # T = 32, k = 2: 64 copies, mean 16
    idx = torch.from_numpy(assign(counts, 32, 2, seed=0))
    cap = capacity(1.25, 32, 2, 4)
    assert cap == 20
    routed = B.plan_rows(idx, 4, cap)
    assert routed.counts == [20, 14, 10, 10] and routed.routed_counts == counts
    assert routed.dropped == dropped(counts, cap) == 10 and routed.rows == 54
    # the kept copies of the hot expert are its first 20 tokens in order
    hot_tokens = (routed.order[:20] // 2).tolist()
    assert hot_tokens == sorted(hot_tokens)
    assert hot_tokens == sorted(t for t in range(32) if 0 in idx[t].tolist())[:20]


def test_dropped_copies_add_nothing_to_the_output(tmp_path):
    """Under a capacity factor the block's output is the full block's with the dropped copies' weights zeroed."""
    spec = spec_of(tmp_path, qwen3_config())
    g = torch.Generator().manual_seed(6)
    w = B.make_weights(spec, torch.float32, CPU, g, std=0.2)
    x = torch.randn(32, spec.hidden, generator=g)
    forced = torch.from_numpy(assign([30, 14, 10, 10, 0, 0, 0, 0], 32, 2, seed=1))
    with torch.no_grad():
        out = B.forward(x, w, spec, backends.torch_loop, cap=20, forced=forced)
        weights, idx = B.route(B.router_scores(x, w, spec.router), w, spec.router, forced)
        full = B.plan_rows(idx, spec.experts, None)
        kept = B.plan_rows(idx, spec.experts, 20)
        mask = torch.zeros(idx.numel())
        mask[kept.order] = 1
        y = B.experts(B.permute(x, full), w, full, spec, backends.torch_loop)
        ref = B.combine(y, weights * mask.view_as(weights), full, 32, None)
    assert kept.dropped == 10
    torch.testing.assert_close(out, ref)


# --- the command ------------------------------------------------------------------------------------------------


def read(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_dry_run_plans_rows_without_timing(tmp_path, capsys):
    code = opbench_main(
        ["moe", "--model-config-path", "examples/configs/tiny-qwen3-moe", "--seqlen", "64", "--dry-run",
         "--routing", "balanced,zipf:1.1", "--report-dir-path", str(tmp_path)]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    rows = read(tmp_path / "benchmark_moe_tiny-qwen3-moe.plan.csv")
    assert {r["status"] for r in rows} == {"planned"} and not any(r["time_s"] for r in rows)
    assert {r["routing"] for r in rows} == {"balanced", "zipf:1.1"}
    # per routing: 5 common phases (no shared experts) + 4 phases × 3 backends, forward and backward
    assert len(rows) == 2 * (5 + 4 * 3) * 2


def test_a_small_cpu_run_writes_rows_and_counts(tmp_path, capsys):
    code = opbench_main(
        ["moe", "--model-config-path", "examples/configs/tiny-qwen3-moe", "--seqlen", "32", "--routing",
         "balanced,model", "--phases", "block", "--capacity-factor", "1.0", "--quick", "--warmup", "0",
         "--min-iters", "1", "--max-iters", "2", "--budget", "0.01", "--device", "cpu",
         "--report-dir-path", str(tmp_path)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    rows = read(tmp_path / "benchmark_moe_tiny-qwen3-moe.csv")
    te = [r for r in rows if r["backend"] == "te_grouped"]
    assert len(te) == 2 and all(r["status"] == "unsupported" and "GPU" in r["error"] for r in te)
    ok = [r for r in rows if r["backend"] != "te_grouped"]
    assert ok and all(r["status"] == "ok" and float(r["time_s"]) > 0 for r in ok)
    assert all(float(r["host_s"]) == float(r["time_s"]) for r in ok)  # on a CPU the host is the device
    assert all(float(r["max_rel_err"]) < 1e-5 for r in ok)
    for r in (r for r in ok if r["pass"] == "fwd"):  # router 2·T·E·h + experts 2·rows·n·k (gate_up 2F×h, down h×F)
        assert int(r["flops"]) == 2 * 32 * 8 * 384 + 2 * int(r["gemm_rows"]) * (2 * 256 * 384 + 384 * 256)
    meta = json.loads((tmp_path / "benchmark_moe_tiny-qwen3-moe.meta.json").read_text())
    counts = meta["routings"]["model"]["tokens_per_expert"]
    assert sum(counts) == 64 and len(counts) == 8
    assert meta["routings"]["balanced"]["tokens_per_expert"] == [8] * 8
    model_rows = [r for r in ok if r["routing"] == "model"]
    assert int(model_rows[0]["tokens_dropped"]) == sum(max(0, c - 8) for c in counts)
    assert "unsupported" in out and "block" in out


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--routing", "zipf:x"], "--routing"),
        (["--routing", "uniform"], "unknown routing"),
        (["--routing", "max-mean:9"], "E/k"),
        (["--routing", "histogram:/nonexistent/h.json"], "/nonexistent/h.json"),
        (["--backends", "cublas"], "--backends"),
        (["--capacity-factor", "0"], "--capacity-factor"),
        (["--model-config-path", "examples/configs/tiny-llama"], "dense"),
        (["--ep", "3"], "do not split over 3 ranks"),
        (["--ep", "2", "--capacity-factor", "1.5"], "not offered with --ep"),
        (["--ep", "2", "--phases", "block"], "drop --phases"),
    ],
)
def test_bad_flags_are_one_line_exit_2(tmp_path, capsys, args, needle):
    base = ["moe", "--model-config-path", "examples/configs/tiny-qwen3-moe", "--seqlen", "64"]
    code = opbench_main([*base, "--report-dir-path", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


# --- expert parallelism (--ep) --------------------------------------------------------------------------------------


def test_ep_chunk_sort_and_its_inverse():
    """Received rows come source-major, (source, expert) chunks; the experts want expert-major; combine undoes it."""
    from opbench.moe.ep import Exchange

    ex = Exchange(recv=[[1, 2], [3, 0]], send_splits=[3, 3], recv_splits=[3, 3])
    rows = torch.arange(6.0)[:, None]  # chunks: (q0,e0)=[0] (q0,e1)=[1,2] (q1,e0)=[3,4,5] (q1,e1)=[]
    by_expert = ex.by_expert(rows)
    assert by_expert.flatten().tolist() == [0, 3, 4, 5, 1, 2] and ex.expert_counts == [4, 2]
    assert torch.equal(ex.by_source(by_expert), rows)


def test_ep_reference_check_can_fail():
    """On a one-rank group the EP block is the single-rank block (error 0); a 1 % wrong output is caught."""
    from opbench.core import dist
    from opbench.moe.ep import EpBlock, reference_error

    spec = block_spec(load_model_configs("examples/configs/tiny-qwen3-moe")[0])
    g = torch.Generator().manual_seed(0)
    w = B.make_weights(spec, torch.float32, CPU, g)
    x = torch.randn((16, spec.hidden), generator=g)
    idx = torch.from_numpy(assign(target_counts(parse_routing("zipf:1.2"), 16, 2, 8)[0], 16, 2, 0))
    ranks = dist.Ranks.join(dist.single(), "cpu", 30)
    try:
        with torch.no_grad():
            block = EpBlock(spec, w, x, idx, backends.grouped_mm, 1, 0)
            out = block.forward()
            assert reference_error(block, out, backends.torch_loop) < 1e-6
            assert reference_error(block, out * 1.01, backends.torch_loop) > 5e-3
    finally:
        ranks.stop()


def test_ep_backward_matches_one_rank_and_can_fail(monkeypatch):
    """On a one-rank group the EP block's gradients (tokens, router, experts, shared experts) are the single-rank
    block's; a backward all-to-all that sends 1 % too much is caught; the explicit reverse all-to-alls are the
    autograd ones (dispatch's backward is the combine's exchange and the other way round)."""
    from opbench.core import dist
    from opbench.moe import ep as EP

    spec = block_spec(load_model_configs("examples/configs/tiny-qwen3-moe")[0])
    g = torch.Generator().manual_seed(0)
    w = B.make_weights(spec, torch.float32, CPU, g)
    x = torch.randn((16, spec.hidden), generator=g)
    grad = torch.randn((16, spec.hidden), generator=g)
    idx = torch.from_numpy(assign(target_counts(parse_routing("zipf:1.2"), 16, 2, 8)[0], 16, 2, 0))
    ranks = dist.Ranks.join(dist.single(), "cpu", 30)
    try:
        block = EP.EpBlock(spec, w, x, idx, backends.torch_loop, 1, 0)
        assert EP.grads_reference_error(block, grad, backends.torch_loop) < 1e-6
        assert not block.x.requires_grad  # grads() leaves the block's tokens as they were
        rows = torch.randn((32, spec.hidden), generator=g)
        with torch.enable_grad():
            leaf = rows.clone().requires_grad_()
            (via_autograd,) = torch.autograd.grad(block.combine(leaf), leaf, rows)
        assert torch.equal(block.combine_backward(rows), via_autograd)  # 1 rank: the exchange keeps the rows
        assert torch.equal(block.dispatch_backward(block.combine_backward(rows)), rows)
        real = EP.AllToAllV.backward

        def off_by_one_percent(ctx, grad_rows):
            back, *rest = real(ctx, grad_rows)
            return (back * 1.01, *rest)

        monkeypatch.setattr(EP.AllToAllV, "backward", staticmethod(off_by_one_percent))
        assert EP.grads_reference_error(block, grad, backends.torch_loop) > 5e-3
    finally:
        ranks.stop()


@pytest.mark.slow
def test_ep_over_two_ranks_dispatches_combines_and_matches_one_rank(tmp_path):
    """A real 2-rank torchrun job (gloo): per routing, dispatch / experts / combine / block rows; the output equals
    the single-rank block on the gathered tokens; the counts exchanged say where the rows went (zipf: the hot experts'
    rank 0 receives the most, balanced: even)."""
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "opbench", "moe", "--model-config-path", "examples/configs/tiny-qwen3-moe",
           "--seqlen", "32", "--ep", "2", "--routing", "balanced,zipf:1.2", "--backends", "grouped_mm", "--quick",
           "--device", "cpu", "--report-dir-path", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read(tmp_path / "benchmark_moe_tiny-qwen3-moe_ep2.csv")
    passes = [("dispatch", "fwd"), ("dispatch", "bwd"), ("experts", "fwd"), ("combine", "fwd"), ("combine", "bwd")]
    passes += [("block", "fwd"), ("block", "bwd")]  # bwd: the reverse all-to-alls; the block's gradients checked
    assert [(r["routing"], r["phase"], r["pass"]) for r in rows] == [
        (routing, phase, p) for routing in ("balanced", "zipf:1.2") for phase, p in passes
    ]
    assert all(r["status"] == "ok" and float(r["time_s"]) > 0 and r["ep"] == "2" for r in rows)
    assert all(float(r["max_rel_err"]) < 1e-5 for r in rows if r["phase"] in ("experts", "block"))
    meta = json.loads((tmp_path / "benchmark_moe_tiny-qwen3-moe_ep2.meta.json").read_text())["routings"]
    assert meta["balanced"]["rows_sent"] == [[32, 32], [32, 32]]  # 32 tokens · top-2 per rank, 4 experts per rank
    zipf = meta["zipf:1.2"]
    assert zipf["rows_received_per_rank"][0] > zipf["rows_received_per_rank"][1]
    assert sum(zipf["tokens_per_expert"]) == 2 * 32 * 2 and sum(map(sum, zipf["rows_sent"])) == 128
