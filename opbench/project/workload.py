"""The work of one decoder layer for one micro-batch on one rank, and of the model's first and last pieces
(embedding; final norm, lm_head and loss), as timed items: GEMMs (from the architecture's description, as
``opbench gemm`` rows), attention operators (as ``opbench attention`` rows), memory-bound operators (bytes moved)
and collectives (nccl-tests sizes), each with what part of it overlaps with compute (docs/project.md, "A step").
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace

from opbench.attention.flops import attention_flops
from opbench.attention.shapes import AttentionShape, operator_shape
from opbench.core.dtypes import element_size
from opbench.gemm.shapes import LinearLayer, gemm_flops, layer_gemms, lm_head_gemm, pass_shape
from opbench.models import ModelConfig
from opbench.models.layout import ALL, COLUMN, CSA, FULL, HCA, LINEAR, REPLICATED, Gemm, Layer

from .megatron_flags import FA2_DET_HEAD_DIM, fa2_deterministic, pinned_allreduce, sm100_sms
from .memory import UNFUSED_KINDS, has_qk_norm, op_matmuls
from .moe_rates import EXPERT_PHASES, TOKEN_PHASES, MoeShape, PhaseTime, k_share
from .plan import Plan, fp8_gemm
from .rates import ESTIMATED, INTERPOLATED, MEASURED, SCAN_KINDS, Rates, Timed
from .torch_compile import compiled

# Item categories, the columns of the breakdown
GEMM, ATTENTION, MEMORY = "gemm", "attention", "memory"
TP_COMM, EP_COMM, CP_COMM = "tp_comm", "ep_comm", "cp_comm"
COMPUTE_KINDS = (GEMM, ATTENTION, MEMORY)
TE_NORM_FUSED = ("qkv", "mlp_gate_up", "mlp_up")  # Transformer Engine's LayerNormLinear: the norm casts to FP8


@dataclass(frozen=True)
class Item:
    category: str
    name: str
    timed: Timed
    exposed: float  # seconds it adds to the stage's time (compute: all of it; comm: what is not overlapped)
    host_s: float | None = None  # the host's issue time where a row measured it (opbench moe), else counted


@dataclass(frozen=True)
class Work:
    """One micro-batch of one piece of the model: forward and backward items (backward includes recomputation)."""

    fwd: tuple[Item, ...]
    bwd: tuple[Item, ...]

    @property
    def fwd_s(self) -> float:
        return sum(i.exposed for i in self.fwd)

    @property
    def bwd_s(self) -> float:
        return sum(i.exposed for i in self.bwd)

    @property
    def wgrad_s(self) -> float:
        """The weight-gradient GEMMs of the backward: what a zero-bubble schedule runs later."""
        return sum(i.exposed for i in self.bwd if i.category == GEMM and i.name.endswith(" wgrad"))

    def __add__(self, other: Work) -> Work:
        return Work(self.fwd + other.fwd, self.bwd + other.bwd)


def _compute(category: str, name: str, timed: Timed) -> Item:
    return Item(category, name, timed, timed.seconds)


def _gemm_items(rates: Rates, g: LinearLayer, fp8: bool = False) -> tuple[list[Item], list[Item]]:
    fwd: list[Item] = []
    bwd: list[Item] = []
    expert = _in_moe_block(g.name)
    for p in ("fwd", "dgrad", "wgrad"):
        m, n, k, _, _ = pass_shape(p, g.tokens, g.n, g.k)
        t = expert_gemm_time(rates, m, n, k, g.groups, fp8) if expert else rates.gemm_time(m, n, k, g.groups, fp8)
        item = _compute(GEMM, f"{g.name} {p}", t)
        (fwd if p == "fwd" else bwd).append(item)
    return fwd, bwd


def expert_gemm_time(rates: Rates, m: int, n: int, k: int, groups: int = 1, fp8: bool = False) -> Timed:
    """A routed experts' grouped GEMM: a measured row as any GEMM's; estimated, its math runs at ``k_share`` of the
    dense estimate's rate, as its reduction width ``k`` sets (the experts' width, or in the weight gradient the rows
    each expert got: narrow experts and few rows per expert run below a large GEMM's rate; docs/project.md, "MoE
    cost model")."""
    t = rates.gemm_time(m, n, k, groups, fp8)
    share = k_share(k, fp8)
    if t.source != ESTIMATED or share >= 1.0 or rates.peak is None:
        return t
    dtype = "fp8" if fp8 else rates.dtype
    peak = rates.peak.tflops(dtype)
    if not peak:
        return t
    math_s = gemm_flops(m, n, k, groups) / (peak * 1e12 * rates.gemm_efficiency(dtype)) * rates.scale("gemm")
    note = f"{t.note}; reduction over {k} at {share:.2f} of a large GEMM's rate"
    return Timed(t.seconds + math_s * (1 / share - 1), ESTIMATED, note)


def fp8_cast_bytes(plan: Plan, g: LinearLayer) -> tuple[float, float]:
    """(forward, backward) bytes the FP8 casts around one GEMM move per micro-batch (docs/project.md, "FP8"):
    input X (tokens × k), weight W (n × k × groups) and output gradient dY (tokens × n), each read in 16 bits and
    written in FP8. te (delayed scaling, amax taken inside each cast): X and dY are cast with their transposes
    in one pass (read 2, write 1 + 1 bytes), except the input of a GEMM right after a norm (qkv, the MLP's
    first), which the norm kernel writes in FP8 itself (no extra traffic; under sequence parallelism backward
    transposes the gathered FP8 input: read 1, write 1); the weight and its transpose once per step (first
    micro-batch). torchao (dynamic tensorwise): each cast reads its input once more for the amax (5 bytes), every
    micro-batch casts W in forward and again transposed in backward, X is cast again transposed for the weight
    gradient, and dY twice (as is and transposed). te with tensorwise (current) scaling reads each activation and
    output gradient once more for its amax before the cast (2 bytes), and the norm's output is cast in a pass of its
    own (its scale is not known before the norm ends): X and dY 6 bytes each. te with MXFP8 (block scaling): each
    cast takes its 32-element blocks' scales inside it and writes both orientations with their E8M0 scales (read 2,
    write 1 + 1 + 2/32 bytes); the norm's output is cast in a pass of its own too (Transformer Engine's
    ``normalization.cpp`` computes the norm in 16 bits and quantises after it for MXFP8 unless NVTE_NORM_FWD_USE_CUDNN
    is set, which Megatron-Bridge's recipes unset for most models: ``perf_plugins.py``)."""
    x, w, dy = g.tokens * g.k * g.groups, g.n * g.k * g.groups, g.tokens * g.n * g.groups  # groups: experts' rows
    if plan.fp8 == "te":  # --fp8-param-gather: the optimizer writes the FP8 weight, only its transpose is made here
        weights = (2 if plan.fp8_param_gather else 4) * w / max(1, plan.microbatches)
        if plan.fp8_recipe == "tensorwise":
            return 6 * x + weights, 6 * dy
        if plan.fp8_recipe == "mxfp8":  # both orientations with their block scales, the norm's output included
            return (4 + 2 / MX_BLOCK) * x + weights, (4 + 2 / MX_BLOCK) * dy
        if g.name in TE_NORM_FUSED:
            return weights, 4 * dy + (2 * x if plan.sp else 0)
        return 4 * x + weights, 4 * dy
    return 5 * x + 5 * w, 5 * x + 3 * w + 8 * dy


# Kernels one Transformer Engine cast launches (docs/project.md, "FP8"): under current (tensorwise) scaling
# Float8CurrentScalingQuantizer::quantize_impl (transformer_engine/pytorch/csrc/quantizer.cpp) runs compute_amax,
# compute_scale_from_amax and the cast-and-transpose; under delayed scaling the cast takes its amax inside, one kernel.
TE_CAST_KERNELS = {"tensorwise": 3, "delayed": 1, "mxfp8": 1}
MX_BLOCK = 32  # elements per MXFP8 scale (OCP Microscaling Formats v1.0: E8M0 scale, blocks of 32)
# recipes whose grouped GEMMs quantise every expert's rows in one call (split_quantize's batched path)
TE_BATCHED_QUANTIZE = ("mxfp8",)


def fp8_cast_kernels(plan: Plan, g: LinearLayer) -> tuple[int, int]:
    """(forward, backward) kernels the FP8 casts of ``fp8_cast_bytes`` launch per micro-batch under Transformer
    Engine: X forward (none where a norm writes it in FP8, delayed scaling) and dY backward, each its recipe's
    kernels; a grouped GEMM's per expert, as TE's GroupedLinear quantises each expert's rows on its own under
    current and delayed scaling (``csrc/extensions/cast.cpp``, ``split_quantize``: only the blockwise, MXFP8 and
    NVFP4 recipes are batched, one call for all the experts: MXFP8 here); under delayed scaling with sequence
    parallelism a norm-fused GEMM's gathered FP8 input is transposed in backward (one kernel). The weights' casts, once a step, are left out. torchao: one kernel
    a pass (an estimate: its dynamic casts launch more)."""
    if plan.fp8 != "te":
        return 1, 1
    batched = plan.fp8_recipe in TE_BATCHED_QUANTIZE
    per = TE_CAST_KERNELS.get(plan.fp8_recipe, 1) * (1 if batched else max(1, g.groups))
    if plan.fp8_recipe == "delayed" and g.name in TE_NORM_FUSED:  # the norm writes X in FP8
        return 0, per + (1 if plan.sp else 0)  # under SP the gathered FP8 X is transposed in backward
    return per, per


def _fa2_deterministic_runs(shape: AttentionShape, plan: Plan) -> bool:
    """Whether a deterministic step on Blackwell runs FlashAttention-2 here and its model covers the call: TE's
    choice, ``--attention-backend flash`` (no FlashAttention-3 on sm100), or ``auto`` with dropout (cuDNN's
    deterministic backward takes no dropout, FlashAttention-4 none either); full softmax attention (causal or not)
    at head dimension 128 (the measured figure's; sliding, chunked, MLA's wider heads and other kinds are not
    modelled), no context parallelism."""
    chosen = plan.attention_backend == "flash" or (plan.attention_backend == "auto" and plan.attention_dropout > 0)
    return (
        chosen
        and shape.attn_kind == FULL
        and shape.head_dim_qk == shape.head_dim_v == FA2_DET_HEAD_DIM
        and plan.cp == 1
        and not shape.sinks
    )


def _attention_items(rates: Rates, shape: AttentionShape, plan: Plan) -> tuple[Item, Item]:
    """One rank's attention for a micro-batch. With context parallelism the rank computes its seqlen/cp queries
    against the whole sequence in cp ring steps, load-balanced: 1/cp of the full causal work, timed at the rate
    the one-step shape achieves."""
    if plan.unfused_attention and shape.attn_kind in UNFUSED_KINDS:
        fwd, bwd = (unfused_attention_time(rates, shape, plan, p) for p in ("fwd", "bwd"))
        name = f"{shape.attn_kind} attention (unfused)"
        return _compute(ATTENTION, name + " fwd", fwd), _compute(ATTENTION, name + " bwd", bwd)
    fwd = rates.attention_time(shape, plan.mbs, "fwd")
    bwd = rates.attention_time(shape, plan.mbs, "bwd")
    sms = sm100_sms(rates.device)
    if rates.a.deterministic_attention and sms and _fa2_deterministic_runs(shape, plan):
        # TE on Blackwell with dropout: FlashAttention-2's deterministic kernels (megatron_flags.py)
        f, b = fa2_deterministic(attention_flops(shape, plan.mbs, "fwd"), sms, plan.mbs, shape.num_head_q,
                                 shape.seqlen_q, shape.causal)  # fmt: skip
        note = "FlashAttention-2 deterministic (--deterministic-mode, dropout, sm100)"
        fwd, bwd = (rates.scaled(Timed(t, ESTIMATED, note), "attention") for t in (f, b))  # measured: fixed cost in
    # a scan's shape is already its whole sequence, and a compressed attention's (DeepSeek-V4's csa, hca and their
    # indexer) the last CP rank's whole kernel (attention/shapes.py, operator_shape): only a ring step scales
    if plan.cp > 1 and shape.attn_kind not in SCAN_KINDS and not shape.compress and shape.attn_kind not in (CSA, HCA):
        whole = replace(shape, seqlen_q=shape.seqlen_q * plan.cp, seqlen_kv=shape.seqlen_kv * plan.cp)
        scale = attention_flops(whole, plan.mbs) / plan.cp / attention_flops(shape, plan.mbs)
        fwd, bwd = (Timed(t.seconds * scale, t.source, t.note) for t in (fwd, bwd))
    name = f"{shape.attn_kind} attention"
    return _compute(ATTENTION, name + " fwd", fwd), _compute(ATTENTION, name + " bwd", bwd)


# The scans' GEMMs whose outputs Megatron's all-to-all CP sends to the head-split layout (in_proj; KDA's gate
# up-projections as opbench splits them, docs/models.md) and whose input it sends back (out_proj)
SCAN_IN_GEMMS, SCAN_OUT_GEMM = ("linear_in", "kda_forget_up", "kda_gate_up"), "linear_out"


def scan_cp_items(lay: Layer, plan: Plan, rates: Rates) -> tuple[list[Item], list[Item]]:
    """Context parallelism on a Mamba-2, gated DeltaNet or KDA mixer, as Megatron-Core runs it (MambaContextParallel;
    GatedDeltaNet's tensor_a2a_cp2hp/hp2cp): an all-to-all over the CP ranks of in_proj's output (seqlen/cp tokens,
    every local head → the whole sequence, heads/cp) before the convolution and scan, and one of the scan's output
    back before out_proj; backward the same two on the gradients. Blocking in the mixer: nothing hides them."""
    if not any(op.kind in SCAN_KINDS for op in lay.attention):
        return [], []
    e = element_size(plan.dtype)
    width_in = sum(g.n for g in lay.gemms if g.layer in SCAN_IN_GEMMS) // plan.tp
    width_out = sum(g.k for g in lay.gemms if g.layer == SCAN_OUT_GEMM) // plan.tp
    inter = plan.spans_nodes(plan.cp, plan.tp)
    items = [
        Item(CP_COMM, f"CP all-to-all ({what})", t, t.seconds)
        for what, width in (("scan input", width_in), ("scan output", width_out))
        for t in [rates.collective_time("all_to_all", plan.tokens * width * e, plan.cp, inter)]
    ]
    return items, items


def unfused_scores_bytes(plan: Plan, scores: int, pass_: str) -> float:
    """Bytes the elementwise passes over the score matrix move besides the batched GEMMs' own operands
    (docs/project.md, "Unfused attention"): forward the fused scale-mask-softmax reads the scores and writes the
    probabilities (2e per score), dropout reads them and writes its 1-byte mask and the dropped copy (2e + 1);
    backward dropout reads the gradient and the mask and writes (2e + 1), the softmax backward reads the
    probabilities and their gradient and writes the scores' gradient (3e)."""
    e = element_size(plan.dtype)
    drop = (2 * e + 1) if plan.attention_dropout else 0
    return scores * ((2 * e if pass_ == "fwd" else 3 * e) + drop)


def unfused_attention_time(rates: Rates, shape: AttentionShape, plan: Plan, pass_: str) -> Timed:
    """Megatron-Core's unfused core attention (``DotProductAttention``: baddbmm Q·Kᵀ over every query head, the
    fused scale-mask-softmax, dropout, bmm P·V) for one rank and micro-batch: its batched GEMMs at the GEMM rate
    (forward Q·Kᵀ and P·V; backward dP = dO·Vᵀ, dV = Pᵀ·dO, dQ = dS·K, dK = dSᵀ·Q), each over b·h/tp batches of the
    whole s/cp × s matrix (masked scores are computed too), plus the elementwise passes over the scores at the
    memory rate (``unfused_scores_bytes``)."""
    sq, sk, batches = plan.seqlen // plan.cp, plan.seqlen, plan.mbs * shape.num_head_q
    dqk, dv = shape.head_dim_qk, shape.head_dim_v
    if pass_ == "fwd":
        shapes = [(sq, sk, dqk), (sq, dv, sk)]
    else:
        shapes = [(sq, sk, dv), (sk, dv, sq), (sq, dqk, sk), (sk, dqk, sq)]
    gemms = [rates.gemm_time(m, n, k, batches) for m, n, k in shapes]
    passes = (1 if pass_ == "fwd" else 2) + (1 if plan.attention_dropout else 0)
    elementwise = rates.memory_time(unfused_scores_bytes(plan, batches * sq * sk, pass_), kernels=passes)
    parts = [*gemms, elementwise]
    source = ESTIMATED if any(t.source == ESTIMATED for t in parts) else INTERPOLATED
    note = f"unfused: {len(gemms)} batched GEMMs ({gemms[0].note}) + softmax passes ({elementwise.note})"
    return Timed(sum(t.seconds for t in parts), source, note)


def memory_bytes(cfg: ModelConfig, lay: Layer, plan: Plan) -> float:
    """Bytes the memory-bound operators of one layer's forward move (docs/project.md, "Memory-bound operators"):
    two norms and two residual adds on the rank's activations (T/tp of them with sequence parallelism), rotary
    embedding on q and k, the MLP's activation function, and for MoE the router's softmax/top-k and the token
    permutation there and back. Backward moves twice as much."""
    e = element_size(plan.dtype)
    t, h, tp = plan.tokens, cfg.hidden_size, plan.tp
    t_seq = t // tp if plan.sp else t
    total = (2 + 2 + 3 + 3) * t_seq * h * e  # norms read+write, residual adds read 2 write 1
    if plan.hidden_dropout:
        total += 2 * t_seq * h  # the output dropouts' 1-byte masks (fused into the residual adds)
    for op in lay.attention:
        if op.kind not in (LINEAR, "indexer"):
            total += 2 * t * (op.heads_q + op.heads_kv) // tp * op.head_dim_qk * e  # rotary on q and k
    for g in lay.gemms:
        if g.layer in ("mlp_gate_up", "shared_gate_up"):
            total += 3 * t * g.n // 2 // tp * e  # SwiGLU: read gate and up, write the product
        elif g.layer == "mlp_up":
            total += 2 * t * g.n // tp * e  # GELU: read, write
        elif g.layer == "expert_gate_up":
            total += routing_bytes(g, t // tp, h, e, sorts_chunks(plan, g))
    return total + expert_memory_bytes(lay, plan)


# Kernels one layer's memory-bound operators launch (docs/project.md, "Fixed cost per kernel"). Fused (Megatron-Core
# with Transformer Engine): per block a norm and a residual add (dropout fused in), fused RoPE on q and on k, the
# fused activation; backward each again, the norms' weight-gradient reduction besides. Eager, op by op as transformers
# runs them: an RMSNorm is 8 kernels (upcast, pow, mean, add eps, rsqrt, mul, downcast, × weight), rotary 5 on each
# of q and k (× cos, neg, cat, × sin, add), the attention output's transpose copy, SwiGLU's silu and mul, a residual
# add; backward about twice as many. A MoE layer's router adds softmax/top-k and the permutation there and back.
FUSED_KERNELS = {"norm": 1, "add": 1, "rotary": 2, "act": 1, "router": 3, "permute": 2}
EAGER_KERNELS = {"norm": 8, "add": 1, "rotary": 10, "act": 2, "router": 6, "permute": 4, "transpose": 1}


def memory_kernels(cfg: ModelConfig, lay: Layer, eager: bool, moe_measured: bool = False) -> tuple[int, int]:
    """(forward, backward) kernels the memory-bound operators ``memory_bytes`` (or ``eager_memory_bytes``) counts
    launch for one layer and micro-batch; ``moe_measured``: without the router's, permutation's and experts'
    activation kernels, whose measured rows (``measured_moe``) hold their own."""
    k = EAGER_KERNELS if eager else FUSED_KERNELS
    fwd = 2 * (k["norm"] + k["add"])
    for op in lay.attention:
        if op.kind not in (LINEAR, "indexer"):
            fwd += k["rotary"] + k.get("transpose", 0) + (2 * k["norm"] if eager and has_qk_norm(lay) else 0)
    for g in lay.gemms:
        if g.layer in ("mlp_gate_up", "shared_gate_up", "mlp_up"):
            fwd += k["act"]
        elif g.layer == "expert_gate_up" and not moe_measured:
            fwd += k["router"] + k["permute"] + k["act"]
    return fwd, 2 * fwd + 2  # backward: each again, twice the work, and the norms' weight gradients


def routing_bytes(g: Gemm, local: int, h: int, e: int, sort: bool = False) -> int:
    """A MoE layer's router softmax and top-k over fp32 logits and the token permutation there and back (read and
    write each) for ``local`` tokens, forward; ``sort``: the all-to-all dispatcher's regrouping of the received
    tokens by local expert after the dispatch and back before the combine (read and write each) as well."""
    return 2 * local * g.experts * 4 + (8 if sort else 4) * local * g.top_k * h * e


def sorts_chunks(plan: Plan, g: Gemm) -> bool:
    """Whether Megatron's all-to-all dispatcher sorts the tokens it received by local expert (``sort_chunks_by_idxs``
    in ``token_dispatcher.py``: with EP and more than one local expert); the flex dispatcher permutes once, after
    its dispatch."""
    return plan.dispatcher != "flex" and plan.ep > 1 and g.experts // plan.ep > 1


# Bytes per element that PyTorch eager's operators read and write, op by op, where transformers' model runs them
# (docs/project.md, "Memory-bound operators"; tests/test_project.py counts them with a dispatch mode). RMSNorm (fp32
# inside): forward upcast, pow, mean, x·rsqrt, downcast, ×weight; its backward 96 B in 16 or 32 bits. Rotary on q
# and k, per element: 13·e forward (q·cos, the half-rotation's neg and cat, ·sin, add), 14.5·e backward. SwiGLU per
# intermediate element 5·e / 9·e, a residual add per element 3·e / 6·e, the attention output's transpose copy
# 2·e / 3·e; the loss per logit: the fp32 copy, log_softmax, and in backward nll_loss's gradient, log_softmax's and
# the downcast.
EAGER_NORM_BWD_BYTES = 96


def eager_norm_bytes(e: int) -> tuple[float, float]:
    """(forward, backward) bytes an eager RMSNorm moves per element in a dtype of ``e`` bytes (the casts to and from
    fp32 cost nothing in fp32)."""
    casts = 0 if e >= 4 else (e + 4) * 2
    return casts + 8 + 4 + 8 + 2 * e, EAGER_NORM_BWD_BYTES


def eager_loss_bytes(e: int) -> tuple[float, float]:
    """(forward, backward) bytes transformers' loss (torch ``cross_entropy`` on ``.float()`` logits) moves per
    logit."""
    cast = 0 if e >= 4 else e + 4
    return cast + 8, 4 + 12 + cast


def eager_memory_bytes(cfg: ModelConfig, lay: Layer, plan: Plan) -> tuple[float, float]:
    """(forward, backward) bytes one layer's memory-bound operators move in PyTorch eager, op by op as transformers
    runs them (``--memory-ops eager``; ``--validate`` trains that): the two norms and q/k norms (fp32 inside), rotary
    on q and k, the attention output's transpose, the MLP's activation, two residual adds; a MoE layer's router and
    permutation as ``memory_bytes`` counts them, the routed experts' SwiGLU as a dense one's."""
    e = element_size(plan.dtype)
    t, h, tp = plan.tokens, cfg.hidden_size, plan.tp
    t_seq = t // tp if plan.sp else t
    norm_f, norm_b = eager_norm_bytes(e)
    fwd = 2 * t_seq * h * (norm_f + 3 * e)
    bwd = 2 * t_seq * h * (norm_b + 6 * e)
    if plan.hidden_dropout:  # the output dropouts' 1-byte masks, written forward and read backward
        fwd, bwd = fwd + 2 * t_seq * h, bwd + 2 * t_seq * h
    qk_norm = has_qk_norm(lay)
    for op in lay.attention:
        if op.kind in (LINEAR, "indexer"):
            continue
        qk = t * (op.heads_q + op.heads_kv) // tp * op.head_dim_qk
        out = t * op.heads_q // tp * op.head_dim_v
        fwd += qk * 13 * e + out * 2 * e + (qk * norm_f if qk_norm else 0)
        bwd += qk * 14.5 * e + out * 3 * e + (qk * norm_b if qk_norm else 0)
    for g in lay.gemms:
        if g.layer in ("mlp_gate_up", "shared_gate_up"):
            width = t * g.n // 2 // tp
            fwd, bwd = fwd + 5 * e * width, bwd + 9 * e * width
        elif g.layer == "mlp_up":
            width = t * g.n // tp
            fwd, bwd = fwd + 2 * e * width, bwd + 3 * e * width
        elif g.layer == "expert_gate_up":
            routing = routing_bytes(g, t // tp, h, e, sorts_chunks(plan, g))
            # the tokens a rank's experts see, as expert_memory_bytes counts them
            width = plan.tokens // tp * g.top_k * plan.expert_tp * (g.n // 2 // plan.expert_tp)
            fwd, bwd = fwd + routing + 5 * e * width, bwd + 2 * routing + 9 * e * width
    return fwd, bwd


def expert_memory_bytes(lay: Layer, plan: Plan) -> int:
    """The part of ``memory_bytes`` that runs on the routed experts' tokens between a MoE layer's dispatch and
    combine (their SwiGLU): what Megatron's A2A overlap runs as the MoE block (docs/project.md, "A step")."""
    total = 0
    for g in lay.gemms:
        if g.layer == "expert_gate_up":
            # tokens a rank's experts see (etp·ep·local·k/E·E/ep)
            rows = plan.tokens // plan.tp * g.top_k * plan.expert_tp
            total += 3 * rows * g.n // 2 // plan.expert_tp * element_size(plan.dtype)
    return total


@dataclass(frozen=True)
class Unfused:
    """What Megatron-Core runs op by op where a model's feature has no fused kernel (``megatron_unfused``): bytes
    and kernels per layer and micro-batch, forward and backward; ``expert``: the forward bytes inside the MoE block
    (between dispatch and combine)."""

    fwd: float = 0.0
    bwd: float = 0.0
    k_fwd: int = 0
    k_bwd: int = 0
    expert: float = 0.0
    k_expert: int = 0  # of k_fwd, the kernels inside the MoE block


def megatron_unfused(cfg: ModelConfig, lay: Layer, plan: Plan, experts: bool = True) -> Unfused:
    """Memory-bound work Megatron-Core runs unfused for three model features (docs/project.md, "Memory-bound
    operators"; Megatron-LM at cba6b0ed0f and 2edffadb52, Megatron-Bridge r0.2.0 and r0.4.0):

    - a clamped GLU in the experts (gpt-oss's ±7 limit): ``fusions/fused_bias_geglu.py``,
      ``weighted_bias_quick_geglu_impl``, splits the fc1 output, clamps both halves and concatenates them in eager
      before the compiled GLU: per fc1-output element 4·e bytes forward (two clamps, a cat), 5·e backward, and the
      forward again in backward when ``moe_act`` is recomputed; 3 kernels each way;
    - expert biases on fc2: ``moe/experts.py``, ``TEGroupedMLP._apply_bias``, adds each local expert's bias times
      its routing probability in a Python loop and concatenates: per fc2-output element 6·e forward, 8·e backward,
      in 2·E + 2 kernels forward and 4·E + 1 backward (E local experts);
    - YaRN RoPE (a factor above 1) outside MLA: Megatron's fused RoPE requires mscale 1 (``rope_utils.py``) and
      Megatron-Bridge turns fusion off for any position embedding but "rope" (``utils/fusions.py``,
      ``validate_rope_fusion_compatibility``): rotary as PyTorch's ops run it, 13·e forward and 14.5·e backward per q
      and k element plus a cat each way (2·e), for fused RoPE's 2·e and 4·e; about 22 kernels forward (cos, sin,
      the casts and products, the half-rotation's neg and cat, the add, the cat, on q and on k) for fused RoPE's 2:
      20 more forward, 40 backward.

    ``experts``: count the experts' pieces (False where measured ``opbench moe`` rows time the block).
    """
    e = element_size(plan.dtype)
    fwd = bwd = expert = 0.0
    k_fwd = k_bwd = k_expert = 0
    recompute_act = plan.recompute == "selective" and "moe_act" in plan.recompute_modules
    for g in lay.gemms if experts else ():
        if g.layer != "expert_gate_up":
            continue
        rows = plan.tokens // plan.tp * g.top_k * plan.expert_tp  # the rows a rank's experts see (expert_memory_bytes)
        if cfg.extra.get("glu_clamp"):
            elems = rows * (g.n // plan.expert_tp)
            fwd, expert = fwd + 4 * e * elems, expert + 4 * e * elems
            bwd += (5 + (4 if recompute_act else 0)) * e * elems
            k_fwd, k_bwd, k_expert = k_fwd + 3, k_bwd + 3 + (3 if recompute_act else 0), k_expert + 3
        if cfg.extra.get("expert_bias"):
            local = max(1, g.experts // max(1, plan.ep))
            elems = rows * cfg.hidden_size
            fwd, expert, bwd = fwd + 6 * e * elems, expert + 6 * e * elems, bwd + 8 * e * elems
            k_fwd, k_bwd, k_expert = k_fwd + 2 * local + 2, k_bwd + 4 * local + 1, k_expert + 2 * local + 2
    if cfg.extra.get("rope_type") == "yarn" and (cfg.extra.get("rope_factor") or 1.0) > 1 and cfg.kv_lora_rank is None:
        for op in lay.attention:
            if op.kind in (LINEAR, "indexer") or op.kind in SCAN_KINDS:
                continue
            qk = plan.tokens * (op.heads_q + op.heads_kv) // plan.tp * op.head_dim_qk
            fwd, bwd = fwd + (13 + 2 - 2) * e * qk, bwd + (14.5 + 2 - 4) * e * qk
            k_fwd, k_bwd = k_fwd + 20, k_bwd + 40
    return Unfused(fwd, bwd, k_fwd, k_bwd, expert, k_expert)


def routed_top_k(cfg: ModelConfig, lay: Layer) -> int:
    """Experts per token of a MoE layer (its routed GEMMs say; else the config)."""
    return next((g.top_k for g in lay.gemms if g.top_k), cfg.num_experts_per_tok)


def layer_work(cfg: ModelConfig, lay: Layer, plan: Plan, rates: Rates, profile: str = "fused") -> Work:
    """Forward and backward of decoder layer ``lay`` for one micro-batch on one rank, recomputation included;
    ``profile`` says whose tensor parallelism runs it (``tp_comm_items``)."""
    par = plan.model_parallel()
    t, e, h = plan.tokens, element_size(plan.dtype), cfg.hidden_size
    local = t // plan.tp if cfg.is_moe else t
    fwd: list[Item] = []
    bwd: list[Item] = []
    cast_fwd = cast_bwd = expert_cast = 0.0
    cast_k_fwd = cast_k_bwd = expert_cast_k = 0
    in_fp8: set[str] = set()
    measured = measured_moe(cfg, lay, plan, rates)
    for g in layer_gemms(lay, t, local, par):
        if isinstance(measured, tuple) and g.name in MEASURED_GEMMS:
            continue  # opbench moe's rows time them
        fp8 = fp8_gemm(plan, g.name, g.n, g.k, g.groups)
        in_fp8 |= {g.name} if fp8 else set()
        f, b = _gemm_items(rates, g, fp8)
        fwd += f
        bwd += b
        if fp8:
            cf, cb = fp8_cast_bytes(plan, g)
            cast_fwd, cast_bwd = cast_fwd + cf, cast_bwd + cb
            expert_cast += cf + cb if _in_moe_block(g.name) else 0.0
            kf, kb = fp8_cast_kernels(plan, g)
            cast_k_fwd, cast_k_bwd = cast_k_fwd + kf, cast_k_bwd + kb
            expert_cast_k += kf + kb if _in_moe_block(g.name) else 0
    attn_fwd: list[Item] = []
    for op in lay.attention:
        if op.kind in SCAN_KINDS:  # Megatron's all-to-all CP: the whole sequence on heads / (tp·cp) (plan.py)
            shape = operator_shape(cfg, op, plan.seqlen, plan.tp * plan.cp, 1)
        else:
            shape = operator_shape(cfg, op, plan.seqlen, plan.tp, plan.cp)
        af, ab = _attention_items(rates, shape, plan)
        attn_fwd.append(af)
        fwd.append(af)
        bwd.append(ab)
    if isinstance(measured, str):  # the estimate stands: its expert GEMMs' notes say why no row was used
        fwd = [_noted(i, measured) if i.category == GEMM and _in_moe_block(i.name) else i for i in fwd]
    mem = memory_bytes(cfg, lay, plan)
    eager = rates.a.memory_ops == "eager"
    mem_fwd, mem_bwd = eager_memory_bytes(cfg, lay, plan) if eager else (mem, 2 * mem)
    # Megatron-Core's unfused pieces of some models' features (a measured MoE block holds its experts' own)
    un = Unfused() if eager else megatron_unfused(cfg, lay, plan, experts=not isinstance(measured, tuple))
    mem, mem_fwd, mem_bwd = mem + un.fwd, mem_fwd + un.fwd, mem_bwd + un.bwd
    # the busiest expert-parallel rank's experts see imbalance × the mean tokens (docs/project.md, "MoE cost model")
    imbalance = rates.a.moe_imbalance if lay.moe and plan.ep > 1 else 1.0
    expert_bytes = 0 if isinstance(measured, tuple) else expert_memory_bytes(lay, plan) + un.expert
    extra = (imbalance - 1) * expert_bytes
    if isinstance(measured, tuple):
        moe_f, moe_b = moe_memory_bytes(cfg, lay, plan, eager)
        mem, mem_fwd, mem_bwd = mem - moe_f if not eager else mem, mem_fwd - moe_f, mem_bwd - moe_b
    mem, mem_fwd, mem_bwd = mem + extra, mem_fwd + extra, mem_bwd + 2 * extra
    k_fwd, k_bwd = memory_kernels(cfg, lay, eager, isinstance(measured, tuple))
    k_fwd, k_bwd = k_fwd + un.k_fwd, k_bwd + un.k_bwd
    mem_f, mem_b = (compiled(rates.a, rates.memory_time(n, eager, k)) for n, k in ((mem_fwd, k_fwd), (mem_bwd, k_bwd)))
    fwd.append(_compute(MEMORY, "norms, residuals, rotary, activations", mem_f))  # compiled: --compile fuses them
    bwd.append(_compute(MEMORY, "norms, residuals, rotary, activations", mem_b))
    if isinstance(measured, tuple):
        fwd += measured[0]
        bwd += measured[1]
    if cast_fwd:
        fwd.append(_compute(MEMORY, "FP8 casts", rates.memory_time(cast_fwd, kernels=max(1, cast_k_fwd))))
        bwd.append(_compute(MEMORY, "FP8 casts", rates.memory_time(cast_bwd, kernels=max(1, cast_k_bwd))))

    if plan.tp > 1:
        fwd_tp, bwd_tp = tp_comm_items(cfg, lay, plan, rates, bwd, profile, in_fp8)
        fwd += fwd_tp
        bwd += bwd_tp
    else:  # experts may still be split (--etp above --tp: Megatron-Core's MoE parallel folding)
        routed = expert_tp_items(cfg, lay, plan, rates)
        fwd += routed
        bwd += routed

    # Expert parallelism: the all-to-all dispatcher sends a rank's T/tp tokens, top_k copies each, out and back.
    # Expert-parallel ranks sit expert_tp apart (Megatron-Core orders expert ranks etp, ep, dp, pp).
    if lay.moe and plan.ep > 1:
        top_k = routed_top_k(cfg, lay)
        stride = plan.expert_tp
        if plan.dispatcher == "flex":  # DeepEP / HybridEP: a token once per node and per GPU its experts are on
            experts = next((g.experts for g in lay.gemms if g.experts), cfg.n_routed_experts)
            a2a = rates.flex_dispatch_time(h * e, local, top_k, experts, plan.ep, stride, plan.domain)
        else:
            a2a = rates.collective_time(
                "all_to_all",
                local * top_k * h * e,
                plan.ep,
                plan.spans_nodes(plan.ep, stride),
                plan.node_share(plan.ep, stride),
            )
        keep_ep = 1 - rates.a.ep_overlap
        fwd += [Item(EP_COMM, "EP all-to-all", a2a, a2a.seconds * keep_ep)] * 2
        bwd += [Item(EP_COMM, "EP all-to-all", a2a, a2a.seconds * keep_ep)] * 2
    if imbalance != 1.0:
        fwd, bwd = imbalanced(fwd, imbalance), imbalanced(bwd, imbalance)

    # Context parallelism: the ring passes K and V (and in backward their gradients too) cp − 1 times.
    if plan.cp > 1:
        fwd_a2a, bwd_a2a = scan_cp_items(lay, plan, rates)
        fwd += fwd_a2a
        bwd += bwd_a2a
        for op, f_item in zip(lay.attention, attn_fwd):
            if op.kind in SCAN_KINDS:
                continue
            kv = 2 * t * max(1, op.heads_kv // plan.tp) * op.head_dim_qk * e
            step = rates.collective_time("send_recv", kv, 2, plan.spans_nodes(plan.cp, plan.tp))
            for where, mult, compute in ((fwd, 1, f_item.timed.seconds), (bwd, 2, 2.5 * f_item.timed.seconds)):
                comm = step.seconds * mult * (plan.cp - 1)
                exposed = max(0.0, comm - compute) if rates.a.cp_overlap else comm
                where.append(Item(CP_COMM, "CP ring exchange", Timed(comm, step.source, step.note), exposed))

    if plan.recompute == "full":  # the layer's forward runs again in backward, from its saved input
        bwd = [replace(i, name=f"recompute {i.name}") for i in fwd] + bwd
    elif plan.recompute == "selective":  # the forward of what --recompute-modules names (default: core attention)
        bwd = [replace(i, name=f"recompute {i.name}") for i in recomputed(plan, fwd, attn_fwd)] + bwd
    elif plan.recompute == "op":  # torchtitan's per-op policy: the even matmuls and every memory-bound op again
        again: dict[str, float] = {}
        whole: dict[str, float] = {}
        for mm in op_matmuls(cfg, lay, plan):
            whole[mm.gemm] = whole.get(mm.gemm, 0) + mm.width
            again[mm.gemm] = again.get(mm.gemm, 0) + (0 if mm.saved else mm.width)
        redo = []
        for i in fwd:
            gemm = i.name.removesuffix(" fwd")
            if i.category == GEMM and again.get(gemm):
                share = again[gemm] / whole[gemm]
                host = None if i.host_s is None else i.host_s * share
                timed = replace(i.timed, seconds=i.timed.seconds * share)
                redo.append(replace(i, name=f"recompute {i.name}", timed=timed, exposed=0, host_s=host))
            elif i.category == MEMORY:
                redo.append(replace(i, name=f"recompute {i.name}"))
        if plan.sp and profile == "eager":  # the all-gathers are not in the policy's save list: run again
            redo += [replace(i, name=f"recompute {i.name}") for i in fwd if i.name == TP_ALL_GATHER]
        bwd = [replace(i, exposed=i.exposed if i.category == TP_COMM else i.timed.seconds) for i in redo] + bwd
    if plan.moe_a2a_overlap and lay.moe and plan.ep > 1:
        # the MoE block's share of each memory-bound item's time: its bytes at the memory rate and its kernels at
        # their fixed cost (the activation's kernel and Megatron's unfused expert pieces; the experts' casts)
        bw, kc = rates.memory_bandwidth().seconds, rates.kernel_cost().seconds
        act = 0 if isinstance(measured, tuple) else (EAGER_KERNELS if eager else FUSED_KERNELS)["act"]  # rows: own
        mem_t = mem / bw + k_fwd * kc
        cast_t = (cast_fwd + cast_bwd) / bw + (cast_k_fwd + cast_k_bwd) * kc
        shares = {
            "norms, residuals, rotary, activations": (
                (imbalance * expert_bytes / bw + (act + un.k_expert) * kc) / mem_t if mem_t else 0.0
            ),
            "FP8 casts": (expert_cast / bw + expert_cast_k * kc) / cast_t if cast_t else 0.0,
        }
        fwd, bwd = a2a_overlapped(fwd, bwd, shares, paired_share(plan), rates.a.moe_a2a_hidden)
    return Work(tuple(fwd), tuple(bwd))


# The GEMMs a MoE layer's measured block (opbench moe rows) replaces; the shared experts stay GEMM rows
MEASURED_GEMMS = ("router", "expert_gate_up", "expert_down")


MEASURED_PERMUTATION = "token permutation (opbench moe)"  # the item of a MoE layer timed from opbench moe rows


def measured_moe(cfg: ModelConfig, lay: Layer, plan: Plan, rates: Rates) -> tuple[list[Item], list[Item]] | str | None:
    """A MoE layer's router (+ scoring and top-k), local permutation there and back, and routed experts (gate/up,
    activation, down), forward and backward, from ``opbench moe`` rows of its shape (docs/project.md, "MoE cost
    model"): the phases on the rank's own T/tp tokens at that many tokens; the experts' at the tokens that give each
    expert the rows it gets here (etp·ep·T/tp over all the experts), × 1/ep (the rank holds E/ep of them). The
    all-to-all stays the comm rows' or the link model's, the shared experts GEMM rows. None: not a MoE layer or no
    rows; a string: why the rows were not used (the estimate stands)."""
    gate_up = next((g for g in lay.gemms if g.layer == "expert_gate_up"), None)
    if not lay.moe or gate_up is None or not rates.moe:
        return None
    if plan.fp8 != "none":
        return f"benchmark_moe rows time {plan.dtype} experts; --fp8 runs them in FP8: not used"
    shape = MoeShape(cfg.hidden_size, gate_up.experts, gate_up.top_k, gate_up.n // 2 // plan.expert_tp)
    local = plan.tokens // plan.tp
    found: dict[tuple[str, str], PhaseTime] = {}
    for phase in TOKEN_PHASES + EXPERT_PHASES:
        tokens = local if phase in TOKEN_PHASES else plan.expert_tp * plan.ep * local
        for p in ("fwd", "bwd"):
            got = rates.moe.phase_time(shape, phase, p, tokens)
            if isinstance(got, str):
                return got
            found[(phase, p)] = got

    def item(category: str, name: str, p: str, phases: tuple[str, ...], share: float = 1.0) -> Item:
        """The phases' measured time × share, calibrated as the item's class (router and experts: GEMM), and their
        rows' host issue time where every row has one: × share only for a backend that issues a call per expert
        (the rank issues E/ep of the row's E); torch._grouped_mm issues one call whatever the experts."""
        parts = [found[(ph, p)] for ph in phases]
        source = MEASURED if all(x.exact for x in parts) else INTERPOLATED
        seconds = sum(x.seconds for x in parts) * share
        timed = rates.scaled(Timed(seconds, source, "; ".join(x.note for x in parts)), category)
        hosts = [None if x.host is None else x.host * (share if x.per_expert else 1.0) for x in parts]
        host = None if any(h is None for h in hosts) else sum(h for h in hosts if h is not None)
        return Item(category, name, timed, timed.seconds, host)

    out: tuple[list[Item], list[Item]] = ([], [])
    for items, p in zip(out, ("fwd", "bwd")):
        items += [
            item(GEMM, f"router {p}", p, ("router", "topk")),
            item(MEMORY, MEASURED_PERMUTATION, p, ("permute", "unpermute_combine")),
            item(GEMM, f"expert_gate_up {p}", p, ("gate_up",), 1 / plan.ep),
            item(MEMORY, "expert activation (routed tokens)", p, ("activation",), 1 / plan.ep),
            item(GEMM, f"expert_down {p}", p, ("down",), 1 / plan.ep),
        ]
    return out


def moe_memory_bytes(cfg: ModelConfig, lay: Layer, plan: Plan, eager: bool) -> tuple[float, float]:
    """The (forward, backward) memory-bound bytes of a layer that measured MoE rows replace: the router's scoring
    and top-k, the local permutation there and back and the experts' activation, as ``memory_bytes`` (or
    ``eager_memory_bytes``) counts them; the all-to-all dispatcher's regrouping stays (opbench moe runs one GPU)."""
    e, t, h, tp = element_size(plan.dtype), plan.tokens, cfg.hidden_size, plan.tp
    fwd = bwd = 0.0
    for g in lay.gemms:
        if g.layer == "expert_gate_up":
            routing = routing_bytes(g, t // tp, h, e)
            width = t // tp * g.top_k * plan.expert_tp * (g.n // 2 // plan.expert_tp)
            act_f, act_b = (5 * e * width, 9 * e * width) if eager else (3 * e * width, 6 * e * width)
            fwd, bwd = fwd + routing + act_f, bwd + 2 * routing + act_b
    return fwd, bwd


def imbalanced(items: list[Item], factor: float) -> list[Item]:
    """The items the busiest expert-parallel rank's extra tokens lengthen, × ``factor``: its routed experts' GEMMs
    and activation, their expert-TP gathers, and the all-to-alls (the dispatch and combine end when the busiest
    rank has received, or sent back, all of its tokens)."""

    def hit(i: Item) -> bool:
        routed = i.name.endswith("(routed tokens)") or i.category == EP_COMM
        return routed or (i.category == GEMM and _in_moe_block(i.name))

    return [
        replace(i, timed=replace(i.timed, seconds=i.timed.seconds * factor), exposed=i.exposed * factor)
        if hit(i)
        else i
        for i in items
    ]


def _noted(i: Item, why: str) -> Item:
    return replace(i, timed=replace(i.timed, note=f"{i.timed.note}; {why}" if i.timed.note else why))


def _in_moe_block(gemm: str) -> bool:
    """Whether GEMM ``gemm`` runs between the dispatch and the combine: the routed experts (Megatron runs the
    shared experts in the pre-dispatch part, the permutation there and the unpermutation in the combine)."""
    return gemm.removeprefix("recompute ").startswith("expert_")


def paired_share(plan: Plan) -> float:
    """The share of micro-batch chunks whose forward Megatron's combined 1F1B runs beside another's backward: all
    but the first forward and last backward without a pipeline; under the interleaved one, all but the warm-up
    forwards (and as many cool-down backwards) of the first stage, one more than without the overlap."""
    chunks = plan.microbatches * plan.vpp
    alone = 2 * (plan.pp - 1) + (plan.vpp - 1) * plan.pp + 1  # Megatron's warm-up count, one more; 1 without pp
    return max(0, chunks - alone) / chunks


def a2a_pair_exposed(a2a: float, pre_f: float, mlp_b: float, mlp_dw: float, mlp_f: float, pre_b: float) -> float:
    """Seconds one layer's forward (of one micro-batch) and backward (of another) take beyond their compute when
    Megatron's --overlap-moe-expert-parallel-comm runs them together: the communication stream runs the backward's
    combine, the forward's dispatch, the backward's dispatch and the forward's combine (``a2a`` each), while the
    compute stream runs the forward's pre-dispatch part (attention block, router, shared experts, permutation), the
    routed experts' backward (data gradients, then weight gradients: --delay-wgrad-compute, which Megatron-Bridge's
    moe_a2a_overlap turns on with it), their forward, then the pre-dispatch part's backward; each waits for what
    it needs (docs/project.md, "A step")."""
    combine_b = a2a  # the communication stream starts with the backward's combine; compute with pre_f
    start = max(combine_b, pre_f)  # the MoE backward needs the combine's gradient, the dispatch the router's output
    mlp_b_end, dispatch_f = start + mlp_b, start + a2a
    dispatch_b = max(mlp_b_end, dispatch_f) + a2a  # after the MoE backward's data gradients
    mlp_f_end = max(mlp_b_end + mlp_dw, dispatch_f) + mlp_f  # the experts' forward needs its dispatched tokens
    combine_f = max(mlp_f_end, dispatch_b) + a2a
    pre_b_end = max(mlp_f_end, dispatch_b) + pre_b  # the attention block's backward needs the dispatch's gradient
    return max(combine_f, pre_b_end) - (pre_f + mlp_b + mlp_dw + mlp_f + pre_b)


def a2a_overlapped(
    fwd: list[Item], bwd: list[Item], moe_shares: dict[str, float], paired: float, hidden: float = 1.0
) -> tuple[list[Item], list[Item]]:
    """The layer's items with its all-to-alls exposed as Megatron's A2A overlap leaves them: ``paired`` of the
    micro-batches run each layer's forward beside another's backward (``a2a_pair_exposed``), of each all-to-all at
    most ``hidden`` hidden (--moe-a2a-hidden: what was measured, docs/project.md, "MoE cost model"), the rest alone
    (all of every all-to-all exposed). ``moe_shares``: the part of each memory-bound item that is the MoE
    block's."""

    def split(items: list[Item]) -> tuple[float, float, float]:
        """(pre-dispatch part, MoE block's data gradients and forward, MoE block's weight gradients) in seconds."""
        pre = moe = moe_dw = 0.0
        for i in items:
            if i.category == EP_COMM:
                continue
            share = moe_shares.get(i.name.removeprefix("recompute "), 0.0) if i.category == MEMORY else 0.0
            if (i.category == GEMM and _in_moe_block(i.name)) or i.name.endswith("(routed tokens)"):
                share = 1.0  # the routed experts, and their expert-TP gathers and reduce-scatters
            if i.category == GEMM and share and i.name.endswith(" wgrad"):
                moe_dw += i.exposed
                continue
            moe += share * i.exposed
            pre += (1 - share) * i.exposed
        return pre, moe, moe_dw

    a2as = [i for i in (*fwd, *bwd) if i.category == EP_COMM]
    a2a = sum(i.timed.seconds for i in a2as) / len(a2as)
    pre_f, mlp_f, _ = split(fwd)
    pre_b, mlp_b, mlp_dw = split(bwd)
    pair = a2a_pair_exposed(a2a, pre_f, mlp_b, mlp_dw, mlp_f, pre_b)
    exposed = (1 - paired) * a2a + paired * max(pair / len(a2as), (1 - hidden) * a2a)

    def hide(items: list[Item]) -> list[Item]:
        return [replace(i, exposed=exposed) if i.category == EP_COMM else i for i in items]

    return hide(fwd), hide(bwd)


TP_ALL_GATHER = "TP all-gather"
# The forward GEMMs each --recompute-modules entry runs again in backward (memory-bound work aside)
RECOMPUTED_GEMMS = {
    "mla_up_proj": ("mla_q_up", "mla_kv_up"),
    "mlp": ("mlp_gate_up", "mlp_up", "mlp_down"),
    "shared_experts": ("shared_gate_up", "shared_down"),
    "moe": ("router", "expert_gate_up", "expert_down", "shared_gate_up", "shared_down"),
}


def recomputed(plan: Plan, fwd: list[Item], attn_fwd: list[Item]) -> list[Item]:
    """The forward items selective recomputation runs again: core attention's kernels, the GEMMs of the other
    modules named, and for ``moe`` its dispatch and combine all-to-alls too (the block runs whole again)."""
    out = list(attn_fwd) if "core_attn" in plan.recompute_modules else []
    gemms = {g for m in plan.recompute_modules for g in RECOMPUTED_GEMMS.get(m, ())}
    out += [i for i in fwd if i.category == GEMM and i.name.removesuffix(" fwd") in gemms]
    if "moe" in plan.recompute_modules:
        out += [i for i in fwd if i.category == EP_COMM]
    return out


def _block(gemm: str) -> str:
    return "mlp" if gemm.startswith(("mlp_", "shared_")) else "attention"


def _column_gemm_time(items: list[Item], column: set[str], suffix: str) -> dict[str, float]:
    """Seconds of ``column``'s GEMMs of one backward pass (``suffix``: " dgrad" or " wgrad"), by block."""
    out = {"attention": 0.0, "mlp": 0.0}
    for i in items:
        gemm = i.name.removesuffix(suffix)
        if i.category == GEMM and gemm != i.name and gemm in column:
            out[_block(gemm)] += i.timed.seconds
    return out


def tp_comm_items(
    cfg: ModelConfig,
    lay: Layer,
    plan: Plan,
    rates: Rates,
    bwd: list[Item],
    profile: str,
    in_fp8: AbstractSet[str] = frozenset(),
) -> tuple[list[Item], list[Item]]:
    """The tensor-parallel collectives of one layer's two blocks (attention, MLP) and what each leaves exposed
    (docs/project.md, "A step"). With sequence parallelism each block all-gathers its input and reduce-scatters
    its output in forward; backward reduce-scatters the input gradient and all-gathers the output gradient.
    Megatron-Core and Transformer Engine (``fused``) save the local shard and all-gather the input again for the
    weight gradient, started before the data-gradient GEMM and waited for after it; the input gradient's
    reduce-scatter is started before the weight-gradient GEMM: those two hide behind the block's
    column-parallel GEMMs. PyTorch's DTensor (``eager``: torchtitan) saves the gathered input and overlaps
    nothing. Without sequence parallelism one all-reduce per block each way; Megatron's backward one is started
    before the weight gradient as well. Every exposed share is then × (1 − ``--tp-overlap``). Under FP8
    (``in_fp8``: the layer's GEMMs that run in FP8) a block whose first GEMM is FP8 gathers its input in FP8, 1
    byte an element: Transformer Engine quantizes the norm's output before the all-gather, torchao's float8 TP
    casts before it too."""
    e = element_size(plan.dtype)
    act = plan.tokens * cfg.hidden_size * e
    inter, share = plan.spans_nodes(plan.tp, 1), plan.node_share(plan.tp, 1)
    keep = 1 - rates.a.tp_overlap
    # the GEMMs that read a block's gathered input (qkv, MLA's down projections, gate/up)
    column = {
        g.layer for g in lay.gemms if g.split in (COLUMN, REPLICATED) and g.rows == ALL and g.k == cfg.hidden_size
    }
    dgrad = _column_gemm_time(bwd, column, " dgrad")
    wgrad = _column_gemm_time(bwd, column, " wgrad")
    fused = profile != "eager"

    def item(name: str, t: Timed, hidden_by: float = 0.0) -> Item:
        return Item(TP_COMM, name, t, keep * max(0.0, t.seconds - hidden_by))

    blocks: tuple[str, ...] = ("attention", "mlp")
    routed: list[Item] = []
    if plan.sp and lay.moe:
        # A MoE layer's router and all-to-all take the rank's own T/tp tokens: no gather before the block, only
        # its shared experts' (a TP-split MLP). Experts split over expert_tp > 1 ranks gather the tokens the
        # all-to-all brought (top_k copies of the group's tokens) over that group after it, and reduce-scatter
        # their outputs before the return (Megatron-Core's all-to-all dispatcher); forward and backward alike.
        shared = any(g.layer.startswith("shared_") for g in lay.gemms)
        blocks = ("attention", "mlp") if shared else ("attention",)
        routed = expert_tp_items(cfg, lay, plan, rates)
    if plan.sp:
        ag = rates.collective_time("all_gather", act, plan.tp, inter, share)
        rs = rates.collective_time("reduce_scatter", act, plan.tp, inter, share)
        fp8_blocks = {_block(name) for name in in_fp8 & set(TE_NORM_FUSED)}
        ag_fp8 = rates.collective_time("all_gather", act // e, plan.tp, inter, share) if fp8_blocks else ag
        ag_in = {b: ag_fp8 if b in fp8_blocks else ag for b in blocks}  # each block's input
        fwd_tp = [item(TP_ALL_GATHER, ag_in[b]) for b in blocks] + [item("TP reduce-scatter", rs) for _ in blocks]
        bwd_tp = [item(TP_ALL_GATHER, ag) for _ in blocks]  # the output gradient (row-parallel's input)
        for b in blocks:
            bwd_tp.append(item("TP reduce-scatter", rs, wgrad[b] if fused else 0.0))
            if fused:
                bwd_tp.append(item("TP all-gather (input again)", ag_in[b], dgrad[b]))
        return fwd_tp + routed, bwd_tp + routed
    ar = pinned_allreduce(
        rates.a, rates.collective_time("all_reduce", act, plan.tp, inter, share), act, plan.tp, inter, share
    )
    return [item("TP all-reduce", ar) for _ in blocks], [
        item("TP all-reduce", ar, wgrad[b] if fused else 0) for b in blocks
    ]


def expert_tp_items(cfg: ModelConfig, lay: Layer, plan: Plan, rates: Rates) -> list[Item]:
    """Experts split over expert_tp > 1 ranks: after the all-to-all the group all-gathers the tokens it brought
    (top_k copies of the rank's T/tp) and reduce-scatters the experts' outputs before the return (Megatron-Core's
    all-to-all dispatcher), in forward and again in backward; with or without TP of the rest of the layer. The flex
    dispatcher has none: it sends the tokens to each GPU of the expert-TP × EP group itself."""
    etp = plan.expert_tp
    if not lay.moe or etp == 1 or plan.dispatcher == "flex":  # flex sends to every GPU of the etp·ep group itself
        return []
    size = plan.tokens * cfg.hidden_size * element_size(plan.dtype) * routed_top_k(cfg, lay) * etp // plan.tp
    inter, share = plan.spans_nodes(etp, 1), plan.node_share(etp, 1)
    keep = 1 - rates.a.tp_overlap
    return [
        Item(TP_COMM, f"TP {kind.replace('_', '-')} (routed tokens)", t, keep * t.seconds)
        for kind in ("all_gather", "reduce_scatter")
        for t in (rates.collective_time(kind, size, etp, inter, share),)
    ]


def head_work(cfg: ModelConfig, plan: Plan, rates: Rates) -> Work:
    """The last piece's extra: lm_head GEMMs and the cross-entropy over fp32 logits (read bf16 logits, write fp32
    probabilities; backward reads them and writes the gradient), vocabulary split over TP."""
    g = lm_head_gemm(cfg, plan.tokens, plan.tp)
    fwd, bwd = _gemm_items(rates, g)
    e = element_size(plan.dtype)
    logits = plan.tokens * g.n
    loss_fwd, loss_bwd = float(e + 4), float(4 + e)
    eager = rates.a.memory_ops == "eager"
    if eager:  # and the final norm, op by op
        loss_fwd, loss_bwd = eager_loss_bytes(e)
        norm_f, norm_b = eager_norm_bytes(e)
        t_seq = plan.tokens // plan.tp if plan.sp else plan.tokens
        fwd.append(_compute(MEMORY, "final norm", rates.memory_time(t_seq * cfg.hidden_size * norm_f, eager)))
        bwd.append(_compute(MEMORY, "final norm", rates.memory_time(t_seq * cfg.hidden_size * norm_b, eager)))
    fwd.append(_compute(MEMORY, "cross-entropy", rates.memory_time(logits * loss_fwd, eager)))
    bwd.append(_compute(MEMORY, "cross-entropy", rates.memory_time(logits * loss_bwd, eager)))
    return Work(tuple(fwd), tuple(bwd))


def mtp_work(cfg: ModelConfig, plan: Plan, rates: Rates) -> Work:
    """One multi-token-prediction depth besides its decoder layer: the embedding of the next tokens, eh_proj
    (2h -> h, column-parallel) and another output layer and cross-entropy."""
    h = cfg.hidden_size
    fwd, bwd = _gemm_items(rates, LinearLayer("mtp_eh_proj", h // plan.tp, 2 * h, plan.tokens))
    extra = Work(tuple(fwd), tuple(bwd))
    return embedding_work(cfg, plan, rates) + extra + head_work(cfg, plan, rates)


def embedding_work(cfg: ModelConfig, plan: Plan, rates: Rates) -> Work:
    """The first piece's extra: the embedding gather (read and write T·h) and, in backward, its scatter-add into
    an fp32 gradient. Gemma 4's per-layer embeddings gather layers × PLE width more per token the same way (their
    projection and gates are GEMM rows: ple_model_proj, ple_gate, ple_proj)."""
    e = element_size(plan.dtype)
    act = plan.tokens * (cfg.hidden_size + (cfg.num_hidden_layers or 0) * cfg.extra.get("ple_dim", 0))
    return Work(
        (_compute(MEMORY, "embedding", rates.memory_time(2 * act * e)),),
        (_compute(MEMORY, "embedding", rates.memory_time(act * (e + 8))),),
    )
