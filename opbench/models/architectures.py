"""One description per architecture opbench models exactly: which config fields it reads (with transformers'
defaults for fields a config.json leaves out), and what each decoder layer is made of (``layout.Layer``).

Every tool reads a model through these descriptions: parameter names and shapes (params.py, FSDP, checkpoints),
GEMM rows (gemm/shapes.py), attention operators (attention/shapes.py). Each follows the transformers 5.x
modeling file of its ``model_type`` (``modeling_<type>.py``) and is checked against the real model's
``named_parameters()`` and a forward's FLOPs in tests/test_architectures.py. Adding an architecture is one entry
in ``ARCHITECTURES`` and its name in that test (docs/models.md, "Adding an architecture").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opbench.core.errors import UsageError

from . import layout as L
from .layout import Attention, Block, Gemm, Layer, Named, weight

if TYPE_CHECKING:
    from .fields import FieldReader, ModelConfig

# transformers' layer_types names -> opbench attention kinds
HF_LAYER_TYPES = {
    "full_attention": L.FULL,
    "sliding_attention": L.SLIDING,
    "chunked_attention": L.CHUNKED,
    "linear_attention": L.LINEAR,
    "indexed_attention": L.SPARSE,
    "compressed_sparse_attention": L.CSA,  # DeepSeek-V4
    "heavily_compressed_attention": L.HCA,
}


@dataclass(frozen=True)
class Architecture:
    """How one ``model_type`` is read and built. ``read`` fills architecture-specific fields into the config
    being parsed (``fields``: canonical names plus ``extra``); ``layer`` builds decoder layer ``i``."""

    model_type: str
    models: str  # for the README and error messages: which released models use it
    layer: Callable[[ModelConfig, int], Layer]
    read: Callable[[FieldReader, dict[str, Any]], None] = lambda r, f: None
    # the transformers layer_types its modeling file builds (any other value is refused by field)
    layer_types: tuple[str, ...] = ("full_attention",)
    moe: bool = False  # routes to experts: an expert count the config gives must be at least 1
    tie_default: bool = False  # transformers' tie_word_embeddings default for this model_type
    head_dim_default: int | None = None  # transformers' head_dim default, when it is not hidden / heads
    # transformers' defaults of the shape fields a config.json may leave out, where they are constants (a Mistral
    # config without num_key_value_heads has 8, not one per head; a Qwen2-MoE one without num_experts has 60):
    # canonical field (config.ALIASES) -> value; tests/test_architectures.py checks them against transformers
    hf_defaults: Mapping[str, int] = field(default_factory=dict)
    embeddings: Callable[[ModelConfig], Named] = lambda c: [
        ("model.embed_tokens.weight", (c.vocab_size, c.hidden_size))
    ]
    layers_prefix: str = "model.layers"
    final: Callable[[ModelConfig], Named] = lambda c: L.norm("model.norm", c.hidden_size)
    lm_head_bias: Callable[[ModelConfig], bool] = lambda c: False


# --- reading helpers ----------------------------------------------------------------------------------------


SOFTMAX_LAYER_TYPES = ("full_attention", "sliding_attention")


def per_layer_list(r: FieldReader, key: str, allowed: Sequence[str], n: int | None, owner: str) -> list[str] | None:
    """A per-layer list of names (``layer_types``, ``mlp_layer_types``): each one ``allowed`` for this
    architecture (``owner``), one entry per layer; else a UsageError naming the field."""
    given = r.strings(key)
    if given is None:
        return None
    bad = sorted({t for t in given if t not in allowed})
    if bad:
        raise UsageError(
            f"{', '.join(repr(t) for t in bad)} {'is' if len(bad) == 1 else 'are'} not among {owner}'s {key} "
            f"({', '.join(allowed)})",
            source=r.where,
            field=key,
        )
    if n is not None and len(given) != n:
        raise UsageError(f"has {len(given)} entries for {n} layers", source=r.where, field=key)
    return given


def check_layer_types(r: FieldReader, fields: dict[str, Any], arch: Architecture) -> None:
    """Every architecture refuses a ``layer_types`` entry its modeling file does not build, whether or not its
    reader uses the list (a linear-attention layer in Qwen2 would be timed as nothing)."""
    unknown = sorted({t for t in r.strings("layer_types") or () if t not in HF_LAYER_TYPES})
    if unknown:
        raise UsageError(
            f"layer type(s) {unknown} are not modelled by opbench (known: {', '.join(HF_LAYER_TYPES)})",
            source=r.where,
            field="layer_types",
        )
    per_layer_list(r, "layer_types", arch.layer_types, fields.get("num_hidden_layers"), arch.model_type)


def layer_kinds(r: FieldReader, fields: dict[str, Any], rule: Callable[[int], str] | None) -> None:
    """``fields['layer_types']``: the config's own ``layer_types`` list when it has one (transformers writes it;
    ``check_layer_types`` has checked it), else ``rule(i)`` per layer as the model's config class derives it; a
    sliding layer with no window is full."""
    n = fields.get("num_hidden_layers")
    given = r.strings("layer_types")
    if given is not None:
        kinds = [HF_LAYER_TYPES[t] for t in given]
    elif rule is not None and n is not None:
        kinds = [rule(i) for i in range(n)]
    else:
        return
    if fields.get("sliding_window") is None:
        kinds = [L.FULL if k == L.SLIDING else k for k in kinds]
    if fields.get("attention_chunk_size") is None:
        kinds = [L.FULL if k == L.CHUNKED else k for k in kinds]
    fields["layer_types"] = tuple(kinds)


def kind_of(cfg: ModelConfig, i: int, default: str = L.FULL) -> str:
    """Layer ``i``'s attention kind (configs without a layer count: the rule's kind for that index)."""
    if cfg.layer_types and i < len(cfg.layer_types):
        return cfg.layer_types[i]
    return default


def window(r: FieldReader, key: str, hf_default: int | None) -> int | None:
    """A window size; 0 or null means none (Qwen2-MoE writes 0 when sliding is off)."""
    return r.number(key, r.hf_default(hf_default), zero=True) or None


def sliding_everywhere(r: FieldReader, fields: dict[str, Any], hf_default: int | None) -> None:
    """Mistral, Mixtral, Phi-3, StarCoder2, Qwen3-MoE: one ``sliding_window`` for every layer when it is set."""
    fields["sliding_window"] = window(r, "sliding_window", hf_default)
    layer_kinds(r, fields, lambda i: L.SLIDING)


def softmax_attention(cfg: ModelConfig, i: int, heads: int, kv_heads: int, d_qk: int, d_v: int, **kw: Any) -> Attention:
    kind = kind_of(cfg, i)
    window = {L.SLIDING: cfg.sliding_window, L.CHUNKED: cfg.attention_chunk_size}.get(kind) or 0
    return Attention(kind, heads, kv_heads, d_qk, d_v, window, **kw)


def standard_attention(
    cfg: ModelConfig,
    i: int,
    prefix: str = "self_attn",
    qkv_bias: bool = False,
    o_bias: bool = False,
    qk_norm: str | None = None,
    q_factor: int = 1,
    sinks: bool = False,
) -> Block:
    """q/k/v/o projections (``q_factor`` 2: q carries an output gate), optional per-head (``head``) or whole
    (``full``, OLMo 2) q/k norms after them, optional gpt-oss sinks (a parameter of the attention module itself,
    so listed first)."""
    h, heads, kv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    params: Named = [(f"{prefix}.sinks", (heads,))] if sinks else []
    params += (
        weight(f"{prefix}.q_proj", q_factor * heads * hd, h, qkv_bias)
        + weight(f"{prefix}.k_proj", kv * hd, h, qkv_bias)
        + weight(f"{prefix}.v_proj", kv * hd, h, qkv_bias)
        + weight(f"{prefix}.o_proj", h, heads * hd, o_bias)
    )
    if qk_norm == "head":
        params += L.norm(f"{prefix}.q_norm", hd) + L.norm(f"{prefix}.k_norm", hd)
    elif qk_norm == "full":
        params += L.norm(f"{prefix}.q_norm", heads * hd) + L.norm(f"{prefix}.k_norm", kv * hd)
    return Block(
        params,
        L.attention_gemms(h, heads, kv, hd, q_factor),
        (softmax_attention(cfg, i, heads, kv, hd, hd, sinks=sinks),),
        L.head_units(heads, kv),
    )


def fused_attention(
    cfg: ModelConfig,
    i: int,
    qkv: str,
    out: str,
    kv_heads: int,
    bias: bool,
    qkv_out: int | None = None,
    transposed: bool = False,
    out_first: bool = False,
) -> Block:
    """One fused q/k/v projection (Phi-3 ``qkv_proj``, GPT-NeoX/Falcon ``query_key_value``, GPT-2 ``c_attn``)."""
    h, heads, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    n_qkv = qkv_out if qkv_out is not None else (heads + 2 * kv_heads) * hd
    w_qkv = weight(qkv, n_qkv, h, bias, transposed)
    w_out = weight(out, h, heads * hd, bias, transposed)
    return Block(
        w_out + w_qkv if out_first else w_qkv + w_out,
        L.attention_gemms(h, heads, kv_heads, hd),
        (softmax_attention(cfg, i, heads, kv_heads, hd, hd),),
        L.head_units(heads, kv_heads),
    )


def mla_attention(cfg: ModelConfig, i: int, prefix: str = "self_attn", indexer: bool = False) -> Block:
    """DeepSeek multi-head latent attention (q LoRA optional), optionally with V3.2's DSA indexer."""
    h, heads, bias = cfg.hidden_size, cfg.num_attention_heads, cfg.attention_bias
    nope, rope, v = cfg.qk_nope_head_dim or 0, cfg.qk_rope_head_dim or 0, cfg.v_head_dim or 0
    kv_rank, q_rank = cfg.kv_lora_rank or 0, cfg.q_lora_rank
    p = prefix
    gemms: list[Gemm] = []
    if q_rank is None:
        params = weight(f"{p}.q_proj", heads * (nope + rope), h)
        gemms.append(Gemm("mla_q", heads * (nope + rope), h, L.COLUMN))
    else:
        params = (
            weight(f"{p}.q_a_proj", q_rank, h, bias)
            + L.norm(f"{p}.q_a_layernorm", q_rank)
            + weight(f"{p}.q_b_proj", heads * (nope + rope), q_rank)
        )
        # q_down is replicated across TP ranks (Megatron builds it duplicated); q_up is column-parallel
        gemms += [Gemm("mla_q_down", q_rank, h, L.REPLICATED), Gemm("mla_q_up", heads * (nope + rope), q_rank)]
    params += (
        weight(f"{p}.kv_a_proj_with_mqa", kv_rank + rope, h, bias)
        + L.norm(f"{p}.kv_a_layernorm", kv_rank)
        + weight(f"{p}.kv_b_proj", heads * (nope + v), kv_rank)
        + weight(f"{p}.o_proj", h, heads * v, bias)
    )
    gemms += [
        Gemm("mla_kv_down", kv_rank + rope, h, L.REPLICATED),
        Gemm("mla_kv_up", heads * (nope + v), kv_rank),
        Gemm("attn_out", h, heads * v, L.ROW),
    ]
    ops: tuple[Attention, ...]
    if indexer:
        ih, idim, topk = cfg.extra["index_n_heads"], cfg.extra["index_head_dim"], cfg.extra["index_topk"]
        params += (
            weight(f"{p}.indexer.wq_b", ih * idim, q_rank or 0)
            + weight(f"{p}.indexer.wk", idim, h)
            + L.norm(f"{p}.indexer.k_norm", idim, bias=True)
            + weight(f"{p}.indexer.weights_proj", ih, h)
        )
        # The indexer is replicated across TP ranks: its top-k sums scores over all of its heads.
        gemms += [
            Gemm("index_q", ih * idim, q_rank or 0, L.REPLICATED),
            Gemm("index_k", idim, h, L.REPLICATED),
            Gemm("index_weights", ih, h, L.REPLICATED),
        ]
        # head_dim_v = 1: each score is weighted by its head's weight and summed over heads (docs/models.md)
        ops = (
            Attention(L.INDEXER, ih, 1, idim, 1, topk),
            Attention(L.SPARSE, heads, heads, nope + rope, v, topk),
        )
    else:
        ops = (Attention(L.FULL, heads, heads, nope + rope, v),)
    return Block(params, tuple(gemms), ops, (("num_attention_heads", heads),))


def gated_deltanet(cfg: ModelConfig, prefix: str = "linear_attn") -> Block:
    """Qwen3-Next's gated DeltaNet: its own parameters (dt_bias, A_log) first, then conv1d, the input projections
    (q, k, v, z and β, a), the gated norm and out_proj; Megatron fuses the two input projections (``linear_in``)."""
    x = cfg.extra
    kh, vh, dk, dv, conv = (
        x["linear_num_key_heads"],
        x["linear_num_value_heads"],
        x["linear_key_head_dim"],
        x["linear_value_head_dim"],
        x["linear_conv_kernel_dim"],
    )
    h = cfg.hidden_size
    conv_dim = 2 * kh * dk + vh * dv
    p = prefix
    params: Named = [(f"{p}.dt_bias", (vh,)), (f"{p}.A_log", (vh,)), (f"{p}.conv1d.weight", (conv_dim, 1, conv))]
    params += weight(f"{p}.in_proj_qkvz", 2 * kh * dk + 2 * vh * dv, h) + weight(f"{p}.in_proj_ba", 2 * vh, h)
    params += L.norm(f"{p}.norm", dv) + weight(f"{p}.out_proj", h, vh * dv)
    gemms = (
        Gemm("linear_in", 2 * kh * dk + 2 * vh * dv + 2 * vh, h, L.COLUMN),
        Gemm("linear_out", h, vh * dv, L.ROW),
    )
    units = (("linear_num_key_heads", kh), ("linear_num_value_heads", vh))
    return Block(params, gemms, (Attention(L.LINEAR, vh, kh, dk, dv, L.LINEAR_CHUNK),), units)


def norms(*names: str, size: int, bias: bool = False) -> Block:
    out: Named = []
    for n in names:
        out += L.norm(n, size, bias)
    return L.with_params(out)


def two_norms(cfg: ModelConfig) -> Block:
    return norms("input_layernorm", "post_attention_layernorm", size=cfg.hidden_size)


def dense_or_moe(cfg: ModelConfig, i: int, dense: Callable[[], Block], moe: Callable[[], Block]) -> tuple[Block, bool]:
    is_moe = cfg.is_moe_layer(i)
    return (moe() if is_moe else dense()), is_moe


def mlp_or_shared_moe(cfg: ModelConfig, i: int) -> tuple[Block, bool]:
    """DeepSeek-style FFN: a gated ``mlp`` on dense layers; routed ``mlp.experts``, the router's ``mlp.gate`` and
    ``mlp.shared_experts`` (shared_intermediate_size wide) on MoE layers."""
    h = cfg.hidden_size
    return dense_or_moe(
        cfg,
        i,
        lambda: L.gated_mlp("mlp", h, cfg.intermediate_size),
        lambda: (
            experts(cfg, "mlp.experts")
            + gate(cfg, "mlp.gate")
            + L.shared_mlp("mlp.shared_experts", h, cfg.shared_intermediate_size)
        ),
    )


def experts(cfg: ModelConfig, prefix: str, **kw: Any) -> Block:
    return L.routed_experts(
        prefix, cfg.n_routed_experts, cfg.hidden_size, cfg.expert_intermediate_size, cfg.num_experts_per_tok, **kw
    )


def gate(cfg: ModelConfig, name: str, bias: bool = False) -> Block:
    return L.router(name, cfg.n_routed_experts, cfg.hidden_size, bias)


# --- Llama family -------------------------------------------------------------------------------------------


def _read_llama(r: FieldReader, f: dict[str, Any]) -> None:
    f["attention_bias"] = r.flag("attention_bias", False)
    f["extra"]["mlp_bias"] = r.flag("mlp_bias", False)


def _llama_layer(cfg: ModelConfig, i: int) -> Layer:
    b = cfg.attention_bias
    blk = standard_attention(cfg, i, qkv_bias=b, o_bias=b)
    blk += L.gated_mlp("mlp", cfg.hidden_size, cfg.intermediate_size, cfg.extra.get("mlp_bias", False))
    return L.layer(i, blk + two_norms(cfg), False)


def _read_mistral(r: FieldReader, f: dict[str, Any]) -> None:
    sliding_everywhere(r, f, 4096)


def _mistral_layer(cfg: ModelConfig, i: int) -> Layer:
    blk = standard_attention(cfg, i) + L.gated_mlp("mlp", cfg.hidden_size, cfg.intermediate_size)
    return L.layer(i, blk + two_norms(cfg), False)


def _read_mixtral(r: FieldReader, f: dict[str, Any]) -> None:
    sliding_everywhere(r, f, None)


def _mixtral_layer(cfg: ModelConfig, i: int) -> Layer:
    if cfg.is_moe:
        mlp = gate(cfg, "mlp.gate") + experts(cfg, "mlp.experts")
    else:  # Primus' own Mixtral entries have no expert fields (a note says so)
        mlp = L.gated_mlp("mlp", cfg.hidden_size, cfg.intermediate_size)
    return L.layer(i, standard_attention(cfg, i) + mlp + two_norms(cfg), cfg.is_moe)


# --- Qwen family --------------------------------------------------------------------------------------------


def _qwen_sliding(r: FieldReader, f: dict[str, Any], rule: Callable[[int, int], bool]) -> None:
    """Qwen2/Qwen3 (and the MoE variants) slide only with ``use_sliding_window``; which layers, per ``rule``."""
    use = r.flag("use_sliding_window", False)
    size = window(r, "sliding_window", 4096)
    f["sliding_window"] = size if use else None
    max_window_layers = r.number("max_window_layers", 28, zero=True) or 0
    layer_kinds(r, f, lambda i: L.SLIDING if use and rule(i, max_window_layers) else L.FULL)


def _read_qwen2(r: FieldReader, f: dict[str, Any]) -> None:
    _qwen_sliding(r, f, lambda i, m: i >= m)


def _qwen2_layer(cfg: ModelConfig, i: int) -> Layer:
    blk = standard_attention(cfg, i, qkv_bias=True) + L.gated_mlp("mlp", cfg.hidden_size, cfg.intermediate_size)
    return L.layer(i, blk + two_norms(cfg), False)


def _read_qwen2_moe(r: FieldReader, f: dict[str, Any]) -> None:
    f["extra"]["qkv_bias"] = r.flag("qkv_bias", True)
    _qwen_sliding(r, f, lambda i, m: bool((i + 1) % 2) and i < m)


def _qwen2_moe_layer(cfg: ModelConfig, i: int) -> Layer:
    h = cfg.hidden_size

    def moe() -> Block:
        return (
            gate(cfg, "mlp.gate")
            + experts(cfg, "mlp.experts")
            + shared_gate_block(cfg, "mlp.shared_expert", "mlp.shared_expert_gate")
        )

    mlp, is_moe = dense_or_moe(cfg, i, lambda: L.gated_mlp("mlp", h, cfg.intermediate_size), moe)
    attn = standard_attention(cfg, i, qkv_bias=cfg.extra.get("qkv_bias", True))
    return L.layer(i, attn + mlp + two_norms(cfg), is_moe)


def shared_gate_block(cfg: ModelConfig, shared: str, gate_name: str) -> Block:
    """Qwen's shared expert and its sigmoid gate (a (1, hidden) linear, replicated like the router)."""
    h = cfg.hidden_size
    return L.shared_mlp(shared, h, cfg.shared_intermediate_size) + Block(
        weight(gate_name, 1, h), (Gemm("shared_gate", 1, h, L.REPLICATED, L.LOCAL),)
    )


def _read_qwen3(r: FieldReader, f: dict[str, Any]) -> None:
    f["attention_bias"] = r.flag("attention_bias", False)
    _qwen_sliding(r, f, lambda i, m: i >= m)


def _qwen3_layer(cfg: ModelConfig, i: int) -> Layer:
    b = cfg.attention_bias
    blk = standard_attention(cfg, i, qkv_bias=b, o_bias=b, qk_norm="head")
    blk += L.gated_mlp("mlp", cfg.hidden_size, cfg.intermediate_size)
    return L.layer(i, blk + two_norms(cfg), False)


def _read_qwen3_moe(r: FieldReader, f: dict[str, Any]) -> None:
    f["attention_bias"] = r.flag("attention_bias", False)
    use = r.flag("use_sliding_window", False)
    f["sliding_window"] = window(r, "sliding_window", 4096) if use else None
    layer_kinds(r, f, lambda i: L.SLIDING)


def _qwen3_moe_layer(cfg: ModelConfig, i: int) -> Layer:
    b = cfg.attention_bias
    mlp, is_moe = dense_or_moe(
        cfg,
        i,
        lambda: L.gated_mlp("mlp", cfg.hidden_size, cfg.intermediate_size),
        lambda: experts(cfg, "mlp.experts") + gate(cfg, "mlp.gate"),
    )
    attn = standard_attention(cfg, i, qkv_bias=b, o_bias=b, qk_norm="head")
    return L.layer(i, attn + mlp + two_norms(cfg), is_moe)


def _read_qwen3_next(r: FieldReader, f: dict[str, Any]) -> None:
    f["attention_bias"] = r.flag("attention_bias", False)
    x = f["extra"]
    for key, default in (
        ("linear_num_key_heads", 16),
        ("linear_num_value_heads", 32),
        ("linear_key_head_dim", 128),
        ("linear_value_head_dim", 128),
        ("linear_conv_kernel_dim", 4),
    ):
        x[key] = r.number(key, default)
    if x["linear_num_value_heads"] % x["linear_num_key_heads"]:
        raise UsageError(
            f"{x['linear_num_value_heads']} is not a multiple of linear_num_key_heads {x['linear_num_key_heads']}",
            source=r.where,
            field="linear_num_value_heads",
        )
    interval = r.number("full_attention_interval", 4) or 4
    layer_kinds(r, f, lambda i: L.LINEAR if (i + 1) % interval else L.FULL)


def _qwen3_next_layer(cfg: ModelConfig, i: int) -> Layer:
    b = cfg.attention_bias
    if kind_of(cfg, i) == L.LINEAR:
        mixer = gated_deltanet(cfg)
    else:
        mixer = standard_attention(cfg, i, qkv_bias=b, o_bias=b, qk_norm="head", q_factor=2)

    def moe() -> Block:
        return (
            gate(cfg, "mlp.gate")
            + experts(cfg, "mlp.experts")
            + shared_gate_block(cfg, "mlp.shared_expert", "mlp.shared_expert_gate")
        )

    mlp, is_moe = dense_or_moe(cfg, i, lambda: L.gated_mlp("mlp", cfg.hidden_size, cfg.intermediate_size), moe)
    return L.layer(i, mixer + mlp + two_norms(cfg), is_moe)


# --- state-space and linear-attention hybrids -------------------------------------------------------------------

# NemotronH's block types: layers_block_type names (and the legacy ones), hybrid_override_pattern characters
_NEMOTRON_H_BLOCKS = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*"}
_NEMOTRON_H_BLOCKS.update(mlp="-", moe="E")


def mamba2_mixer(cfg: ModelConfig, prefix: str = "mixer") -> Block:
    """Mamba-2's mixer as transformers' NemotronH registers it: dt_bias, A_log, D (the module's own parameters, so
    first), the depthwise conv1d over x, B and C, in_proj (z, x, B, C, Δ), the grouped gated RMSNorm and out_proj.
    The GEMMs are the gated DeltaNet's rows (``linear_in``, ``linear_out``); tensor parallel as Megatron-Core's
    MambaMixer: in_proj column-parallel over heads and groups, out_proj row-parallel (docs/models.md)."""
    x = cfg.extra
    heads, hd, n, groups, kernel = (
        x["mamba_num_heads"],
        x["mamba_head_dim"],
        x["ssm_state_size"],
        x["n_groups"],
        x["conv_kernel"],
    )
    h, inner, bias = cfg.hidden_size, heads * hd, x["use_bias"]
    conv_dim = inner + 2 * groups * n
    p = prefix
    params: Named = [(f"{p}.dt_bias", (heads,)), (f"{p}.A_log", (heads,)), (f"{p}.D", (heads,))]
    params += [(f"{p}.conv1d.weight", (conv_dim, 1, kernel))]
    params += [(f"{p}.conv1d.bias", (conv_dim,))] if x["use_conv_bias"] else []
    params += weight(f"{p}.in_proj", inner + conv_dim + heads, h, bias)
    params += L.norm(f"{p}.norm", inner) + weight(f"{p}.out_proj", h, inner, bias)
    gemms = (Gemm("linear_in", inner + conv_dim + heads, h, L.COLUMN), Gemm("linear_out", h, inner, L.ROW))
    units = (("mamba_num_heads", heads), ("n_groups", groups))
    return Block(params, gemms, (Attention(L.MAMBA2, heads, groups, n, hd, x["chunk_size"]),), units)


def _read_nemotron_h(r: FieldReader, f: dict[str, Any]) -> None:
    """NemotronH (Nemotron-H, Nemotron Nano 2, Nemotron 3): one block per layer, its kind from
    ``layers_block_type`` (else the legacy ``hybrid_override_pattern``; transformers' default is M, E, *, -), whose
    length is the layer count whatever ``num_hidden_layers`` says (as transformers)."""
    x = f["extra"]
    for key, alias, default in (
        ("ssm_state_size", (), 128),
        ("mamba_num_heads", (), 128),
        ("mamba_head_dim", (), 64),
        ("n_groups", ("mamba_n_groups",), 8),
        ("conv_kernel", ("mamba_d_conv",), 4),
        ("chunk_size", ("mamba_chunk_size",), 128),
    ):
        x[key] = r.number(key, default, alias=alias)
    x["use_conv_bias"] = r.flag("use_conv_bias", r.flag("mamba_conv_bias", True))
    x["use_bias"] = r.flag("use_bias", False)
    x["mlp_bias"] = r.flag("mlp_bias", False)
    if r.obj.get("moe_latent_size") is not None:
        raise UsageError(
            "NemotronH's latent MoE projections are not modelled by opbench", source=r.where, field="moe_latent_size"
        )
    if x["mamba_num_heads"] % x["n_groups"]:
        raise UsageError(
            f"mamba_num_heads {x['mamba_num_heads']} is not a multiple of n_groups {x['n_groups']}",
            source=r.where,
            field="n_groups",
        )
    names = r.strings("layers_block_type")
    key = "layers_block_type"
    if names is None and isinstance(r.obj.get("hybrid_override_pattern"), str):
        key, names = "hybrid_override_pattern", list(r.obj["hybrid_override_pattern"])
    if names is None:
        names = ["linear_attention", "moe", "full_attention", "mlp"]
    known = {**_NEMOTRON_H_BLOCKS, **{c: c for c in "M*-E"}}
    bad = sorted({t for t in names if t not in known})
    if bad or not names:
        raise UsageError(f"unknown block type(s) {bad} (known: {', '.join(known)})", source=r.where, field=key)
    x["block_types"] = "".join(known[t] for t in names)
    f["num_hidden_layers"] = len(names)
    if "E" in x["block_types"] and not f["n_routed_experts"]:
        raise UsageError("missing for the MoE (E) blocks", source=r.where, field="n_routed_experts")


def _nemotron_h_layer(cfg: ModelConfig, i: int) -> Layer:
    """One NemotronH block: its RMSNorm, then one mixer: Mamba-2 (M), attention without RoPE or biases (*), the
    squared-ReLU MLP (-), or the MoE (E: non-gated routed experts, sigmoid router, one shared squared-ReLU MLP)."""
    x, h = cfg.extra, cfg.hidden_size
    kind = x["block_types"][i % len(x["block_types"])]
    blk = L.with_params(L.norm("norm", h))
    if kind == "M":
        return L.layer(i, blk + mamba2_mixer(cfg), False)
    if kind == "*":
        return L.layer(i, blk + standard_attention(cfg, i, prefix="mixer"), False)
    if kind == "-":
        mlp = L.plain_mlp("mixer.up_proj", "mixer.down_proj", h, cfg.intermediate_size, x["mlp_bias"])
        return L.layer(i, blk + mlp, False)
    e, ffn, top_k = cfg.n_routed_experts, cfg.expert_intermediate_size, cfg.num_experts_per_tok
    shared = cfg.shared_expert_intermediate_size or ffn
    experts = Block(
        [("mixer.experts.up_proj", (e, ffn, h)), ("mixer.experts.down_proj", (e, h, ffn))],
        (
            Gemm("expert_gate_up", ffn, h, L.EXPERT_COLUMN, L.ROUTED, e, top_k),  # up only: no gate
            Gemm("expert_down", h, ffn, L.EXPERT_ROW, L.ROUTED, e, top_k),
        ),
    )
    shared_mlp = Block(
        weight("mixer.shared_experts.up_proj", shared, h, x["mlp_bias"])
        + weight("mixer.shared_experts.down_proj", h, shared, x["mlp_bias"]),
        (Gemm("shared_gate_up", shared, h, L.COLUMN), Gemm("shared_down", h, shared, L.ROW)),
        tp_units=(("shared expert intermediate size", shared),),
    )
    return L.layer(i, blk + experts + gate(cfg, "mixer.gate") + shared_mlp, True)


# --- DeepSeek / GLM / ERNIE ---------------------------------------------------------------------------------


def _read_deepseek(version: str) -> Callable[[FieldReader, dict[str, Any]], None]:
    def read(r: FieldReader, f: dict[str, Any]) -> None:
        f["attention_bias"] = r.flag("attention_bias", False)
        f["extra"]["mlp_bias"] = r.flag("mlp_bias", False) if version == "v2" else False
        if f.get("kv_lora_rank") is None:  # a Primus-style entry has no transformers defaults to fall back on
            raise UsageError(
                "missing: DeepSeek's attention is multi-head latent attention (give kv_lora_rank, "
                "qk_nope_head_dim, qk_rope_head_dim and v_head_dim)",
                source=r.where,
                field="kv_lora_rank",
            )
        if version == "v32":
            x = f["extra"]
            for key, default in (("index_topk", 2048), ("index_head_dim", 128), ("index_n_heads", 64)):
                x[key] = r.number(key, default)
            if f.get("q_lora_rank") is None:
                raise UsageError(
                    "missing: DeepSeek-V3.2's indexer reads the compressed query (transformers builds no "
                    "q_lora_rank-free variant)",
                    source=r.where,
                    field="q_lora_rank",
                )
            n = f.get("num_hidden_layers")
            mlp_types = per_layer_list(r, "mlp_layer_types", ("dense", "sparse"), n, "deepseek_v32")
            if mlp_types is not None:
                f["moe_layers"] = tuple(i for i, t in enumerate(mlp_types) if t == "sparse")
            layer_kinds(r, f, lambda i: L.SPARSE)

    return read


def _deepseek_layer(indexer: bool) -> Callable[[ModelConfig, int], Layer]:
    def build(cfg: ModelConfig, i: int) -> Layer:
        h = cfg.hidden_size
        mlp_bias = cfg.extra.get("mlp_bias", False)
        mlp, is_moe = dense_or_moe(
            cfg,
            i,
            lambda: L.gated_mlp("mlp", h, cfg.intermediate_size, mlp_bias),
            lambda: (
                experts(cfg, "mlp.experts")
                + gate(cfg, "mlp.gate")
                + L.shared_mlp("mlp.shared_experts", h, cfg.shared_intermediate_size, mlp_bias)
            ),
        )
        return L.layer(i, mla_attention(cfg, i, indexer=indexer) + mlp + two_norms(cfg), is_moe)

    return build


# --- DeepSeek-V4 ----------------------------------------------------------------------------------------------

# transformers' DeepSeek-V4 layer types and the compress rates its legacy ``compress_ratios`` list maps to them
_V4_LAYER_TYPES = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")
_V4_RATIOS = {0: L.SLIDING, 4: L.CSA, 128: L.HCA}
_V4_SCORING = ("sqrtsoftplus", "softmax", "sigmoid")
# Megatron-Core's DSv4HybridAttention asserts a tensor-parallel size of 1 (docs/models.md, "DeepSeek-V4")
_V4_NO_TP = "its shared KV heads (Megatron-Core runs DeepSeek-V4's attention at TP 1 only)"


def _read_deepseek_v4(r: FieldReader, f: dict[str, Any]) -> None:
    """DeepSeek-V4 (Flash, Pro): every layer a hyper-connected MoE layer whose attention is a 128-token sliding
    window alone, or with compressed sparse (CSA, rate 4, indexer top-k) or heavily compressed (HCA, rate 128)
    pooled keys; ``layer_types`` (else the legacy ``compress_ratios``, else transformers' rule: two HCA layers,
    then CSA and HCA alternating)."""
    x = f["extra"]
    for key, default in (
        ("o_groups", 8),
        ("o_lora_rank", 1024),
        ("index_n_heads", 64),
        ("index_head_dim", 128),
        ("index_topk", 512),
        ("hc_mult", 4),
        ("hc_sinkhorn_iters", 20),
    ):
        x[key] = r.number(key, default)
    # transformers builds the multi-token-prediction layers of the checkpoint nowhere (its MTP weights are skipped)
    x["num_nextn_predict_layers"] = r.number("num_nextn_predict_layers", 1, zero=True)
    f["sliding_window"] = window(r, "sliding_window", 128)
    if f["sliding_window"] is None:
        raise UsageError(
            "missing: every DeepSeek-V4 layer attends over its sliding window", source=r.where, field="sliding_window"
        )
    rates = r.obj.get("compress_rates") or {}
    if not isinstance(rates, dict):
        raise UsageError("must be an object of layer type -> rate", source=r.where, field="compress_rates")
    for name, kind, default in (
        ("compressed_sparse_attention", "csa", 4),
        ("heavily_compressed_attention", "hca", 128),
    ):
        value = rates.get(name, r.obj.get(f"compress_rate_{kind}", default))  # the legacy top-level field
        x[f"{kind}_compress"] = r._check_int("compress_rates", value, zero=False)
    x["scoring_func"] = r.obj.get("scoring_func", "sqrtsoftplus")
    if x["scoring_func"] not in _V4_SCORING:
        raise UsageError(
            f"must be one of {', '.join(_V4_SCORING)}, got {x['scoring_func']!r}", source=r.where, field="scoring_func"
        )
    if f.get("q_lora_rank") is None:
        raise UsageError("missing: DeepSeek-V4's query is low-rank", source=r.where, field="q_lora_rank")
    heads, groups = f.get("num_attention_heads"), x["o_groups"]
    if heads and groups and heads % groups:
        raise UsageError(
            f"{heads} attention heads do not split into {groups} output groups", source=r.where, field="o_groups"
        )
    f["num_key_value_heads"] = 1  # transformers' kv_proj is one head of head_dim whatever the config says
    if r.pick("moe_intermediate_size")[0] is None and f.get("intermediate_size") is not None:
        f["moe_intermediate_size"] = f["intermediate_size"]  # transformers' attribute_map: one field, two names
    f["intermediate_size"] = f.get("moe_intermediate_size")  # the shared expert's width (no dense MLP)
    # transformers builds one shared expert of the expert width whatever n_shared_experts says
    f["shared_expert_intermediate_size"], f["n_shared_experts"] = f["intermediate_size"], 1
    n = f.get("num_hidden_layers")
    ratios = r.indices("compress_ratios")
    if ratios is not None and r.strings("layer_types") is None:
        bad = sorted({v for v in ratios if v not in _V4_RATIOS})
        if bad:
            raise UsageError(f"{bad} are not among 0, 4, 128", source=r.where, field="compress_ratios")
        if n is not None and len(ratios) != n:
            raise UsageError(f"has {len(ratios)} entries for {n} layers", source=r.where, field="compress_ratios")
        layer_kinds(r, f, lambda i: _V4_RATIOS[ratios[i]])
    else:
        layer_kinds(r, f, lambda i: L.CSA if i >= 2 and i % 2 else L.HCA)
    mlp_types = per_layer_list(r, "mlp_layer_types", ("hash_moe", "moe"), n, "deepseek_v4")
    if mlp_types is None:  # the first num_hash_layers layers route by a frozen token -> expert table
        hashed = r.number("num_hash_layers", 3, zero=True) or 0
        mlp_types = ["hash_moe" if i < hashed else "moe" for i in range(n or 0)]
    x["hash_layers"] = tuple(i for i, t in enumerate(mlp_types) if t == "hash_moe")
    _every_layer_routes(f)


def _hyper_connection(name: str, streams: int, hidden: int, gemm: str) -> Block:
    """One mHC site: ``fn`` maps the n flattened streams to the pre (n), post (n) and Sinkhorn-projected comb (n×n)
    weights, replicated and run where the residual lives, on the rank's sequence-parallel tokens (Megatron-Core's
    HyperConnectionModule marks its weights sequence-parallel); its mixing is the ``hc`` operator."""
    width = (2 + streams) * streams
    params: Named = [(f"{name}.fn", (width, streams * hidden)), (f"{name}.base", (width,)), (f"{name}.scale", (3,))]
    return Block(params, (Gemm(gemm, width, streams * hidden, L.REPLICATED, L.LOCAL),))


def _deepseek_v4_attention(cfg: ModelConfig, i: int) -> Block:
    """Shared-KV multi-query attention with sinks (one KV head of ``head_dim``, read as both key and value), a
    low-rank query, the grouped low-rank output (``o_a_proj``: ``o_groups`` blocks, then ``o_b_proj``), and for CSA
    and HCA layers the compressor (kv and gate projections, softmax-pooled per window of m tokens), CSA's with its
    own lightning indexer. Every GEMM is replicated: Megatron-Core runs this attention at TP 1."""
    x, h, heads, d = cfg.extra, cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    q_rank, g, o_rank, win = cfg.q_lora_rank or 0, x["o_groups"], x["o_lora_rank"], cfg.sliding_window or 0
    p, rep = "self_attn", L.REPLICATED
    params: Named = [(f"{p}.sinks", (heads,))]
    params += weight(f"{p}.q_a_proj", q_rank, h) + L.norm(f"{p}.q_a_norm", q_rank)
    params += weight(f"{p}.q_b_proj", heads * d, q_rank)
    params += weight(f"{p}.kv_proj", d, h) + L.norm(f"{p}.kv_norm", d)
    params += weight(f"{p}.o_a_proj", g * o_rank, heads * d // g) + weight(f"{p}.o_b_proj", h, g * o_rank)
    gemms = [
        Gemm("v4_q_down", q_rank, h, rep),
        Gemm("v4_q_up", heads * d, q_rank, rep),
        Gemm("v4_kv", d, h, rep),
        Gemm("v4_out_a", o_rank, heads * d // g, rep, groups=g),
        Gemm("v4_out_b", h, g * o_rank, rep),
    ]
    kind = kind_of(cfg, i, L.SLIDING)
    ops: tuple[Attention, ...] = (Attention(L.SLIDING, heads, 1, d, d, win, sinks=True),)
    c = f"{p}.compressor"
    if kind == L.CSA:  # two overlapping series per token (2·head_dim), pooled over 2m slots with stride m
        m, ih, idim, topk = x["csa_compress"], x["index_n_heads"], x["index_head_dim"], x["index_topk"]
        params += [(f"{c}.position_bias", (m, 2 * d))] + weight(f"{c}.kv_proj", 2 * d, h)
        params += weight(f"{c}.gate_proj", 2 * d, h) + L.norm(f"{c}.kv_norm", d)
        ix = f"{c}.indexer"
        params += [(f"{ix}.position_bias", (m, 2 * idim))] + weight(f"{ix}.kv_proj", 2 * idim, h)
        params += weight(f"{ix}.gate_proj", 2 * idim, h) + L.norm(f"{ix}.kv_norm", idim)
        params += weight(f"{ix}.q_b_proj", ih * idim, q_rank) + weight(f"{ix}.scorer.weights_proj", ih, h)
        gemms += [
            Gemm("compress_kv", 4 * d, h, rep),  # kv_proj and gate_proj read the same input: one GEMM
            Gemm("index_compress_kv", 4 * idim, h, rep),
            Gemm("index_q", ih * idim, q_rank, rep),
            Gemm("index_weights", ih, h, rep),
        ]
        ops = (
            Attention(L.INDEXER, ih, 1, idim, 1, topk, compress=m),
            Attention(L.CSA, heads, 1, d, d, win, sinks=True, compress=m, topk=topk),
        )
    elif kind == L.HCA:  # one series, non-overlapping windows of m tokens
        m = x["hca_compress"]
        params += [(f"{c}.position_bias", (m, d))] + weight(f"{c}.kv_proj", d, h)
        params += weight(f"{c}.gate_proj", d, h) + L.norm(f"{c}.kv_norm", d)
        gemms.append(Gemm("compress_kv", 2 * d, h, rep))
        ops = (Attention(L.HCA, heads, 1, d, d, win, sinks=True, compress=m),)
    return Block(params, tuple(gemms), ops, ((_V4_NO_TP, 1),))


def _deepseek_v4_layer(cfg: ModelConfig, i: int) -> Layer:
    """Attention, then the MoE (router, routed experts, one shared expert of the expert width; hash-routed layers
    have the same weights), the two norms and the two hyper-connections (attention's, then the MoE's). The two
    ``hc`` operators come first in ``attention``, so the last operator is the layer's own kind; the last layer also
    runs the final stream collapse (``hc_head``, its weights the model's ``hc_head``)."""
    h, x, n = cfg.hidden_size, cfg.extra, cfg.extra["hc_mult"]
    ffn = cfg.expert_intermediate_size
    mlp = gate(cfg, "mlp.gate") + experts(cfg, "mlp.experts") + L.shared_mlp("mlp.shared_experts", h, ffn)
    blk = _deepseek_v4_attention(cfg, i) + mlp + two_norms(cfg)
    blk += _hyper_connection("attn_hc", n, h, "hc_attn") + _hyper_connection("ffn_hc", n, h, "hc_ffn")
    site = Attention(L.HC, n, n, h, h, x["hc_sinkhorn_iters"])
    blk = Block(blk.params, blk.gemms, (site, site, *blk.attention), blk.tp_units)
    if cfg.num_hidden_layers is not None and i == cfg.num_hidden_layers - 1:
        blk += Block(gemms=(Gemm("hc_head", n, n * h, L.REPLICATED, L.LOCAL),))
    return L.layer(i, blk, True)


def _deepseek_v4_final(cfg: ModelConfig) -> Named:
    n, h = cfg.extra["hc_mult"], cfg.hidden_size
    return L.norm("model.norm", h) + [
        ("model.hc_head.hc_fn", (n, n * h)),
        ("model.hc_head.hc_base", (n,)),
        ("model.hc_head.hc_scale", (1,)),
    ]


def _read_glm4_moe(r: FieldReader, f: dict[str, Any]) -> None:
    f["attention_bias"] = r.flag("attention_bias", False)
    f["extra"]["use_qk_norm"] = r.flag("use_qk_norm", False)


def _glm4_moe_layer(cfg: ModelConfig, i: int) -> Layer:
    attn = standard_attention(
        cfg, i, qkv_bias=cfg.attention_bias, qk_norm="head" if cfg.extra.get("use_qk_norm") else None
    )
    mlp, is_moe = mlp_or_shared_moe(cfg, i)
    return L.layer(i, attn + mlp + two_norms(cfg), is_moe)


def _read_ernie(r: FieldReader, f: dict[str, Any]) -> None:
    x = f["extra"]
    x["use_bias"] = r.flag("use_bias", False)
    n = f.get("num_hidden_layers")
    start = r.number("moe_layer_start_index", 1, zero=True) or 0
    end = r.signed("moe_layer_end_index", -1)
    interval = r.number("moe_layer_interval", 1) or 1
    if end == -1 and n is not None:
        end = n - 1
    if n is not None and f.get("n_routed_experts"):
        f["moe_layers"] = tuple(i for i in range(n) if (i + 1) % interval == 0 and start <= i <= end)


def _ernie_layer(cfg: ModelConfig, i: int) -> Layer:
    h, b = cfg.hidden_size, cfg.extra.get("use_bias", False)
    attn = standard_attention(cfg, i, qkv_bias=b, o_bias=b)

    def moe() -> Block:
        blk = gate(cfg, "mlp.gate") + L.with_params(
            [("mlp.gate.moe_statics.e_score_correction_bias", (1, cfg.n_routed_experts))]
        )
        blk += experts(cfg, "mlp.experts")
        if cfg.n_shared_experts:
            blk += L.shared_mlp("mlp.shared_experts", h, cfg.shared_intermediate_size, b)
        return blk

    mlp, is_moe = dense_or_moe(cfg, i, lambda: L.gated_mlp("mlp", h, cfg.intermediate_size, b), moe)
    return L.layer(i, attn + mlp + two_norms(cfg), is_moe)


# --- gpt-oss, Llama 4, Gemma 3, OLMo 2, Phi-3 ------------------------------------------------------------------


def _read_gpt_oss(r: FieldReader, f: dict[str, Any]) -> None:
    f["attention_bias"] = r.flag("attention_bias", True)
    # every gpt-oss layer routes to experts: a config.json without the counts takes transformers' defaults
    if r.pick("n_routed_experts")[0] is None:
        if not r.hf:
            raise UsageError("missing: every gpt_oss layer routes to experts", source=r.where, field="n_routed_experts")
        f["n_routed_experts"] = 128
    if r.pick("num_experts_per_tok")[0] is None and r.hf:
        f["num_experts_per_tok"] = 4
    f["sliding_window"] = window(r, "sliding_window", 128)
    layer_kinds(r, f, lambda i: L.SLIDING if (i + 1) % 2 else L.FULL)
    # its experts' GLU clamps gate and up at ±swiglu_limit (transformers' GptOssExperts: 7.0) and add biases; its
    # RoPE is YaRN of factor 32 where the config leaves them out (GptOssConfig's defaults)
    f["extra"]["glu_clamp"] = True
    f["extra"]["expert_bias"] = True
    if not f["extra"]["rope_type"] and r.hf:
        f["extra"]["rope_type"], f["extra"]["rope_factor"] = "yarn", 32.0


def _gpt_oss_layer(cfg: ModelConfig, i: int) -> Layer:
    b = cfg.attention_bias
    attn = standard_attention(cfg, i, qkv_bias=b, o_bias=b, sinks=True)
    mlp = gate(cfg, "mlp.router", bias=True) + experts(cfg, "mlp.experts", transposed=True, bias=True)
    return L.layer(i, attn + mlp + two_norms(cfg), True)


def _read_llama4(r: FieldReader, f: dict[str, Any]) -> None:
    f["attention_bias"] = r.flag("attention_bias", False)
    n = f.get("num_hidden_layers")
    # Llama 4's intermediate_size is the experts' (and the shared expert's) width; dense layers use
    # intermediate_size_mlp. opbench's intermediate_size is the dense MLP's.
    expert_ffn = f.get("intermediate_size")
    if expert_ffn is None:
        raise UsageError("missing (Llama 4's experts' width)", source=r.where, field="intermediate_size")
    f["moe_intermediate_size"] = expert_ffn
    f["shared_expert_intermediate_size"] = expert_ffn
    f["intermediate_size"] = r.number("intermediate_size_mlp", 16384)
    moe_layers = r.indices("moe_layers")
    step = r.number("interleave_moe_layer_step", 1) or 1
    if moe_layers is None and n is not None:
        moe_layers = tuple(range(step - 1, n, step))
    f["moe_layers"] = moe_layers
    f["attention_chunk_size"] = window(r, "attention_chunk_size", 8192)
    rope = r.indices("no_rope_layers")  # 1 = the layer uses RoPE (and chunked attention), 0 = NoPE, global
    interval = r.number("no_rope_layer_interval", 4) or 4

    def rule(i: int) -> str:
        uses_rope = rope[i] if rope and i < len(rope) else int((i + 1) % interval != 0)
        return L.CHUNKED if uses_rope else L.FULL

    layer_kinds(r, f, rule)


def _llama4_layer(cfg: ModelConfig, i: int) -> Layer:
    h, b = cfg.hidden_size, cfg.attention_bias
    attn = standard_attention(cfg, i, qkv_bias=b, o_bias=b)  # its q/k norm is an L2 norm without weights

    def moe() -> Block:
        return (
            experts(cfg, "feed_forward.experts", transposed=True)
            + gate(cfg, "feed_forward.router")
            + L.shared_mlp("feed_forward.shared_expert", h, cfg.shared_intermediate_size)
        )

    mlp, is_moe = dense_or_moe(cfg, i, lambda: L.gated_mlp("feed_forward", h, cfg.intermediate_size), moe)
    return L.layer(i, attn + mlp + two_norms(cfg), is_moe)


def _read_gemma3(r: FieldReader, f: dict[str, Any]) -> None:
    if r.flag("use_bidirectional_attention", False):
        raise UsageError(
            "true: a bidirectional (encoder) Gemma 3 is not a causal language model",
            source=r.where,
            field="use_bidirectional_attention",
        )
    f["attention_bias"] = r.flag("attention_bias", False)
    f["sliding_window"] = window(r, "sliding_window", 4096)
    pattern = r.number("sliding_window_pattern", alias=("_sliding_window_pattern",)) or 6
    layer_kinds(r, f, lambda i: L.SLIDING if (i + 1) % pattern else L.FULL)


def _gemma3_layer(cfg: ModelConfig, i: int) -> Layer:
    b = cfg.attention_bias
    blk = standard_attention(cfg, i, qkv_bias=b, o_bias=b, qk_norm="head")
    blk += L.gated_mlp("mlp", cfg.hidden_size, cfg.intermediate_size)
    blk += norms(
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
        size=cfg.hidden_size,
    )
    return L.layer(i, blk, False)


def _read_bias_flag(r: FieldReader, f: dict[str, Any]) -> None:
    f["attention_bias"] = r.flag("attention_bias", False)


def _olmo2_layer(cfg: ModelConfig, i: int) -> Layer:
    b = cfg.attention_bias
    blk = standard_attention(cfg, i, qkv_bias=b, o_bias=b, qk_norm="full")
    blk += L.gated_mlp("mlp", cfg.hidden_size, cfg.intermediate_size)
    blk += norms("post_attention_layernorm", "post_feedforward_layernorm", size=cfg.hidden_size)
    return L.layer(i, blk, False)


def _read_phi3(r: FieldReader, f: dict[str, Any]) -> None:
    sliding_everywhere(r, f, None)


def _phi3_layer(cfg: ModelConfig, i: int) -> Layer:
    attn = fused_attention(
        cfg, i, "self_attn.qkv_proj", "self_attn.o_proj", cfg.num_key_value_heads, False, out_first=True
    )
    blk = attn + L.gated_mlp("mlp", cfg.hidden_size, cfg.intermediate_size, fused=True)
    return L.layer(i, blk + two_norms(cfg), False)


# --- GPT-2, GPT-NeoX, Falcon, StarCoder2: LayerNorm with biases, two-matrix GELU MLPs -------------------------


def _read_gpt2(r: FieldReader, f: dict[str, Any]) -> None:
    if r.flag("add_cross_attention", False):
        raise UsageError(
            "true: GPT-2 with cross-attention is an encoder-decoder part, not a causal language model",
            source=r.where,
            field="add_cross_attention",
        )
    h = f.get("hidden_size")
    if f.get("intermediate_size") is None and h is not None:
        f["intermediate_size"] = 4 * h  # n_inner: None means 4·n_embd
    if f.get("from_hf"):  # transformers' GPT-2 reads neither: every head has its own k and v, of n_embd / n_head
        f["num_key_value_heads"] = f["head_dim"] = None
    f["extra"]["n_positions"] = r.number("n_positions", 1024, alias=("max_position_embeddings",))


def _gpt2_layer(cfg: ModelConfig, i: int) -> Layer:
    h = cfg.hidden_size
    blk = norms("ln_1", size=h, bias=True)
    blk += fused_attention(cfg, i, "attn.c_attn", "attn.c_proj", cfg.num_attention_heads, True, transposed=True)
    blk += norms("ln_2", size=h, bias=True)
    blk += L.plain_mlp("mlp.c_fc", "mlp.c_proj", h, cfg.intermediate_size, True, transposed=True)
    return L.layer(i, blk, False)


def _read_gpt_neox(r: FieldReader, f: dict[str, Any]) -> None:
    f["attention_bias"] = r.flag("attention_bias", True)
    h, heads = f.get("hidden_size"), f.get("num_attention_heads")
    if h and heads:
        f["head_dim"] = h // heads  # its query_key_value is 3·hidden whatever head_dim says


def _gpt_neox_layer(cfg: ModelConfig, i: int) -> Layer:
    h, b = cfg.hidden_size, cfg.attention_bias
    blk = norms("input_layernorm", "post_attention_layernorm", size=h, bias=True)
    blk += fused_attention(cfg, i, "attention.query_key_value", "attention.dense", cfg.num_attention_heads, b)
    blk += L.plain_mlp("mlp.dense_h_to_4h", "mlp.dense_4h_to_h", h, cfg.intermediate_size, True)
    return L.layer(i, blk, False)


def _read_falcon(r: FieldReader, f: dict[str, Any]) -> None:
    x = f["extra"]
    x["bias"] = r.flag("bias", False)
    x["new_decoder_architecture"] = new = r.flag("new_decoder_architecture", False)
    x["multi_query"] = mq = r.flag("multi_query", True)
    x["parallel_attn"] = r.flag("parallel_attn", True)
    x["alibi"] = r.flag("alibi", False)
    ln = r.number("num_ln_in_parallel_attn", None)
    x["num_ln_in_parallel_attn"] = 2 if ln is None and new else ln
    h, heads = f.get("hidden_size"), f.get("num_attention_heads")
    if h is not None and f.get("intermediate_size") is None:
        f["intermediate_size"] = 4 * h  # ffn_hidden_size: None means 4·hidden
    if h and heads:
        f["head_dim"] = h // heads  # Falcon's attention ignores head_dim
    # KV heads: num_kv_heads for the new (40B/180B) layout, one for multi-query, else every head
    if not new:
        f["num_key_value_heads"] = 1 if mq else heads


def _falcon_layer(cfg: ModelConfig, i: int) -> Layer:
    x, h = cfg.extra, cfg.hidden_size
    kv, hd, heads = cfg.num_key_value_heads, cfg.head_dim, cfg.num_attention_heads
    if x["new_decoder_architecture"]:
        qkv_out = (2 * kv + heads) * hd
    elif x["multi_query"]:
        qkv_out = h + 2 * hd
    else:
        qkv_out = 3 * h
    blk = fused_attention(
        cfg, i, "self_attention.query_key_value", "self_attention.dense", kv, x["bias"], qkv_out=qkv_out
    )
    blk += L.plain_mlp("mlp.dense_h_to_4h", "mlp.dense_4h_to_h", h, cfg.intermediate_size, x["bias"])
    if not x["parallel_attn"]:
        blk += norms("post_attention_layernorm", "input_layernorm", size=h, bias=True)
    elif x["num_ln_in_parallel_attn"] == 2:
        blk += norms("ln_attn", "ln_mlp", size=h, bias=True)
    else:
        blk += norms("input_layernorm", size=h, bias=True)
    return L.layer(i, blk, False)


def _read_starcoder2(r: FieldReader, f: dict[str, Any]) -> None:
    f["extra"]["use_bias"] = r.flag("use_bias", True)
    sliding_everywhere(r, f, None)


def _starcoder2_layer(cfg: ModelConfig, i: int) -> Layer:
    h, b = cfg.hidden_size, cfg.extra.get("use_bias", True)
    blk = standard_attention(cfg, i, qkv_bias=b, o_bias=b)
    blk += L.plain_mlp("mlp.c_fc", "mlp.c_proj", h, cfg.intermediate_size, b)
    blk += norms("input_layernorm", "post_attention_layernorm", size=h, bias=True)
    return L.layer(i, blk, False)


def _nemotron_layer(cfg: ModelConfig, i: int) -> Layer:
    """Nemotron-4 / Minitron: squared-ReLU MLP of two matrices (``up_proj``, ``down_proj``), LayerNorm1p with
    biases (shifted weight: same parameters as a LayerNorm)."""
    h, b = cfg.hidden_size, cfg.attention_bias
    blk = standard_attention(cfg, i, qkv_bias=b, o_bias=b)
    blk += L.plain_mlp("mlp.up_proj", "mlp.down_proj", h, cfg.intermediate_size, cfg.extra.get("mlp_bias", False))
    blk += norms("input_layernorm", "post_attention_layernorm", size=h, bias=True)
    return L.layer(i, blk, False)


# --- 2025-26 releases -------------------------------------------------------------------------------------


def _read_olmo3(r: FieldReader, f: dict[str, Any]) -> None:
    """OLMo 3: OLMo 2's layer; every fourth layer full, the others sliding (``sliding_window``, 4096)."""
    f["attention_bias"] = r.flag("attention_bias", False)
    f["sliding_window"] = _window_or_null(r, "sliding_window", 4096)
    layer_kinds(r, f, lambda i: L.SLIDING if (i + 1) % 4 else L.FULL)


def _window_or_null(r: FieldReader, key: str, hf_default: int | None) -> int | None:
    """``window``, except that an explicit ``null`` means no window (transformers keeps a None it is given)."""
    return None if r.given(key) and r.pick(key)[0] is None else window(r, key, hf_default)


def _read_smollm3(r: FieldReader, f: dict[str, Any]) -> None:
    """SmolLM3: Llama's layer; ``no_rope_layers`` (1 = RoPE, default every fourth layer 0 = NoPE) changes no
    shape, and only NoPE layers slide, with ``use_sliding_window`` and a ``sliding_window`` (transformers: None)."""
    _read_llama(r, f)
    use = r.flag("use_sliding_window", False)
    f["sliding_window"] = window(r, "sliding_window", None) if use else None
    rope = r.indices("no_rope_layers")
    interval = r.number("no_rope_layer_interval", 4) or 4

    def rule(i: int) -> str:
        uses_rope = rope[i] if rope and i < len(rope) else int((i + 1) % interval != 0)
        return L.FULL if uses_rope else L.SLIDING

    layer_kinds(r, f, rule)


def _read_minimax_m2(r: FieldReader, f: dict[str, Any]) -> None:
    """MiniMax-M2: every layer routes (sigmoid router with a correction-bias buffer, not a parameter); the
    experts' width is ``intermediate_size`` (there is no dense MLP); partial RoPE (``rotary_dim``) changes no shape."""
    f["moe_intermediate_size"] = f.get("intermediate_size")
    if r.pick("n_routed_experts")[0] is None and not r.hf:
        raise UsageError("missing: every minimax_m2 layer routes to experts", source=r.where, field="n_routed_experts")


def _minimax_m2_layer(cfg: ModelConfig, i: int) -> Layer:
    attn = standard_attention(cfg, i, qk_norm="full")  # q/k RMSNorm over all heads at once, as OLMo 2
    mlp = gate(cfg, "mlp.gate") + experts(cfg, "mlp.experts")
    return L.layer(i, attn + mlp + two_norms(cfg), True)


def _dense_then_sparse(r: FieldReader, f: dict[str, Any], owner: str) -> None:
    """``mlp_layer_types`` (``dense``/``sparse`` per layer) where the config gives it, else transformers' default:
    the first layer dense, every other one routed."""
    mlp_types = per_layer_list(r, "mlp_layer_types", ("dense", "sparse"), f.get("num_hidden_layers"), owner)
    if mlp_types is not None:
        f["moe_layers"] = tuple(i for i, t in enumerate(mlp_types) if t == "sparse")
    else:
        f["moe_layers"], f["first_k_dense_replace"], f["moe_layer_freq"] = None, 1, 1
        f["decoder_sparse_step"], f["mlp_only_layers"] = 1, ()


def _read_mimo_v2_flash(r: FieldReader, f: dict[str, Any]) -> None:
    """MiMo-V2-Flash: the first layer and every sixth full, the others sliding (``sliding_window`` 129 = 128
    earlier keys and the query's own; ``sliding_window_size`` is that minus one). A sliding layer has twice the
    KV heads and sinks whether or not it has a window (``extra['swa_layers']``)."""
    f["attention_bias"] = r.flag("attention_bias", False)
    if f.get("v_head_dim") is None:
        raise UsageError("missing: MiMo-V2-Flash's values have their own head_dim", source=r.where, field="v_head_dim")
    size = r.number("sliding_window_size", zero=True)
    f["sliding_window"] = size + 1 if size is not None else _window_or_null(r, "sliding_window", 129)
    n = f.get("num_hidden_layers")
    given = r.strings("layer_types")
    if given is not None:
        swa = tuple(i for i, t in enumerate(given) if t == "sliding_attention")
    else:
        swa = tuple(i for i in range(n or 0) if i and (i + 1) % 6)
    f["extra"]["swa_layers"] = swa
    layer_kinds(r, f, lambda i: L.SLIDING if i and (i + 1) % 6 else L.FULL)
    _dense_then_sparse(r, f, "mimo_v2_flash")


def _mimo_v2_flash_layer(cfg: ModelConfig, i: int) -> Layer:
    h, heads, d_qk, d_v = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.v_head_dim or 0
    b = cfg.attention_bias
    swa = i in cfg.extra.get("swa_layers", ()) if cfg.num_hidden_layers is not None else bool(i and (i + 1) % 6)
    kv = cfg.num_key_value_heads * (2 if swa else 1)
    params: Named = [("self_attn.sinks", (heads,))] if swa else []
    params += (
        weight("self_attn.q_proj", heads * d_qk, h, b)
        + weight("self_attn.k_proj", kv * d_qk, h, b)
        + weight("self_attn.v_proj", kv * d_v, h, b)
        + weight("self_attn.o_proj", h, heads * d_v)  # never a bias
    )
    attn = Block(
        params,
        (Gemm("qkv", heads * d_qk + kv * (d_qk + d_v), h, L.COLUMN), Gemm("attn_out", h, heads * d_v, L.ROW)),
        (softmax_attention(cfg, i, heads, kv, d_qk, d_v, sinks=swa),),
        L.head_units(heads, kv),
    )
    mlp, is_moe = dense_or_moe(
        cfg,
        i,
        lambda: L.gated_mlp("mlp", h, cfg.intermediate_size),
        lambda: experts(cfg, "mlp.experts") + gate(cfg, "mlp.gate"),  # sigmoid router; correction bias a buffer
    )
    return L.layer(i, attn + mlp + two_norms(cfg), is_moe)


def _read_glm_moe_dsa(r: FieldReader, f: dict[str, Any]) -> None:
    """GLM-5: DeepSeek-V3.2's layer (32 indexer heads by default); ``indexer_types`` (else ``index_topk_pattern``
    of F/S, else ``index_topk_freq`` / ``index_skip_topk_offset``) says which layers run their own indexer
    (``full``) and which reuse the previous one's top-k (``shared``: no indexer parameters, no indexer operator)."""
    _read_deepseek("v32")(r, f)
    f["extra"]["index_n_heads"] = r.number("index_n_heads", 32)
    n = f.get("num_hidden_layers")
    types = per_layer_list(r, "indexer_types", ("full", "shared"), n, "glm_moe_dsa")
    pattern = r.obj.get("index_topk_pattern")
    if types is None and isinstance(pattern, str) and set(pattern) <= {"F", "S"}:
        types = ["full" if c == "F" else "shared" for c in pattern]
    elif types is None and pattern is not None:
        types = per_layer_list(r, "index_topk_pattern", ("full", "shared"), n, "glm_moe_dsa")
    if types is None and n is not None:
        freq = max(r.number("index_topk_freq", 1) or 1, 1)
        offset = r.number("index_skip_topk_offset", 2, zero=True) or 0
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if types is not None and n is not None and len(types) != n:
        raise UsageError(f"has {len(types)} entries for {n} layers", source=r.where, field="index_topk_pattern")
    f["extra"]["shared_index_layers"] = tuple(i for i, t in enumerate(types or ()) if t == "shared")


def _glm_moe_dsa_layer(cfg: ModelConfig, i: int) -> Layer:
    if i in cfg.extra.get("shared_index_layers", ()):  # reuses the previous indexer's top-k
        plain = mla_attention(cfg, i)
        nope, rope, v = cfg.qk_nope_head_dim or 0, cfg.qk_rope_head_dim or 0, cfg.v_head_dim or 0
        heads, topk = cfg.num_attention_heads, cfg.extra["index_topk"]
        sparse = Attention(L.SPARSE, heads, heads, nope + rope, v, topk)
        attn = Block(plain.params, plain.gemms, (sparse,), plain.tp_units)
    else:
        attn = mla_attention(cfg, i, indexer=True)
    mlp, is_moe = mlp_or_shared_moe(cfg, i)  # never biased (mlp_bias is not read)
    return L.layer(i, attn + mlp + two_norms(cfg), is_moe)


def _every_layer_routes(f: dict[str, Any]) -> None:
    """Architectures whose every decoder layer is MoE whatever a config's DeepSeek/Qwen layer fields say."""
    f["moe_layers"], f["first_k_dense_replace"], f["moe_layer_freq"] = None, 0, 1
    f["decoder_sparse_step"], f["mlp_only_layers"] = 1, ()


def _qwen3_5_deltanet(cfg: ModelConfig) -> Block:
    """Qwen3.5's gated DeltaNet: Qwen3-Next's operator and GEMMs, with the input projection split four ways
    (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``) and registered after the norm and out_proj."""
    x, h, p = cfg.extra, cfg.hidden_size, "linear_attn"
    kh, vh, dk, dv = (
        x["linear_num_key_heads"],
        x["linear_num_value_heads"],
        x["linear_key_head_dim"],
        x["linear_value_head_dim"],
    )
    qkv = 2 * kh * dk + vh * dv
    params: Named = [(f"{p}.dt_bias", (vh,)), (f"{p}.A_log", (vh,))]
    params += [(f"{p}.conv1d.weight", (qkv, 1, x["linear_conv_kernel_dim"]))]
    params += L.norm(f"{p}.norm", dv) + weight(f"{p}.out_proj", h, vh * dv)
    params += weight(f"{p}.in_proj_qkv", qkv, h) + weight(f"{p}.in_proj_z", vh * dv, h)
    params += weight(f"{p}.in_proj_b", vh, h) + weight(f"{p}.in_proj_a", vh, h)
    same = gated_deltanet(cfg, p)  # linear_in: the four projections fused, as Megatron fuses them
    return Block(params, same.gemms, same.attention, same.tp_units)


def _read_qwen3_5_moe(r: FieldReader, f: dict[str, Any]) -> None:
    _read_qwen3_next(r, f)
    _every_layer_routes(f)
    if f.get("intermediate_size") is None:  # no dense MLP: the width opbench requires is the experts'
        f["intermediate_size"] = f.get("moe_intermediate_size")


def _qwen3_5_layer(cfg: ModelConfig, i: int) -> Layer:
    """Qwen3.5 (dense and MoE): Qwen3-Next's layer pattern; the MoE variant routes in every layer."""
    b = cfg.attention_bias
    if kind_of(cfg, i) == L.LINEAR:
        mixer = _qwen3_5_deltanet(cfg)
    else:
        mixer = standard_attention(cfg, i, qkv_bias=b, o_bias=b, qk_norm="head", q_factor=2)
    if cfg.is_moe:
        mlp = (
            gate(cfg, "mlp.gate")
            + experts(cfg, "mlp.experts")
            + shared_gate_block(cfg, "mlp.shared_expert", "mlp.shared_expert_gate")
        )
    else:
        mlp = L.gated_mlp("mlp", cfg.hidden_size, cfg.intermediate_size)
    return L.layer(i, mixer + mlp + two_norms(cfg), cfg.is_moe)


def _read_longcat_flash(r: FieldReader, f: dict[str, Any]) -> None:
    """LongCat-Flash: ``num_layers`` decoder layers of two MLA sublayers each (transformers' num_hidden_layers is
    twice it); ``moe_topk`` of ``n_routed_experts`` real and ``zero_expert_num`` zero-computation experts."""
    x = f["extra"]
    layers = r.number("num_layers")
    if layers is None and f.get("num_hidden_layers") is not None:
        layers = f["num_hidden_layers"] // 2  # transformers' num_hidden_layers setter: num_layers = value // 2
    f["num_hidden_layers"] = layers
    f["attention_bias"] = r.flag("attention_bias", False)
    x["router_bias"] = r.flag("router_bias", False)
    if r.pick("num_experts_per_tok")[0] is None:
        f["num_experts_per_tok"] = r.number("moe_topk", r.hf_default(12)) or 0
    if r.pick("moe_intermediate_size")[0] is None:
        f["moe_intermediate_size"] = r.number("expert_ffn_hidden_size", r.hf_default(2048))
    x["zero_expert_num"] = zero = r.number("zero_expert_num", r.hf_default(256), zero=True) or 0
    if f.get("kv_lora_rank") is None:
        raise UsageError("missing: LongCat-Flash's attention is MLA", source=r.where, field="kv_lora_rank")
    experts, top_k = f.get("n_routed_experts") or 0, f.get("num_experts_per_tok") or 0
    if experts and (top_k * experts) % (experts + zero):
        raise UsageError(
            f"top-k {top_k} over {experts} experts and {zero} zero-computation experts routes a fractional "
            f"{top_k * experts / (experts + zero):g} real experts per token under balanced routing; opbench's GEMM "
            "rows need a whole number",
            source=r.where,
            field="zero_expert_num",
        )
    x["real_top_k"] = top_k * experts // (experts + zero) if experts else 0
    _every_layer_routes(f)


def _longcat_flash_layer(cfg: ModelConfig, i: int) -> Layer:
    """The shortcut MoE (routed from the first sublayer's output, added after the second), then two MLA
    sublayers, two dense MLPs and their norms. Tokens routed to a zero-computation expert cost only the routing:
    the expert GEMMs carry the real experts' share of T·top_k, top_k·E/(E+Z) per token (``real_top_k``)."""
    h, x = cfg.hidden_size, cfg.extra
    e, z, ffn = cfg.n_routed_experts, x["zero_expert_num"], cfg.expert_intermediate_size
    # transformers allocates gate_up_proj for the zero experts too (unused), down_proj for the real ones only
    params: Named = [("mlp.experts.gate_up_proj", (e + z, 2 * ffn, h)), ("mlp.experts.down_proj", (e, h, ffn))]
    real = L.routed_experts("mlp.experts", e, h, ffn, x["real_top_k"])
    moe = Block(params, real.gemms) + L.router("mlp.router.classifier", e + z, h, x["router_bias"])
    blk = moe + mla_attention(cfg, i, "self_attn.0") + mla_attention(cfg, i, "self_attn.1")
    blk += L.gated_mlp("mlps.0", h, cfg.intermediate_size) + L.gated_mlp("mlps.1", h, cfg.intermediate_size)
    blk += norms("input_layernorm.0", "input_layernorm.1", "post_attention_layernorm.0", size=h)
    blk += norms("post_attention_layernorm.1", size=h)
    return L.layer(i, blk, True)


# --- Kimi Linear (KDA + MLA), Gemma 4 -----------------------------------------------------------------------


def _read_kimi_linear(r: FieldReader, f: dict[str, Any]) -> None:
    """Kimi Linear: KDA layers (transformers' ``linear_attention``) beside MLA layers without RoPE
    (``full_attention``); the linear heads, head dim and conv kernel from ``linear_attn_config`` (the checkpoint's
    spelling, which wins, as in transformers) or the top-level ``linear_*`` fields; its config.json names the expert
    fields ``num_experts``, ``num_experts_per_token``, ``num_shared_experts``. Layers are dense before
    ``first_k_dense_replace`` (transformers: 1) unless ``mlp_layer_types`` says which."""
    f["attention_bias"] = r.flag("attention_bias", False)
    x, sub = f["extra"], r.obj.get("linear_attn_config")
    if sub is not None and not isinstance(sub, Mapping):
        raise UsageError("must be an object", source=r.where, field="linear_attn_config")
    sub = sub or {}
    for key, inner, default in (
        ("linear_num_heads", "num_heads", 32),
        ("linear_head_dim", "head_dim", 128),
        ("linear_conv_kernel_dim", "short_conv_kernel_size", 4),
    ):
        value = sub.get(inner)
        x[key] = r.number(key, default) if value is None else type(r)(sub, r.where, r.hf).number(inner)
    if r.pick("num_experts_per_tok")[0] is None and r.obj.get("num_experts_per_token") is not None:
        f["num_experts_per_tok"] = r.number("num_experts_per_token")
    if r.pick("n_shared_experts")[0] is None and r.obj.get("num_shared_experts") is not None:
        f["n_shared_experts"] = r.number("num_shared_experts", zero=True)
    if f.get("kv_lora_rank") is None:
        raise UsageError("missing: Kimi Linear's full-attention layers are MLA", source=r.where, field="kv_lora_rank")
    n = f.get("num_hidden_layers")
    mlp_types = per_layer_list(r, "mlp_layer_types", ("dense", "sparse"), n, "kimi_linear")
    f["moe_layers"] = None if mlp_types is None else tuple(i for i, t in enumerate(mlp_types) if t == "sparse")
    f["first_k_dense_replace"] = r.number("first_k_dense_replace", 1 if r.hf else 0, zero=True) or 0
    f["moe_layer_freq"], f["decoder_sparse_step"], f["mlp_only_layers"] = 1, 1, ()
    full = sub.get("full_attn_layers")
    if r.strings("layer_types") is None and isinstance(full, list) and "kda_layers" in sub and n is not None:
        full_set = {i - 1 for i in full if isinstance(i, int)}  # 1-indexed; transformers reads the pair only
        layer_kinds(r, f, lambda i: L.FULL if i in full_set else L.KDA)
    else:
        layer_kinds(r, f, lambda i: L.FULL if i and i % 4 == 0 else L.KDA)
    if "layer_types" in f:  # transformers' "linear_attention" is KDA here, not the gated DeltaNet
        f["layer_types"] = tuple(L.KDA if k == L.LINEAR else k for k in f["layer_types"])


def kda_mixer(cfg: ModelConfig, prefix: str = "self_attn") -> Block:
    """Kimi Delta Attention as transformers registers it: q, k, v, the short conv over them, the forget gate (its
    own dt_bias and A_log, then its low-rank f_a/f_b projections), β (``b_proj``), the output gate's low-rank
    g_a/g_b, the gated RMSNorm and o_proj. No Megatron implementation exists; opbench splits it as Megatron splits
    the gated DeltaNet (docs/models.md, "Kimi Linear"): q, k, v, β fused column-parallel over heads (``linear_in``),
    the two rank-d down projections fused and replicated (``kda_gate_down``, as MLA's), their up projections
    column-parallel (``kda_forget_up``, ``kda_gate_up``), o_proj row-parallel (``linear_out``)."""
    x, h, p = cfg.extra, cfg.hidden_size, prefix
    heads, d, kernel = x["linear_num_heads"], x["linear_head_dim"], x["linear_conv_kernel_dim"]
    inner = heads * d
    params = weight(f"{p}.q_proj", inner, h) + weight(f"{p}.k_proj", inner, h) + weight(f"{p}.v_proj", inner, h)
    params += [(f"{p}.conv1d.weight", (3 * inner, 1, kernel))]
    params += [(f"{p}.forget_gate.dt_bias", (inner,)), (f"{p}.forget_gate.A_log", (1, 1, heads, 1))]
    params += weight(f"{p}.forget_gate.f_a_proj", d, h) + weight(f"{p}.forget_gate.f_b_proj", inner, d)
    params += weight(f"{p}.b_proj", heads, h) + weight(f"{p}.g_a_proj", d, h) + weight(f"{p}.g_b_proj", inner, d)
    params += L.norm(f"{p}.o_norm", d) + weight(f"{p}.o_proj", h, inner)
    gemms = (
        Gemm("linear_in", 3 * inner + heads, h, L.COLUMN),
        Gemm("kda_gate_down", 2 * d, h, L.REPLICATED),
        Gemm("kda_forget_up", inner, d, L.COLUMN),
        Gemm("kda_gate_up", inner, d, L.COLUMN),
        Gemm("linear_out", h, inner, L.ROW),
    )
    op = Attention(L.KDA, heads, heads, d, d, L.LINEAR_CHUNK)
    return Block(params, gemms, (op,), (("linear_num_heads", heads),))


def _kimi_linear_layer(cfg: ModelConfig, i: int) -> Layer:
    """A KDA or an MLA mixer (MLA without RoPE: the same shapes), then a dense MLP or the MoE (routed experts, the
    sigmoid router's weight, shared experts of moe_intermediate_size × n_shared_experts)."""
    mixer = kda_mixer(cfg) if kind_of(cfg, i) == L.KDA else mla_attention(cfg, i)
    mlp, is_moe = mlp_or_shared_moe(cfg, i)
    return L.layer(i, mixer + mlp + two_norms(cfg), is_moe)


_GEMMA4_LAYER_KEYS = ("head_dim", "num_key_value_heads")  # what a Gemma 4 per_layer_config entry may override


def _read_gemma4(r: FieldReader, f: dict[str, Any]) -> None:
    """Gemma 4 (text): Gemma 3's sliding pattern (every sixth layer full, the last one always), a 512 window;
    full layers with their own head_dim (``global_head_dim``, 512) and, with ``attention_k_eq_v``, their own KV heads
    (``num_global_key_value_heads``) and no v_proj, or as ``per_layer_config`` writes them; the last
    ``num_kv_shared_layers`` layers read the KV of the last earlier layer of their kind (no k/v projections, and a
    double-wide MLP with ``use_double_wide_mlp``); per-layer input embeddings (PLE) of
    ``hidden_size_per_layer_input`` per layer (0: none); with ``enable_moe_block`` every layer adds routed experts
    beside its dense MLP."""
    if r.obj.get("use_bidirectional_attention") == "all":
        raise UsageError(
            "'all': a bidirectional Gemma 4 is not a causal language model",
            source=r.where,
            field="use_bidirectional_attention",
        )
    f["attention_bias"] = r.flag("attention_bias", False)
    f["sliding_window"] = window(r, "sliding_window", 512)
    layer_kinds(r, f, lambda i: L.SLIDING if (i + 1) % 6 else L.FULL)
    x, n = f["extra"], f.get("num_hidden_layers")
    x["k_eq_v"] = r.flag("attention_k_eq_v", False)
    x["double_wide"] = r.flag("use_double_wide_mlp", False)
    x["ple_dim"] = r.number("hidden_size_per_layer_input", 256, zero=True) or 0
    x["ple_vocab"] = r.number("vocab_size_per_layer_input", 262144)
    x["kv_shared"] = shared = r.number("num_kv_shared_layers", 0, zero=True) or 0
    per = r.obj.get("per_layer_config")
    if per is None:  # transformers derives it for the full layers
        kv = r.number("num_global_key_value_heads") if x["k_eq_v"] else None
        x["global_heads"] = (r.number("global_head_dim", 512), kv)
    elif not isinstance(per, Mapping) or not all(isinstance(v, Mapping) for v in per.values()):
        raise UsageError("must be an object of per-layer objects", source=r.where, field="per_layer_config")
    else:
        heads: dict[int, tuple[int | None, int | None]] = {}
        for key, over in per.items():
            if not str(key).isdigit() or set(over) - set(_GEMMA4_LAYER_KEYS):
                raise UsageError(
                    f"entry {key!r} overrides {sorted(set(over))}; opbench models layer indices overriding "
                    f"{', '.join(_GEMMA4_LAYER_KEYS)} only",
                    source=r.where,
                    field="per_layer_config",
                )
            sub = type(r)(over, r.where, r.hf)
            heads[int(key)] = (sub.number("head_dim"), sub.number("num_key_value_heads"))
        x["layer_heads"] = heads
    if r.flag("enable_moe_block", False):
        if not f.get("n_routed_experts"):
            raise UsageError("missing: enable_moe_block routes to experts", source=r.where, field="num_experts")
        f["num_experts_per_tok"] = r.number("top_k_experts", alias=("num_experts_per_tok",))
        if not f["num_experts_per_tok"]:
            raise UsageError("missing: enable_moe_block routes to experts", source=r.where, field="top_k_experts")
        _every_layer_routes(f)
    else:
        f["n_routed_experts"] = f["num_experts_per_tok"] = 0
    if x["ple_dim"] and n is None:
        raise UsageError(
            "missing: Gemma 4's per-layer embeddings are num_hidden_layers × hidden_size_per_layer_input wide",
            source=r.where,
            field="num_hidden_layers",
        )
    kinds = f.get("layer_types")
    if shared and n is not None and kinds:
        kinds = (*kinds[: n - 1], L.FULL)
        if shared >= n or set(kinds[: n - shared]) != set(kinds):
            raise UsageError(
                f"{shared} of {n} layers reuse KV that no earlier layer of their kind computes",
                source=r.where,
                field="num_kv_shared_layers",
            )


def _gemma4_layer(cfg: ModelConfig, i: int) -> Layer:
    """Attention (q/k norms, a v norm without weights; k and v projections only where the layer computes its KV, v
    only where k ≠ v), the GeGLU MLP (twice as wide in KV-shared layers with ``use_double_wide_mlp``), Gemma 3's four
    norms, the PLE gate and projection, then the routed experts with their router and three norms. The PLE GEMMs
    are replicated across TP ranks (no Megatron implementation; docs/models.md, "Gemma 4"); the model-level PLE
    projection (hidden → layers × PLE width, once per step) is listed with layer 0 as ``ple_model_proj``."""
    x, h, heads, b = cfg.extra, cfg.hidden_size, cfg.num_attention_heads, cfg.attention_bias
    n = cfg.num_hidden_layers
    kind = L.FULL if n is not None and i == n - 1 else kind_of(cfg, i)  # transformers forces the last layer full
    hd, kv = cfg.head_dim, cfg.num_key_value_heads
    if "layer_heads" in x:
        over_hd, over_kv = x["layer_heads"].get(i, (None, None))
    else:
        over_hd, over_kv = x["global_heads"] if kind == L.FULL else (None, None)
    hd, kv = over_hd or hd, over_kv or kv
    shared = bool(x["kv_shared"]) and n is not None and i >= n - x["kv_shared"]
    k_eq_v = x["k_eq_v"] and kind == L.FULL
    p = "self_attn"
    params = weight(f"{p}.q_proj", heads * hd, h, b) + L.norm(f"{p}.q_norm", hd)
    if not shared:
        params += L.norm(f"{p}.k_norm", hd) + weight(f"{p}.k_proj", kv * hd, h, b)
        params += [] if k_eq_v else weight(f"{p}.v_proj", kv * hd, h, b)
    params += weight(f"{p}.o_proj", h, heads * hd, b)
    n_qkv = heads * hd + (0 if shared else kv * hd * (1 if k_eq_v else 2))
    window = (cfg.sliding_window or 0) if kind == L.SLIDING else 0
    attn = Block(
        params,
        (Gemm("qkv", n_qkv, h, L.COLUMN), Gemm("attn_out", h, heads * hd, L.ROW)),
        (Attention(kind, heads, kv, hd, hd, window),),
        L.head_units(heads, kv),
    )
    ffn = cfg.intermediate_size * (2 if x["double_wide"] and shared else 1)
    blk = attn + L.gated_mlp("mlp", h, ffn)
    blk += norms(
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
        size=h,
    )
    d = x["ple_dim"]
    if d:
        blk += Block(
            weight("per_layer_input_gate", d, h) + weight("per_layer_projection", h, d),
            (Gemm("ple_gate", d, h, L.REPLICATED), Gemm("ple_proj", h, d, L.REPLICATED)),
        ) + L.with_params(L.norm("post_per_layer_input_norm", h))
        if i == 0 and n is not None:
            blk += Block([], (Gemm("ple_model_proj", n * d, h, L.REPLICATED),))
    if cfg.is_moe:
        e = cfg.n_routed_experts
        blk += Block(
            [("router.scale", (h,)), ("router.per_expert_scale", (e,))] + weight("router.proj", e, h),
            (Gemm("router", e, h, L.REPLICATED, L.LOCAL),),
        )
        blk += experts(cfg, "experts")
        blk += norms(
            "post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2", size=h
        )
    return L.layer(i, blk, cfg.is_moe)


def _gemma4_final(c: ModelConfig) -> Named:
    """The final norm, then the PLE parameters the model registers after its layers: the per-layer embedding table
    (all layers' slices side by side), the projection of the input embedding to every layer's slice, its norm."""
    params = L.norm("model.norm", c.hidden_size)
    d, n = c.extra["ple_dim"], c.num_hidden_layers or 0
    if d:
        params += [("model.embed_tokens_per_layer.weight", (c.extra["ple_vocab"], n * d))]
        params += weight("model.per_layer_model_projection", n * d, c.hidden_size)
        params += L.norm("model.per_layer_projection_norm", d)
    return params


def _layer_norm_final(name: str) -> Callable[[ModelConfig], Named]:
    return lambda c: L.norm(name, c.hidden_size, bias=True)


def _embedding(name: str) -> Callable[[ModelConfig], Named]:
    return lambda c: [(name, (c.vocab_size, c.hidden_size))]


# transformers' DeepSeek defaults (hf_defaults): the MLA ranks V2 and V3 share, and V3's (and V3.2's) experts
_MLA_DEFAULTS = dict(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
_DEEPSEEK_V3_DEFAULTS = dict(
    n_routed_experts=256,
    num_experts_per_tok=8,
    moe_intermediate_size=2048,
    n_shared_experts=1,
    first_k_dense_replace=3,
    **_MLA_DEFAULTS,
)

_ARCHS: Sequence[Architecture] = (
    Architecture("llama", "Llama 2, Llama 3/3.1/3.3", _llama_layer, _read_llama),
    Architecture(
        "mistral",
        "Mistral 7B, Mistral NeMo/Small",
        _mistral_layer,
        _read_mistral,
        layer_types=SOFTMAX_LAYER_TYPES,
        hf_defaults=dict(num_key_value_heads=8),
    ),
    Architecture(
        "mixtral",
        "Mixtral 8x7B/8x22B",
        _mixtral_layer,
        _read_mixtral,
        layer_types=SOFTMAX_LAYER_TYPES,
        moe=True,
        hf_defaults=dict(num_key_value_heads=8, n_routed_experts=8, num_experts_per_tok=2),
    ),
    Architecture(
        "qwen2",
        "Qwen2, Qwen2.5",
        _qwen2_layer,
        _read_qwen2,
        layer_types=SOFTMAX_LAYER_TYPES,
        hf_defaults=dict(num_key_value_heads=32),
    ),
    Architecture(
        "qwen2_moe",
        "Qwen1.5-MoE, Qwen2-57B-A14B",
        _qwen2_moe_layer,
        _read_qwen2_moe,
        layer_types=SOFTMAX_LAYER_TYPES,
        moe=True,
        hf_defaults=dict(
            num_key_value_heads=16,
            n_routed_experts=60,
            num_experts_per_tok=4,
            moe_intermediate_size=1408,
            shared_expert_intermediate_size=5632,
        ),
    ),
    Architecture(
        "qwen3",
        "Qwen3 dense",
        _qwen3_layer,
        _read_qwen3,
        layer_types=SOFTMAX_LAYER_TYPES,
        head_dim_default=128,
        hf_defaults=dict(num_key_value_heads=32),
    ),
    Architecture(
        "qwen3_moe",
        "Qwen3-30B-A3B, Qwen3-235B-A22B",
        _qwen3_moe_layer,
        _read_qwen3_moe,
        layer_types=SOFTMAX_LAYER_TYPES,
        moe=True,
        hf_defaults=dict(num_key_value_heads=4, n_routed_experts=128, num_experts_per_tok=8, moe_intermediate_size=768),
    ),
    Architecture(
        "qwen3_next",
        "Qwen3-Next-80B-A3B",
        _qwen3_next_layer,
        _read_qwen3_next,
        ("full_attention", "linear_attention"),
        moe=True,
        head_dim_default=256,
        hf_defaults=dict(
            num_key_value_heads=2,
            n_routed_experts=512,
            num_experts_per_tok=10,
            moe_intermediate_size=512,
            shared_expert_intermediate_size=512,
        ),
    ),
    Architecture(
        "nemotron_h",
        "Nemotron-H, Nemotron Nano 2, Nemotron 3 Nano (Mamba-2 hybrids)",
        _nemotron_h_layer,
        _read_nemotron_h,
        ("full_attention", "linear_attention"),
        moe=True,
        head_dim_default=128,
        embeddings=_embedding("model.embeddings.weight"),
        final=lambda c: L.norm("model.norm_f", c.hidden_size),
        hf_defaults=dict(
            num_key_value_heads=8,
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=7688,
            shared_expert_intermediate_size=7688,
        ),
    ),
    Architecture(
        "deepseek_v2",
        "DeepSeek-V2, V2-Lite",
        _deepseek_layer(False),
        _read_deepseek("v2"),
        moe=True,
        hf_defaults=dict(
            n_routed_experts=64,
            moe_intermediate_size=1407,
            n_shared_experts=2,
            first_k_dense_replace=0,
            **_MLA_DEFAULTS,
        ),
    ),
    Architecture(
        "deepseek_v3",
        "DeepSeek-V3, R1, Kimi K2",
        _deepseek_layer(False),
        _read_deepseek("v3"),
        moe=True,
        hf_defaults=_DEEPSEEK_V3_DEFAULTS,
    ),
    Architecture(
        "deepseek_v32",
        "DeepSeek-V3.2",
        _deepseek_layer(True),
        _read_deepseek("v32"),
        ("indexed_attention",),
        moe=True,
        hf_defaults=_DEEPSEEK_V3_DEFAULTS,
    ),
    Architecture(
        "deepseek_v4",
        "DeepSeek-V4-Flash, V4-Pro (CSA/HCA attention, hyper-connections)",
        _deepseek_v4_layer,
        _read_deepseek_v4,
        _V4_LAYER_TYPES,
        moe=True,
        head_dim_default=512,
        final=_deepseek_v4_final,
        hf_defaults=dict(
            num_key_value_heads=1,
            q_lora_rank=1024,
            n_routed_experts=256,
            num_experts_per_tok=6,
            moe_intermediate_size=2048,
            n_shared_experts=1,
        ),
    ),
    Architecture(
        "glm4_moe",
        "GLM-4.5, GLM-4.6",
        _glm4_moe_layer,
        _read_glm4_moe,
        moe=True,
        hf_defaults=dict(
            num_key_value_heads=8,
            n_routed_experts=128,
            num_experts_per_tok=8,
            moe_intermediate_size=1408,
            n_shared_experts=1,
            first_k_dense_replace=1,
        ),
    ),
    Architecture(
        "ernie4_5_moe",
        "ERNIE-4.5 MoE",
        _ernie_layer,
        _read_ernie,
        moe=True,
        tie_default=True,
        lm_head_bias=lambda c: bool(c.extra.get("use_bias")),
        hf_defaults=dict(
            num_key_value_heads=4,
            n_routed_experts=64,
            num_experts_per_tok=6,
            moe_intermediate_size=1536,
            n_shared_experts=2,
        ),
    ),
    Architecture(
        "gpt_oss",
        "gpt-oss-20b/120b",
        _gpt_oss_layer,
        _read_gpt_oss,
        layer_types=SOFTMAX_LAYER_TYPES,
        moe=True,
        head_dim_default=64,
        hf_defaults=dict(num_key_value_heads=8, n_routed_experts=128, num_experts_per_tok=4),
    ),
    Architecture(
        "llama4_text",
        "Llama 4 Scout/Maverick (text)",
        _llama4_layer,
        _read_llama4,
        ("full_attention", "chunked_attention"),
        moe=True,
        head_dim_default=128,
        hf_defaults=dict(num_key_value_heads=8, n_routed_experts=16, num_experts_per_tok=1, intermediate_size=8192),
    ),
    Architecture(
        "gemma3_text",
        "Gemma 3 (text)",
        _gemma3_layer,
        _read_gemma3,
        layer_types=SOFTMAX_LAYER_TYPES,
        tie_default=True,
        head_dim_default=256,
        hf_defaults=dict(num_key_value_heads=4),
    ),
    Architecture("olmo2", "OLMo 2", _olmo2_layer, _read_bias_flag),
    Architecture("phi3", "Phi-3, Phi-3.5, Phi-4", _phi3_layer, _read_phi3, layer_types=SOFTMAX_LAYER_TYPES),
    Architecture(
        "gpt2",
        "GPT-2 (GPT-3-style GELU MLP, learned positions)",
        _gpt2_layer,
        _read_gpt2,
        tie_default=True,
        embeddings=lambda c: [
            ("transformer.wte.weight", (c.vocab_size, c.hidden_size)),
            ("transformer.wpe.weight", (c.extra["n_positions"], c.hidden_size)),
        ],
        layers_prefix="transformer.h",
        final=_layer_norm_final("transformer.ln_f"),
    ),
    Architecture(
        "gpt_neox",
        "GPT-NeoX-20B, Pythia",
        _gpt_neox_layer,
        _read_gpt_neox,
        embeddings=_embedding("gpt_neox.embed_in.weight"),
        layers_prefix="gpt_neox.layers",
        final=_layer_norm_final("gpt_neox.final_layer_norm"),
    ),
    Architecture(
        "falcon",
        "Falcon 7B/40B/180B",
        _falcon_layer,
        _read_falcon,
        tie_default=True,
        embeddings=_embedding("transformer.word_embeddings.weight"),
        layers_prefix="transformer.h",
        final=_layer_norm_final("transformer.ln_f"),
    ),
    Architecture(
        "nemotron",
        "Nemotron-4, Minitron",
        _nemotron_layer,
        _read_llama,  # the same attention_bias and mlp_bias flags
        final=_layer_norm_final("model.norm"),
    ),
    Architecture(
        "starcoder2",
        "StarCoder2",
        _starcoder2_layer,
        _read_starcoder2,
        SOFTMAX_LAYER_TYPES,
        tie_default=True,
        final=_layer_norm_final("model.norm"),
        hf_defaults=dict(num_key_value_heads=2),
    ),
    Architecture("olmo3", "OLMo 3", _olmo2_layer, _read_olmo3, SOFTMAX_LAYER_TYPES),
    Architecture(
        "smollm3",
        "SmolLM3",
        _llama_layer,
        _read_smollm3,
        SOFTMAX_LAYER_TYPES,
        tie_default=True,
        hf_defaults=dict(num_key_value_heads=4),
    ),
    Architecture(
        "minimax_m2",
        "MiniMax-M2",
        _minimax_m2_layer,
        _read_minimax_m2,
        moe=True,
        head_dim_default=128,
        hf_defaults=dict(num_key_value_heads=8, n_routed_experts=256, num_experts_per_tok=8),
    ),
    Architecture(
        "mimo_v2_flash",
        "MiMo-V2-Flash",
        _mimo_v2_flash_layer,
        _read_mimo_v2_flash,
        SOFTMAX_LAYER_TYPES,
        moe=True,
        head_dim_default=192,
        hf_defaults=dict(
            num_key_value_heads=4,
            n_routed_experts=256,
            num_experts_per_tok=8,
            moe_intermediate_size=2048,
            v_head_dim=128,
        ),
    ),
    Architecture(
        "glm_moe_dsa",
        "GLM-5",
        _glm_moe_dsa_layer,
        _read_glm_moe_dsa,
        ("indexed_attention",),
        moe=True,
        hf_defaults=dict(
            _DEEPSEEK_V3_DEFAULTS,
            num_key_value_heads=64,
            q_lora_rank=2048,
            qk_nope_head_dim=192,
            v_head_dim=256,
            intermediate_size=12288,
        ),
    ),
    Architecture(
        "qwen3_5_text",
        "Qwen3.5 dense (text; the multimodal 'qwen3_5' config's text_config)",
        _qwen3_5_layer,
        _read_qwen3_next,
        ("full_attention", "linear_attention"),
        head_dim_default=256,
        hf_defaults=dict(num_key_value_heads=4),
    ),
    Architecture(
        "qwen3_5_moe_text",
        "Qwen3.5 MoE (text; the multimodal 'qwen3_5_moe' config's text_config)",
        _qwen3_5_layer,
        _read_qwen3_5_moe,
        ("full_attention", "linear_attention"),
        moe=True,
        head_dim_default=256,
        hf_defaults=dict(
            num_key_value_heads=2,
            n_routed_experts=256,
            num_experts_per_tok=8,
            moe_intermediate_size=512,
            shared_expert_intermediate_size=512,
        ),
    ),
    Architecture(
        "longcat_flash",
        "LongCat-Flash (zero-computation experts; two MLA sublayers and a shortcut MoE per layer)",
        _longcat_flash_layer,
        _read_longcat_flash,
        moe=True,
        hf_defaults=dict(n_routed_experts=512, **_MLA_DEFAULTS),
    ),
    Architecture(
        "kimi_linear",
        "Kimi Linear 48B-A3B (Kimi Delta Attention + MLA hybrid)",
        _kimi_linear_layer,
        _read_kimi_linear,
        ("full_attention", "linear_attention"),
        moe=True,
        hf_defaults=dict(
            num_key_value_heads=32,
            n_routed_experts=256,
            num_experts_per_tok=8,
            moe_intermediate_size=1024,
            n_shared_experts=1,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
        ),
    ),
    Architecture(
        "gemma4_text",
        "Gemma 4 (text; per-layer embeddings, KV shared across layers, optional MoE)",
        _gemma4_layer,
        _read_gemma4,
        layer_types=SOFTMAX_LAYER_TYPES,
        tie_default=True,  # MoE only with enable_moe_block (its reader checks the expert fields)
        head_dim_default=256,
        final=_gemma4_final,
        hf_defaults=dict(num_key_value_heads=4),
    ),
)
ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in _ARCHS}
SUPPORTED = tuple(ARCHITECTURES)
# Multimodal configs whose language model is one of the above, in ``text_config``.
TEXT_CONFIG_WRAPPERS = {"gemma3": "gemma3_text", "llama4": "llama4_text"}
TEXT_CONFIG_WRAPPERS.update(qwen3_5="qwen3_5_text", qwen3_5_moe="qwen3_5_moe_text", gemma4="gemma4_text")


def unsupported(model_type: str, where: str) -> UsageError:
    return UsageError(
        f"model_type '{model_type}' is not an architecture opbench models exactly (it would not guess a layout); "
        f"supported: {', '.join(SUPPORTED)}",
        source=where,
        field="model_type",
    )


def architecture(cfg: ModelConfig) -> Architecture:
    return ARCHITECTURES[cfg.architecture]


PROBE_LAYERS = 64  # configs without num_hidden_layers (Primus' schema): the first layers show every kind


def decoder_layers(cfg: ModelConfig) -> list[Layer]:
    """Every decoder layer (or, without a layer count, the first ``PROBE_LAYERS``: enough to see each kind)."""
    n = cfg.num_hidden_layers if cfg.num_hidden_layers is not None else PROBE_LAYERS
    build = architecture(cfg).layer
    return [build(cfg, i) for i in range(n)]
