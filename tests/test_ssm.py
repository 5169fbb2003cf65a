"""Mamba-2's chunked scan (opbench/attention/operators.py ``chunked_ssd``) against its definitions and against
transformers' own NemotronH Mamba-2 mixer on real CPU tensors; its FLOP formula (flops.mamba2_flops) against what
torch's FLOP counter sees the reference do."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from opbench.attention.flops import attention_flops, mamba2_flops
from opbench.attention.operators import causal_conv1d, chunked_ssd, recurrent_ssd, ssd_reference
from opbench.attention.reference import max_errors
from opbench.attention.shapes import AttentionShape

# Norm-wise relative error (max|err| / max|ref|, reference.max_errors) allowed between opbench's chunked scan and
# transformers' mixer: both compute the scan in fp32 with the same chunking, so only summation order differs.
MIXER_TOLERANCE = 1e-5


def _inputs(bs=2, s=45, h=4, p=8, g=2, n=16, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*size):
        return torch.randn(*size, generator=gen, dtype=dtype)

    x, b, c = randn(bs, s, h, p), randn(bs, s, g, n), randn(bs, s, g, n)
    dt = F.softplus(randn(bs, s, h) - 2.0)
    a = -1.0 - 7.0 * torch.rand(h, generator=gen, dtype=dtype)
    return x, dt, a, b, c, randn(h)


@pytest.mark.parametrize("chunk", [8, 16, 64])
def test_chunked_scan_equals_the_recurrence_and_the_semiseparable_matrix(chunk):
    """Three forms of one operator: token by token, the whole (L ∘ C·Bᵀ) matrix, and by chunks (45 tokens: the last
    chunk padded; 64: one chunk)."""
    inputs = _inputs()
    rec = recurrent_ssd(*inputs)
    assert torch.allclose(ssd_reference(*inputs), rec, rtol=0, atol=1e-12)
    assert max_errors(chunked_ssd(*inputs, chunk=chunk), rec)[1] < 1e-6  # fp32 inside


def test_chunked_scan_gradients_match_the_oracle():
    x, dt, a, b, c, d = (t.requires_grad_() for t in _inputs(s=40))
    grad = torch.randn(2, 40, 4, 8, dtype=torch.float64)
    ref = torch.autograd.grad(ssd_reference(x, dt, a, b, c, d), (x, dt, a, b, c, d), grad)
    got = torch.autograd.grad(chunked_ssd(x, dt, a, b, c, d, chunk=16), (x, dt, a, b, c, d), grad)
    for g, r in zip(got, ref):
        assert max_errors(g, r)[1] < 1e-5


def _nemotron_h_mixer():
    transformers = pytest.importorskip("transformers")
    from transformers.models.nemotron_h import modeling_nemotron_h as M

    cfg = transformers.NemotronHConfig(
        hidden_size=32,
        mamba_num_heads=4,
        mamba_head_dim=8,
        ssm_state_size=16,
        n_groups=2,
        conv_kernel=4,
        chunk_size=16,
        layers_block_type=["linear_attention"],
        vocab_size=64,
    )
    torch.manual_seed(0)
    mixer = M.NemotronHMamba2Mixer(cfg, layer_idx=0).double().eval()
    with torch.no_grad():  # away from the init's A_log = log(1…H), D = 1, dt_bias = 1, so each is exercised
        mixer.D.copy_(torch.randn(4))
        mixer.dt_bias.copy_(torch.randn(4) - 1.0)
        mixer.A_log.copy_(torch.rand(4) * 2.0)
        mixer.norm.weight.copy_(1.0 + 0.1 * torch.randn(32))
    return mixer


def _opbench_mixer(mixer, hidden: torch.Tensor) -> torch.Tensor:
    """The same layer with opbench's causal conv and chunked scan: in_proj → (z, xBC, Δ), conv + SiLU over xBC,
    Δ = softplus(Δ + dt_bias) ≥ time_step_min, A = −exp(A_log), scan with D, grouped gated RMSNorm, out_proj."""
    bs, s, _ = hidden.shape
    h, p, n, g = mixer.num_heads, mixer.head_dim, mixer.ssm_state_size, mixer.n_groups
    inner = h * p
    z, xbc, dt = mixer.in_proj(hidden).split([inner, mixer.conv_dim, h], dim=-1)
    xbc = causal_conv1d(xbc, mixer.conv1d.weight[:, 0], mixer.conv1d.bias)
    x, b, c = xbc.split([inner, g * n, g * n], dim=-1)
    dt = F.softplus(dt + mixer.dt_bias).clamp(min=mixer.time_step_limit[0])
    a = -torch.exp(mixer.A_log.float())
    y = chunked_ssd(
        x.reshape(bs, s, h, p), dt, a, b.reshape(bs, s, g, n), c.reshape(bs, s, g, n), mixer.D, chunk=mixer.chunk_size
    )
    return mixer.out_proj(mixer.norm(y.reshape(bs, s, inner), z))


def test_chunked_scan_matches_transformers_nemotron_h_mixer():
    """transformers' NemotronHMamba2Mixer on CPU runs its torch path (``causal_conv1d_fn`` and ``mamba2_chunk_scan``
    fall back to torch without the causal_conv1d / mamba_ssm packages). 50 tokens (the last of 4 chunks of 16
    padded), 4 heads in 2 groups: the output and the gradients of the input and of every mixer parameter agree
    within MIXER_TOLERANCE (norm-wise relative; the scan is fp32 in both)."""
    mixer = _nemotron_h_mixer()
    hidden = torch.randn(2, 50, 32, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 50, 32, dtype=torch.float64)
    wrt = (hidden, *mixer.parameters())
    ref = mixer(hidden)
    ref_grads = torch.autograd.grad(ref, wrt, grad)
    got = _opbench_mixer(mixer, hidden)
    got_grads = torch.autograd.grad(got, wrt, grad)
    errors = {"output": max_errors(got, ref)}
    names = ["hidden_states", *(n for n, _ in mixer.named_parameters())]
    errors.update({name: max_errors(g, r) for name, g, r in zip(names, got_grads, ref_grads)})
    assert all(rel < MIXER_TOLERANCE for _, rel in errors.values()), errors
    assert set(names) >= {"dt_bias", "A_log", "D", "conv1d.weight", "in_proj.weight", "norm.weight"}


def test_flop_formula_counts_the_chunked_scan():
    """torch's FLOP counter on opbench's chunked scan sees exactly the formula's matmuls: C·Bᵀ per group, the masked
    product, the chunk states and the output from states; the formula adds the elementwise state passing
    (2·N·P per head and chunk), which the counter does not see."""
    from torch.utils.flop_counter import FlopCounterMode

    bs, s, h, p, g, n, chunk = 2, 45, 4, 8, 2, 16, 16
    shape = AttentionShape("t", s, s, h, g, n, p, True, "mamba2", chunk)
    inputs = _inputs(bs, s, h, p, g, n, dtype=torch.float32)
    with FlopCounterMode(display=False) as counter:
        chunked_ssd(*inputs, chunk=chunk)
    chunks = math.ceil(s / chunk)
    assert counter.get_total_flops() == mamba2_flops(shape, bs) - bs * chunks * h * 2 * n * p
    assert attention_flops(shape, bs, "fwdbwd") == 3 * mamba2_flops(shape, bs)
    per_chunk = 2 * chunk**2 * n * g + h * (2 * chunk**2 * p + 4 * chunk * n * p + 2 * n * p)
    assert mamba2_flops(shape, bs) == bs * chunks * per_chunk


def test_causal_conv_is_causal():
    x = torch.randn(1, 12, 6)
    w = torch.randn(6, 4)
    y = causal_conv1d(x, w)
    x2 = x.clone()
    x2[:, 7:] += 1.0
    assert torch.equal(causal_conv1d(x2, w)[:, :7], y[:, :7])


def test_nemotron_h_legacy_pattern_and_field_names(tmp_path):
    """A Nemotron-H config.json as the Hub's older ones are written: the blocks as ``hybrid_override_pattern`` (its
    length, not ``num_hidden_layers``, is the layer count), ``mamba_n_groups`` / ``mamba_d_conv`` /
    ``mamba_chunk_size``: the same parameters as transformers builds from it; an unknown block is one line naming
    the field."""
    import json

    transformers = pytest.importorskip("transformers")
    from opbench.core.errors import UsageError
    from opbench.models import load_model_configs
    from opbench.models.architectures import decoder_layers
    from opbench.models.params import parameter_shapes

    given = dict(
        model_type="nemotron_h",
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=96,
        vocab_size=256,
        mamba_num_heads=8,
        mamba_head_dim=8,
        ssm_state_size=16,
        mamba_n_groups=4,
        mamba_d_conv=2,
        mamba_chunk_size=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48,
        hybrid_override_pattern="M-M*E",
        num_hidden_layers=52,
    )
    path = tmp_path / "config.json"
    path.write_text(json.dumps(given))
    (cfg,) = load_model_configs(path)
    hf_cfg = transformers.AutoConfig.for_model(**given)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    assert [(s.name, s.shape) for s in parameter_shapes(cfg)] == [
        (n, tuple(p.shape)) for n, p in model.named_parameters()
    ]
    layers = decoder_layers(cfg)
    assert cfg.num_hidden_layers == 5 and [lay.moe for lay in layers] == [False] * 4 + [True]
    assert [lay.attention[0].kind if lay.attention else "-" for lay in layers] == ["mamba2", "-", "mamba2", "full", "-"]
    assert layers[0].attention[0].window == 32 and layers[0].attention[0].heads_kv == 4
    path.write_text(json.dumps({**given, "hybrid_override_pattern": "M-X"}))
    with pytest.raises(UsageError, match="field 'hybrid_override_pattern': unknown block type"):
        load_model_configs(path)
