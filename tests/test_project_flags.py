"""opbench project: Primus' V-Half and V-Min pipeline schedules against the figures of their source, torch.compile
as a measured effect (``--compile``), and Megatron's flags that cost time (``--deterministic-mode``,
``--no-gradient-accumulation-fusion``, ``--nccl-algo``)."""

from __future__ import annotations

import pytest

from opbench.project.pipeline import StageTimes, in_flight, simulate


def _order(p: int, m: int, schedule: str) -> str:
    from opbench.project.pipeline import _orders_controllable

    return " ".join(f"{kind}{chunk}.{mb}" for kind, mb, chunk in _orders_controllable(p, m, schedule)[0])


def test_v_half_and_v_min_run_primus_pipelines_orders():
    """Stage 0's order at p = 4, m = 4 as Primus-pipeline's ``ScheduleZBVGreedy`` builds it (its
    ``schedule_from_pattern``, run out of tree on the same p and m; the orders agreed on every stage for p 2–9 and
    m of 1, 2, 3, p, 2p, 3p + 1 and 4p): F0.3 = chunk 0's forward of micro-batch 3, B the input gradient, W the
    weight gradient."""
    assert _order(4, 4, "v-half") == (
        "F0.0 F0.1 F0.2 F0.3 F1.0 B1.0 W1.0 F1.1 B1.1 W1.1 F1.2 B1.2 W1.2 B0.0 W0.0 F1.3 B1.3 B0.1 W1.3 B0.2 W0.1 "
        "W0.2 B0.3 W0.3"
    )
    assert _order(4, 4, "v-min") == (
        "F0.0 F0.1 F0.2 F1.0 B1.0 W1.0 F1.1 B1.1 W1.1 F0.3 B0.0 W0.0 F1.2 B1.2 B0.1 W1.2 W0.1 F1.3 B1.3 B0.2 W1.3 "
        "W0.2 B0.3 W0.3"
    )


@pytest.mark.parametrize(
    "schedule, p, chunks, bubble",
    [
        # V-Half: p/2 + 1 micro-batches (p + 2 chunks) for even p ≥ 4, Primus' blog's "p/2 + x"; bubble 3p − 7 chunk ops
        ("v-half", 4, 6, 5), ("v-half", 8, 10, 17), ("v-half", 16, 18, 41),
        # V-Min: the blog's "p/3 + x" (p = 16: 12 chunks = 6 micro-batches = 16/3 + 2/3)
        ("v-min", 4, 4, 11), ("v-min", 8, 8, 26), ("v-min", 16, 12, 59),
    ],
)  # fmt: skip
def test_v_half_and_v_min_trade_bubble_for_activations(schedule, p, chunks, bubble):
    """Equal forward, input-gradient and weight-gradient times (1 each per chunk: Primus' and the paper's unit), m =
    3p: the peak chunks held and the idle time are the ones Primus' order gives; ZB-V holds 2p chunks (1F1B's p
    micro-batches) with p − 1 of bubble, 1F1B 3(p − 1)·2 (a stage's F + B + W is 6 chunk ops)."""
    m = 3 * p
    stages = [[StageTimes(1.0, 2.0, 1.0)] * 2 for _ in range(p)]
    r = simulate(stages, m, schedule=schedule)
    assert r.in_flight == (chunks,) * p == in_flight(p, m, 2, schedule)
    assert r.total_s - 6 * m == pytest.approx(bubble)
    zbv = simulate(stages, m, schedule="zbv")
    assert zbv.in_flight == (2 * p,) * p and zbv.total_s - 6 * m == pytest.approx(p - 1)
    one = simulate([[StageTimes(2.0, 4.0)] for _ in range(p)], m)
    assert zbv.total_s < r.total_s < one.total_s  # more bubble than ZB-V, less than 1F1B
    assert r.in_flight[0] < 2 * one.in_flight[0]  # in chunks: 1F1B's first stage holds p micro-batches = 2p chunks
    assert r.in_flight[0] / (2 * p) <= {"v-half": 0.75, "v-min": 0.5}[schedule]
    if p == 16:  # the paper's limits: 1/2 and 1/3 of 1F1B's activations plus a constant
        assert r.in_flight[0] / (2 * p) == pytest.approx({"v-half": 0.5625, "v-min": 0.375}[schedule])


def test_v_half_and_v_min_peaks_are_the_documented_table():
    """docs/project.md ("A step") tables the peak chunks in_flight computes: V-Min equals V-Half at odd p, and
    neither is "about p and 2p/3" (the text it replaced); the same for m from 3p to 8p."""
    table = {3: (4, 4), 4: (6, 4), 5: (6, 6), 8: (10, 8), 16: (18, 12)}
    for p, peaks in table.items():
        for m in (3 * p, 8 * p):
            assert tuple(max(in_flight(p, m, 2, s)) for s in ("v-half", "v-min")) == peaks, (p, m)


def test_v_half_projects_on_the_command_line(capsys):
    from opbench.core.errors import run_cli
    from opbench.project.__main__ import main

    base = ["--model", "Llama2_7B", "--device", "MI300X", "--world-size", "8", "--pp", "8", "--global-batch", "32"]
    peaks = {}
    for schedule in ("zbv", "v-half", "v-min"):
        assert run_cli(main, [*base, "--schedule", schedule, "--vpp", "2"], prog="opbench project") == 0
        out = capsys.readouterr().out
        peaks[schedule] = float(out.split("memory (stage")[1].split("): ")[1].split(" GiB")[0])
    assert peaks["v-min"] < peaks["v-half"] < peaks["zbv"]
    assert run_cli(main, [*base, "--schedule", "v-min"], prog="opbench project") == 2
    assert "--schedule v-min runs two model chunks per stage: --vpp 2" in capsys.readouterr().err


# --- torch.compile (--compile) ------------------------------------------------------------------------------------

TITAN_8B = "--model Llama3.1_8B --mbs 2 --recompute op --fsdp --activation-profile eager --seqlen 8192 --microbatches 1"


def _titan(flags: str):
    """A torchtitan Llama-3.1-8B row (benchmarks/llama3_h100_202412_torchtitan.md) projected on H100s as
    bench/project_vs_published.py projects it."""
    import shlex

    from opbench.models import load_model_configs, select_models
    from opbench.project.__main__ import assumptions, base_plan, build_parser
    from opbench.project.rates import Rates
    from opbench.project.step import Projector

    args = build_parser().parse_args(shlex.split(f"{TITAN_8B} {flags} --device H100"))
    (cfg,) = select_models(load_model_configs(None, None), args.model)
    plan = base_plan(cfg, args)  # resolves the part's node (--gpus-per-node) before Rates takes it
    rates = Rates([], "H100", args.dtype, assumptions(args), args.gpus_per_node)
    return Projector(cfg, rates, args.activation_profile).project(plan)


def test_compile_default_is_torchtitans_published_ratio_taken_apart():
    """COMPILE_MEMORY_TIME comes from torchtitan's 8-GPU row (5,762 → 6,667 tokens/s): projected with --compile that
    row is 1.157× its eager projection; the 128-GPU row (5,605 → 6,514: 1.162×), which the default was not fitted
    to, lands within 1 %. Compile leaves GEMMs and attention alone: a factor of 1 is the eager step's time."""
    from opbench.project.torch_compile import TORCHTITAN_8B_COMPILE_TPS, TORCHTITAN_8B_EAGER_TPS

    eager = _titan("--world-size 8 --memory-ops eager")
    assert eager.step_s / _titan("--world-size 8 --compile").step_s == pytest.approx(
        TORCHTITAN_8B_COMPILE_TPS / TORCHTITAN_8B_EAGER_TPS, rel=0.01
    ), "the projection of torchtitan's row moved: re-derive COMPILE_MEMORY_TIME (torch_compile.py)"
    wide = _titan("--world-size 128 --memory-ops eager").step_s / _titan("--world-size 128 --compile").step_s
    assert wide == pytest.approx(6514 / 5605, rel=0.01)
    assert _titan("--world-size 8 --compile-memory-time 1").step_s == pytest.approx(eager.step_s)
    # --memory-ops fused (Megatron/TE's kernels, the old stand-in for compile) projects far more than compile gains
    assert eager.step_s / _titan("--world-size 8 --memory-ops fused").step_s > 1.3


def test_compile_keeps_the_inputs_of_fused_elementwise_regions():
    """A compiled block saves neither RMSNorm's fp32 input copy and x·rsqrt nor silu's output (Inductor's min-cut
    partitioner recomputes them): per token and layer that is 2·h·(4 − e) + 2·h·e + F·e bytes fewer than eager."""
    from opbench.models import load_model_configs, select_models
    from opbench.models.architectures import decoder_layers
    from opbench.project.memory import activation_parts
    from opbench.project.plan import Plan

    (cfg,) = select_models(load_model_configs(), "Llama3.1_8B")
    lay = decoder_layers(cfg)[0]
    plan = Plan(world=8, seqlen=8192, global_batch=16, mbs=2, sharding="fsdp")
    eager = sum(activation_parts(cfg, lay, plan, "eager").values())
    compiled = sum(activation_parts(cfg, lay, plan, "eager", compiled=True).values())
    h, f, e = 4096, 14336, 2
    assert (eager - compiled) / plan.tokens == 2 * h * (4 - e) + 2 * h * e + f * e
    assert sum(activation_parts(cfg, lay, plan, "fused", compiled=True).values()) == sum(
        activation_parts(cfg, lay, plan, "fused").values()
    )  # Megatron's fused profile keeps no such intermediates to begin with


@pytest.mark.slow
def test_validate_compile_trains_the_compiled_blocks_and_measures_their_effect(run, tmp_path, record):
    """--validate --compile on CPU: tiny-llama trained eager and with every decoder block through torch.compile
    (Inductor's C++ kernels: g++); the compiled step's saved activations are the projection's (what Inductor's
    partitioner keeps), and compile's measured effect and the factor it implies are printed. Step times are
    recorded, never compared: the two runs are timed at different moments."""
    import csv
    import shutil

    from conftest import ROOT

    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("torch.compile's CPU kernels need a C++ compiler")
    out = tmp_path / "validate"
    r = run(
        "opbench", "project", "--model-config-path", str(ROOT / "examples" / "configs" / "tiny-llama"),
        "--seqlen", "128", "--mbs", "2", "--microbatches", "1", "--world-size", "1", "--validate", "--compile",
        "--steps", "2", "--report-dir-path", str(out),
        # one compile worker: on two cores a pool of them is slower to start than the kernels take to build
        env={"OMP_NUM_THREADS": "1", "OPBENCH_CLOCK": "cpu", "TORCHINDUCTOR_COMPILE_THREADS": "1"},
        timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    with open(out / "project_validate.csv", newline="") as fh:
        rows = {row["quantity"]: row for row in csv.DictReader(fh)}
    eager, compiled = rows["activation_bytes"], rows["compiled_activation_bytes"]
    assert 0.97 <= float(compiled["ratio"]) <= 1.03 and 0.97 <= float(eager["ratio"]) <= 1.03
    measured = float(compiled["measured"]) / float(eager["measured"])
    projected = float(compiled["projected"]) / float(eager["projected"])
    assert measured == pytest.approx(projected, rel=0.01) and measured < 0.95
    assert "torch.compile's effect, compiled / eager" in r.stdout and "imply --compile-memory-time" in r.stdout
    step = float(rows["compiled_step_time_s"]["measured"]) / float(rows["step_time_s"]["measured"])
    record(f"project --validate --compile, tiny-llama CPU: activations compiled/eager {measured:.3f} measured, "
           f"{projected:.3f} projected; step time compiled/eager {step:.3f} measured")  # fmt: skip


# --- Megatron's flags that cost time -------------------------------------------------------------------------------


def test_nccl_model_is_ncclss_own_latency_and_bandwidth():
    """NCCL 2.30's tuning model (Simple protocol): an 8-GPU NVLink ring all-reduce costs 8.4 + 14 · 3.4 µs before
    its bytes, a tree 8.4 + 2 · 7 · 4.0; a tree's algorithm bandwidth is 0.92 / 2 of the bus bandwidth (× the per-size
    correction), a ring's n / 2(n − 1). Across 64 nodes the tree's log2 hops win small all-reduces by far."""
    from opbench.project.megatron_flags import nccl_allreduce_us

    size, bw = 1 << 30, 100.0  # 1 GiB (no tree correction at this size), 100 GB/s bus bandwidth
    assert nccl_allreduce_us("ring", size, 8, 1, bw, True) == pytest.approx(8.4 + 14 * 3.4 + size / (bw * 8 / 14 * 1e3))
    assert nccl_allreduce_us("tree", size, 8, 1, bw, True) == pytest.approx(
        8.4 + 2 * 7 * 4.0 + size / (bw * 0.46 * 1e3)
    )
    # 512 ranks on 64 nodes, 1 MB: ring 8.4 + (1022 − 126) · 3.4 + 126 · 14 µs, × 1.4 (the inter-node plateau)
    ring = nccl_allreduce_us("ring", 1e6, 512, 64, bw, True)
    assert ring == pytest.approx((8.4 + (1022 - 126) * 3.4 + 126 * 14) * 1.4 + 1e6 / (bw * 512 / 1022 * 1e3))
    assert nccl_allreduce_us("tree", 1e6, 512, 64, bw, True) < ring / 10


def test_pinned_allreduce_costs_what_ncclss_model_puts_over_its_own_choice():
    from opbench.project.megatron_flags import pinned_allreduce
    from opbench.project.rates import Assumptions, Timed

    timed = Timed(1e-3, "estimated", "ring")  # 64 MB over 8 ranks in 1 ms
    same = pinned_allreduce(Assumptions(), timed, 64e6, 8, False, 8)
    assert same is timed  # default: NCCL's own choice, as measured or estimated
    assert pinned_allreduce(Assumptions(nccl_algo="ring"), timed, 64e6, 8, False, 8).seconds == timed.seconds
    tree = pinned_allreduce(Assumptions(nccl_algo="tree"), timed, 64e6, 8, False, 8)
    assert tree.seconds > 1.3e-3 and "NCCL_ALGO=tree" in tree.note  # inside a node NCCL's model prefers the ring
    # across 64 nodes a small all-reduce: NCCL would choose the tree, so pinning Ring costs
    small = Timed(50e-6, "estimated", "")
    assert pinned_allreduce(Assumptions(nccl_algo="ring"), small, 1e5, 512, True, 8).seconds > 10 * small.seconds


def _megatron_7b(flags: str = "", device: str = "H100"):
    """Megatron CI's GPT 7B, tp4 without SP (tests/functional_tests/test_cases/gpt/gpt3_7b_tp4_pp1_memory_speed),
    projected on H100s (or ``device``)."""
    import json
    import shlex

    from opbench.models import load_model_configs
    from opbench.project.__main__ import assumptions, base_plan, build_parser
    from opbench.project.rates import Rates
    from opbench.project.step import Projector

    config = {
        "model_type": "starcoder2", "hidden_size": 4096, "intermediate_size": 16384, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 131073, "max_position_embeddings": 8192,
        "use_bias": True, "tie_word_embeddings": False,
    }  # fmt: skip
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "config.json").write_text(json.dumps(config))
        argv = f"--model-config-path {folder} --world-size 8 --tp 4 --no-sequence-parallel --mbs 2 --global-batch 8 "
        argv += f"--zero 1 --seqlen 8192 --device {device} {flags}"
        args = build_parser().parse_args(shlex.split(argv))
        (cfg,) = load_model_configs(folder)
    plan = base_plan(cfg, args)  # resolves the part's node (--gpus-per-node) before Rates takes it
    rates = Rates([], device, args.dtype, assumptions(args), args.gpus_per_node)
    projector = Projector(cfg, rates, args.activation_profile)
    return projector, plan, rates


def test_no_gradient_accumulation_fusion_adds_the_hooks_pass_per_microbatch():
    """Without the fusion each micro-batch's backward adds every linear weight's bf16 gradient into its fp32 main
    gradient: 2 + 4 + 4 bytes a weight at the memory rate (the embedding's and the final norm's gradients go through
    the hook either way: not counted)."""
    from opbench.gemm.shapes import padded_vocab

    projector, plan, rates = _megatron_7b("--no-gradient-accumulation-fusion")
    (chunk,) = projector.stage_work(plan)[0]
    (item,) = [i for i in chunk.bwd if i.name == "gradient accumulation (unfused)"]
    embedding = padded_vocab(131073, 4) // 4 * 4096
    weights = projector.stage_params(plan, 0).numel - embedding - 2 * 4096  # the final LayerNorm's weight and bias
    # (the layers' biases counted whole, as memory.layer_numel counts them: a few thousand of 1.7 billion)
    assert item.timed.seconds == pytest.approx(rates.memory_time(weights * (2 + 4 + 4)).seconds, rel=1e-5)
    fused, plan, _ = _megatron_7b()
    step = projector.project(plan).step_s - fused.project(plan).step_s
    assert step == pytest.approx(plan.microbatches * item.timed.seconds, rel=1e-6)


def test_deterministic_mode_pins_the_ring_and_refuses_what_megatron_refuses(capsys):
    from opbench.core.errors import run_cli
    from opbench.project.__main__ import main

    projector, plan, rates = _megatron_7b("--deterministic-mode")
    assert rates.a.nccl_algo == "ring"
    tree, plan, _ = _megatron_7b("--nccl-algo tree")
    assert tree.project(plan).step_s > projector.project(plan).step_s  # TP all-reduces inside a node: the ring's
    base = ["--model", "Llama3.1_8B", "--device", "H100", "--world-size", "8"]
    for extra, message in (
        (["--deterministic-mode", "--cross-entropy-loss-fusion"], "field '--cross-entropy-loss-fusion': Megatron's"),
        (["--deterministic-mode", "--tp", "8", "--tp-overlap", "0.5"], "field '--tp-overlap': Megatron's"),
        (["--deterministic-mode", "--nccl-algo", "tree"], "field '--nccl-algo': Megatron's --deterministic-mode"),
        (["--fsdp", "--no-gradient-accumulation-fusion"], "field '--no-gradient-accumulation-fusion': Megatron's"),
        (["--world-size", "1", "--validate", "--nccl-algo", "ring"], "field '--nccl-algo': --validate trains"),
    ):
        assert run_cli(main, [*base, *extra], prog="opbench project") == 2
        err = capsys.readouterr().err
        assert err.startswith(f"opbench project: error: {message}") and len(err.splitlines()) == 1, err
    assert run_cli(main, [*base, "--deterministic-mode"], prog="opbench project") == 0
    assert "attention's deterministic backward" in capsys.readouterr().err  # named: modelled where FA2 runs it


def test_deterministic_attention_with_dropout_on_blackwell_is_flashattention2s_grid():
    """--deterministic-mode with attention dropout: TE keeps cuDNN on H100 (no cost modelled) but falls back to
    FlashAttention-2's deterministic kernels on Blackwell, whose backward grid is ceil(SMs / (b·h)) splits per
    (batch, head): the model reproduces the figures it is built on (flash-attention PR #1893, H100) and times the
    GB200 call as its two waves run (docs/project.md, "Flags that cost time")."""
    from opbench.attention.flops import attention_flops
    from opbench.project.megatron_flags import fa2_deterministic, fa2_deterministic_backward_blocks

    assert fa2_deterministic(1.796e-3 * 306e12, 132, 2, 16, 8192, True) == pytest.approx((1.796e-3, 8.279e-3))
    # the reference grid (5 splits × 32) on 132 SMs: the 28 CTAs beyond the first wave start as the shortest end;
    # split x of 5 has sum(128 − 2j, j = x, x + 5, …) blocks: 884, 858, 832, 806, 780 (13 key blocks each)
    assert fa2_deterministic_backward_blocks(132, 2, 16, 8192, True) == 1664  # 780 + 884: a 5th-split SM takes a 1st
    # tp4's call (b = 2, 8 local heads) on 148 SMs: 10 splits, 160 CTAs; pp4's (b = 1, 32 heads) the reference grid
    assert fa2_deterministic_backward_blocks(148, 2, 8, 8192, True) == 836
    assert fa2_deterministic_backward_blocks(148, 1, 32, 8192, True) == 1664
    assert fa2_deterministic_backward_blocks(160, 2, 8, 8192, True) == 476  # Blackwell Ultra's 160 SMs: one wave
    assert fa2_deterministic_backward_blocks(132, 1, 1, 1024, False) == 16  # bidirectional: every key block 16

    def attention(device: str, flags: str):
        projector, plan, _ = _megatron_7b(flags, device)
        lay = projector.layers[0]
        work = projector._layer(lay, plan)
        items = {i.name: i.timed for i in work.fwd + work.bwd if i.category == "attention"}
        return items, projector.project(plan).step_s, plan

    for device in ("H100", "GB200"):
        plain, step, plan = attention(device, "--deterministic-mode")
        dropped, step_dropped, _ = attention(device, "--deterministic-mode --attention-dropout 0.1")
        if device == "H100":  # cuDNN's deterministic path: unchanged
            assert dropped == plain and step_dropped == step
            continue
        shape = _attention_shape(device)
        fwd, bwd = fa2_deterministic(attention_flops(shape, 2, "fwd"), 148, 2, 8, 8192, True)
        assert dropped["full attention bwd"].seconds == pytest.approx(bwd)
        assert dropped["full attention fwd"].seconds == pytest.approx(fwd)
        assert "FlashAttention-2 deterministic" in dropped["full attention bwd"].note
        assert dropped["full attention bwd"].seconds > 3 * plain["full attention bwd"].seconds and step_dropped > step
        assert attention(device, "--attention-dropout 0.1")[0] == plain  # no determinism: flash's usual kernels
        # TE's choice: flash has no FlashAttention-3 on sm100 (FA2 without dropout too); fused keeps cuDNN
        flash, _, _ = attention(device, "--deterministic-mode --attention-backend flash")
        assert flash["full attention bwd"] == dropped["full attention bwd"]
        fused, _, _ = attention(device, "--deterministic-mode --attention-backend fused --attention-dropout 0.1")
        assert fused == plain


def _attention_shape(device: str):
    """The 7B layer's attention shape on one tp4 rank."""
    from opbench.attention.shapes import operator_shape

    projector, plan, _ = _megatron_7b("", device)
    op = projector.layers[0].attention[0]
    return operator_shape(projector.cfg, op, plan.seqlen, plan.tp, plan.cp)


def test_compile_refuses_an_explicit_fused_and_implies_eager_otherwise(capsys):
    """--compile (or --compile-memory-time) projects PyTorch's eager ops compiled: an explicit --memory-ops or
    --activation-profile fused contradicts it (one line, exit 2); unset, both are eager under it and fused without."""
    import argparse

    from opbench.core.errors import run_cli
    from opbench.project.__main__ import build_parser, main
    from opbench.project.search import resolve_compile

    base = ["--model", "Qwen3_0.6B", "--device", "H100", "--world-size", "8", "--seqlen", "4096"]
    for compiled in (["--compile"], ["--compile-memory-time", "0.5"]):
        for flag in ("--memory-ops", "--activation-profile"):
            assert run_cli(main, [*base, *compiled, flag, "fused"], prog="opbench project") == 2
            err = capsys.readouterr().err
            assert err.startswith(f"opbench project: error: field '{flag}': fused is") and len(err.splitlines()) == 1
        assert run_cli(main, [*base, *compiled, "--memory-ops", "eager"], prog="opbench project") == 0
        capsys.readouterr()
    parse = build_parser().parse_args
    assert resolve_compile(parse(["--world-size", "8", "--compile-memory-time", "0.5"])) == ("eager", "eager")
    assert resolve_compile(parse(["--world-size", "8", "--memory-ops", "eager"])) == ("eager", "fused")
    args = parse(["--world-size", "8"])
    assert resolve_compile(args) == resolve_compile(args) == ("fused", "fused") and not args.compile
    assert resolve_compile(argparse.Namespace(compile=True)) == ("eager", "eager")  # idempotent, attribute-free


def test_help_shows_the_flags(capsys):
    from opbench.project.__main__ import build_parser

    text = build_parser().format_help()
    for flag in ("--compile", "--compile-memory-time", "--deterministic-mode", "--no-gradient-accumulation-fusion",
                 "--nccl-algo", "v-half", "v-min"):  # fmt: skip
        assert flag in text, flag
