"""Kimi Delta Attention (opbench/attention/operators.py ``chunked_kda``) against its recurrence, against
transformers' own torch KDA (``chunk_kimi_delta_attention``) and its Kimi Linear layer on real CPU tensors (output
and gradients); its FLOP formula (flops.kda_flops) against what torch's FLOP counter sees; the kind's shapes from a
Kimi Linear config; the flash-linear-attention backend's refusal on a CPU."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from opbench.attention.flops import attention_flops, gated_deltanet_flops, kda_bytes, kda_flops
from opbench.attention.operators import causal_conv1d, chunked_kda, recurrent_kda
from opbench.attention.reference import max_errors
from opbench.attention.shapes import AttentionShape, model_attention_shapes
from opbench.core.errors import UsageError
from opbench.models import load_model_configs

# Norm-wise relative error (max|err| / max|ref|) between opbench's chunked KDA and transformers': both compute in
# fp32 with the same chunking, only the summation order differs; with the random layer's steep per-channel decays
# each is ~1e-5 from an fp64 recurrence (measured: 1e-6 to 1e-5 on the output and every gradient, both alike).
LAYER_TOLERANCE = 1e-4


def _inputs(b=2, s=45, h=3, dk=16, dv=8, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*size):
        return torch.randn(*size, generator=gen, dtype=dtype)

    q, k, v = randn(b, s, h, dk), randn(b, s, h, dk), randn(b, s, h, dv)
    g = -0.5 * torch.rand(b, s, h, dk, generator=gen, dtype=dtype)  # a per-channel decay of 0.6–1 per token
    return q, k, v, g, torch.sigmoid(randn(b, s, h))


@pytest.mark.parametrize("chunk", [8, 16, 64])
def test_chunked_kda_equals_the_recurrence(chunk):
    """45 tokens: the last chunk padded (8, 16), or one chunk longer than the sequence (64)."""
    inputs = _inputs()
    assert max_errors(chunked_kda(*inputs, chunk=chunk), recurrent_kda(*inputs))[1] < 1e-6  # fp32 inside


def test_chunked_kda_gradients_match_the_oracle():
    inputs = tuple(t.requires_grad_() for t in _inputs(s=40))
    grad = torch.randn(2, 40, 3, 8, dtype=torch.float64)
    ref = torch.autograd.grad(recurrent_kda(*inputs), inputs, grad)
    got = torch.autograd.grad(chunked_kda(*inputs, chunk=16), inputs, grad)
    for g, r in zip(got, ref):
        assert max_errors(g, r)[1] < 1e-5


def test_chunked_kda_matches_transformers_torch_kda():
    """transformers' ``chunk_kimi_delta_attention`` (its torch fallback when fla is absent), chunk 16 over 50 tokens,
    with the L2 norm inside as Kimi Linear calls it: output and every input's gradient."""
    pytest.importorskip("transformers")
    from transformers.models.kimi_linear.modeling_kimi_linear import chunk_kimi_delta_attention

    inputs = tuple(t.requires_grad_() for t in _inputs(s=50))
    grad = torch.randn(2, 50, 3, 8, dtype=torch.float64)
    ref, _ = chunk_kimi_delta_attention(*inputs, chunk_size=16, use_qk_l2norm_in_kernel=True)
    got = chunked_kda(*inputs, chunk=16)
    assert max_errors(got, ref)[1] < LAYER_TOLERANCE
    for g, r in zip(torch.autograd.grad(got, inputs, grad), torch.autograd.grad(ref, inputs, grad)):
        assert max_errors(g, r)[1] < LAYER_TOLERANCE


def _kimi_kda_layer():
    transformers = pytest.importorskip("transformers")
    from transformers.models.kimi_linear import modeling_kimi_linear as M

    cfg = transformers.AutoConfig.for_model(
        "kimi_linear",
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=64,
        num_hidden_layers=1,
        linear_attn_config=dict(
            num_heads=2, head_dim=16, short_conv_kernel_size=4, full_attn_layers=[], kda_layers=[1]
        ),
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    layer = M.KimiLinearDeltaAttention(cfg, layer_idx=0).double().eval()
    for p in layer.parameters():  # the init leaves dt_bias and A_log empty: every parameter random
        with torch.no_grad():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() > 1 else 1.0))
    return layer


def _opbench_kda_layer(layer, hidden: torch.Tensor) -> torch.Tensor:
    """The same layer with opbench's causal conv and chunked KDA: q, k, v projections → short conv + SiLU, the forget
    gate g = −exp(A_log)·softplus(f_b(f_a(x)) + dt_bias) per channel, β = sigmoid(b_proj(x)), KDA, the output
    gate g_b(g_a(x)) through the gated RMSNorm, o_proj."""
    b, s, _ = hidden.shape
    h, d = layer.num_heads, layer.head_dim
    qkv = torch.cat([layer.q_proj(hidden), layer.k_proj(hidden), layer.v_proj(hidden)], dim=-1)
    q, k, v = causal_conv1d(qkv, layer.conv1d.weight[:, 0]).reshape(b, s, 3, h, d).unbind(2)
    fg = layer.forget_gate
    f = fg.f_b_proj(fg.f_a_proj(hidden)) + fg.dt_bias
    g = -torch.exp(fg.A_log.reshape(1, 1, h, 1)) * F.softplus(f.reshape(b, s, h, d))
    beta = torch.sigmoid(layer.b_proj(hidden))
    out = chunked_kda(q, k, v, g, beta, chunk=64)
    gate = layer.g_b_proj(layer.g_a_proj(hidden)).reshape(b, s, h, d)
    return layer.o_proj(layer.o_norm(out, gate).reshape(b, s, h * d))


def test_chunked_kda_matches_transformers_kimi_linear_layer():
    """transformers' KimiLinearDeltaAttention on CPU runs its torch path (causal_conv1d and fla absent). 70 tokens
    (two chunks of 64, the second padded), 2 heads of 16: the output and the gradients of the input and of every
    layer parameter agree within LAYER_TOLERANCE (norm-wise relative)."""
    layer = _kimi_kda_layer()
    hidden = torch.randn(2, 70, 32, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 70, 32, dtype=torch.float64)
    wrt = (hidden, *layer.parameters())
    ref = layer(hidden)
    ref_grads = torch.autograd.grad(ref, wrt, grad)
    got = _opbench_kda_layer(layer, hidden)
    got_grads = torch.autograd.grad(got, wrt, grad)
    errors = {"output": max_errors(got, ref)}
    names = ["hidden_states", *(n for n, _ in layer.named_parameters())]
    errors.update({name: max_errors(g, r) for name, g, r in zip(names, got_grads, ref_grads)})
    assert all(rel < LAYER_TOLERANCE for _, rel in errors.values()), errors
    assert {"forget_gate.A_log", "forget_gate.dt_bias", "conv1d.weight", "o_norm.weight"} <= set(names)


def test_flop_formula_counts_the_chunked_kda():
    """torch's FLOP counter on opbench's chunked KDA sees the formula's matmuls but the triangular solves (torch
    does not count them) and the diagonal 16×16 blocks of the two C×C matrices, which it builds channel by channel
    (elementwise: uncounted; the formula counts both matrices whole, 2·C²·d_k each, as one matmul each). The
    formula is the chunked delta rule's, one formula for both kinds."""
    from torch.utils.flop_counter import FlopCounterMode

    b, s, h, dk, dv, chunk = 2, 45, 3, 16, 8, 32
    shape = AttentionShape("t", s, s, h, h, dk, dv, True, "kda", chunk)
    with FlopCounterMode(display=False) as counter:
        chunked_kda(*_inputs(b, s, h, dk, dv, dtype=torch.float32), chunk=chunk)
    chunks, sub = math.ceil(s / chunk), 16
    per_chunk = 4 * chunk**2 * dk + 2 * chunk**2 * dv + 6 * chunk * dk * dv
    assert kda_flops(shape, b, with_solve=False) == b * h * chunks * per_chunk
    off_diagonal = 2 * 2 * sub * sub * dk  # two matrices: the second block of 16 rows against the first 16 tokens
    seen = b * h * chunks * (per_chunk - 2 * 2 * chunk**2 * dk + off_diagonal)
    assert counter.get_total_flops() == seen
    assert kda_flops(shape, b) == b * h * chunks * (per_chunk + chunk**2 * (dk + dv))
    assert kda_flops(shape, b) == gated_deltanet_flops(shape, b)
    assert attention_flops(shape, b, "fwdbwd") == 3 * kda_flops(shape, b)
    # bytes: q, k, g (dk each), v and the output (dv each), β, per token and head; the fp32 state entering each chunk
    assert kda_bytes(shape, b, 2) == b * (s * h * (3 * dk + 2 * dv + 1) * 2 + chunks * h * dk * dv * 4)


@pytest.fixture(scope="module")
def kimi_config(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("kimi") / "Kimi-Linear"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(transformers.AutoConfig.for_model("kimi_linear").to_dict()))
    return folder


def test_kimi_linear_attention_shapes_split_heads_over_tp(kimi_config):
    """Kimi Linear's default 27 layers: 21 KDA (32 heads of 128, chunk 64) and 6 MLA layers; --tp 2 halves both."""
    (cfg,) = load_model_configs(kimi_config)
    kda, mla = model_attention_shapes(cfg, seqlen=4096, tp=2)
    assert (kda.attn_kind, kda.num_head_q, kda.num_head_kv, kda.head_dim_qk, kda.window) == ("kda", 16, 16, 128, 64)
    assert (kda.layer_count, mla.layer_count, mla.attn_kind, mla.num_head_q) == (21, 6, "full", 16)
    with pytest.raises(UsageError, match="linear_num_heads 32 of Kimi-Linear is not divisible by --tp 3"):
        model_attention_shapes(cfg, seqlen=4096, tp=3)


def test_attention_dry_run_plans_kda_from_a_kimi_linear_config(kimi_config, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "opbench", "attention", "--model-config-path", str(kimi_config), "--seqlen", "4096",
         "--dry-run", "--report-dir-path", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "kda" in r.stdout and "kda_torch" in r.stdout and "kda_fla" in r.stdout


def test_fla_backend_says_why_it_does_not_run_on_the_cpu():
    """kda_fla is flash-linear-attention's Triton kernel: on a CPU it is a skipped row with its reason, never a
    crash (fla's kernels autotune, which needs a GPU driver; Triton's interpreter fails inside them)."""
    from opbench.attention.backends import BACKENDS
    from opbench.core.sweep import Unsupported

    shape = AttentionShape("t", 128, 128, 2, 2, 32, 32, True, "kda", 64)
    with pytest.raises(Unsupported, match="KDA kernels run on CUDA/ROCm GPUs only"):
        BACKENDS["kda_fla"].build(shape, torch.device("cpu"), "bf16")
