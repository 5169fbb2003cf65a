"""What one decoder layer is made of, as every tool needs it: its parameters (Hugging Face names, shapes,
registration order), its weight GEMMs (with how Megatron-style parallelism splits each), and its attention operator.

Each architecture in ``architectures.py`` builds a :class:`Layer` from these pieces; params, GEMM shapes,
attention shapes, FSDP sizes and checkpoint states are all read from it, so a formula for a layer lives once
(docs/models.md is the contract). Pure Python: no torch, no transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

Named = list[tuple[str, tuple[int, ...]]]

# How tensor parallelism splits a weight GEMM (Megatron-Core's conventions, docs/conventions.md "GEMM shapes").
COLUMN = "column"  # N / tp: q/k/v, gate/up, column-parallel projections
ROW = "row"  # K / tp: attention output, down projections
REPLICATED = "replicated"  # not split: routers, MLA's down projections, the DSA indexer
EXPERT_COLUMN = "expert_column"  # routed experts' gate/up: N / etp, experts / ep
EXPERT_ROW = "expert_row"  # routed experts' down: K / etp, experts / ep
VOCAB = "vocab"  # lm_head: N = vocabulary padded to a multiple of 128·tp, / tp

# Which rows a GEMM multiplies, for T = mbs·seqlen/cp tokens per rank.
ALL = "all"  # every token (TP layers gather the sequence-parallel activations)
LOCAL = "local"  # T / tp: the rank's sequence-parallel share (routers, shared-expert gates)
ROUTED = "routed"  # a routed expert's share of T·top_k under balanced routing

# Attention kinds (docs/models.md, "Attention kinds").
FULL = "full"  # causal over every earlier key
SLIDING = "sliding"  # causal over the last `window` keys (the query's own included)
CHUNKED = "chunked"  # causal within blocks of `window` tokens (Llama 4)
SPARSE = "sparse"  # causal over `window` keys an indexer picks (DeepSeek-V3.2 DSA top-k)
LINEAR = "linear"  # gated DeltaNet, chunkwise (Qwen3-Next); `window` = the chunk size
INDEXER = "indexer"  # the DSA lightning indexer's scoring of every earlier key
MAMBA2 = "mamba2"  # Mamba-2's chunked state-space scan (SSD, NemotronH); `window` = the chunk size
KDA = "kda"  # Kimi Delta Attention: the gated delta rule with a per-channel decay (Kimi Linear); `window` = chunk
# DeepSeek-V4 (docs/models.md, "DeepSeek-V4"): the sliding window plus keys pooled `compress`:1 by a learned
# compressor; `csa` keeps the indexer's `topk` pooled entries (m = 4), `hca` every causal one (m = 128)
CSA = "csa"  # compressed sparse attention: `window` raw keys + the top-k of the rate-`compress` pooled keys
HCA = "hca"  # heavily compressed attention: `window` raw keys + every causal rate-`compress` pooled key
HC = "hc"  # a manifold-constrained hyper-connection site: `heads_q` residual streams of `head_dim_qk` mixed
ATTENTION_KINDS = (FULL, SLIDING, CHUNKED, SPARSE, LINEAR, INDEXER, MAMBA2, KDA, CSA, HCA, HC)
LINEAR_CHUNK = 64  # the chunk size of the chunkwise gated delta rule (flash-linear-attention's, transformers')


@dataclass(frozen=True)
class Gemm:
    """One weight multiplication of the forward, Y[T,N] = X[T,K]·W[N,K]ᵀ, before any parallel split.

    Several Hugging Face linears that read the same input are one GEMM here (q, k, v → ``qkv``; gate, up →
    ``mlp_gate_up``), as Megatron fuses them; routed experts are one grouped GEMM over ``experts`` weights."""

    layer: str  # the GEMM row's name
    n: int
    k: int
    split: str = COLUMN
    rows: str = ALL
    experts: int = 0  # routed: experts in the bank
    top_k: int = 0  # routed: experts per token
    groups: int = 1  # a grouped GEMM of `groups` weights, each on its own slice of K (DeepSeek-V4's o_a_proj)


@dataclass(frozen=True)
class Attention:
    """The attention operator of a layer, whole (before tensor or context parallelism).

    For ``linear`` layers ``heads_q`` is the number of value heads (recurrent states, outputs) and ``heads_kv``
    the number of query/key heads; ``window`` is the sliding window, chunk size, top-k or linear chunk size."""

    kind: str
    heads_q: int
    heads_kv: int
    head_dim_qk: int
    head_dim_v: int
    window: int = 0
    sinks: bool = False  # gpt-oss: one learned logit per head joins each softmax
    compress: int = 0  # DeepSeek-V4: keys pooled compress:1 (csa, hca, and the indexer that scores them)
    topk: int = 0  # DeepSeek-V4's csa: pooled keys the indexer keeps per query


@dataclass(frozen=True)
class Block:
    """A piece of a layer: its parameters (names relative to the layer) and its GEMMs, in model order."""

    params: Named = field(default_factory=list)
    gemms: tuple[Gemm, ...] = ()
    attention: tuple[Attention, ...] = ()  # the DSA layer carries two operators: the indexer and the attention
    tp_units: tuple[tuple[str, int], ...] = ()  # (config field, count) that --tp must divide

    def __add__(self, other: Block) -> Block:
        return Block(
            self.params + other.params,
            self.gemms + other.gemms,
            self.attention + other.attention,
            self.tp_units + other.tp_units,
        )


# Each distinct (GEMMs, attention operators, moe) of a layer, numbered in the order first seen (Layer.kind)
_KINDS: dict[tuple[tuple[Gemm, ...], tuple[Attention, ...], bool], int] = {}


@dataclass(frozen=True)
class Layer:
    """Decoder layer ``index``: parameters, GEMMs, attention operators; ``moe`` when it routes to experts."""

    index: int
    params: Named
    gemms: tuple[Gemm, ...]
    attention: tuple[Attention, ...]
    tp_units: tuple[tuple[str, int], ...]
    moe: bool

    @cached_property
    def kind(self) -> int:
        """A number for what sets this layer's work (its GEMMs, attention operators and routing): layers of one
        kind have the same work. Interned once per layer, so a projection's caches key on an int instead of
        hashing the GEMM tuples again for every layout a search tries."""
        return _KINDS.setdefault((self.gemms, self.attention, self.moe), len(_KINDS))


def with_params(params: Named) -> Block:
    return Block(params=list(params))


def weight(name: str, out_features: int, in_features: int, bias: bool = False, transposed: bool = False) -> Named:
    """nn.Linear registers ``weight`` (out, in) then ``bias`` (out,); GPT-2's Conv1D stores the weight (in, out)."""
    shape = (in_features, out_features) if transposed else (out_features, in_features)
    params: Named = [(f"{name}.weight", shape)]
    if bias:
        params.append((f"{name}.bias", (out_features,)))
    return params


def norm(name: str, size: int, bias: bool = False) -> Named:
    """RMSNorm (weight) or LayerNorm (weight, bias)."""
    params: Named = [(f"{name}.weight", (size,))]
    return params + [(f"{name}.bias", (size,))] if bias else params


def attention_gemms(hidden: int, heads: int, kv_heads: int, head_dim: int, q_factor: int = 1) -> tuple[Gemm, ...]:
    """``qkv`` (column-parallel; ``q_factor`` 2 when q carries an output gate, Qwen3-Next) and ``attn_out`` (row)."""
    return (
        Gemm("qkv", (q_factor * heads + 2 * kv_heads) * head_dim, hidden, COLUMN),
        Gemm("attn_out", hidden, heads * head_dim, ROW),
    )


def head_units(heads: int, kv_heads: int) -> tuple[tuple[str, int], ...]:
    return (("num_attention_heads", heads), ("num_key_value_heads", kv_heads))


def gated_mlp(prefix: str, hidden: int, ffn: int, bias: bool = False, fused: bool = False) -> Block:
    """SwiGLU/GeGLU MLP: gate and up (one ``gate_up_proj`` when ``fused``, Phi-3), then down."""
    if fused:
        params = weight(f"{prefix}.gate_up_proj", 2 * ffn, hidden, bias)
    else:
        params = weight(f"{prefix}.gate_proj", ffn, hidden, bias) + weight(f"{prefix}.up_proj", ffn, hidden, bias)
    params += weight(f"{prefix}.down_proj", hidden, ffn, bias)
    return Block(
        params,
        (Gemm("mlp_gate_up", 2 * ffn, hidden, COLUMN), Gemm("mlp_down", hidden, ffn, ROW)),
        tp_units=(("intermediate_size", ffn),),
    )


def plain_mlp(up: str, down: str, hidden: int, ffn: int, bias: bool, transposed: bool = False) -> Block:
    """A two-matrix MLP (GELU, or squared ReLU, between them): GPT-2, GPT-NeoX, Falcon, StarCoder2, Nemotron."""
    return Block(
        weight(up, ffn, hidden, bias, transposed) + weight(down, hidden, ffn, bias, transposed),
        (Gemm("mlp_up", ffn, hidden, COLUMN), Gemm("mlp_down", hidden, ffn, ROW)),
        tp_units=(("intermediate_size", ffn),),
    )


def shared_mlp(prefix: str, hidden: int, ffn: int, bias: bool = False) -> Block:
    """Shared experts: an ordinary gated MLP every token goes through, tensor-parallel like the dense MLP."""
    params = (
        weight(f"{prefix}.gate_proj", ffn, hidden, bias)
        + weight(f"{prefix}.up_proj", ffn, hidden, bias)
        + weight(f"{prefix}.down_proj", hidden, ffn, bias)
    )
    return Block(
        params,
        (Gemm("shared_gate_up", 2 * ffn, hidden, COLUMN), Gemm("shared_down", hidden, ffn, ROW)),
        tp_units=(("shared expert intermediate size", ffn),),
    )


def router(name: str, experts: int, hidden: int, bias: bool = False) -> Block:
    """The router's logits GEMM: replicated, on the rank's sequence-parallel tokens."""
    return Block(weight(name, experts, hidden, bias), (Gemm("router", experts, hidden, REPLICATED, LOCAL),))


def routed_experts(
    prefix: str, experts: int, hidden: int, ffn: int, top_k: int, transposed: bool = False, bias: bool = False
) -> Block:
    """Fused expert weights as transformers 5.x stores them: ``gate_up_proj`` (E, 2·ffn, hidden) and ``down_proj``
    (E, hidden, ffn); gpt-oss and Llama 4 store them (E, hidden, 2·ffn) and (E, ffn, hidden), gpt-oss with biases."""
    if transposed:
        params: Named = [(f"{prefix}.gate_up_proj", (experts, hidden, 2 * ffn))]
        if bias:
            params.append((f"{prefix}.gate_up_proj_bias", (experts, 2 * ffn)))
        params.append((f"{prefix}.down_proj", (experts, ffn, hidden)))
        if bias:
            params.append((f"{prefix}.down_proj_bias", (experts, hidden)))
    else:
        params = [
            (f"{prefix}.gate_up_proj", (experts, 2 * ffn, hidden)),
            (f"{prefix}.down_proj", (experts, hidden, ffn)),
        ]
    gemms = (
        Gemm("expert_gate_up", 2 * ffn, hidden, EXPERT_COLUMN, ROUTED, experts, top_k),
        Gemm("expert_down", hidden, ffn, EXPERT_ROW, ROUTED, experts, top_k),
    )
    return Block(params, gemms)


# The order a layer's forward runs its GEMMs in (parameters keep their registration order, which differs: DeepSeek
# registers its experts before the router).
GEMM_ORDER = (
    "ple_model_proj",
    "hc_attn",
    "v4_q_down",
    "v4_q_up",
    "v4_kv",
    "compress_kv",
    "index_compress_kv",
    "mla_q",
    "mla_q_down",
    "mla_q_up",
    "mla_kv_down",
    "mla_kv_up",
    "index_q",
    "index_k",
    "index_weights",
    "qkv",
    "linear_in",
    "kda_gate_down",
    "kda_forget_up",
    "kda_gate_up",
    "attn_out",
    "linear_out",
    "v4_out_a",
    "v4_out_b",
    "mlp_gate_up",
    "mlp_up",
    "mlp_down",
    "hc_ffn",
    "router",
    "expert_gate_up",
    "expert_down",
    "shared_gate_up",
    "shared_down",
    "shared_gate",
    "ple_gate",
    "ple_proj",
    "hc_head",
)


def layer(index: int, block: Block, moe: bool) -> Layer:
    gemms = tuple(sorted(block.gemms, key=lambda g: GEMM_ORDER.index(g.layer)))
    return Layer(index, block.params, gemms, block.attention, block.tp_units, moe)
