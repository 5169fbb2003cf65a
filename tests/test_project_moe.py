"""opbench project's MoE cost model (docs/project.md, "MoE cost model"): measured ``opbench moe`` rows replace the
estimate by phase, the grouped GEMMs' reduction width sets their estimated rate, and --moe-imbalance and
--moe-a2a-hidden move the time as documented. CPU, no torch, seconds."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from opbench.models import load_model_configs, select_models
from opbench.models.architectures import decoder_layers
from opbench.project.moe_rates import FLEX_RDMA_PUBLISHED, K0_FP8, K_REFERENCE, fit_k0, flex_rdma_share, k_share
from opbench.project.plan import Plan
from opbench.project.rates import Assumptions, Rates
from opbench.project.workload import EP_COMM, GEMM, MEASURED_PERMUTATION, expert_gemm_time, layer_work

TINY = "examples/configs/tiny-qwen3-moe"  # hidden 384, 8 experts, top-2, expert width 256
HEADER = "model,routing,backend,phase,pass,mbs,seqlen,tokens,hidden,experts,top_k,expert_intermediate,dtype,imbalance,time_s,status"
# the phases the projection reads: on the rank's own tokens, and on the tokens its experts get
TOKEN_PHASES = ("router", "topk", "permute", "unpermute_combine")
EXPERT_PHASES = ("gate_up", "activation", "down")


@pytest.fixture(scope="module")
def tiny():
    (cfg,) = load_model_configs(TINY)
    return cfg, decoder_layers(cfg)[0]


def _rows(tokens: int, phases: tuple[str, ...], seconds: float, hidden: int = 384, backend: str = "eager") -> list[str]:
    return [
        f"tiny,balanced,{backend},{ph},{p},1,{tokens},{tokens},{hidden},8,2,256,bf16,1,{seconds * (2 if p == 'bwd' else 1)},ok"
        for ph in phases
        for p in ("fwd", "bwd")
    ]


def _planted(folder, rows: list[str]):
    folder.mkdir(exist_ok=True)
    (folder / "benchmark_moe_tiny.csv").write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    return Rates([folder], "H100", "bf16", Assumptions(), 8)


def _items(work, p: str = "fwd") -> dict:
    return {i.name: i for i in (work.fwd if p == "fwd" else work.bwd)}


def test_the_reduction_width_constant_is_the_fit_of_deepgemms_table():
    """K0 is what the fit over DeepGEMM's published table gives (redone here); the share is 1 at the reference
    width, falls with narrower reductions, and FP8 (twice the K steps a second) loses more than bf16."""
    assert fit_k0() == K0_FP8
    assert k_share(K_REFERENCE, False) == k_share(2 * K_REFERENCE, True) == 1.0
    assert k_share(768, True) < k_share(768, False) < k_share(2048, False) < 1.0
    rates = Rates([], "H100", "bf16", Assumptions(), 8)
    dense, expert = rates.gemm_time(4096, 1536, 768, 8), expert_gemm_time(rates, 4096, 1536, 768, 8)
    assert dense.source == expert.source == "estimated" and expert.seconds > dense.seconds
    wide = (rates.gemm_time(4096, 1536, 8192, 8), expert_gemm_time(rates, 4096, 1536, 8192, 8))
    assert wide[0] == wide[1]  # a wide reduction runs at the dense estimate's rate


def test_measured_moe_rows_replace_the_estimate_by_phase(tiny, tmp_path):
    """A planted benchmark_moe CSV times the layer's router, permutation and experts as its rows say: the phases on
    the rank's own tokens at that many tokens, the experts' at the tokens giving each expert its rows here (ep·T),
    × 1/ep; between two measured token counts linearly; the all-to-all stays the link model's."""
    cfg, lay = tiny
    plan = Plan(world=2, seqlen=512, global_batch=2, ep=2)  # 512 tokens a rank; its 4 experts see 2 × 512 tokens
    rows = _rows(512, TOKEN_PHASES, 1e-4) + _rows(1024, EXPERT_PHASES, 1e-3) + _rows(2048, EXPERT_PHASES, 3e-3)
    rows += _rows(1024, ("gate_up",), 5e-4, backend="grouped_mm")  # the fastest backend wins
    bad = _rows(1024, ("down",), 1e-5, backend="grouped_mm")[0].replace(",1e-05,", ",-1,")
    rates = _planted(tmp_path / "r", [*rows, bad])
    assert [(b.line, b.field) for b in rates.left_out] == [(len(rows) + 2, "time_s")]  # named, not used
    work = layer_work(cfg, lay, plan, rates)
    fwd, bwd = _items(work), _items(work, "bwd")
    assert fwd["expert_gate_up fwd"].timed.seconds == pytest.approx(5e-4 / 2)
    assert fwd["expert_gate_up fwd"].timed.source == "measured"
    assert fwd["expert_down fwd"].timed.seconds == pytest.approx(1e-3 / 2)
    assert bwd["expert_down bwd"].timed.seconds == pytest.approx(2e-3 / 2)
    assert fwd["router fwd"].timed.seconds == pytest.approx(2e-4)  # router + top-k
    assert fwd[MEASURED_PERMUTATION].timed.seconds == pytest.approx(2e-4)
    assert "expert_gate_up dgrad" not in bwd and "router wgrad" not in bwd
    estimated = layer_work(cfg, lay, plan, Rates([], "H100", "bf16", Assumptions(), 8))
    a2a = [i.timed for i in work.fwd if i.category == EP_COMM]
    assert a2a == [i.timed for i in estimated.fwd if i.category == EP_COMM]
    # 768 tokens a rank: its experts see 1,536, halfway between the rows of 1,024 and 2,048
    rates = _planted(tmp_path / "i", _rows(768, TOKEN_PHASES, 1e-4) + rows[len(TOKEN_PHASES) * 2 :])
    down = _items(layer_work(cfg, lay, replace(plan, seqlen=768), rates))["expert_down fwd"].timed
    assert down.source == "interpolated" and down.seconds == pytest.approx(2e-3 / 2)


def test_moe_rows_of_another_shape_or_beyond_their_tokens_are_not_used(tiny, tmp_path):
    """A row of another shape is not used, nor one that would have to be extrapolated in tokens: the estimate
    stands and its note says why."""
    cfg, lay = tiny
    plan = Plan(world=2, seqlen=512, global_batch=2, ep=2)
    base = _items(layer_work(cfg, lay, plan, Rates([], "H100", "bf16", Assumptions(), 8)))["expert_gate_up fwd"]
    other = _planted(tmp_path / "o", _rows(512, TOKEN_PHASES, 1e-4, 512) + _rows(1024, EXPERT_PHASES, 1e-3, 512))
    got = _items(layer_work(cfg, lay, plan, other))["expert_gate_up fwd"].timed
    assert got.seconds == base.timed.seconds and got.source == "estimated"
    assert "hidden 512" in got.note and "not used" in got.note
    far = _planted(tmp_path / "f", _rows(512, TOKEN_PHASES, 1e-4) + _rows(4096, EXPERT_PHASES, 1e-3))
    got = _items(layer_work(cfg, lay, plan, far))["expert_gate_up fwd"].timed
    assert got.source == "estimated" and "not extrapolated" in got.note


def test_measured_moe_rows_give_the_host_time_of_their_phases(tiny, tmp_path):
    """A GPU row's host_s (opbench moe: its call's issue time from an idle device) is the host time of the item it
    times, in place of counting that item's operators (and the memory item's kernels the rows hold); the experts'
    × 1/ep only for a backend that issues a call per expert; interpolated between token counts as the time is; a
    step whose measured issue outlasts its GPU work waits on the host. A CPU row's host_s (the whole call there), a
    row without one and one out of bounds give none: the operators are counted."""
    from opbench.project.step import Projector
    from opbench.project.workload import FUSED_KERNELS, memory_kernels

    cfg, lay = tiny
    plan = Plan(world=2, seqlen=512, global_batch=4, ep=2)  # two micro-batches

    def planted(name: str, host: str | None, device: str = "NVIDIA H100", experts: str = "grouped_mm") -> Rates:
        rows = _rows(512, TOKEN_PHASES, 1e-5) + _rows(1024, EXPERT_PHASES, 1e-5, backend=experts)
        rows += _rows(256, TOKEN_PHASES, 1e-5)  # 256 and 512 tokens: 384 interpolates (below)
        folder = tmp_path / name
        folder.mkdir()
        header = HEADER + ("" if host is None else ",host_s,device")
        # host "time": each row's host_s is its own time_s (what opbench moe writes on a CPU)
        text = [header] + [
            r if host is None else f"{r},{r.split(',')[-2] if host == 'time' else host},{device}" for r in rows
        ]
        if host not in (None, "time"):  # the 256-token rows' host time: half the 512-token rows'
            text = [t.replace(f",{host},", f",{float(host) / 2},") if ",256,256," in t else t for t in text]
        (folder / "benchmark_moe_tiny.csv").write_text("\n".join(text) + "\n")
        return Rates([folder], "H100", "bf16", Assumptions(), 8)

    host = 2e-4
    rates = planted("gpu", str(host))
    work = layer_work(cfg, lay, plan, rates)
    fwd, bwd = _items(work), _items(work, "bwd")
    assert fwd["router fwd"].host_s == pytest.approx(2 * host)  # router + top-k
    assert fwd[MEASURED_PERMUTATION].host_s == pytest.approx(2 * host)  # permute + unpermute/combine
    assert fwd["expert_gate_up fwd"].host_s == bwd["expert_down bwd"].host_s == pytest.approx(host)  # one call
    assert all(i.host_s is None for i in work.fwd if i.name.startswith(("qkv", "attn_out")))
    looped = _items(layer_work(cfg, lay, plan, planted("loop", str(host), experts="torch_loop")))
    assert looped["expert_gate_up fwd"].host_s == pytest.approx(host / 2)  # E/ep of the row's E calls
    shape = rates.moe.shapes[0]
    assert rates.moe.phase_time(shape, "router", "fwd", 384).host == pytest.approx(0.75 * host)  # 1/2 → 1
    per_layer = 2 * 7 * host  # seven phases, forward and backward
    projector = Projector(cfg, rates)
    layers = cfg.num_hidden_layers
    assert projector.stage_host_measured(plan) == [pytest.approx(layers * per_layer)]
    none = Projector(cfg, planted("cpu", str(host), "AMD EPYC"))  # the name opbench moe writes on this CPU
    assert none.stage_host_measured(plan) == [0.0]
    assert Projector(cfg, planted("torch", str(host), "cpu")).stage_host_measured(plan) == [0.0]
    assert Projector(cfg, planted("same", "time")).stage_host_measured(plan) == [0.0]  # host_s = time_s: a CPU's
    # the measured items' operators are not counted, and the memory item leaves out the kernels the rows hold
    k = FUSED_KERNELS
    moe_kernels = k["router"] + k["permute"] + k["act"]
    full, measured = memory_kernels(cfg, lay, False), memory_kernels(cfg, lay, False, True)
    assert (full[0] - measured[0], full[1] - measured[1]) == (moe_kernels, 2 * moe_kernels) and moe_kernels > 0
    assert projector._memory_kernels(lay, plan, work) == measured
    assert projector.stage_host_ops(plan)[0] < none.stage_host_ops(plan)[0]
    older = Projector(cfg, planted("older", None))  # a file without the column
    assert older.stage_host_measured(plan) == [0.0]
    assert older.stage_host_ops(plan) == none.stage_host_ops(plan)
    for value in ("-1", "1e9", "inf", "fast"):  # bounded like a time: the row is left out and named
        rows = _rows(512, TOKEN_PHASES, 1e-5) + _rows(1024, EXPERT_PHASES, 1e-5)
        folder = tmp_path / f"bad{value}"
        folder.mkdir()
        text = [HEADER + ",host_s,device", *(r + f",{host},H100" for r in rows[1:]), rows[0] + f",{value},H100"]
        (folder / "benchmark_moe_tiny.csv").write_text("\n".join(text) + "\n")
        left = Rates([folder], "H100", "bf16", Assumptions(), 8).left_out
        assert [(b.line, b.field) for b in left] == [(len(rows) + 1, "host_s")], value
    # the step: the counted operators' issue and the measured seconds, per micro-batch
    cost = rates.host_cost().seconds
    counted = projector.stage_host_ops(plan)[0] - none.stage_host_ops(plan)[0]
    step, counted_only = projector.project(plan), none.project(plan)  # the same optimizer
    assert step.host_s - counted_only.host_s == pytest.approx(2 * (cost * counted + layers * per_layer))
    slow = Projector(cfg, planted("slow", "0.05")).project(plan)  # 50 ms a phase: host-bound
    assert slow.host_bound and slow.step_s == pytest.approx(slow.host_s) and slow.sync_wait_s == 0.0


def test_a_moe_layer_that_synchronises_loses_the_hosts_lead(tiny, tmp_path):
    """Megatron's dropless dispatchers read the token counts on the host in every MoE layer's forward (and
    transformers' eager experts call nonzero()): the GPU then waits for the first operator after the sync, and for
    the forward's host issue where that outlasts its GPU work, even when the step's host time is far below its GPU
    time, in every micro-batch. The backward does not synchronise."""
    from opbench.project.search import breakdown
    from opbench.project.step import Projector

    cfg, lay = tiny
    plan = Plan(world=2, seqlen=512, global_batch=4, ep=2)  # two micro-batches

    def rates(name: str, fwd_host: float, bwd_host: float, device: str = "H100", **assumed) -> Rates:
        folder = tmp_path / name
        folder.mkdir()
        lines = [HEADER + ",host_s,device"]
        for tokens, phases in ((512, TOKEN_PHASES + EXPERT_PHASES), (1024, EXPERT_PHASES)):  # EP 1 and 2
            for ph in phases:  # the GPU's work is the backward's: 1 ms forward, 10 ms backward a phase
                lines.append(
                    f"tiny,balanced,eager,{ph},fwd,1,{tokens},{tokens},384,8,2,256,bf16,1,1e-3,ok,{fwd_host},{device}"
                )
                lines.append(
                    f"tiny,balanced,eager,{ph},bwd,1,{tokens},{tokens},384,8,2,256,bf16,1,1e-2,ok,{bwd_host},{device}"
                )
        (folder / "benchmark_moe_tiny.csv").write_text("\n".join(lines) + "\n")
        return Rates([folder], "H100", "bf16", Assumptions(**assumed), 8)

    free = Projector(cfg, rates("free", 1e-6, 1e-6, host_us_per_op=0.0)).project(plan)
    assert free.host_wait_s == free.sync_wait_s == 0.0
    cost = rates("cost", 1e-6, 1e-6).host_cost().seconds
    layers = cfg.num_hidden_layers
    # the forward's measured host (7 × 2 ms) beyond its GPU work: stalls at every layer, the step not host-bound
    slow_fwd = Projector(cfg, rates("fwd", 2e-3, 1e-6)).project(plan)
    assert slow_fwd.host_s < free.step_s and not slow_fwd.host_bound
    assert slow_fwd.sync_wait_s == slow_fwd.host_wait_s > 2 * layers * (7 * 2e-3 - 7 * 1e-3)
    assert slow_fwd.step_s == pytest.approx(free.step_s + slow_fwd.sync_wait_s)
    assert "waiting on the host (synchronisations)" in breakdown(cfg, slow_fwd, "H100", None)
    # the same host time in the backward, which runs ahead: only the first operator after each sync
    slow_bwd = Projector(cfg, rates("bwd", 1e-6, 2e-3)).project(plan)
    assert slow_bwd.sync_wait_s == pytest.approx(2 * layers * cost)
    # without expert parallelism, Megatron's and transformers' MoE layers synchronise all the same
    one = replace(plan, world=1, global_batch=2, ep=1)
    for profile in ("fused", "eager"):
        alone = Projector(cfg, rates(f"one_{profile}", 1e-6, 1e-6), profile=profile).project(one)
        assert alone.sync_wait_s == pytest.approx(2 * layers * cost) and not alone.host_bound, profile


def test_moe_imbalance_lengthens_the_busiest_ranks_experts_and_all_to_alls(tiny):
    """--moe-imbalance R: under expert parallelism the busiest rank's routed-expert GEMMs and all-to-alls take R
    times as long; attention and the dense GEMMs do not move; without EP nothing moves."""
    cfg, lay = tiny
    plan = Plan(world=2, seqlen=512, global_batch=2, ep=2)
    base = layer_work(cfg, lay, plan, Rates([], "H100", "bf16", Assumptions(), 8))
    hot = layer_work(cfg, lay, plan, Rates([], "H100", "bf16", Assumptions(moe_imbalance=1.5), 8))
    for b, h in zip((*base.fwd, *base.bwd), (*hot.fwd, *hot.bwd)):
        routed = b.category == EP_COMM or (b.category == GEMM and b.name.startswith("expert_"))
        if routed:
            assert h.timed.seconds == pytest.approx(1.5 * b.timed.seconds), b.name
        elif b.category != "memory":
            assert h.timed.seconds == b.timed.seconds, b.name
    assert hot.fwd_s > base.fwd_s
    alone = replace(plan, ep=1)
    flat = Rates([], "H100", "bf16", Assumptions(moe_imbalance=1.5), 8)
    assert layer_work(cfg, lay, alone, flat).fwd_s == layer_work(cfg, lay, alone, base_rates()).fwd_s


def base_rates() -> Rates:
    return Rates([], "H100", "bf16", Assumptions(), 8)


def test_moe_a2a_hidden_caps_what_the_overlap_hides():
    """--moe-a2a-hidden H: under --moe-a2a-overlap at most H of each all-to-all is hidden. H = 1 is the stream model
    alone, H = 0 hides nothing (as without the overlap), the measured default lies between."""
    (cfg,) = select_models(load_model_configs(), "Qwen3_30B_A3B")
    lay = decoder_layers(cfg)[0]
    plan = Plan(world=16, seqlen=4096, global_batch=64, ep=16, moe_a2a_overlap=True)

    def exposed(hidden: float | None) -> float:
        a = Assumptions() if hidden is None else Assumptions(moe_a2a_hidden=hidden)
        work = layer_work(cfg, lay, plan, Rates([], "H100", "bf16", a, 8))
        return sum(i.exposed for i in (*work.fwd, *work.bwd) if i.category == EP_COMM)

    work = layer_work(cfg, lay, replace(plan, moe_a2a_overlap=False), base_rates())
    whole = sum(i.timed.seconds for i in (*work.fwd, *work.bwd) if i.category == EP_COMM)
    assert exposed(0.0) == pytest.approx(whole)
    assert exposed(1.0) < exposed(None) < exposed(0.0)
    paired = 3 / 4  # 4 micro-batches: the first forward and the last backward alone
    assert exposed(None) >= whole * (1 - paired * 0.3655) - 1e-12


def test_moe_flags_are_checked(capsys):
    """--moe-imbalance below 1 and --moe-a2a-hidden beyond 1 are one line naming the flag, exit code 2."""
    from opbench.core.errors import run_cli
    from opbench.project.__main__ import main

    for flag in (["--moe-imbalance", "0.5"], ["--moe-a2a-hidden", "1.5"]):
        argv = ["--model", "Qwen3_30B_A3B", "--world-size", "16", "--ep", "16", "--device", "H100", *flag]
        assert run_cli(main, argv, prog="opbench project") == 2
        out, err = capsys.readouterr()
        assert flag[0] in err and len(err.splitlines()) == 1 and not out, err


def test_the_flex_dispatchers_rdma_stage_carries_a_token_to_every_node_its_experts_are_on_its_own_included():
    """DeepEP and HybridEP count a token once per node its experts are on, its own node included, and publish
    43-58 GB/s for that on a 50 GB/s NIC: the median, 1.01 of the NIC, is the RDMA stage's rate. Qwen3-30B-A3B over
    two nodes (128 experts, top 8) then sends its 4,096 tokens through it 1.99 times each: 1.58x the network-only
    count's time at 0.8 of the NIC, which is what the Megatron-Bridge A/B's hidden share implied (10 s of all-to-all
    a step where the link model gave 5.4)."""
    rates = [r for rows in FLEX_RDMA_PUBLISHED.values() for _, d, c in rows for r in (d, c)]
    assert len(rates) == 12 and min(rates) == 41.24 and max(rates) == 58.0
    assert flex_rdma_share() == pytest.approx(1.01)
    r = Rates([], "H100", "bf16", Assumptions(), 8)
    token, tokens = 2048 * 2, 4096
    nodes_hit = 2 * (1 - math.prod((64 - i) / (128 - i) for i in range(8)))
    assert nodes_hit == pytest.approx(1.9938, abs=1e-4)
    t = r.flex_dispatch_time(token, tokens, 8, 128, 16, 1, 8)
    latency = Assumptions().latency_us_inter * 1e-6
    assert t.seconds - latency == pytest.approx(tokens * token * nodes_hit / (50.0 * 1.01e9), rel=1e-6)
    assert "its own included" in t.note
    old_model = tokens * token * nodes_hit / 2 / (50.0 * 0.8e9)  # the other node only, at the link efficiency
    assert (t.seconds - latency) / old_model == pytest.approx(1.584, abs=0.01)
    # within one node there is no RDMA stage: NVLink alone, as before
    one = r.flex_dispatch_time(token, tokens, 8, 128, 8, 1, 8)
    assert "RDMA" not in one.note


def _gpt_oss(tmp_path, **over):
    import json

    config = {
        "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 4, "vocab_size": 201088,
        "num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128, **over,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    (cfg,) = load_model_configs(str(tmp_path))
    return cfg


def test_megatrons_unfused_clamp_expert_bias_and_yarn_rotary_are_timed(tmp_path, tiny):
    """gpt-oss under Megatron-Core (the fused profile): the experts' GLU clamp and cat (4·e forward, 5·e backward,
    and again with moe_act recomputed, per fc1-output element), the per-expert bias loop (6·e / 8·e per fc2-output
    element, 2E + 2 and 4E + 1 kernels) and YaRN's unfused rotary (13·e / 12.5·e more per q and k element) are in the
    layer's memory-bound bytes; a model without them (Qwen3-MoE) and PyTorch eager's profile get nothing; a config
    that names another RoPE scaling gets no rotary term (docs/project.md, "Memory-bound operators")."""
    from opbench.project.workload import Unfused, megatron_unfused

    cfg = _gpt_oss(tmp_path)
    assert cfg.extra["rope_type"] == "yarn" and cfg.extra["rope_factor"] == 32.0 and cfg.extra["glu_clamp"]
    lay = decoder_layers(cfg)[0]
    plan = Plan(world=64, ep=8, pp=1, mbs=1, seqlen=4096, global_batch=64, recompute="selective",
                recompute_modules=("moe_act",))  # fmt: skip
    got = megatron_unfused(cfg, lay, plan)
    e, rows, fc1, h = 2, 4096 * 4, 2 * 2880, 2880
    qk = 4096 * (64 + 8) * 64
    assert got.fwd == pytest.approx(4 * e * rows * fc1 + 6 * e * rows * h + 13 * e * qk)
    assert got.bwd == pytest.approx((5 + 4) * e * rows * fc1 + 8 * e * rows * h + 12.5 * e * qk)
    assert got.expert == pytest.approx(4 * e * rows * fc1 + 6 * e * rows * h)
    assert (got.k_fwd, got.k_bwd, got.k_expert) == (3 + 2 * 16 + 2 + 20, 3 + 3 + 4 * 16 + 1 + 40, 3 + 2 * 16 + 2)
    assert megatron_unfused(cfg, lay, plan, experts=False) == Unfused(13 * e * qk, 12.5 * e * qk, 20, 40, 0.0)
    rope = _gpt_oss(tmp_path, rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert megatron_unfused(rope, decoder_layers(rope)[0], plan, experts=False) == Unfused()
    qwen, qlay = tiny
    assert megatron_unfused(qwen, qlay, replace(plan, world=8)) == Unfused()
    # in the layer's memory-bound item: fused gets them, eager (transformers, torchtitan) does not
    rates = Rates([], "H100", "bf16", Assumptions(), 8)
    base = replace(cfg, extra={**cfg.extra, "glu_clamp": False, "expert_bias": False, "rope_type": ""})
    name = "norms, residuals, rotary, activations"
    for memory_ops, more in (("fused", True), ("eager", False)):
        r = Rates([], "H100", "bf16", Assumptions(memory_ops=memory_ops), 8)
        with_, without = (_items(layer_work(c, lay, plan, r))[name].timed.seconds for c in (cfg, base))
        assert (with_ > without) is more
    fused = _items(layer_work(cfg, lay, plan, rates))[name].timed.seconds
    plain = _items(layer_work(base, lay, plan, rates))[name].timed.seconds
    assert fused - plain == pytest.approx(
        got.fwd / rates.memory_bandwidth().seconds + got.k_fwd * rates.kernel_cost().seconds, rel=1e-6
    )


def test_a_bad_rope_scaling_factor_is_one_line(tmp_path, capsys):
    """A RoPE scaling factor read from a config is bounded like a flag: outside 1-10⁴ (or not a number) is one
    line naming the file and the field, exit 2."""
    from opbench.core.errors import UsageError

    for factor in (0.5, "32", 1e9, True):
        with pytest.raises(UsageError) as err:
            _gpt_oss(tmp_path, rope_scaling={"rope_type": "yarn", "factor": factor})
        assert "rope_scaling.factor" in str(err.value) and "config.json" in str(err.value)
    # another scaling's factor is not used, so not checked; a null type is none
    assert _gpt_oss(tmp_path, rope_scaling={"rope_type": "dynamic", "factor": 0.5}).extra["rope_type"] == "dynamic"
    assert _gpt_oss(tmp_path, rope_scaling={"rope_type": None, "factor": 0.5}).extra["rope_type"] == "yarn"  # default


def test_attention_at_head_dimension_64_runs_at_cudnns_share_of_128s_rate():
    """On an NVIDIA GPU, estimated softmax attention at head dimension ≤ 64 runs at cuDNN's measured share of its
    rate at 128 (cudnn-frontend, H200, cuDNN 9.19.1: 336/591 forward, 289/474 backward); 128 and AMD unchanged."""
    from opbench.attention.shapes import AttentionShape
    from opbench.project.rates import HEAD_DIM_64_SHARE

    rates = Rates([], "H100", "bf16", Assumptions(), 8)
    amd = Rates([], "MI300X", "bf16", Assumptions(), 8)
    for p in ("fwd", "bwd"):
        d64 = AttentionShape("m", 4096, 4096, 64, 8, 64, 64, True)
        assert "head dim" not in amd._attention_time(d64, 1, p).note  # no AMD figure: one efficiency
        d128 = replace(d64, num_head_q=32, head_dim_qk=128, head_dim_v=128)  # the same FLOPs
        t64, t128 = rates._attention_time(d64, 1, p), rates._attention_time(d128, 1, p)
        assert t64.seconds == pytest.approx(t128.seconds / HEAD_DIM_64_SHARE[p]) and "head dim" in t64.note
    assert HEAD_DIM_64_SHARE == pytest.approx({"fwd": 0.5685, "bwd": 0.6097}, abs=1e-4)


def test_te_casts_launch_their_recipes_kernels_per_expert():
    """Transformer Engine's casts launch amax, scale and cast-and-transpose under current (tensorwise) scaling and
    one kernel under delayed scaling, per expert for a grouped GEMM (TE quantises each expert's rows on its own);
    a GEMM after a norm gets its input in FP8 from the norm under delayed scaling (docs/project.md, "FP8")."""
    from opbench.gemm.shapes import LinearLayer
    from opbench.project.workload import fp8_cast_kernels

    experts = LinearLayer("expert_gate_up", 1536, 2048, 4096, groups=8)
    qkv = LinearLayer("qkv", 5120, 2048, 4096)
    plan = Plan(world=16, ep=16, mbs=1, seqlen=4096, global_batch=16, fp8="te", fp8_recipe="tensorwise")
    assert fp8_cast_kernels(plan, experts) == (24, 24) and fp8_cast_kernels(plan, qkv) == (3, 3)
    delayed = replace(plan, fp8_recipe="delayed")
    assert fp8_cast_kernels(delayed, experts) == (8, 8) and fp8_cast_kernels(delayed, qkv) == (0, 1)
    assert fp8_cast_kernels(replace(delayed, tp=2), qkv) == (0, 2)  # SP (on by default with TP): X transposed
    assert fp8_cast_kernels(replace(plan, fp8="torchao", fp8_recipe="delayed"), experts) == (1, 1)
    # MXFP8: one quantisation for all the experts (split_quantize's batched path), and after a norm too (TE casts
    # the norm's 16-bit output for MXFP8 unless cuDNN's norm is asked for)
    mx = replace(plan, fp8_recipe="mxfp8")
    assert fp8_cast_kernels(mx, experts) == (1, 1) and fp8_cast_kernels(mx, qkv) == (1, 1)
