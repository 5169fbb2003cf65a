"""`opbench project` on the attention kinds beyond softmax and gated DeltaNet (docs/project.md, "Kinds beyond
softmax attention"): what Mamba-2 and Kimi Delta Attention keep for backward, counted against transformers' own
layers in bf16, the rate their scans are timed at, and context parallelism on them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from opbench.models import load_model_configs
from opbench.models.architectures import decoder_layers
from opbench.project.plan import Plan


def _kept(block, x) -> int:
    """Bytes of every distinct storage ``block``'s forward saves for backward (saved_tensors_hooks) and its graph
    still holds when the forward returns, less its parameters and its input (the block's norm output, counted by the
    layer). A tensor saved by a piece of graph the forward then drops is freed at once: it is not kept, and its
    memory may go to a later tensor at the same address (counting by address alone made this count flaky)."""
    import weakref

    import torch

    skip = {p.untyped_storage().data_ptr() for p in block.parameters()} | {x.untyped_storage().data_ptr()}
    saved: list[weakref.ref] = []

    def pack(t):
        saved.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(x)
    kept = {}
    for ref in saved:
        t = ref()
        if t is not None and t.untyped_storage().data_ptr() not in skip:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    del out
    return sum(kept.values())


def _mamba2(tmp_path, seqlen: int, heads: int, groups: int):
    """transformers' NemotronH Mamba-2 mixer (torch_forward: no mamba_ssm here) and opbench's reading of its config."""
    import torch
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    hf = NemotronHConfig(hidden_size=48, mamba_num_heads=heads, mamba_head_dim=8, ssm_state_size=12, n_groups=groups,
                         conv_kernel=3, chunk_size=16, num_hidden_layers=1, layer_types=["mamba"], vocab_size=256)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(hf.to_dict()))
    return NemotronHMamba2Mixer(hf, 0).to(torch.bfloat16).train(), 48


def _kda(tmp_path, seqlen: int, heads: int, groups: int):
    """transformers' Kimi Delta Attention (torch_chunk_kda: no flash-linear-attention here), chunk 64."""
    import torch
    from transformers import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

    attn = {"num_heads": heads, "head_dim": 8, "short_conv_kernel_size": 3, "kda_layers": [1], "full_attn_layers": []}
    hf = KimiLinearConfig(hidden_size=48, linear_attn_config=attn, num_hidden_layers=1, vocab_size=256,
                          bos_token_id=0, eos_token_id=1, pad_token_id=2)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(hf.to_dict()))
    return KimiLinearDeltaAttention(hf, 0).to(torch.bfloat16).train(), 48


@pytest.mark.parametrize(
    "kind,seqlen,heads,groups",
    [("mamba2", 40, 4, 2), ("mamba2", 32, 3, 1), ("kda", 40, 2, 0), ("kda", 150, 3, 0)],
)
def test_scan_mixers_keep_what_transformers_keeps(tmp_path, kind, seqlen, heads, groups):
    """The eager profile's Mamba-2 and KDA mixers against transformers' own bf16 layers: every distinct storage the
    forward saves for backward, less the block's input and out_proj's input (the norm output and the linear_out
    GEMM's, counted by the layer), is the formula's to the byte; padded and whole chunks, one chunk and several,
    grouped B/C. The layer's activations are the eager ones under --activation-profile eager, and the fused profile
    (mamba_ssm's and fla's saved tensors) keeps less and grows with the micro-batch as its tokens do."""
    import torch

    from opbench.models.layout import KDA, MAMBA2
    from opbench.project.memory import activation_parts, kda_saved_bytes, mamba2_saved_bytes

    block, hidden = (_mamba2 if kind == "mamba2" else _kda)(tmp_path, seqlen, heads, groups)
    x = torch.randn(3, seqlen, hidden, dtype=torch.bfloat16, requires_grad=True)
    kept = _kept(block, x)
    (cfg,) = load_model_configs(str(tmp_path))
    lay = decoder_layers(cfg)[0]
    (op,) = [a for a in lay.attention if a.kind in (MAMBA2, KDA)]
    assert op.kind == {"mamba2": MAMBA2, "kda": KDA}[kind]
    plan = Plan(world=1, seqlen=seqlen, global_batch=3, mbs=3, dtype="bf16")
    out_proj_input = 3 * seqlen * op.heads_q * op.head_dim_v * 2
    if kind == "mamba2":
        ours = mamba2_saved_bytes(op, op.heads_q, op.heads_kv, plan, cfg.extra["conv_kernel"], eager=True)
        fused = mamba2_saved_bytes(op, op.heads_q, op.heads_kv, plan, cfg.extra["conv_kernel"], eager=False)
    else:
        ours = kda_saved_bytes(op, op.heads_q, plan, cfg.extra["linear_conv_kernel_dim"], eager=True)
        fused = kda_saved_bytes(op, op.heads_q, plan, cfg.extra["linear_conv_kernel_dim"], eager=False)
    assert kept == ours + out_proj_input
    assert fused < ours
    # the layer counts it under --activation-profile eager, and its fused term is linear in the micro-batch
    eager_rest = activation_parts(cfg, lay, plan, "eager")["rest"]
    fused_rest = activation_parts(cfg, lay, plan, "fused")["rest"]
    assert eager_rest - fused_rest >= ours - fused
    one, two = (activation_parts(cfg, lay, replace(plan, mbs=m, global_batch=m))["rest"] for m in (1, 2))
    assert two == 2 * one


def _attention_rows(path, rows: list[dict]) -> None:
    """``rows`` as an attention_benchmark.csv of the schema's columns (the rest empty)."""
    import csv

    from opbench.attention.schema import SCHEMA

    with open(path / "attention_benchmark.csv", "w", newline="") as fh:
        out = csv.DictWriter(fh, fieldnames=SCHEMA.columns)
        out.writeheader()
        for r in rows:
            out.writerow({"model": "m", "dtype": "bf16", "batch_size": 1, "causal": True, "status": "ok", **r})


def _row(backend: str, kind: str, shape: tuple, window: int, fwd: float, bwd: float, **extra) -> dict:
    keys = ("seqlen_q", "seqlen_kv", "num_head_q", "num_head_kv", "head_dim_qk", "head_dim_v")
    return dict(zip(keys, shape)) | {"backend": backend, "attn_kind": kind, "window": window, "fwd_time": fwd,
                                     "bwd_time": bwd, "sinks": False, "compress": 0, "topk": 0} | extra  # fmt: skip


def test_scans_and_mixing_are_timed_at_the_rate_of_their_kind(tmp_path):
    """With no row of their kind the chunked scans (linear, kda, mamba2) are their matmul FLOPs at the GEMM
    efficiency plus their minimum traffic at the memory rate, never softmax attention's efficiency; hc's Sinkhorn
    mixing is hc_bytes at the memory rate. A measured row of the kind is used on its shape and scaled by FLOPs to
    another (a kda row never times a mamba2 shape), and a csa row's FLOPs count its pooling and top-k."""
    from opbench.attention.flops import attention_flops, hc_bytes, scan_bytes
    from opbench.attention.shapes import AttentionShape
    from opbench.project.rates import Assumptions, Rates

    est = Rates([], "H100", "bf16", Assumptions(kernel_us=0, memory_bandwidth_gbs=3000), 8)
    bw = 3000e9
    for kind, hq, hkv, dk, dv, win in (("kda", 32, 32, 128, 128, 64), ("mamba2", 128, 8, 128, 64, 128),
                                       ("linear", 32, 16, 128, 128, 64)):  # fmt: skip
        shape = AttentionShape("m", 4096, 4096, hq, hkv, dk, dv, True, attn_kind=kind, window=win)
        for p, mult in (("fwd", 1), ("bwd", 2)):
            t = est.attention_time(shape, 1, p)
            peak = 989e12 * est.gemm_efficiency("bf16")
            want = attention_flops(shape, 1, p) / peak + mult * scan_bytes(shape, 1, 2) / bw
            assert t.source == "estimated" and t.seconds == pytest.approx(want, rel=1e-6), (kind, p)
            assert "scan traffic" in t.note
    hc = AttentionShape("m", 4096, 4096, 4, 4, 7168, 7168, True, attn_kind="hc", window=20)
    assert est.attention_time(hc, 1, "fwd").seconds == pytest.approx(hc_bytes(hc, 1, 2) / bw)
    assert est.attention_time(hc, 1, "bwd").seconds == pytest.approx(2 * hc_bytes(hc, 1, 2) / bw)

    kda = AttentionShape("m", 4096, 4096, 32, 32, 128, 128, True, attn_kind="kda", window=64)
    csa = AttentionShape("m", 4096, 4096, 64, 1, 512, 512, True, attn_kind="csa", window=128, sinks=True,
                         compress=4, topk=512)  # fmt: skip
    _attention_rows(
        tmp_path,
        [
            _row("kda_fla", "kda", (4096, 4096, 32, 32, 128, 128), 64, 0.0004, 0.0010),
            _row(
                "v4_torch", "csa", (4096, 4096, 64, 1, 512, 512), 128, 0.0020, 0.0050, sinks=True, compress=4, topk=512
            ),  # fmt: skip
        ],
    )
    measured = Rates([tmp_path], "H100", "bf16", Assumptions(kernel_us=0), 8)
    assert measured.attention_time(kda, 1, "fwd").seconds == pytest.approx(0.0004)
    assert measured.attention_time(kda, 1, "fwd").source == "measured"
    longer = AttentionShape("m", 8192, 8192, 32, 32, 128, 128, True, attn_kind="kda", window=64)
    t = measured.attention_time(longer, 1, "bwd")
    rate = attention_flops(kda, 1, "bwd") / 0.0010
    assert t.source == "interpolated" and t.seconds == pytest.approx(attention_flops(longer, 1, "bwd") / rate)
    mamba = AttentionShape("m", 4096, 4096, 128, 8, 128, 64, True, attn_kind="mamba2", window=128)
    assert measured.attention_time(mamba, 1, "fwd").source == "estimated"  # no mamba2 row: not the kda one
    half = replace(csa, num_head_q=32)  # half the heads: half the FLOPs of the row's shape, pooled keys counted
    t = measured.attention_time(half, 1, "fwd")
    assert t.source == "interpolated" and t.seconds == pytest.approx(0.0010)


def _tiny(folder, kind: str):
    """A tiny NemotronH (Mamba-2, MLP, attention, MLP: 4 Mamba heads in 2 groups) or Kimi Linear (two KDA layers and
    an MLA one, 4 heads; dense MLPs) written into ``folder`` as transformers writes them."""
    from transformers import KimiLinearConfig, NemotronHConfig

    if kind == "mamba2":
        hf = NemotronHConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=32, mamba_num_heads=4, mamba_head_dim=32, ssm_state_size=16, n_groups=2,
                             conv_kernel=4, chunk_size=64, layer_types=["mamba", "mlp", "attention", "mlp"],
                             num_hidden_layers=4, vocab_size=512)  # fmt: skip
    else:
        attn = {"num_heads": 4, "head_dim": 32, "short_conv_kernel_size": 4, "kda_layers": [1, 2],
                "full_attn_layers": [3]}  # fmt: skip
        hf = KimiLinearConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4,
                              head_dim=32, linear_attn_config=attn, num_hidden_layers=3, vocab_size=512,
                              bos_token_id=0, eos_token_id=1, pad_token_id=2, kv_lora_rank=32, q_lora_rank=None,
                              qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=32,
                              mlp_layer_types=["dense"] * 3)  # fmt: skip
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf.to_dict()))
    return str(folder)


@pytest.mark.parametrize("kind", ["mamba2", "kda"])
def test_context_parallel_on_a_scan_is_megatrons_all_to_all(tmp_path, run, kind):
    """--cp on a Mamba-2 or KDA layer is Megatron-Core's all-to-all context parallelism: the scan runs the whole
    sequence on heads/cp (its time is the one-rank scan's on fewer heads, not a ring's share), two all-to-alls
    forward (in_proj's output, the scan's output) and two backward, no K/V ring exchange; the softmax layer beside
    it keeps its ring. Heads that do not split over the CP ranks are refused in one line naming the field."""
    from opbench.attention.shapes import operator_shape
    from opbench.project.plan import problems
    from opbench.project.rates import Assumptions, Rates
    from opbench.project.workload import layer_work

    config = _tiny(tmp_path / kind, kind)
    (cfg,) = load_model_configs(config)
    layers = decoder_layers(cfg)
    lay = next(lay for lay in layers if any(a.kind == kind for a in lay.attention))
    (op,) = [a for a in lay.attention if a.kind == kind]
    rates = Rates([], "H100", "bf16", Assumptions(kernel_us=0), 8)
    plan = Plan(world=2, seqlen=4096, global_batch=2, cp=2)
    assert not problems(cfg, plan, layers)
    work = layer_work(cfg, lay, plan, rates)
    names = [i.name for i in work.fwd]
    assert names.count("CP all-to-all (scan input)") == names.count("CP all-to-all (scan output)") == 1
    assert "CP ring exchange" not in names
    assert [i.name for i in work.bwd].count("CP all-to-all (scan input)") == 1
    scan = next(i for i in work.fwd if i.name == f"{kind} attention fwd")
    whole = operator_shape(cfg, op, 4096, 2, 1)  # the whole sequence, half the heads
    assert whole.seqlen_q == 4096 and whole.num_head_q == op.heads_q // 2
    assert scan.timed.seconds == pytest.approx(rates.attention_time(whole, 1, "fwd").seconds)
    softmax = next(lay for lay in layers if any(a.kind not in (kind, "hc") for a in lay.attention))
    assert "CP ring exchange" in [i.name for i in layer_work(cfg, softmax, plan, rates).fwd]
    bad = replace(plan, world=8, cp=8)
    ((flag, why),) = problems(cfg, bad, layers)
    assert (
        flag == "--cp"
        and "does not split over cp 8" in why
        and ("mamba_num_heads" if kind == "mamba2" else "linear_num_heads") in why
    )
    r = run("opbench", "project", "--model-config-path", config, "--world-size", "8", "--cp", "8", "--seqlen", "4096",
            "--device", "H100")  # fmt: skip
    assert r.returncode == 2 and "--cp" in r.stderr and "does not split over cp 8" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mamba2", "kda"])
def test_validate_on_a_tiny_hybrid_matches_its_activations_and_peak(run, tmp_path, record, kind):
    """--validate trains a tiny NemotronH (Mamba-2, MLP, attention, MLP: one norm per layer) or Kimi Linear (two KDA
    layers, one MLA) with transformers on this CPU in fp32 (their PyTorch paths: no mamba_ssm or fla) and sets the
    projection beside it: activations and peak memory of one micro-batch within 5 %, parameters, gradients and
    optimizer state exact. The step time is recorded, not asserted: the scans' rows are opbench's torch-ops kernels,
    not transformers' (docs/project.md, "Kinds beyond softmax attention")."""
    import csv

    config = _tiny(tmp_path / kind, kind)
    out = tmp_path / "validate"
    # 256 tokens: the ratios are byte counts, the same at 512 (KDA's reference chunk loop trained 15 s there, 5 s here)
    r = run("opbench", "project", "--model-config-path", config, "--world-size", "1", "--seqlen", "256", "--mbs", "2",
            "--microbatches", "2", "--validate", "--steps", "3", "--report-dir-path", str(out),
            env={"OMP_NUM_THREADS": "1", "OPBENCH_CLOCK": "cpu"}, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    with open(out / "project_validate.csv", newline="") as fh:
        rows = {row["quantity"]: row for row in csv.DictReader(fh)}
    ratio = {k: float(v["ratio"]) for k, v in rows.items() if v.get("ratio")}
    record(
        f"project --validate, tiny {kind} hybrid, 1 rank: step time projected/measured {ratio['step_time_s']:.3f}, "
        f"activations {ratio['activation_bytes']:.3f}, peak memory {ratio['peak_memory_one_microbatch_bytes']:.3f}"
    )
    assert 0.95 <= ratio["activation_bytes"] <= 1.05
    assert 0.95 <= ratio["peak_memory_one_microbatch_bytes"] <= 1.05
    for exact in ("params_bytes", "grads_bytes", "optimizer_bytes"):
        assert rows[exact]["projected"] == rows[exact]["measured"], exact


def test_compressed_attention_under_cp_is_the_last_ranks_kernel_once(tmp_path):
    """DeepSeek-V4's csa, hca and their indexer: the shape under --cp is already the last CP rank's whole kernel
    (its seqlen/cp queries over every earlier pooled key), so the projection times it as it is; scaling it as a
    ring step (cp steps of one block) counted its keys cp times and made a rank's work grow with cp."""
    import transformers

    from opbench.project.rates import Assumptions, Rates
    from opbench.project.workload import ATTENTION, layer_work

    (tmp_path / "config.json").write_text(transformers.AutoConfig.for_model("deepseek_v4").to_json_string())
    (cfg,) = load_model_configs(str(tmp_path))
    rates = Rates([], "H100", "bf16", Assumptions(), 8)
    times = []
    for cp in (1, 2, 4):
        plan = Plan(world=cp, seqlen=8192, global_batch=1, cp=cp)
        total: dict[str, float] = {}
        for lay in decoder_layers(cfg)[:6]:
            work = layer_work(cfg, lay, plan, rates)
            for item in work.fwd + work.bwd:
                if item.category == ATTENTION and item.name.split()[0] in ("csa", "hca", "indexer"):
                    total[item.name] = total.get(item.name, 0.0) + item.timed.seconds
        times.append(total)
    assert times[0].keys() == times[1].keys() == times[2].keys() and len(times[0]) == 6
    for name in times[0]:
        assert times[0][name] > times[1][name] > times[2][name], name  # each rank's share shrinks with cp
