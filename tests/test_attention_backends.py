"""Attention backends on CPU: causal alignment, GQA and MLA head dims agree with the oracle; the flash-attn
adapter against a reference with flash_attn_func's signature; unsupported rows; backward timing."""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from opbench.attention import backends as B
from opbench.attention.__main__ import main
from opbench.attention.flops import attention_flops
from opbench.attention.reference import reference_attention
from opbench.attention.runner import (
    AttentionCase,
    ProblemCache,
    check,
    inconsistent_passes,
    make_problem,
    run_case,
    time_passes,
)
from opbench.attention.schema import SCHEMA
from opbench.attention.shapes import AttentionShape
from opbench.core.sweep import Unsupported
from opbench.core.timing import TimingConfig

FAST = TimingConfig(warmup_iters=1, warmup_s=0.0, min_iters=3, max_iters=4, rel_tol=0.5, budget_s=0.02)

# (seqlen_q, seqlen_kv, heads_q, heads_kv, dim_qk, dim_v): equal lengths, queries at the end of a longer KV
# (decode/chunked prefill), more queries than keys (first rows see nothing), GQA, MQA, MLA-like dims, one token.
CASES = [
    (24, 24, 4, 4, 32, 32),
    (12, 40, 4, 2, 32, 32),
    (40, 12, 6, 2, 32, 32),
    (17, 33, 4, 1, 24, 24),
    (20, 30, 4, 4, 48, 32),
    (1, 1, 4, 2, 32, 32),  # one key: dQ is zero in exact arithmetic, rounding noise in a kernel (not an error)
]
CPU_BACKENDS = ["math", "sdpa", "sdpa_flash", "sdpa_math"]


def mk(sq, skv, hq, hkv, dqk, dv, causal=True) -> AttentionShape:
    return AttentionShape("t", sq, skv, hq, hkv, dqk, dv, causal)


@pytest.mark.parametrize("dims", CASES, ids=lambda d: "x".join(map(str, d)))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_cpu_backends_agree_with_oracle(dims, causal):
    shape = mk(*dims, causal=causal)
    problem = make_problem(shape, 2, "fp32", torch.device("cpu"), with_grads=True)
    for name in CPU_BACKENDS:
        backend = B.BACKENDS[name]
        try:
            prepared = backend.build(shape, torch.device("cpu"), "fp32")
            errs = check(prepared.fn, backend.layout, problem)
        except Unsupported as exc:
            # the CPU flash kernel needs equal q/k/v head dims; everything else must run
            assert name == "sdpa_flash" and dims[4] != dims[5], (name, exc)
            assert "same last dimension" in str(exc)
            continue
        assert errs["max_rel_err"] < 1e-5, (name, errs)
        assert errs["grad_max_rel_err"] < 1e-4, (name, errs)


def test_rows_without_visible_keys_are_zero_everywhere():
    shape = mk(40, 12, 4, 2, 32, 32)
    problem = make_problem(shape, 1, "fp32", torch.device("cpu"), with_grads=False)
    assert problem.ref[0][:, :28].abs().max() == 0  # rows 0..27 see no key (bottom-right alignment)
    for name in CPU_BACKENDS:
        backend = B.BACKENDS[name]
        out = backend.build(shape, torch.device("cpu"), "fp32").fn(
            *(B.to_layout(t, backend.layout) for t in problem.inputs)
        )
        assert torch.isfinite(out).all() and B.from_layout(out, backend.layout)[:, :28].abs().max() == 0, name


def test_top_left_causal_would_be_caught():
    """SDPA's own is_causal (top-left) differs from the convention when lengths differ: the check flags it."""
    shape = mk(12, 40, 4, 4, 32, 32)
    problem = make_problem(shape, 1, "fp32", torch.device("cpu"), with_grads=True)

    def top_left(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    errs = check(top_left, B.BHSD, problem)
    assert errs["max_rel_err"] > 0.05


def test_wrong_backend_becomes_error_row(monkeypatch):
    shape = mk(12, 40, 4, 4, 32, 32)
    broken = B.Backend(
        "broken",
        B.BHSD,
        lambda s, d, t: B.Prepared(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        "top-left causal",
    )
    monkeypatch.setitem(B.BACKENDS, "broken", broken)
    row = run_case(AttentionCase(shape, 1, "broken", "fp32"), torch.device("cpu"), ["fwd"], FAST, ProblemCache())
    assert row["status"] == "error" and "wrong result" in row["error"]
    assert row.get("fwd_time") is None  # a wrong kernel is not timed


def reference_flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_func's contract, written out independently: (batch, seq, heads, dim) in and out, KV heads
    shared by consecutive query-head groups, causal aligned bottom-right, equal q/k/v head dims (as FA2)."""
    assert q.dim() == 4 and k.shape[:3] == v.shape[:3] and q.shape[0] == k.shape[0]
    assert v.shape[-1] == q.shape[-1], "FA2 needs equal head dims"
    sq, hq, skv, hkv = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    group = hq // hkv
    idx = torch.arange(hq) // group
    kk, vv = k[:, :, idx], v[:, :, idx]  # (b, skv, hq, d)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, kk) * (softmax_scale or q.shape[-1] ** -0.5)
    if causal:
        rows = torch.arange(sq)[:, None]
        cols = torch.arange(skv)[None, :]
        scores = scores.masked_fill(cols > rows + (skv - sq), float("-inf"))
        if window_size[0] >= 0:  # keys i − left … i are visible
            scores = scores.masked_fill(cols < rows + (skv - sq) - window_size[0], float("-inf"))
    p = torch.softmax(scores, -1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", p, vv)


@pytest.mark.parametrize("dims", CASES, ids=lambda d: "x".join(map(str, d)))
def test_flash_attn_adapter_against_reference_signature(dims):
    shape = mk(*dims)
    problem = make_problem(shape, 2, "fp32", torch.device("cpu"), with_grads=True)
    prepared = B.flash_attn_adapter(reference_flash_attn_func, shape, pad_v=True)
    errs = check(prepared.fn, B.BSHD, problem)
    assert errs["max_rel_err"] < 1e-5 and errs["grad_max_rel_err"] < 1e-4, errs
    assert ("zero-padded" in prepared.note) == (dims[4] != dims[5])


def test_flash_attn_adapter_passes_the_sliding_window():
    shape = AttentionShape("t", 40, 40, 4, 2, 32, 32, True, "sliding", 7)
    problem = make_problem(shape, 2, "fp32", torch.device("cpu"), with_grads=True)
    errs = check(B.flash_attn_adapter(reference_flash_attn_func, shape, pad_v=True).fn, B.BSHD, problem)
    assert errs["max_rel_err"] < 1e-5 and errs["grad_max_rel_err"] < 1e-4, errs
    with pytest.raises(Unsupported, match="no sparse mask"):
        B.flash_attn_adapter(reference_flash_attn_func, replace(shape, attn_kind="sparse"), pad_v=True)


# Every attention kind a model config can give, through the real runner on CPU: (shape, backends that run it)
KIND_CASES = [
    (AttentionShape("gpt-oss", 48, 48, 4, 2, 16, 16, True, "sliding", 12, sinks=True), ["math", "sdpa", "sdpa_math"]),
    (AttentionShape("llama4", 48, 48, 4, 2, 16, 16, True, "chunked", 16), ["math", "sdpa", "sdpa_flash"]),
    (AttentionShape("llama4-tail", 40, 40, 4, 2, 16, 16, True, "chunked", 16), ["math", "sdpa"]),
    (AttentionShape("dsa", 48, 48, 4, 4, 24, 16, True, "sparse", 8), ["math", "sdpa", "sdpa_math"]),
    (AttentionShape("qwen3-next", 70, 70, 4, 2, 16, 8, True, "linear", 16), ["gdn_torch"]),
    (AttentionShape("dsa-indexer", 40, 40, 3, 1, 16, 1, True, "indexer", 8), ["indexer_torch"]),
    # Mamba-2: 4 heads of 8 in 2 groups sharing a 16-wide state, chunks of 16 (the last one padded)
    (AttentionShape("nemotron-h", 40, 40, 4, 2, 16, 8, True, "mamba2", 16), ["mamba2_torch"]),
    # Kimi Delta Attention: 3 heads of 16, chunks of 32 (two blocks of 16 each; the last chunk padded)
    (AttentionShape("kimi-linear", 40, 40, 3, 3, 16, 16, True, "kda", 32), ["kda_torch"]),
]


@pytest.mark.parametrize("shape,backends", KIND_CASES, ids=[s.model for s, _ in KIND_CASES])
def test_every_attention_kind_runs_checked_and_timed(shape, backends):
    cache = ProblemCache()
    for name in backends:
        row = run_case(AttentionCase(shape, 2, name, "fp32"), torch.device("cpu"), ["fwd", "bwd"], FAST, cache)
        assert row["status"] == "ok", (name, row.get("error"))
        assert row["max_rel_err"] < 1e-4 and row["grad_max_rel_err"] < 1e-3, (name, row)
        assert row["attn_kind"] == shape.attn_kind and row["fwd_flops"] == attention_flops(shape, 2)
        assert row["fwd_time"] > 0 and row["bwd_tflops"] > 0
        note = row["note"] or ""
        if shape.attn_kind in ("sliding", "sparse"):
            assert "dense kernel under a" in note  # SDPA has no window: the row says it computed every score
        if shape.attn_kind == "chunked":
            assert ("timed as causal attention over 3 blocks of 16" in note) == (shape.seqlen_q == 48)
        assert ("attention sinks not applied" in note) == shape.sinks
        assert ("torch's dispatch runs SDPA " in note) == (name == "sdpa")  # which kernel the default picked


def test_masked_kinds_refused_where_a_kernel_has_no_such_mask():
    sparse = AttentionShape("dsa", 48, 48, 4, 4, 16, 16, True, "sparse", 8)
    with pytest.raises(Unsupported, match="no sparse mask"):
        B.BACKENDS["triton"].build(sparse, torch.device("cuda"), "bf16")


def test_unsupported_row_for_linear_kernels_off_gpu():
    linear = AttentionShape("qwen3-next", 64, 64, 4, 2, 16, 8, True, "linear", 64)
    row = run_case(AttentionCase(linear, 1, "gdn_fla", "fp32"), torch.device("cpu"), ["fwd"], FAST, ProblemCache())
    assert row["status"] == "unsupported" and "GPUs only" in row["error"]
    ssd = AttentionShape("nemotron-h", 64, 64, 4, 2, 16, 8, True, "mamba2", 16)
    row = run_case(AttentionCase(ssd, 1, "mamba2_ssm", "fp32"), torch.device("cpu"), ["fwd"], FAST, ProblemCache())
    assert (
        row["status"] == "unsupported" and "mamba_ssm's Triton SSD kernels run on CUDA/ROCm GPUs only" in row["error"]
    )


def test_flash_attn_adapter_unwraps_fa3_tuple():
    shape = mk(12, 40, 4, 2, 32, 32)
    problem = make_problem(shape, 1, "fp32", torch.device("cpu"), with_grads=False)

    def fa3_like(q, k, v, softmax_scale=None, causal=False):
        out = reference_flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal)
        return out, torch.zeros(q.shape[0], q.shape[2], q.shape[1])

    errs = check(B.flash_attn_adapter(fa3_like, shape, pad_v=False).fn, B.BSHD, problem)
    assert errs["max_rel_err"] < 1e-5


def test_flash_attn_4_is_found_where_only_its_wheel_is_installed(monkeypatch):
    """flash-attn-4 installs flash_attn.cute alone (flash_attn is then a namespace package without flash_attn_func):
    on Hopper/Blackwell it is taken, behind FA3; on other GPUs FA2 or a message naming every module looked at."""
    import sys
    import types

    fa4 = types.ModuleType("flash_attn.cute")
    fa4.flash_attn_func = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)  # None in sys.modules: ImportError
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", fa4)
    monkeypatch.setattr(torch.version, "hip", None)
    gpu = torch.device("cuda", 0)
    for major, flavour in ((9, "fa4"), (10, "fa4")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, m=major: (m, 0))
        assert B.load_flash_attn(gpu) == (fa4.flash_attn_func, flavour)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 0))
    with pytest.raises(Unsupported, match="flash_attn has no flash_attn_func.*flash-attn-4 on Hopper"):
        B.load_flash_attn(gpu)


def test_backward_timing_never_reruns_forward():
    shape = mk(32, 32, 4, 2, 32, 32)
    calls = {"n": 0}
    fn = B.BACKENDS["sdpa"].build(shape, torch.device("cpu"), "fp32").fn

    def counted(q, k, v):
        calls["n"] += 1
        return fn(q, k, v)

    q, k, v = (torch.randn(1, h, 32, 32, requires_grad=True) for h in (4, 2, 2))
    stats = time_passes(counted, (q, k, v), ["bwd"], torch.device("cpu"), FAST)
    assert calls["n"] == 1 and stats["bwd"].iters >= 3  # one untimed forward, many timed backwards
    calls["n"] = 0
    stats = time_passes(counted, (q, k, v), ["fwdbwd"], torch.device("cpu"), FAST)
    assert calls["n"] >= stats["fwdbwd"].iters + 1


def test_reference_handles_long_rows_in_chunks():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 50, 4, 16), torch.randn(1, 70, 2, 16), torch.randn(1, 70, 2, 8)
    g = torch.randn(1, 50, 4, 8)
    whole = reference_attention(q, k, v, True, g)
    chunked = reference_attention(q, k, v, True, g, chunk_bytes=1)  # one query row at a time
    for a, b in zip(whole, chunked):
        assert torch.allclose(a, b, atol=1e-12)


def test_cli_cpu_rows(tmp_path):
    shapes = tmp_path / "s.json"
    shapes.write_text(
        '[{"model": "gqa", "seqlen_q": 32, "seqlen_kv": 64, "num_head_q": 4, "num_head_kv": 2,'
        ' "head_dim_qk": 32, "head_dim_v": 32, "causal": true},'
        ' {"model": "mla", "seqlen_q": 48, "seqlen_kv": 48, "num_head_q": 4, "num_head_kv": 4,'
        ' "head_dim_qk": 48, "head_dim_v": 32, "causal": true}]'
    )
    out = tmp_path / "a.csv"
    assert (
        main(
            [
                "--shapes-json-path",
                str(shapes),
                "--backends",
                "math,sdpa_flash,sdpa_efficient,flash_attn,triton",
                "--batch-sizes",
                "1,2",
                "--device",
                "cpu",
                "--min-iters",
                "3",
                "--max-iters",
                "4",
                "--budget",
                "0.02",
                "--report-csv-path",
                str(out),
            ]
        )
        == 0
    )
    df = pd.read_csv(out, keep_default_na=True)
    assert tuple(df.columns) == SCHEMA.columns
    for col in [
        "model",
        "batch_size",
        "seqlen_q",
        "seqlen_kv",
        "num_head_q",
        "num_head_kv",
        "head_dim_qk",
        "head_dim_v",
        "causal",
        "dtype",
        "backend",
        "fwd_time",
        "fwd_tflops",
        "bwd_time",
        "bwd_tflops",
        "fwdbwd_time",
        "max_abs_err",
        "status",
        "error",
    ]:
        assert col in df.columns
    assert len(df) == 2 * 2 * 5
    ok = df[df.status == "ok"]
    assert set(ok.backend) == {"math", "sdpa_flash"} and set(df[df.backend == "math"].status) == {"ok"}
    assert not ((ok.model == "mla") & (ok.backend == "sdpa_flash")).any()
    for p in ("fwd", "bwd", "fwdbwd"):
        assert (ok[f"{p}_time"] > 0).all() and (ok[f"{p}_iters"] >= 3).all()
        assert (ok[f"{p}_time_min"] <= ok[f"{p}_time"]).all() and (ok[f"{p}_time"] <= ok[f"{p}_time_max"]).all()
    assert (ok.max_abs_err < 1e-4).all() and ok.error.isna().all()
    for _, r in ok.iterrows():
        s = AttentionShape(
            r.model, r.seqlen_q, r.seqlen_kv, r.num_head_q, r.num_head_kv, r.head_dim_qk, r.head_dim_v, bool(r.causal)
        )
        assert math.isclose(r.bwd_tflops, attention_flops(s, r.batch_size, "bwd") / r.bwd_time / 1e12, rel_tol=1e-4)
    bad = df[df.status != "ok"]
    assert set(bad.status) == {"unsupported"}
    assert bad.fwd_time.isna().all() and bad.max_abs_err.isna().all()  # never a zero standing for "did not run"
    assert bad.error.str.len().min() > 10
    reasons = dict(zip(bad.backend, bad.error))
    assert "CPU" in reasons["sdpa_efficient"] and "GPU" in reasons["flash_attn"]
    assert "TRITON_INTERPRET" in reasons["triton"]
    assert "same last dimension" in bad[bad.backend == "sdpa_flash"].error.iloc[0]


def test_fwdbwd_faster_than_bwd_is_marked_noisy():
    """fwd+bwd includes bwd, so a row where it took less time is noise, and says so (the console counts it)."""
    from opbench.core.timing import noisy_advice

    bad = {"bwd_time": 0.30, "fwdbwd_time": 0.20}
    assert inconsistent_passes(bad) == "noisy: fwdbwd 0.2 s < bwd 0.3 s"
    assert inconsistent_passes({"bwd_time": 0.2, "fwdbwd_time": 0.3}) is None
    assert inconsistent_passes({"fwd_time": 0.1}) is None
    rows = [{"note": "v zero-padded 96->128; noisy bwd: IQR 30% of the median"}, {"note": None}, {"note": "x"}]
    assert noisy_advice(rows).startswith("1 of 3 rows are noisy") and noisy_advice(rows[1:]) is None


def test_kernel_without_gqa_gets_expanded_kv_outside_the_timed_region(monkeypatch):
    """sdpa_efficient has no GQA (CUDA only, so not runnable here): the same path is taken by SDPA's math kernel
    with native GQA switched off. Without the expansion SDPA refuses 4 query heads on 2 K/V heads; with it the row
    is checked against the GQA reference (gradients reach the original 2 K/V heads) and timed on 4-head K/V."""
    monkeypatch.setattr(B, "KV_EXPANDED_KERNELS", {"MATH"})
    shape = mk(24, 24, 4, 2, 16, 16)
    seen: list[tuple[int, ...]] = []
    plain = B.BACKENDS["sdpa_math"]

    def build(s, device, dtype):
        prepared = plain.build(s, device, dtype)

        def fn(q, k, v):
            seen.append(tuple(k.shape))
            return prepared.fn(q, k, v)

        return replace(prepared, fn=fn)

    monkeypatch.setitem(B.BACKENDS, "sdpa_math", replace(plain, build=build))
    row = run_case(
        AttentionCase(shape, 2, "sdpa_math", "fp32"), torch.device("cpu"), ["fwd", "bwd"], FAST, ProblemCache()
    )
    assert row["status"] == "ok", row
    assert row["grad_max_rel_err"] < 1e-3 and row["fwd_time"] > 0 and row["bwd_time"] > 0
    assert "K/V heads expanded 2->4 before timing" in row["note"]
    assert set(seen) == {(2, 4, 24, 16)}  # every call, checked and timed, saw the expanded heads
    monkeypatch.setattr(B, "KV_EXPANDED_KERNELS", set())  # native GQA again: no note, K/V handed as they are
    row = run_case(AttentionCase(shape, 2, "sdpa_math", "fp32"), torch.device("cpu"), ["fwd"], FAST, ProblemCache())
    assert row["status"] == "ok" and "expanded" not in (row["note"] or "") and (2, 2, 24, 16) in seen


@pytest.mark.parametrize(
    "shape", [KIND_CASES[4][0], KIND_CASES[5][0], KIND_CASES[6][0]], ids=["gdn", "indexer", "mamba2"]
)
def test_a_long_causal_operator_is_checked_on_a_prefix_the_oracle_gets_exactly(monkeypatch, shape):
    """Gated DeltaNet's and the indexer's oracles do not fit a GPU at training lengths (16 GiB and more at 4k): past
    CHECK_PREFIX tokens they run on the prefix, with the output gradient zero past it. That is exact for a causal
    operator: the full-length oracle, given the same output gradient, agrees on the prefix's output and on every
    input's gradient (zero past the prefix)."""
    import opbench.attention.runner as R

    monkeypatch.setattr(R, "CHECK_PREFIX", 24)
    monkeypatch.setattr(R, "MAMBA2_CHECK_PREFIX", 24)
    cpu = torch.device("cpu")
    short = R.make_problem(shape, 2, "fp32", cpu, with_grads=True)
    assert short.out_part is not None and short.ref[0].shape[1] == 24
    monkeypatch.setattr(R, "CHECK_PREFIX", 10**6)
    monkeypatch.setattr(R, "MAMBA2_CHECK_PREFIX", 10**6)
    whole = R.make_problem(shape, 2, "fp32", cpu, with_grads=True)
    oracles = {"indexer": R.indexer_reference, "linear": R.recurrent_gated_delta_rule, "mamba2": R.ssd_reference}
    full = R.partial_reference(oracles[shape.attn_kind])(*whole.inputs, short.grad_out)
    assert torch.allclose(full[0][short.out_part], short.ref[0], atol=1e-12)
    for got, want in zip(short.ref[1:], full[1:]):
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-12)
    monkeypatch.setattr(R, "CHECK_PREFIX", 24)
    monkeypatch.setattr(R, "MAMBA2_CHECK_PREFIX", 24)
    backend = {"linear": "gdn_torch", "indexer": "indexer_torch", "mamba2": "mamba2_torch"}[shape.attn_kind]
    row = run_case(AttentionCase(shape, 2, backend, "fp32"), cpu, ["fwd", "bwd"], FAST, R.ProblemCache())
    assert row["status"] == "ok" and row["grad_max_rel_err"] < 1e-3, row
    assert "checked on the first 24 tokens" in row["note"]
