"""Model config + parallel sizes → the GEMM shapes of one training step (docs/conventions.md, "GEMM shapes of a training step" is the contract).

Pure Python, no torch: ``--dry-run`` and tests are instant. Every linear layer is Y[T,N] = X[T,K]·W[N,K]ᵀ with
T = mbs·seqlen/cp tokens per rank; Megatron tensor parallelism splits N of column-parallel layers and K of
row-parallel ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from opbench.core.dtypes import element_size
from opbench.core.errors import UsageError
from opbench.models import ModelConfig
from opbench.models.architectures import decoder_layers
from opbench.models.layout import ALL, COLUMN, EXPERT_COLUMN, EXPERT_ROW, LOCAL, ROUTED, ROW, VOCAB, Gemm, Layer

PASSES = ("fwd", "dgrad", "wgrad")
DENSE_LAYERS = ("qkv", "attn_out", "mlp_gate_up", "mlp_up", "mlp_down", "lm_head")
MOE_LAYERS = ("router", "expert_gate_up", "expert_down", "shared_gate_up", "shared_down", "shared_gate")
MLA_LAYERS = ("mla_q", "mla_q_down", "mla_q_up", "mla_kv_down", "mla_kv_up")
DSA_LAYERS = ("index_q", "index_k", "index_weights")
LINEAR_ATTENTION_LAYERS = ("linear_in", "linear_out", "kda_gate_down", "kda_forget_up", "kda_gate_up")
# DeepSeek-V4 (docs/models.md, "DeepSeek-V4"): its attention, compressors and hyper-connection mixing
V4_LAYERS: tuple[str, ...] = ("hc_attn", "v4_q_down", "v4_q_up", "v4_kv", "compress_kv", "index_compress_kv")
V4_LAYERS += ("v4_out_a", "v4_out_b", "hc_ffn", "hc_head")
PLE_LAYERS = ("ple_model_proj", "ple_gate", "ple_proj")  # Gemma 4's per-layer embeddings
ALL_LAYERS = (*DENSE_LAYERS, *MOE_LAYERS, *MLA_LAYERS, *DSA_LAYERS, *LINEAR_ATTENTION_LAYERS, *V4_LAYERS, *PLE_LAYERS)
VOCAB_PAD = 128  # Megatron's --make-vocab-size-divisible-by default


@dataclass(frozen=True)
class ModelParallel:
    tp: int = 1
    ep: int = 1
    cp: int = 1
    etp: int | None = None  # expert tensor parallel (Megatron --expert-tensor-parallel-size); None = tp, as Megatron

    @property
    def expert_tp(self) -> int:
        """The expert weights' TP split: --etp, defaulting to --tp as Megatron-Core does (1 = not TP-split)."""
        return self.etp if self.etp is not None else self.tp


@dataclass(frozen=True)
class LinearLayer:
    """One weight W[N,K] applied to ``tokens`` rows, ``groups`` times (grouped GEMM for routed experts), in
    ``count`` decoder layers of the model (None: the config gives no layer count)."""

    name: str
    n: int
    k: int
    tokens: int
    groups: int = 1
    count: int | None = 1


@dataclass(frozen=True)
class GemmShape:
    model: str
    layer: str
    pass_: str
    mbs: int
    m: int
    n: int
    k: int
    groups: int
    trans_a: bool
    trans_b: bool
    layer_count: int | None = 1  # decoder layers that run this GEMM per step (1 for lm_head; None: unknown)

    @property
    def flops(self) -> int:
        return gemm_flops(self.m, self.n, self.k, self.groups)

    def bytes_moved(self, dtype: str) -> int:
        return gemm_bytes(self.m, self.n, self.k, self.groups, dtype)

    def as_row(self) -> dict:
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        d["transA"] = d.pop("trans_a")
        d["transB"] = d.pop("trans_b")
        return d


def gemm_flops(m: int, n: int, k: int, groups: int = 1) -> int:
    """2·m·n·k per GEMM, × groups for a grouped GEMM (docs/conventions.md, "GEMM shapes of a training step")."""
    return 2 * m * n * k * groups


def gemm_bytes(m: int, n: int, k: int, groups: int, dtype: str) -> int:
    """Minimum traffic: read A and B once, write C once (docs/conventions.md, "GEMM shapes of a training step");
    an fp8 GEMM writes C in bf16 (the fp8 backend's ``out_dtype``, as FP8 training recipes do)."""
    ab = element_size(dtype)
    c = element_size("bf16") if dtype == "fp8" else ab
    return ((m * k + k * n) * ab + m * n * c) * groups


def pass_shape(pass_: str, tokens: int, n: int, k: int) -> tuple[int, int, int, bool, bool]:
    """(m, n, k, transA, transB) of one pass, with the operand layout Primus uses.

    fwd   Y  = X·Wᵀ    (T, N, K)  NT: A = X[T,K], B = W[N,K] read transposed
    dgrad dX = dY·W    (T, K, N)  NN: A = dY[T,N], B = W[N,K]
    wgrad dW = dYᵀ·X   (N, K, T)  TN: A = dY[T,N] read transposed, B = X[T,K]
    """
    if pass_ == "fwd":
        return tokens, n, k, False, True
    if pass_ == "dgrad":
        return tokens, k, n, False, False
    if pass_ == "wgrad":
        return n, k, tokens, True, False
    raise ValueError(f"unknown pass {pass_!r}")


def _divide(value: int, by: int, what: str, flag: str) -> int:
    if value % by:
        raise UsageError(f"{what} = {value} is not divisible by {flag} {by}", field=flag)
    return value // by


def padded_vocab(vocab: int, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of 128·tp so every TP rank gets an equal slice."""
    mult = VOCAB_PAD * tp
    return math.ceil(vocab / mult) * mult


def tokens_per_expert(tokens: int, top_k: int, n_experts: int, ep: int, etp: int = 1) -> int:
    """Rows of one local expert's GEMM under balanced routing: ``tokens`` (the rank's sequence-parallel share,
    T/tp) · etp · ep · top_k / n_experts, rounded up (docs/conventions.md, "GEMM shapes of a training step",
    "MoE under tensor parallelism").

    The dispatcher's all-to-all over EP brings every EP rank's tokens for the local experts and the expert-TP
    group gathers them, so with etp = tp a rank's grouped GEMM covers T·top_k rows in total; with tp = etp = ep
    = 1 this is Primus' "balance_seq"."""
    return math.ceil(tokens * etp * ep * top_k / n_experts)


def _split(gemm: Gemm, tp: int, etp: int) -> tuple[int, int]:
    """(N, K) of one rank's share of ``gemm`` (docs/conventions.md, "GEMM shapes of a training step")."""
    n, k = gemm.n, gemm.k
    if gemm.split == COLUMN:
        return _divide(n, tp, f"{gemm.layer}: N", "--tp"), k
    if gemm.split == ROW:
        return n, _divide(k, tp, f"{gemm.layer}: K", "--tp")
    if gemm.split == EXPERT_COLUMN:
        return n // etp, k
    if gemm.split == EXPERT_ROW:
        return n, k // etp
    if gemm.split == VOCAB:
        return padded_vocab(n, tp) // tp, k
    return n, k


def check_parallel(cfg: ModelConfig, tokens: int, par: ModelParallel, layers: Sequence[Layer]) -> int:
    """Refuse sizes a parallel layout cannot split (one line naming the flag); the rank's tokens at the MoE layers
    (T/tp: MoE with TP runs sequence-parallel, Megatron-Core's rule)."""
    tp, name = par.tp, cfg.name
    for what, value in dict.fromkeys(unit for lay in layers for unit in lay.tp_units):
        _divide(value, tp, f"{name}: {what}", "--tp")
    if not cfg.is_moe:
        return tokens
    local = _divide(tokens, tp, f"{name}: tokens mbs·seqlen/cp (sequence parallel with MoE)", "--tp")
    _divide(cfg.n_routed_experts, par.ep, f"{name}: n_routed_experts", "--ep")
    _divide(cfg.expert_intermediate_size, par.expert_tp, f"{name}: moe_intermediate_size", "--etp")
    return local


def layer_gemms(lay: Layer, tokens: int, local: int, par: ModelParallel) -> list[LinearLayer]:
    """One decoder layer's GEMMs as one TP/EP rank runs them (``local``: the rank's tokens at the MoE layers)."""
    out = []
    for gemm in lay.gemms:
        n, k = _split(gemm, par.tp, par.expert_tp)
        groups, rows = gemm.groups, {ALL: tokens, LOCAL: local}.get(gemm.rows, tokens)
        if gemm.rows == ROUTED:
            # Megatron-Core: experts are split by etp (default tp); the dispatcher brings etp·ep ranks' tokens
            groups = gemm.experts // par.ep
            rows = tokens_per_expert(local, gemm.top_k, gemm.experts, par.ep, par.expert_tp)
        out.append(LinearLayer(gemm.layer, n, k, rows, groups))
    return out


def lm_head_gemm(cfg: ModelConfig, tokens: int, tp: int) -> LinearLayer:
    return LinearLayer("lm_head", padded_vocab(cfg.vocab_size, tp) // tp, cfg.hidden_size, tokens)


def model_layers(cfg: ModelConfig, tokens: int, par: ModelParallel) -> list[LinearLayer]:
    """The distinct linear layers of the model's decoder layers (+ lm_head) as one TP/EP rank sees them, in model
    order, each with the number of layers that run it. Read from the architecture's description (layout.Gemm)."""
    layers = decoder_layers(cfg)
    local = check_parallel(cfg, tokens, par, layers)
    seen: dict[tuple, int] = {}
    for lay in layers:
        for g in layer_gemms(lay, tokens, local, par):
            key = (g.name, g.n, g.k, g.tokens, g.groups)
            seen[key] = seen.get(key, 0) + 1
    counted = cfg.num_hidden_layers is not None
    out = [
        LinearLayer(layer, n, k, rows, groups, count if counted else None)
        for (layer, n, k, rows, groups), count in seen.items()
    ]
    out.append(lm_head_gemm(cfg, tokens, par.tp))
    return out


def gemm_shapes(
    cfg: ModelConfig,
    mbs_list: Sequence[int] = (1,),
    seqlen: int | None = None,
    par: ModelParallel = ModelParallel(),
    layers: Iterable[str] | None = None,
    passes: Iterable[str] = PASSES,
) -> list[GemmShape]:
    """All (layer, pass, mbs) GEMMs of one rank's training step, in model order."""
    for flag, value in (("--tp", par.tp), ("--ep", par.ep), ("--cp", par.cp), ("--etp", par.expert_tp)):
        if value < 1:
            raise UsageError(f"must be positive, got {value}", field=flag)
    seq = seqlen or cfg.seqlen
    if not seq:
        raise UsageError(f"model '{cfg.name}' has no seqlen; pass --seqlen", source=cfg.source or None, field="seqlen")
    seq_local = _divide(seq, par.cp, f"{cfg.name}: seqlen", "--cp")
    wanted = set(layers) if layers is not None else None
    passes = list(passes)
    shapes: list[GemmShape] = []
    for mbs in mbs_list:
        if mbs < 1:
            raise UsageError(f"must be positive, got {mbs}", field="--mbs")
        for layer in model_layers(cfg, mbs * seq_local, par):
            if wanted is not None and layer.name not in wanted:
                continue
            for p in passes:
                m, n, k, ta, tb = pass_shape(p, layer.tokens, layer.n, layer.k)
                shapes.append(GemmShape(cfg.name, layer.name, p, mbs, m, n, k, layer.groups, ta, tb, layer.count))
    return shapes


LAYOUTS = {"NN": (False, False), "NT": (False, True), "TN": (True, False), "TT": (True, True)}
RAW = "raw"


def parse_mnk(text: str) -> list[tuple[int, int, int]]:
    """``--mnk 8192x8192x8192,4096x14336x4096``: (m, n, k) triples, each a positive integer (ValueError if not)."""
    out = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            raise UsageError(
                f"'{item.strip()}' is not MxNxK with positive integers (e.g. 4096x14336x4096)", field="--mnk"
            )
        m, n, k = (int(p) for p in parts)
        out.append((m, n, k))
    return out


def raw_shapes(mnk: Sequence[tuple[int, int, int]], layout: str) -> list[GemmShape]:
    """Shapes given as numbers, no model (Primus' --M --N --K --trans_a --trans_b): layer and pass are ``raw``,
    the layout letters say whether A and B are stored transposed (docs/conventions.md, "GEMM shapes")."""
    trans_a, trans_b = LAYOUTS[layout]
    return [GemmShape(RAW, RAW, RAW, 1, m, n, k, 1, trans_a, trans_b) for m, n, k in mnk]
