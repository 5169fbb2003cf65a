"""opbench's Triton attention kernel, forward and backward, checked on CPU under TRITON_INTERPRET=1.

The interpreter must be switched on before triton is imported, so each check runs in a fresh interpreter
process. Shapes are tiny (the interpreter is numpy, one program at a time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

pytest.importorskip("triton")

CHECK = textwrap.dedent("""
    import json, torch
    from opbench.attention.triton_attention import triton_attention
    from opbench.attention.reference import reference_attention, max_errors
    torch.manual_seed(0)
    results = []
    # (batch, sq, skv, hq, hkv, dqk, dv, causal, blocks, transposed_q, sliding window)
    cases = [
        (1, 20, 37, 4, 2, 32, 32, True, None, False, 0),     # queries at the end of a longer KV, GQA
        (2, 37, 20, 2, 1, 16, 16, True, None, False, 0),     # more queries than keys: empty rows, MQA
        (1, 33, 33, 3, 3, 40, 40, False, None, True, 0),     # full mask, head dim padded 40->64, strided q
        (1, 17, 17, 4, 1, 48, 24, True, None, False, 0),     # MLA-like head_dim_qk != head_dim_v
        (1, 21, 70, 4, 2, 24, 16, True, (32, 16), False, 0), # uneven tiles, both directions
        (1, 70, 21, 2, 1, 16, 16, True, (16, 32), False, 0),
        (1, 70, 70, 2, 1, 16, 16, True, (16, 16), False, 20), # sliding window: whole key blocks skipped
        (1, 21, 70, 2, 2, 16, 16, True, (16, 16), False, 9),  # window with queries at the end of the keys
    ]
    for b, sq, skv, hq, hkv, dqk, dv, causal, blocks, tq, window in cases:
        q = torch.randn(b, hq, sq, dqk).transpose(1, 2) if tq else torch.randn(b, sq, hq, dqk)
        q.requires_grad_()
        k = torch.randn(b, skv, hkv, dqk, requires_grad=True)
        v = torch.randn(b, skv, hkv, dv, requires_grad=True)
        out = triton_attention(q, k, v, causal, blocks=blocks, window=window)
        g = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
        again = torch.autograd.grad(out, (q, k, v), g)      # backward re-run on the retained graph
        ref = reference_attention(q, k, v, causal, g, kind="sliding" if window else "full", window=window)
        errs = [max_errors(x, r)[1] for x, r in zip((out, *grads), ref)]
        errs.append(max(max_errors(a, b.double())[0] for a, b in zip(again, grads)))
        results.append(errs)
    print(json.dumps(results))
""")


def run_interpreted(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_triton_kernel_matches_oracle_under_interpreter():
    proc = run_interpreted(["-c", CHECK])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 8
    for i, (out, dq, dk, dv, rerun) in enumerate(results):
        assert out < 1e-5 and max(dq, dk, dv) < 1e-5, (i, out, dq, dk, dv)
        assert rerun == 0.0, i


def test_cli_checks_triton_on_cpu_but_never_times_it(tmp_path):
    shapes = tmp_path / "s.json"
    shapes.write_text(
        '[{"model": "tiny", "seqlen_q": 24, "seqlen_kv": 40, "num_head_q": 4, "num_head_kv": 2,'
        ' "head_dim_qk": 32, "head_dim_v": 16, "causal": true}]'
    )
    out = tmp_path / "t.csv"
    proc = run_interpreted(
        [
            "-m",
            "opbench.attention",
            "--shapes-json-path",
            str(shapes),
            "--backends",
            "triton,math",
            "--device",
            "cpu",
            "--quick",
            "--report-csv-path",
            str(out),
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_csv(out).set_index("backend")
    tri = df.loc["triton"]
    assert tri.status == "unsupported" and "not timed" in tri.error
    assert 0 < tri.max_abs_err < 1e-5 and 0 < tri.grad_max_abs_err < 1e-5  # checked against the oracle
    assert pd.isna(tri.fwd_time) and pd.isna(tri.bwd_time) and pd.isna(tri.fwdbwd_time)
    assert df.loc["math"].status == "ok" and df.loc["math"].fwd_time > 0


@pytest.mark.parametrize(
    "target,kind,causal,window",
    [
        ("cuda:90", "fwd", True, 0),
        ("cuda:90", "fwd", False, 0),
        ("cuda:90", "dkdv", True, 128),  # a sliding window (gpt-oss, Gemma): its own specialisation
        ("cuda:90", "dq", False, 0),
        ("hip:gfx942", "dq", True, 0),
    ],
)
def test_kernels_compile_for_gpu_targets(target, kind, causal, window):
    """The interpreter does no type checking, so compile the kernels for real targets (MLA head dims; the bench
    script compiles every configuration). A helper whose two returns differed in integer width passed the
    interpreter and failed on an H100."""
    from opbench.attention.triton_aot import compile_kernel

    compiled = compile_kernel(target, kind, "bf16", 192, 128, causal, window)
    assert compiled.fits(target), compiled
