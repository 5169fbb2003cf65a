"""Memory per GPU: parameters, gradients and optimizer state under the chosen sharding, activations saved for
backward under the recomputation mode and pipeline schedule, and the transient buffers a step peaks with
(docs/project.md, "Memory"). Pure Python.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from opbench.core.dtypes import element_size
from opbench.gemm.shapes import layer_gemms, padded_vocab
from opbench.models import ModelConfig
from opbench.models.architectures import architecture, decoder_layers
from opbench.models.layout import (
    CHUNKED,
    COLUMN,
    EXPERT_COLUMN,
    EXPERT_ROW,
    FULL,
    HC,
    INDEXER,
    KDA,
    LINEAR,
    LINEAR_CHUNK,
    MAMBA2,
    REPLICATED,
    ROW,
    SLIDING,
    SPARSE,
    Attention,
    Layer,
)
from opbench.models.params import ParamSpec, parameter_shapes

from .plan import RECOMPUTE_MODULES, Plan, fp8_gemm

GIB = 1 << 30
# The kinds Megatron's unfused core attention runs (--attention-backend unfused): softmax attention, whose scores it
# materialises; memory here and time in workload.py both read this
UNFUSED_KINDS = (FULL, SLIDING, CHUNKED)
ADAM_STEP_BYTES = 4  # torch's Adam keeps a float32 'step' tensor per parameter tensor
# Transformer Engine's cached FP8 weight (1 byte) and, on Hopper and MI300 (no FP8 GEMM but TN), its transpose
# (1 byte): kept from a step's first micro-batch on (docs/project.md, "FP8")
TE_WEIGHT_CACHE_BYTES = 2


# The math libraries' workspaces a Megatron/Transformer Engine process allocates through PyTorch's caching allocator
# (so max_memory_allocated counts them), 32 MiB each on Hopper: PyTorch's cuBLAS and cuBLASLt workspaces and
# Transformer Engine's cuBLAS workspace. Megatron-LM's CI runs hold 96-106 MiB beyond their parameters, gradients
# and optimizer state after a step (docs/project.md, "Memory")
LIBRARY_WORKSPACE_BYTES = 3 * (32 << 20)
# PyTorch eager on a GPU (the eager profile): a cuBLAS handle and workspace per thread, the forward's and autograd's
# backward thread, 32 MiB each on Hopper; measured on an H200 (torch 2.11): 64-68 MiB beyond what the tensors hold
EAGER_WORKSPACE_BYTES = 2 * (32 << 20)
# transformers' eager RMSNorm computes in fp32: it keeps the fp32 copy of its input, 4 bytes an element in any dtype
EAGER_NORM_INPUT_BYTES = 4
# transformers' eager loss at its peak, per logit: two fp32 gradients (docs/project.md, "Memory")
EAGER_LOSS_BYTES = 8
# ... and with TP communication overlapped by its userbuffers (--tp-overlap), a cuBLAS workspace for each of the
# three streams those GEMMs run on: Megatron's CI tp2 pp2 FP8 run with --tp-comm-overlap holds 106 MiB more than
# the same model's runs without (one run: an inference from it, docs/project.md)
UB_WORKSPACE_BYTES = 3 * (32 << 20)
# ... and for MoE, Transformer Engine's grouped GEMM runs the experts on its four cuBLAS streams, a workspace each
# (Megatron's CI MoE run with --moe-grouped-gemm holds 132 MiB beyond the dense runs' 96-106 MiB)
GROUPED_GEMM_WORKSPACE_BYTES = 4 * (32 << 20)


@dataclass(frozen=True)
class Memory:
    """Bytes one GPU holds at its peak: persistent state and the step's activations and transient buffers."""

    params: int
    grads: int
    optimizer: int
    activations: int
    # transient: unsharded FSDP units, logits and their gradient, a recomputed layer; and (fused profile) the math
    # libraries' workspaces
    buffers: int
    # Bytes of the sum above never held at once: FSDP with one micro-batch allocates its gradients during backward
    # (zero_grad sets them to None), as the activations are freed, so the peak holds one or the other
    not_at_peak: int = 0

    @property
    def total(self) -> int:
        """The peak: every part, less what is never held at the same time."""
        return self.params + self.grads + self.optimizer + self.activations + self.buffers - self.not_at_peak


@dataclass(frozen=True)
class StageParams:
    """A stage's parameters on one rank: element count and tensor count, and for FSDP the padded shard counts."""

    numel: int
    tensors: int
    fsdp_padded: int  # Σ ceil(d0 / shard) · rest: what FSDP2 keeps per rank (its sharded storage)
    fsdp_local: int  # Σ rank 0's rows · rest: the sharded gradient and optimizer state (unpadded)
    largest_unit: int  # the largest FSDP unit that is a decoder layer, elements on this rank
    zero1_numel: int  # ZeRO-1 (torch's ZeroRedundancyOptimizer): the parameters the fullest rank keeps state of
    zero1_tensors: int
    root_unit: int = 0  # the FSDP root unit (embedding, final norm, lm_head as this stage has them), on this rank
    shard: int = 1  # the data-parallel ranks (dp·cp) a sharded optimizer splits over
    expert_numel: int = 0  # of numel, the routed experts' weights on this rank
    expert_shard: int = 1  # the expert data-parallel ranks (world / (pp·ep·etp)) their optimizer state splits over

    def zero1(self, profile: str) -> tuple[int, int]:
        """(elements, tensors) one rank keeps optimizer state for under ZeRO-1: Megatron-Core's distributed
        optimizer (the fused profile) splits the flat gradient buffer evenly over the DP ranks, the routed
        experts' buffer over the expert data-parallel ranks (one under EP = DP: no split); torch's
        ZeroRedundancyOptimizer (eager) assigns whole parameters, so a large embedding lands on one rank
        (docs/project.md, "Memory")."""
        if profile == "eager":
            return self.zero1_numel, self.zero1_tensors
        dense = self.numel - self.expert_numel
        return -(-dense // self.shard) + -(-self.expert_numel // self.expert_shard), -(-self.tensors // self.shard)


def _gemm_weight(n: int, k: int, split: str, experts: int, tp: int, ep: int, etp: int) -> tuple[int, int]:
    """(elements on one rank, elements in the whole model) of one GEMM's weight."""
    whole = n * k * max(1, experts)
    if split == COLUMN or split == ROW:
        return whole // tp, whole
    if split in (EXPERT_COLUMN, EXPERT_ROW):
        return whole // (ep * etp), whole
    if split == REPLICATED:
        return whole, whole
    return whole // tp, whole


def layer_numel(lay: Layer, plan: Plan) -> int:
    """One decoder layer's parameters on one rank: GEMM weights split as their GEMMs are; everything else
    (norms, biases, sinks, convolutions) replicated."""
    total = sum(math.prod(shape) for _, shape in lay.params)
    rank = whole = 0
    for g in lay.gemms:
        r, w = _gemm_weight(g.n, g.k, g.split, g.experts, plan.tp, plan.ep, plan.expert_tp)
        rank += r
        whole += w
    return rank + max(0, total - whole)


def stage_layers(
    cfg: ModelConfig, plan: Plan, stage: int, layers: Sequence[Layer] | None = None
) -> list[tuple[int, Layer]]:
    """(chunk, layer) of every decoder layer pipeline stage ``stage`` holds: chunk c of stage s is the model's
    piece ``plan.piece(c, s)`` (c·pp + s; in a V, piece 2pp − 1 − s for c = 1), each of ``plan.piece_layers``
    consecutive layers (layers / (pp·vpp) when even).
    ``layers``: decoder_layers(cfg), if known."""
    layers = layers if layers is not None else decoder_layers(cfg)
    counts = plan.piece_layers(len(layers))
    assert counts is not None, "plan.problems() refuses a split that does not work"
    starts = [sum(counts[:piece]) for piece in range(len(counts))]
    out = []
    for chunk in range(plan.vpp):
        piece = plan.piece(chunk, stage)
        out += [(chunk, lay) for lay in layers[starts[piece] : starts[piece] + counts[piece]]]
        if piece == len(counts) - 1 and layers:  # multi-token prediction: layers like the last, after it
            out += [(chunk, replace(layers[-1], index=len(layers) + d)) for d in range(plan.mtp_layers)]
    return out


def mtp_numel(cfg: ModelConfig, plan: Plan) -> int:
    """Parameters multi-token prediction adds to the last stage besides its layers, on one rank: per depth two
    norms and a final norm (h each) and eh_proj (2h -> h, split over TP), and under a pipeline the word embedding
    the MTP input needs (vocabulary split over TP) unless the output layer already shares it."""
    if not plan.mtp_layers:
        return 0
    h = cfg.hidden_size
    extra = plan.mtp_layers * (3 * h + 2 * h * h // plan.tp)
    if plan.pp > 1 and not cfg.tie_word_embeddings:
        extra += padded_vocab(cfg.vocab_size, plan.tp) // plan.tp * h
    return extra


def _shard_counts(specs: list[ParamSpec], shard: int) -> tuple[int, int]:
    padded = local = 0
    for s in specs:
        d0 = s.shape[0] if s.shape else 1
        rest = s.numel // d0 if d0 else 0
        chunk = -(-d0 // shard)
        padded += chunk * rest
        local += min(chunk, d0) * rest
    return padded, local


def stage_params(cfg: ModelConfig, plan: Plan, stage: int, layers: Sequence[Layer] | None = None) -> StageParams:
    """The parameters stage ``stage`` holds on one rank. Without tensor or expert parallelism they are the real
    model's tensors (params.parameter_shapes: exact, FSDP padding included); with them, each GEMM weight is split
    as its GEMM is and the embedding and lm_head by vocabulary (padded to 128·tp, as Megatron)."""
    first, last = stage == 0, stage == plan.last_stage
    shard = plan.dp * plan.cp
    if plan.tp == plan.ep == plan.expert_tp == 1 and not plan.mtp_layers:  # (MTP's are not the HF model's)
        specs = parameter_shapes(cfg)
        mine = {f"layers.{lay.index}" for _, lay in stage_layers(cfg, plan, stage, layers)}
        root = architecture(cfg)
        head_names = {n for n, _ in root.final(cfg)} | {"lm_head.weight", "lm_head.bias"}
        picked = [
            s
            for s in specs
            if s.unit in mine
            or (
                s.unit == "root"
                and (plan.pp == 1 or (first and s.name not in head_names) or (last and s.name in head_names))
            )
        ]
        if last and not first and cfg.tie_word_embeddings:  # the last stage keeps its own copy of a tied embedding
            picked += [s for s in specs if s.name in {n for n, _ in root.embeddings(cfg)}][:1]
        padded, local = _shard_counts(picked, shard)
        units: dict[str, int] = {}
        for s in picked:
            d0 = s.shape[0] if s.shape else 1
            units[s.unit] = units.get(s.unit, 0) + -(-d0 // shard) * (s.numel // d0 if d0 else 0)
        z_numel, z_tensors = zero1_partition([s.numel for s in picked], shard)
        total = sum(s.numel for s in picked)
        root_unit = units.pop("root", 0)
        return StageParams(
            total, len(picked), padded, local, max(units.values(), default=0), z_numel, z_tensors, root_unit, shard
        )
    vocab = padded_vocab(cfg.vocab_size, plan.tp) // plan.tp * cfg.hidden_size
    numel = tensors = experts = 0
    largest = 0
    for _, lay in stage_layers(cfg, plan, stage, layers):
        n = layer_numel(lay, plan)
        experts += sum(
            _gemm_weight(g.n, g.k, g.split, g.experts, plan.tp, plan.ep, plan.expert_tp)[0]
            for g in lay.gemms
            if g.split in (EXPERT_COLUMN, EXPERT_ROW)
        )
        numel += n
        tensors += len(lay.params)
        largest = max(largest, n)
    root_numel = 0
    if first:
        root_numel += vocab
        tensors += 1
    if last:
        root_numel += vocab if (not cfg.tie_word_embeddings or not first) else 0
        root_numel += cfg.hidden_size + mtp_numel(cfg, plan)
        tensors += (
            2 + 4 * plan.mtp_layers + (1 if plan.mtp_layers and plan.pp > 1 and not cfg.tie_word_embeddings else 0)
        )
    numel += root_numel
    expert_shard = max(1, plan.world // (plan.pp * plan.ep * plan.expert_tp))  # Megatron's expert data parallel
    padded = -(-(numel - experts) // shard) + -(-experts // expert_shard)
    return StageParams(
        numel,
        tensors,
        padded,
        padded,
        -(-largest // shard),
        padded,
        -(-tensors // shard),
        -(-root_numel // shard),
        shard,
        experts,
        expert_shard,
    )


def fp8_weights(cfg: ModelConfig, plan: Plan, stage: int, layers: Sequence[Layer] | None = None) -> tuple[int, int]:
    """(elements of the weights --fp8 runs in FP8 on one rank of stage ``stage``, elements of its largest
    decoder layer's): what Transformer Engine caches FP8 copies of and torchao all-gathers in FP8."""
    if plan.fp8 == "none":
        return 0, 0
    par = plan.model_parallel()
    local = plan.tokens // plan.tp if cfg.is_moe else plan.tokens
    total = largest = 0
    for _, lay in stage_layers(cfg, plan, stage, layers):
        n = sum(
            g.n * g.k * g.groups
            for g in layer_gemms(lay, plan.tokens, local, par)
            if fp8_gemm(plan, g.name, g.n, g.k, g.groups)
        )
        total += n
        largest = max(largest, n)
    return total, largest


def zero1_owners(numels: Sequence[int], shard: int) -> list[int]:
    """The rank that keeps each parameter's optimizer state when a sharded optimizer assigns whole parameters as
    torch's ZeroRedundancyOptimizer does: largest first (ties in order), each to the rank with the fewest elements
    so far (ties to the lowest rank)."""
    heap = [(0, r) for r in range(shard)]  # (elements, rank): the emptiest (lowest rank on ties) first
    owners = [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda j: -numels[j]):
        size, r = heapq.heappop(heap)
        owners[i] = r
        heapq.heappush(heap, (size + numels[i], r))
    return owners


def zero1_partition(numels: Sequence[int], shard: int) -> tuple[int, int]:
    """(elements, tensors) of the fullest rank under ``zero1_owners`` (Megatron's distributed optimizer splits a
    flat buffer evenly instead: StageParams.zero1)."""
    if shard >= len(numels):  # a rank per parameter: the fullest holds the largest
        return (max(numels), 1) if numels else (0, 0)
    size, count = [0] * shard, [0] * shard
    for n, r in zip(numels, zero1_owners(numels, shard)):
        size[r] += n
        count[r] += 1
    fullest = max(range(shard), key=lambda r: (size[r], -r))
    return size[fullest], count[fullest]


def grad_bytes_per_param(plan: Plan) -> int:
    """Bytes of a main gradient without FSDP: 4 (fp32; Megatron under bf16, and fp32 training), 2 with
    ``--grad-dtype bf16`` in mixed precision."""
    return 2 if plan.grad_dtype == "bf16" and plan.dtype in ("bf16", "fp16") else 4


def state_bytes(sp: StageParams, plan: Plan, profile: str = "fused") -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes on one rank (docs/project.md, "Memory"). Mixed precision (bf16/fp16)
    follows Megatron-Core for none/zero1 (16-bit parameters, fp32 main gradients, fp32 master copy and Adam
    moments; zero1 shards the last over data parallel) and FSDP2 with param_dtype 16-bit / reduce fp32 for fsdp
    (fp32 sharded parameters, gradients and moments; with pipeline parallelism also the whole 16-bit parameters
    and fp32 gradients, which a pipeline schedule keeps across micro-batches). fp32: 4-byte parameters and gradients, Adam's two moments;
    the optimizer also keeps torch's per-tensor step counter."""
    mixed = plan.dtype in ("bf16", "fp16")
    shard = plan.dp * plan.cp
    steps = ADAM_STEP_BYTES * sp.tensors
    if plan.sharding == "fsdp" and plan.pp > 1:
        # FSDP2 under a pipeline schedule (torchtitan): the stage's parameters are gathered at its first forward
        # and stay gathered all step (no reshard after forward, nor after backward until the last micro-batch),
        # and each gradient is kept whole, accumulated in the reduce dtype (fp32) across micro-batches until the
        # reduce-scatter after the last: 16-bit whole + fp32 shard, fp32 whole gradients, sharded moments
        return element_size(plan.dtype) * sp.numel + 4 * sp.fsdp_padded, 4 * sp.numel, 8 * sp.fsdp_local + steps
    if plan.sharding == "fsdp":
        return 4 * sp.fsdp_padded, 4 * sp.fsdp_local, 8 * sp.fsdp_local + steps
    p_bytes = (2 if mixed else 4) * sp.numel
    g_bytes = grad_bytes_per_param(plan) * sp.numel
    per_param = 12 if mixed else 8
    if plan.sharding == "zero1" and (shard > 1 or sp.expert_shard > 1):
        numel, tensors = sp.zero1(profile)
        return p_bytes, g_bytes, per_param * numel + ADAM_STEP_BYTES * tensors
    return p_bytes, g_bytes, per_param * sp.numel + steps


@dataclass(frozen=True)
class OpMatmul:
    """One matmul of a dense layer as torchtitan runs it (q, k, v, o, w1, w3, w2 unfused), in forward order."""

    gemm: str  # the Layer GEMM it is part of (qkv, attn_out, mlp_gate_up, mlp_up, mlp_down)
    tokens: int  # rows of its output on this rank: row-parallel outputs are whole-sequence partial sums
    width: int  # columns of its output on this rank
    saved: bool  # torchtitan's op policy keeps the 1st, 3rd, 5th, ... matmul of a layer; the rest is recomputed


def op_matmuls(cfg: ModelConfig, lay: Layer, plan: Plan) -> list[OpMatmul]:
    """The matmuls of a dense layer under ``--recompute op`` (docs/project.md, "Memory"): torchtitan's per-op
    selective checkpointing counts a layer's matmuls in forward order and saves every odd one."""
    t, tp, h = plan.tokens, plan.tp, cfg.hidden_size
    widths: list[tuple[str, int, int]] = []
    for g in lay.gemms:
        if g.layer == "qkv":
            op = lay.attention[0]
            hq, hkv = max(1, op.heads_q // tp), max(1, op.heads_kv // tp)
            widths += [
                ("qkv", t, hq * op.head_dim_qk),
                ("qkv", t, hkv * op.head_dim_qk),
                ("qkv", t, hkv * op.head_dim_v),
            ]
        elif g.layer == "mlp_gate_up":
            widths += [("mlp_gate_up", t, g.n // 2 // tp)] * 2  # w1 (gate), then w3 (up)
        elif g.layer in ("attn_out", "mlp_down"):
            widths.append((g.layer, t, h))
        else:
            widths.append((g.layer, t, g.n // tp))
    return [OpMatmul(name, rows, width, i % 2 == 0) for i, (name, rows, width) in enumerate(widths)]


def op_sac_bytes(cfg: ModelConfig, lay: Layer, plan: Plan) -> int:
    """What a dense layer saves under torchtitan's per-op checkpointing: its input, every odd matmul's output,
    the attention kernel's output and fp32 log-sum-exp, and with TP the reduce-scatters' outputs."""
    e = element_size(plan.dtype)
    t, h, tp = plan.tokens, cfg.hidden_size, plan.tp
    t_seq = t // tp if plan.sp else t
    total = t_seq * h * e  # the checkpointed block's input
    total += sum(m.tokens * m.width for m in op_matmuls(cfg, lay, plan) if m.saved) * e
    for op in lay.attention:
        hq = max(1, op.heads_q // tp)
        total += t * hq * op.head_dim_v * e + t * hq * 4
    if plan.sp:
        total += 2 * t_seq * h * e  # reduce_scatter outputs are in the save list too
    return total


def layer_activation_bytes(
    cfg: ModelConfig, lay: Layer, plan: Plan, profile: str = "fused", compiled: bool = False
) -> int:
    """Bytes one decoder layer saves for backward per micro-batch (docs/project.md, "Activations"): each block's
    norm input and output (the GEMM input; T/tp of them with sequence parallelism), what the attention kernel
    keeps (q, k, v, output and its fp32 log-sum-exp; gated DeltaNet: its convolution's input and output, gate,
    output-norm input and per-chunk fp32 states; the DSA indexer's q, k, weights and the chosen keys), the MLP's
    activation input and output, and for MoE the router's fp32 probabilities and the permuted tokens.
    ``profile='eager'`` is PyTorch eager as transformers runs it: RMSNorm keeps its normalised output too, SwiGLU
    keeps silu's output as well, and under tensor parallelism the gathered sequence. Full recomputation keeps the
    layer's input only; selective drops what its ``--recompute-modules`` keep (``activation_parts``)."""
    e = element_size(plan.dtype)
    t_seq = plan.tokens // plan.tp if plan.sp else plan.tokens
    if plan.recompute == "full":
        return t_seq * cfg.hidden_size * e
    if plan.recompute == "op":
        return op_sac_bytes(cfg, lay, plan)
    parts = activation_parts(cfg, lay, plan, profile, compiled)
    return sum(n for module, n in parts.items() if module not in recomputed_modules(plan))


def recomputed_modules(plan: Plan) -> set[str]:
    """The activation_parts selective recomputation drops: the modules named, and with ``moe`` the whole MoE block
    (Megatron-Core's MoE-layer checkpoint runs the shared experts and the activation inside it)."""
    if plan.recompute != "selective":
        return set()
    named = set(plan.recompute_modules)
    return named | ({"moe_act", "shared_experts"} if "moe" in named else set())


def has_qk_norm(lay: Layer) -> bool:
    """Whether the layer norms q and k per head (Qwen3, OLMo-2): its params say."""
    return any(name.endswith(("q_norm.weight", "k_norm.weight")) for name, _ in lay.params)


MLP_GEMMS = ("mlp_gate_up", "mlp_up", "expert_gate_up", "shared_gate_up")


def norm_blocks(lay: Layer) -> int:
    """The pre-norm blocks of a layer: a mixer and an MLP (2), or one of them (NemotronH's layers are a norm and
    one mixer: Mamba-2, attention, MLP or MoE)."""
    mixer = any(op.kind != HC for op in lay.attention)
    mlp = any(g.layer in MLP_GEMMS for g in lay.gemms)
    return max(1, int(mixer) + int(mlp))


def activation_parts(
    cfg: ModelConfig, lay: Layer, plan: Plan, profile: str = "fused", compiled: bool = False
) -> dict[str, int]:
    """What a layer saves for backward, by the Megatron-Core module whose selective recomputation
    (``--recompute-modules``) would drop it: ``layernorm`` (the two blocks' norm outputs), ``core_attn`` (what the
    attention kernel keeps beyond its q, k, v inputs: the log-sum-exp, or unfused the scores), ``mla_up_proj`` (MLA's
    up-projected q, k, v), ``mlp`` (a dense MLP's intermediates), ``shared_experts``, ``moe_act`` (the experts'
    activation output), ``moe`` (everything the routed experts and their router keep) and ``rest``. ``compiled``:
    the eager profile's layer under torch.compile, whose fused kernels keep their inputs, not their elementwise
    intermediates (torch_compile.py: no fp32 norm copy, x·rsqrt or silu output)."""
    e = element_size(plan.dtype)
    t, h, tp = plan.tokens, cfg.hidden_size, plan.tp
    t_seq = t // tp if plan.sp else t
    eager = profile == "eager"
    kept = eager and not compiled  # elementwise intermediates kept: PyTorch eager op by op
    parts = dict.fromkeys(RECOMPUTE_MODULES, 0) | {"rest": 0}
    qk_norm = has_qk_norm(lay)
    # two blocks' norm input and output (the GEMMs' input); under sequence parallelism PyTorch's DTensor keeps
    # the all-gathered output, Megatron the local shard (it gathers again in backward, workload.tp_comm_items)
    # (eager: transformers' RMSNorm upcasts its input to fp32 and keeps that copy, EAGER_NORM_INPUT_BYTES)
    blocks = norm_blocks(lay)
    parts["rest"] += blocks * t_seq * h * (EAGER_NORM_INPUT_BYTES if kept else e)
    parts["layernorm"] += blocks * (t if eager else t_seq) * h * e
    if kept:
        parts["rest"] += blocks * t_seq * h * e  # RMSNorm keeps x·rsqrt (16-bit) besides its input and output
    mla = any(g.layer in ("mla_q_up", "mla_kv_up") for g in lay.gemms)
    for op in lay.attention:
        hq, hkv = max(1, op.heads_q // tp), max(1, op.heads_kv // tp)
        if op.kind == INDEXER:
            parts["rest"] += t * (op.heads_q * op.head_dim_qk + op.head_dim_qk + op.heads_q) * e
        elif op.kind == MAMBA2:  # under --cp the whole sequence on heads/cp (Megatron's all-to-all, workload.py)
            mixer = mamba2_saved_bytes(
                op, hq // plan.cp, max(1, hkv // plan.cp), plan, cfg.extra.get("conv_kernel", 4), kept
            )
            parts["rest"] += mixer
        elif op.kind == KDA:
            parts["rest"] += kda_saved_bytes(op, hq // plan.cp, plan, cfg.extra.get("linear_conv_kernel_dim", 4), kept)
        elif op.kind == LINEAR and eager:
            parts["rest"] += eager_delta_rule_bytes(op, hq, hkv, plan, cfg.raw.get("linear_conv_kernel_dim", 4))
        elif op.kind == LINEAR:
            conv = 2 * hkv * op.head_dim_qk + hq * op.head_dim_v
            parts["rest"] += t * (2 * conv + 3 * hq * op.head_dim_v + 2 * hq) * e
            chunks = plan.mbs * math.ceil(plan.seqlen // plan.cp / LINEAR_CHUNK)  # per sequence, not per token
            parts["rest"] += chunks * hq * op.head_dim_qk * op.head_dim_v * 4
        elif plan.unfused_attention and op.kind in UNFUSED_KINDS:
            # Megatron's unfused core attention: q, k and v (GQA's expanded to every query head) for its two
            # matmuls, the context, and over the whole score matrix the softmax's output and, with attention
            # dropout, its 1-byte mask and output (5·a·s²·b in Korthikanti et al.'s count)
            qkv = t * (hq * op.head_dim_qk + hkv * (op.head_dim_qk + op.head_dim_v)) * e
            parts["mla_up_proj" if mla else "rest"] += qkv
            parts["core_attn"] += t * (hq * op.head_dim_qk + hq * (op.head_dim_qk + op.head_dim_v)) * e - qkv
            parts["rest"] += t * hq * op.head_dim_v * e  # the context: the output projection's input
            scores = plan.mbs * hq * (plan.seqlen // plan.cp) * plan.seqlen
            parts["core_attn"] += scores * (e + (1 + e if plan.attention_dropout else 0))
            if qk_norm:  # q/k norms keep their input
                parts["rest"] += t * (hq + hkv) * op.head_dim_qk * e
        else:
            parts["mla_up_proj" if mla else "rest"] += (
                t * (hq * op.head_dim_qk + hkv * (op.head_dim_qk + op.head_dim_v)) * e
            )
            parts["rest"] += t * hq * op.head_dim_v * e  # the output: the output projection's input
            parts["core_attn"] += t * hq * 4  # log-sum-exp
            if op.kind == SPARSE:
                parts["core_attn"] += t * op.window * 4  # the selected key indices (int32)
            if qk_norm:  # q/k norms keep their input (eager: its fp32 copy, and the normalised 16-bit one)
                parts["rest"] += t * (hq + hkv) * op.head_dim_qk * (EAGER_NORM_INPUT_BYTES + e if kept else e)
    local = t // tp if cfg.is_moe else t
    for g in lay.gemms:
        if g.layer in ("mlp_gate_up", "shared_gate_up"):
            width = g.n // 2 // tp
            # gate and up, and their product (down's input)
            parts["mlp" if g.layer == "mlp_gate_up" else "shared_experts"] += (3 + (1 if kept else 0)) * t * width * e
        elif g.layer == "mlp_up":
            parts["mlp"] += 2 * t * g.n // tp * e
        elif g.layer == "expert_gate_up":
            rows = local * g.top_k * plan.expert_tp
            width = g.n // 2 // plan.expert_tp
            parts["moe_act"] += rows * width * e  # the activation's output (the down projection's input)
            parts["moe"] += rows * h * e + (2 + (1 if kept else 0)) * rows * width * e
            parts["moe"] += local * g.experts * 4 * 2  # router logits and probabilities, fp32
            parts["moe"] += rows * h * e  # each expert's output, kept for the routing-weight product
        elif g.layer in ("mla_q_up", "mla_kv_up", "linear_out"):
            parts["rest"] += t * g.k * e  # a second GEMM input inside the block (compressed q / kv, gated-norm output)
    if plan.fp8 == "te":
        for module, n in te_saved_parts(cfg, lay, plan).items():
            parts[module] += n
    if plan.hidden_dropout:  # the two blocks' output dropouts keep a 1-byte mask each (T/tp under SP)
        parts["rest"] += blocks * t_seq * h
    return parts


def eager_delta_rule_bytes(op: Attention, hv: int, hk: int, plan: Plan, conv_kernel: object) -> int:
    """What a gated DeltaNet layer keeps for backward in PyTorch eager, as transformers' ``torch_chunk_gated_delta_rule``
    (no flash-linear-attention) runs it in 16 bits (docs/project.md, "Activations"), beside the block's norm output
    (in_proj's input) and the gated norm's output (out_proj's input, the ``linear_out`` GEMM's): the convolution's
    padded input and output, the gate and the gated norm's input; in fp32 the per-head q, k, v, decays and beta, and
    per chunk of 64 tokens (the sequence padded to whole chunks) its 64×64 decay, UT-system and attention matrices,
    the solved values and keys, and the recurrent state each chunk starts from."""
    e = element_size(plan.dtype)
    seqs, seq = plan.mbs, plan.seqlen // plan.cp
    dk, dv, chunk = op.head_dim_qk, op.head_dim_v, LINEAR_CHUNK
    chunks = math.ceil(seq / chunk)
    padded = chunks * chunk
    kernel = conv_kernel if isinstance(conv_kernel, int) and 0 < conv_kernel <= 64 else 4
    conv = 2 * hk * dk + hv * dv
    per_seq = (
        5 * hv * padded * chunk * 4  # pairwise decays, UT system, intra-chunk attention, their products
        + (6 * padded + 2 * seq) * hv * dk * 4  # q, k (scaled, decayed, chunked), k·beta, solved keys
        + (3 * padded + 3 * seq) * hv * dv * 4  # v, v·beta, solved values, each chunk's corrected values
        + 2 * seq * hv * dv * e  # the gate and the gated norm's input (its output is linear_out's input)
        + (2 * seq + kernel - 1) * conv * e  # the convolution's padded input and its output
        + chunks * hv * dk * dv * 4  # the recurrent state each chunk starts from
        + (4 * padded + 5 * seq) * hv * 4  # decays and beta, per token, in fp32
        + seq * hv * e  # beta before the cast
        + chunks * hv * 4
    )
    return seqs * per_seq + chunk * chunk + 2 * hv * 4  # the causal mask; A_log and dt_bias in fp32


def mamba2_saved_bytes(op: Attention, heads: int, groups: int, plan: Plan, conv_kernel: object, eager: bool) -> int:
    """What a Mamba-2 mixer (NemotronH's) keeps for backward beside the block's norm output (in_proj's input) and
    out_proj's input (the ``linear_out`` GEMM's), for ``heads`` heads of P = head_dim_v and ``groups`` B/C groups of
    state N = head_dim_qk on this rank (docs/project.md, "Activations"). Fused: what mamba_ssm's
    ``MambaSplitConv1dScanCombinedFn`` saves (``ssd_combined.py``): in_proj's output (z, x, B, C, dt), the scan's
    output before the gated norm and the norm's fp32 1/rms per group; conv, scan and norm are recomputed in its
    backward. ``eager``: transformers' ``torch_forward`` (no mamba_ssm), counted tensor by tensor in
    tests/test_project_kinds.py: the 16-bit in_proj output, padded convolution output and dt, and in fp32 the
    chunked scan's copies of x, B, C and dt, per chunk its L×L decay, score and masked-score matrices and the states,
    and the gated norm's intermediates."""
    e = element_size(plan.dtype)
    b, seq = plan.mbs, plan.seqlen  # the whole sequence: under --cp the caller passes heads/cp
    p, n, chunk = op.head_dim_v, op.head_dim_qk, op.window
    inner = heads * p
    conv = inner + 2 * groups * n
    proj = inner + conv + heads
    if not eager:
        return b * seq * (proj * e + inner * e + groups * 4)
    kernel = conv_kernel if isinstance(conv_kernel, int) and 0 < conv_kernel <= 64 else 4
    chunks = math.ceil(seq / chunk)
    padded = chunks * chunk
    return (
        b * seq * (proj + 2 * heads) * e  # in_proj's output; dt + dt_bias and its softplus
        + b * conv * (seq + kernel - 1) * e  # the convolution's output before its causal slice
        + b * seq * (2 * heads + 5 * inner + groups) * 4  # dt (two fp32 copies), x in fp32, the gated norm's four
        + b * padded * (5 * inner + 5 * heads * n + 2 * heads) * 4  # padded x, D·x, outputs; B, C copies; decays
        + b * heads * chunks * chunk * chunk * 3 * 4  # per chunk: exp(segsum), C·Bᵀ and the masked scores
        + b * heads * (chunks + 1) * (chunks + 1) * 4  # the inter-chunk decay
        + b * heads * (2 * chunks + 1) * p * n * 4  # the chunk states, with and without the initial one
        + 2 * (chunk * chunk + (chunks + 1) ** 2)  # the segsum masks (bool)
        + 2 * heads * 4  # exp(A_log) and A, fp32
    )


def kda_saved_bytes(op: Attention, heads: int, plan: Plan, conv_kernel: object, eager: bool) -> int:
    """What a Kimi Delta Attention mixer keeps for backward beside the block's norm output (its projections' input)
    and o_proj's input (the ``linear_out`` GEMM's), for ``heads`` heads of d = head_dim_qk on this rank (docs/project.md,
    "Activations"). Fused, as flash-linear-attention 0.6 runs it (``fla/layers/kda.py``): each short convolution's
    input (``ShortConvolution``), what ``ChunkKDAFunction`` saves (``fla/ops/kda/chunk.py``: the l2-normed q and k
    with their fp32 1/norm, v, the raw gate, β before and after its fp32 sigmoid, the 16-bit Aqk and Akk of
    chunk-size columns per token; the gate's cumulative sum is recomputed), the gated norm's input, gate and fp32
    1/rms (``FusedRMSNormGated``), and the two rank-d low-rank outputs (the gate's f_a and g_a). ``eager``:
    transformers' ``torch_chunk_kda`` (no fla), counted tensor by tensor in tests/test_project_kinds.py: its fp32
    padded q, k, v, β and their products, per chunk the L×L×d decay and products, the UT solve's row-by-row clones
    and the recurrent state each chunk starts from."""
    e = element_size(plan.dtype)
    b, seq = plan.mbs, plan.seqlen  # the whole sequence: under --cp the caller passes heads/cp
    d, chunk = op.head_dim_qk, op.window
    inner = heads * d
    if not eager:
        return b * seq * ((9 * inner + heads + 2 * heads * chunk + 2 * d) * e + 4 * heads * 4)
    kernel = conv_kernel if isinstance(conv_kernel, int) and 0 < conv_kernel <= 64 else 4
    chunks = math.ceil(seq / chunk)
    padded = chunks * chunk
    solve = sum(i + i * i for i in range(1, chunk))  # the UT solve's clones of row i and the i×i block above it
    return (
        b * seq * (3 * inner + heads + 2 * d) * e  # the convolution's input, β, the two low-rank outputs
        + b * 3 * inner * (seq + kernel - 1) * e  # the convolution's output before its causal slice
        + b * seq * ((7 * inner + heads) * 4 + inner)  # forget gate, gated norm in fp32; where()'s mask
        + b * seq * 2 * (inner + heads) * 4  # q and k in fp32 and their l2 norms
        + b * heads * padded * (7 * d + 1) * 4  # padded q, k, v, β, k·β, v·β, exp(g), k·β·exp(g)
        + b * heads * chunks * (2 * chunk * chunk * d + chunk * chunk + solve) * 4  # decay, k·β·k, attn, solve
        + b * heads * chunks * (5 * chunk * d + d * d + chunk * chunk * d + chunk * chunk + d) * 4  # the chunk loop
        # k_cumdecay's per-chunk copies (chunks − 2 of them kept: the loop's first and last are freed with the
        # pieces of graph the forward drops; one chunk makes none, and the chunk loop's terms above count two the
        # single-chunk path does not make)
        + b * heads * chunk * d * 4 * ((chunks if chunks > 1 else 0) - 2)
        + (2 * heads + d) * 4
        + 3 * chunk * chunk  # exp(A_log), -exp(A_log), the norm weight in fp32; masks
    )


def te_saved_delta(cfg: ModelConfig, lay: Layer, plan: Plan) -> int:
    """te_saved_parts, summed."""
    return sum(te_saved_parts(cfg, lay, plan).values())


def te_saved_parts(cfg: ModelConfig, lay: Layer, plan: Plan) -> dict[str, int]:
    """What Transformer Engine's FP8 GEMMs change in a layer's saved activations (docs/project.md, "FP8"): each
    saves its own input in FP8 (1 byte; the local shard under sequence parallelism), so a 16-bit tensor only FP8
    GEMMs read is no longer kept (the norm outputs of dense blocks, the MLP activation's output, the permuted
    tokens, the second GEMM inputs of MLA and gated DeltaNet) and the attention output, which the attention
    kernel keeps in 16 bits, gets an FP8 copy beside it (delayed scaling, Megatron's default recipe). By the module
    whose recomputation would drop the tensor (activation_parts)."""
    e = element_size(plan.dtype)
    t, h, tp = plan.tokens, cfg.hidden_size, plan.tp
    t_seq = t // tp if plan.sp else t
    local = t // tp if cfg.is_moe else t
    delta = dict.fromkeys(RECOMPUTE_MODULES, 0) | {"rest": 0}
    ranked = {g.name: g for g in layer_gemms(lay, t, local, plan.model_parallel())}  # this rank's shapes
    fp8 = {
        g.layer: g
        for g in lay.gemms
        if g.layer in ranked and fp8_gemm(plan, g.layer, ranked[g.layer].n, ranked[g.layer].k, ranked[g.layer].groups)
    }
    if "qkv" in fp8:
        delta["layernorm"] -= t_seq * h * (e - 1)  # the attention block's norm output
    if "attn_out" in fp8:
        for op in lay.attention:
            if op.kind not in (LINEAR, INDEXER):
                delta["rest"] += t * max(1, op.heads_q // tp) * op.head_dim_v  # an FP8 copy of the attention output
    for name, g in fp8.items():
        if name in ("mlp_gate_up", "mlp_up"):
            delta["layernorm"] -= t_seq * h * (e - 1)  # the MLP block's norm output
            width = g.n // 2 // tp if name == "mlp_gate_up" else g.n // tp
            delta["mlp"] -= t * width * (e - 1)  # the activation's output, mlp_down's input
        elif name == "shared_gate_up":
            # the router keeps the 16-bit norm output: the shared expert saves an FP8 copy
            delta["shared_experts"] += t_seq * h - t * (g.n // 2 // tp) * (e - 1)
        elif name == "expert_gate_up":
            rows = local * g.top_k * plan.expert_tp
            delta["moe"] -= rows * h * (e - 1)  # the permuted tokens
            delta["moe_act"] -= rows * (g.n // 2 // plan.expert_tp) * (e - 1)  # the activation's output
        elif name in ("mla_q_up", "mla_kv_up", "linear_out"):
            delta["rest"] -= t * g.k * (e - 1)
    return delta


def activation_bytes(
    cfg: ModelConfig,
    plan: Plan,
    stage: int,
    in_flight: int,
    profile: str = "fused",
    all_layers: Sequence[Layer] | None = None,
    compiled: bool = False,
) -> tuple[int, int]:
    """(activations kept at the peak, transient buffers) on stage ``stage`` holding ``in_flight`` micro-batch
    chunks. Transient: the last stage's fp32 logits and their gradient; a recomputed layer's activations under
    full recomputation. ``compiled``: decoder layers under torch.compile (``activation_parts``)."""
    layers = stage_layers(cfg, plan, stage, all_layers)
    # a few kinds of layer, many of each; --recompute-method block: the first N of each chunk recomputed, the rest not
    index = Counter[int]()
    kinds = Counter[tuple[int, bool]]()  # (Layer.kind, recomputed)
    for chunk, lay in layers:
        kinds[(lay.kind, plan.recomputes(index[chunk]))] += 1
        index[chunk] += 1
    first = {lay.kind: lay for _, lay in reversed(layers)}
    plain = replace(plan, recompute="none")
    per_chunk = sum(
        n * layer_activation_bytes(cfg, first[k[0]], plan if k[1] else plain, profile, compiled)
        for k, n in kinds.items()
    )
    if plan.recompute == "full" and plan.recompute_method == "uniform" and plan.recompute_num_layers > 1:
        # groups of N layers keep one input each (every layer's full-recompute bytes are its input)
        groups = sum(-(-n // plan.recompute_num_layers) for n in index.values())
        per_chunk = groups * (plan.tokens // (plan.tp if plan.sp else 1)) * cfg.hidden_size * element_size(plan.dtype)
    kept = per_chunk // max(1, plan.vpp) * in_flight
    if plan.cpu_offload_layers:  # the first N layers' activations wait on the host (pp 1: one chunk, in order)
        kept -= in_flight * sum(offloaded_bytes(cfg, plan, layers, profile, compiled))
    if plan.moe_a2a_overlap and layers:  # a combined 1F1B step: the forward's first layers beside all of the chunk
        # its backward frees
        kept += max(layer_activation_bytes(cfg, lay, plan, profile, compiled) for lay in first.values())
    if stage == 0 and plan.hidden_dropout:  # the embedding's dropout mask, one per micro-batch of the first chunk
        kept += plan.tokens // (plan.tp if plan.sp else 1) * cfg.hidden_size * -(-in_flight // max(1, plan.vpp))
    e = element_size(plan.dtype)
    buffers = 0
    if plan.recompute in ("full", "op", "selective") and layers:  # one layer's recomputed part during its backward
        full = replace(plan, recompute="none")
        buffers += max(  # none (op under TP can keep more than no recomputation: matmul outputs, whole sequences)
            0,
            *(layer_activation_bytes(cfg, lay, full, profile, compiled)
              - layer_activation_bytes(cfg, lay, plan, profile, compiled)
              for lay in first.values()),
        ) * (plan.recompute_num_layers if plan.recompute == "full" and plan.recompute_method == "uniform" else 1)  # fmt: skip
    if profile == "eager" and not compiled and layers:  # the eager KDA backward's chunk products (kda_backward_bytes)
        buffers = max(buffers, *(kda_backward_bytes(lay, plan) for lay in first.values()))
    if stage == plan.last_stage:
        kept += head_activation_bytes(cfg, plan, profile)
        vocab = padded_vocab(cfg.vocab_size, plan.tp) // plan.tp
        # eager (torch cross_entropy on .float() logits), beside the saved fp32 log-probabilities: in forward the
        # 16-bit logits and their fp32 copy (e + 4, or 4 in fp32, where the copy is the logits), in backward two
        # fp32 gradients at once, the log-probabilities' (nll_loss's) and the logits' (log_softmax's): 8 bytes, the
        # larger; fused (Megatron's vocab-parallel cross-entropy): the fp32 softmax it saves becomes the gradient
        # in place, beside the 16-bit logits (forward) or their gradient; Megatron's --cross-entropy-loss-fusion
        # (native) takes the exponentials out of place: one more fp32 copy beside the 16-bit logits in forward
        per_logit = EAGER_LOSS_BYTES if profile == "eager" else (e + 4 if plan.ce_fusion else e)
        buffers += plan.tokens * vocab * per_logit
    return kept, buffers


def offloaded_bytes(
    cfg: ModelConfig,
    plan: Plan,
    layers: Sequence[tuple[int, Layer]],
    profile: str = "fused",
    compiled: bool = False,
) -> list[int]:
    """The activations each of the first ``plan.cpu_offload_layers`` decoder layers (of ``layers``, a stage's in
    order) sends to the host and takes back (Megatron's --cpu-offloading-num-layers: Transformer Engine's offload
    context moves the tensors a layer saves for backward, docs/project.md, "CPU offloading")."""
    return [layer_activation_bytes(cfg, lay, plan, profile, compiled) for _, lay in layers[: plan.cpu_offload_layers]]


def kda_backward_bytes(lay: Layer, plan: Plan) -> int:
    """What transformers' eager KDA (``torch_chunk_kda``) holds beyond its saved tensors while its backward runs:
    two fp32 gradients of its per-chunk L×L×d products (the decay mask and k·β·k) at once. Measured: a tiny Kimi
    Linear's --validate peak (two KDA layers, 4 heads of 32, 2 × 512 tokens) lay 2.2 such tensors above the
    projection without it (0.81 of the measured peak; 0.98 with it; tests/test_project_kinds.py)."""
    return max(
        (
            2
            * plan.mbs
            * (op.heads_q // plan.tp // plan.cp)
            * math.ceil(plan.seqlen / op.window)
            * op.window**2
            * op.head_dim_qk
            * 4
            for op in lay.attention
            if op.kind == KDA
        ),
        default=0,
    )


def head_activation_bytes(cfg: ModelConfig, plan: Plan, profile: str = "fused") -> int:
    """What the last piece saves for one micro-batch: the final norm's input and output (lm_head's input; eager
    RMSNorm keeps its fp32 input and x·rsqrt) and the cross-entropy's fp32 log-probabilities over the rank's
    vocabulary slice. The last stage holds one micro-batch of these at a time (its forward is followed at once by
    its backward)."""
    e = element_size(plan.dtype)
    t_seq = plan.tokens // (plan.tp if plan.sp else 1)
    vocab = padded_vocab(cfg.vocab_size, plan.tp) // plan.tp if plan.tp > 1 else cfg.vocab_size
    norm = EAGER_NORM_INPUT_BYTES + 2 * e if profile == "eager" else 2 * e
    head = norm * t_seq * cfg.hidden_size + plan.tokens * vocab * 4
    # each MTP depth: its own loss (another head), and the inputs of its two norms and of eh_proj (2h)
    return head * (1 + plan.mtp_layers) + plan.mtp_layers * 4 * t_seq * cfg.hidden_size * e


def memory(
    cfg: ModelConfig,
    plan: Plan,
    stage: int,
    in_flight: int,
    profile: str = "fused",
    known: StageParams | None = None,
    layers: Sequence[Layer] | None = None,
    tp_overlap: float = 0.0,
    gpu: bool = True,
    compiled: bool = False,
) -> Memory:
    """Stage ``stage``'s memory per GPU at its peak, holding ``in_flight`` micro-batch chunks (``tp_overlap``, the
    --tp-overlap share: above 0 under sequence parallelism, Transformer Engine's userbuffers overlap TP
    communication, on streams with workspaces of their own; ``gpu``: False for a CPU, which has no math library
    workspaces, as --validate trains the eager profile there; ``compiled``: decoder layers under torch.compile)."""
    sp = known or stage_params(cfg, plan, stage, layers)
    params, grads, opt = state_bytes(sp, plan, profile)
    acts, buffers = activation_bytes(cfg, plan, stage, in_flight, profile, layers, compiled)
    workspace = 0
    if profile == "fused":
        workspace = LIBRARY_WORKSPACE_BYTES + (UB_WORKSPACE_BYTES if tp_overlap > 0 and plan.sp else 0)
        workspace += GROUPED_GEMM_WORKSPACE_BYTES if cfg.is_moe else 0
    elif gpu:
        workspace = EAGER_WORKSPACE_BYTES
    fp8_total, fp8_largest = fp8_weights(cfg, plan, stage, layers)
    fsdp_sharded = plan.sharding == "fsdp" and plan.pp == 1  # weights gathered one unit at a time (below)
    te_cache = plan.fp8 == "te" and not plan.fp8_param_gather
    if te_cache:  # FP8 copies of the weights and their transposes, kept across micro-batches and steps: of the
        # rank's own weights; under FSDP of its shards (a gathered unit's copy lives while the unit is gathered,
        # counted with it below), never of the whole model on every rank (docs/project.md, "FP8")
        shards = plan.dp * plan.cp if fsdp_sharded else 1
        params += TE_WEIGHT_CACHE_BYTES * -(-fp8_total // shards)
    # --fp8-param-gather: the weight is its FP8 copy (1 B) and keeps its transpose (1 B): the 16-bit bytes, no more
    if fsdp_sharded:  # under a pipeline all is gathered already (state_bytes)
        e = element_size(plan.dtype)
        # FSDP2 keeps the root unit gathered from its forward to the end of backward (it does not reshard the
        # root after forward); at the peak, the loss's backward, the last decoder layer is gathered too (prefetched
        # for its backward). Measured with FSDPMemTracker on 2 ranks: root + one layer's all-gather buffer.
        shard = plan.dp * plan.cp
        layer_bytes = sp.largest_unit * shard * e
        if plan.fp8 == "torchao":  # its FP8 weights are all-gathered in FP8
            layer_bytes -= fp8_largest * (e - 1)
        if te_cache:  # the gathered layer's FP8 copy and transpose, while it is gathered
            layer_bytes += TE_WEIGHT_CACHE_BYTES * fp8_largest
        gathered = sp.root_unit * shard * e + (layer_bytes if shard > 1 else 0)
        if plan.microbatches == 1:
            # The peak is at the start of backward (every activation, no gradient yet) or at its end (every
            # gradient; the root's unsharded gradient and its fp32 copy for the reduce-scatter, no activation).
            start = acts + buffers + gathered
            end = grads + sp.root_unit * shard * (2 * e + 4)
            not_at_peak = start + grads - max(start, end)  # the workspaces are held at both
            return Memory(params, grads, opt, acts, buffers + gathered + workspace, not_at_peak=not_at_peak)
        buffers += gathered
    return Memory(params, grads, opt, acts, buffers + workspace)
