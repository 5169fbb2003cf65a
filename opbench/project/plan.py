"""A training layout: how a world of GPUs splits a model (TP × CP × PP × DP, experts over EP × ETP), the batch
(micro-batch, global batch), sharding, recomputation and pipeline schedule; which layouts are valid for a model,
with the reason when not; and every valid layout of a world, for ``--search`` (docs/project.md, "Layouts").
Rank order is Megatron-Core's default ``tp-cp-ep-dp-pp``: TP groups are neighbours, pipeline stages farthest
apart. Pure Python.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from opbench.core.errors import UsageError
from opbench.core.peaks import has_mxfp8
from opbench.gemm.shapes import ModelParallel, check_parallel
from opbench.models import ModelConfig
from opbench.models.architectures import decoder_layers
from opbench.models.layout import MAMBA2, Layer

from .pipeline import INTERLEAVED, V_SHAPED, ZERO_BUBBLE, piece_of

SHARDINGS = ("none", "zero1", "fsdp")  # DDP (replicated optimizer), sharded optimizer (ZeRO-1), FSDP2 / ZeRO-3
MAX_MICROBATCHES = 1 << 14  # per step per DP rank (real jobs: at most a few thousand)
RECOMPUTE = ("none", "selective", "full")  # what --search tries
# Megatron-Core's --recompute-modules, what --recompute selective recomputes (its default: core_attn)
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "shared_experts", "moe_act", "moe")
# "op": torchtitan's per-op selective checkpointing (every second matmul output and attention saved), dense
# layers only (docs/project.md, "Recomputation"); a flag value, not searched
RECOMPUTE_CHOICES = (*RECOMPUTE, "op")
OP_SAC_GEMMS = ("qkv", "attn_out", "mlp_gate_up", "mlp_up", "mlp_down")  # the layers "op" knows
# FP8 training recipes (docs/project.md, "FP8"): "te" = Transformer Engine as Megatron-LM, NeMo and Primus run it
# (delayed scaling, FP8 weight copies cached across micro-batches, GEMM inputs saved for backward in FP8);
# "torchao" = torchtitan's float8 (dynamic tensorwise scaling, inputs saved in 16 bits, FP8 FSDP all-gathers)
FP8_RECIPES = ("none", "te", "torchao")
# Transformer Engine's scaling (Megatron's --fp8-recipe): delayed = scales from an amax history, taken inside each
# cast; tensorwise = current scaling, each tensor's amax taken in a pass of its own before its cast; mxfp8 = MXFP8
# block scaling (one E8M0 scale per 32 elements, taken inside the cast; Blackwell and CDNA 4 parts only)
FP8_SCALINGS = ("delayed", "tensorwise", "mxfp8")
# Megatron-Core's --attention-backend values (local: the unfused attention of --transformer-impl local)
ATTENTION_BACKENDS = ("auto", "flash", "fused", "unfused", "local")
UNFUSED_ATTENTION = ("unfused", "local")
DISPATCHERS = ("alltoall", "flex")  # Megatron's --moe-token-dispatcher-type values modelled (not allgather)
FP8_EXCLUDED = ("router",)  # GEMMs that stay 16-bit under FP8 (besides lm_head and any dimension not a multiple of 16)


@dataclass(frozen=True)
class Plan:
    world: int
    seqlen: int
    global_batch: int  # sequences per optimizer step
    mbs: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None  # expert tensor parallel; None = tp (Megatron-Core's default)
    vpp: int = 1  # model chunks per pipeline stage (interleaved schedule)
    sharding: str = "none"
    recompute: str = "none"
    schedule: str = "1f1b"
    sequence_parallel: bool = True  # with tp > 1 (Megatron's --sequence-parallel)
    gpus_per_node: int = 8
    # GPUs sharing one NVLink/NVSwitch (or xGMI) fabric: a group inside one talks at the link rate, one that crosses
    # domains goes through the NICs; None: the node (--gpus-per-node). GB200/GB300 NVL72: 72 (docs/project.md,
    # "NVLink domains")
    nvlink_domain: int | None = None
    dtype: str = "bf16"
    grad_dtype: str = "fp32"  # main gradients and their DP reduction without FSDP (Megatron: fp32; NeMo may use bf16)
    # Uneven pipeline pieces, as Megatron-Core's flags: decoder layers of the first and last piece, and the
    # embedding / loss counted as one layer of the first / last piece when the rest is split evenly
    first_layers: int | None = None
    last_layers: int | None = None
    embedding_as_layer: bool = False
    loss_as_layer: bool = False
    fp8: str = "none"  # FP8_RECIPES: the decoder layers' GEMMs in FP8
    fp8_param_gather: bool = (
        False  # te: FP8 weights are the parameters (Megatron's --fp8-param-gather, NeMo's fp8_params)
    )
    fp8_recipe: str = "delayed"  # FP8_SCALINGS, for fp8 == "te"
    hidden_dropout: float = 0.0  # Megatron's --hidden-dropout: the embedding's and each block's output dropout
    ce_fusion: bool = False  # Megatron's --cross-entropy-loss-fusion (native): one more fp32 copy of the logits
    # Megatron's --attention-backend: flash/fused kernels (auto, the default) or the unfused core attention, which
    # keeps the softmax of the whole score matrix (and with --attention-dropout its mask and output) for backward
    attention_backend: str = "auto"
    attention_dropout: float = 0.0
    # Megatron's --mtp-num-layers (DeepSeek-V3's multi-token prediction, on in Megatron-Bridge's DeepSeek recipes):
    # after the last decoder layer, each depth norms and joins the hidden state with the next token's embedding
    # (eh_proj, 2h -> h), runs one more layer like the last, and predicts through the output layer with a loss
    mtp_layers: int = 0
    recompute_modules: tuple[str, ...] = ("core_attn",)  # with recompute == "selective"
    # With recompute == "full", Megatron's --recompute-method / --recompute-num-layers: uniform checkpoints groups of
    # N consecutive layers (each group keeps its input only; N = 1 is every layer alone), block checkpoints the first
    # N layers of each model chunk and runs the rest without recomputation
    recompute_method: str = "uniform"
    recompute_num_layers: int = 1
    # Megatron's --overlap-moe-expert-parallel-comm (Megatron-Bridge's moe_a2a_overlap): its combined 1F1B runs one
    # micro-batch's forward beside another's backward, layer by layer, hiding each all-to-all behind the other's
    # compute (docs/project.md, "A step"); one layer's activations more at the peak
    moe_a2a_overlap: bool = False
    # Megatron's --moe-token-dispatcher-type: alltoall (NCCL, top-k copies of each token) or flex (DeepEP / HybridEP:
    # a token once to each node, then each GPU, its experts are on)
    dispatcher: str = "alltoall"
    # Megatron's --cpu-offloading-num-layers (with --cpu-offloading; Transformer Engine's offload context): the
    # activations of the first N decoder layers go to the host during forward and come back for backward
    # (docs/project.md, "CPU offloading")
    cpu_offload_layers: int = 0

    def recomputes(self, index: int) -> bool:
        """Whether a decoder layer, ``index`` within its model chunk, runs with --recompute as given: every layer,
        but under --recompute-method block only the first --recompute-num-layers of each chunk."""
        block = self.recompute == "full" and self.recompute_method == "block"
        return not block or index < self.recompute_num_layers

    @property
    def unfused_attention(self) -> bool:
        return self.attention_backend in UNFUSED_ATTENTION

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)

    @property
    def expert_tp(self) -> int:
        return self.etp if self.etp is not None else self.tp

    @property
    def microbatches(self) -> int:
        return self.global_batch // (self.mbs * self.dp)

    @property
    def sp(self) -> bool:
        return self.sequence_parallel and self.tp > 1

    @property
    def tokens(self) -> int:
        """Tokens one rank's GEMMs multiply per micro-batch: mbs · seqlen / cp (TP all-gathers the sequence)."""
        return self.mbs * self.seqlen // self.cp

    def model_parallel(self) -> ModelParallel:
        return ModelParallel(tp=self.tp, ep=self.ep, cp=self.cp, etp=self.etp)

    def piece(self, chunk: int, stage: int) -> int:
        """The model piece chunk ``chunk`` of stage ``stage`` runs (pipeline.piece_of: a V puts the last piece on
        the first stage)."""
        return piece_of(chunk, stage, self.pp, self.schedule)

    @property
    def last_stage(self) -> int:
        """The stage that runs the last piece (lm_head and the loss): the first in a V."""
        return 0 if self.schedule in V_SHAPED else self.pp - 1

    @property
    def domain(self) -> int:
        """GPUs of one NVLink/xGMI domain: --nvlink-domain, else the node."""
        return self.nvlink_domain or self.gpus_per_node

    def spans_nodes(self, group: int, stride: int) -> bool:
        """Whether some group of ``group`` ranks ``stride`` apart reaches past one NVLink domain (the node unless
        --nvlink-domain says more): the slowest group sets the collective's time. Placement as ``domain_shares``."""
        return group > 1 and domain_shares(self.world, self.domain, group, stride)[1]

    def piece_layers(self, n_layers: int) -> list[int] | None:
        """Decoder layers of each pipeline piece (piece c·pp + s is model chunk c of stage s), or None when they
        do not split: the first and last piece as given, the rest evenly over the other pieces, where the
        embedding and the loss may each count as one layer (docs/project.md, "Layouts")."""
        pieces = self.pp * self.vpp
        if pieces > n_layers + 2:  # every piece but one holding the embedding or the loss needs a layer
            return None
        counts = [0] * pieces
        inner = list(range(pieces))
        rest = n_layers
        for piece, given in ((0, self.first_layers), (pieces - 1, self.last_layers)):
            if given is not None and piece in inner:
                counts[piece] = given
                rest -= given
                inner.remove(piece)
        if rest < 0 or (not inner and rest):
            return None
        extra = {0: self.embedding_as_layer, pieces - 1: self.loss_as_layer}
        virtual = rest + sum(1 for piece, on in extra.items() if on and piece in inner)
        if inner and virtual % len(inner):
            return None
        for piece in inner:
            counts[piece] = virtual // len(inner) - (1 if extra.get(piece) else 0)
        if min(counts) < 0:
            return None
        return counts

    @property
    def uneven(self) -> bool:
        """Whether the pipeline pieces are split by the uneven-split flags."""
        return (
            self.first_layers is not None
            or self.last_layers is not None
            or self.embedding_as_layer
            or self.loss_as_layer
        )

    def node_share(self, group: int, stride: int) -> int:
        """How many ranks of a group of ``group`` ranks ``stride`` apart sit in one NVLink domain (the node by
        default), the fewest over every group and domain it touches: across domains a ring collective drives that
        many NICs per domain (one per GPU), so its bus bandwidth scales with it, and the thinnest share is the
        bottleneck (an all-to-all's rank there sends the most through its NIC). Placement as ``domain_shares``."""
        return max(1, domain_shares(self.world, self.domain, group, stride)[0])

    def label(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        parts += [f"etp{self.expert_tp}"] if self.ep > 1 and self.expert_tp != self.tp else []
        parts += [f"vpp{self.vpp}"] if self.vpp > 1 else []
        parts += ["zero-bubble"] if self.pp > 1 and self.schedule in ZERO_BUBBLE else []
        parts += [self.schedule] if self.schedule in V_SHAPED else []
        modules = (
            ""
            if self.recompute != "selective" or self.recompute_modules == ("core_attn",)
            else "+".join(self.recompute_modules)
        )
        if self.recompute == "full" and (self.recompute_method, self.recompute_num_layers) != ("uniform", 1):
            modules = f"{self.recompute_method}{self.recompute_num_layers}"
        parts += [f"mbs{self.mbs}", self.sharding, f"rc-{self.recompute}" + (f"[{modules}]" if modules else "")]
        parts += ["grads-bf16"] if self.grad_dtype == "bf16" and self.sharding != "fsdp" else []
        parts += [f"first{self.first_layers}"] if self.first_layers is not None else []
        parts += [f"last{self.last_layers}"] if self.last_layers is not None else []
        parts += ["emb-as-layer"] if self.embedding_as_layer else []
        parts += ["loss-as-layer"] if self.loss_as_layer else []
        if self.fp8 != "none":
            recipe = f"-{self.fp8_recipe}" if self.fp8 == "te" and self.fp8_recipe != "delayed" else ""
            parts += [f"fp8-{self.fp8}{recipe}" + ("-param-gather" if self.fp8_param_gather else "")]
        parts += [f"dropout{self.hidden_dropout:g}"] if self.hidden_dropout else []
        parts += [f"offload{self.cpu_offload_layers}"] if self.cpu_offload_layers else []
        parts += ["ce-fusion"] if self.ce_fusion else []
        parts += [f"mtp{self.mtp_layers}"] if self.mtp_layers else []
        parts += ["attn-unfused"] if self.unfused_attention else []
        parts += ["a2a-overlap"] if self.moe_a2a_overlap else []
        parts += [f"dispatcher-{self.dispatcher}"] if self.dispatcher != "alltoall" and self.ep > 1 else []
        parts += (
            [f"attn-dropout{self.attention_dropout:g}"] if self.unfused_attention and self.attention_dropout else []
        )
        return " ".join(parts)


# The chunked scans under context parallelism: Megatron-Core's all-to-all (MambaContextParallel in
# ssm/mamba_context_parallel.py; GatedDeltaNet's tensor_a2a_cp2hp, which its KDA subclass inherits) gives each CP rank
# the whole sequence for heads / (tp·cp) of the heads: the heads on a TP rank must split over the CP ranks
SCAN_HEADS = {  # the config fields of the heads and of the key heads or B/C groups ("": KDA's are the heads)
    "mamba2": ("mamba_num_heads", "n_groups"),
    "linear": ("linear_num_value_heads", "linear_num_key_heads"),
    "kda": ("linear_num_heads", ""),
}


def scan_cp_problems(cfg: ModelConfig, plan: Plan, layers: Sequence[Layer]) -> list[tuple[str, str]]:
    """--cp on a model with Mamba-2, gated DeltaNet or KDA layers: their heads (and the key heads or B/C groups) on
    a TP rank must split over the CP ranks, as Megatron-Core's all-to-all asserts (Mamba-2's groups may instead be
    repeated: cp a multiple of the groups on a TP rank)."""
    for op in {a for lay in layers for a in lay.attention if a.kind in SCAN_HEADS}:
        heads, groups = op.heads_q // plan.tp, op.heads_kv // plan.tp
        names = SCAN_HEADS[op.kind]
        why = f"{cfg.name}'s {op.kind} layers run the whole sequence on heads / (tp·cp) under Megatron's all-to-all"
        if heads % plan.cp:
            return [("--cp", f"{names[0]} {op.heads_q} / tp {plan.tp} does not split over cp {plan.cp}: {why}")]
        repeat = op.kind == "mamba2" and groups < plan.cp and plan.cp % groups == 0
        if names[1] and groups % plan.cp and not repeat:
            return [("--cp", f"{names[1]} {op.heads_kv} / tp {plan.tp} does not split over cp {plan.cp}: {why}")]
    return []


def problems(cfg: ModelConfig, plan: Plan, layers: Sequence[Layer] | None = None) -> list[tuple[str, str]]:
    """(flag, reason) for everything that makes ``plan`` impossible for ``cfg``; empty when it is valid.
    ``layers``: decoder_layers(cfg), if known."""
    out: list[tuple[str, str]] = []
    if plan.world % (plan.tp * plan.pp * plan.cp):
        return [("--world-size", f"{plan.world} GPUs do not split into tp·pp·cp = {plan.tp * plan.pp * plan.cp}")]
    n_layers = cfg.num_hidden_layers
    if n_layers is None:
        return [("num_hidden_layers", "the config has no layer count; a step needs it")]
    if plan.pp == 1 and (plan.first_layers is not None or plan.last_layers is not None):
        out.append(("--pp", "--decoder-first/last-pipeline-num-layers split a pipeline: give --pp 2 or more"))
    elif plan.piece_layers(n_layers) is None:
        if plan.uneven:
            out.append(
                (
                    "--pp",
                    f"{n_layers} layers do not split into pp·vpp = {plan.pp * plan.vpp} chunks with the first/last "
                    "piece's layers and embedding/loss accounting given",
                )
            )
        else:
            out.append(
                (
                    "--pp",
                    f"{n_layers} layers do not split into pp·vpp = {plan.pp * plan.vpp} equal chunks (uneven: "
                    "--decoder-first/last-pipeline-num-layers, --account-for-embedding/loss-in-pipeline-split)",
                )
            )
    pieces = plan.piece_layers(n_layers) if plan.recompute == "full" else None
    if pieces and plan.recompute_num_layers > max(pieces):
        # Megatron applies it to each model chunk's layers (TransformerBlock: num_layers_per_pipeline_rank, the
        # chunk's own layers under a virtual pipeline) and states its range as 1 to the layers per pipeline rank
        per = f"{n_layers} layers / pp {plan.pp}" + (f" / vpp {plan.vpp}" if plan.vpp > 1 else "")
        out.append(
            (
                "--recompute-num-layers",
                f"{plan.recompute_num_layers:,} is more than the {max(pieces)} decoder layers of a model chunk "
                f"({cfg.name}: {per}); Megatron counts it per pipeline stage (per model chunk with --vpp): give 1 to "
                f"{max(pieces)}",
            )
        )
    if plan.cpu_offload_layers:  # Megatron's own refusals (megatron/core/transformer/transformer_config.py)
        flag = "--cpu-offloading-num-layers"
        if plan.cpu_offload_layers >= n_layers:
            out.append((flag, f"{plan.cpu_offload_layers:,} is not fewer than {cfg.name}'s {n_layers} decoder layers"))
        if plan.pp > 1:
            out.append((flag, "Megatron offloads activations only without pipeline parallelism: --pp 1"))
        if plan.recompute != "none":
            out.append((flag, "Megatron does not offload activations with recomputation: --recompute none"))
        if any(op.kind == MAMBA2 for lay in (layers or decoder_layers(cfg)) for op in lay.attention):
            # Megatron's hybrid stack (megatron/core/models/hybrid/hybrid_block.py) opens no offload context
            out.append((flag, "Megatron's hybrid (Mamba) stack offloads no activations"))
    if plan.schedule in V_SHAPED and plan.vpp != 2:
        out.append(("--vpp", f"--schedule {plan.schedule} runs two model chunks per stage: --vpp 2"))
    elif plan.vpp > 1 and plan.schedule not in (*INTERLEAVED, *V_SHAPED):
        out.append(("--vpp", "model chunks per stage need --schedule interleaved, interleaved-zero-bubble or zbv"))
    elif plan.vpp > 1 and plan.pp == 1:
        out.append(("--vpp", f"{plan.vpp} model chunks per stage need a pipeline: give --pp 2 or more"))
    for given, flag, piece in ((plan.first_layers, "embedding", "first"), (plan.last_layers, "loss", "last")):
        if given is not None and (plan.embedding_as_layer if flag == "embedding" else plan.loss_as_layer):
            out.append(
                (
                    f"--account-for-{flag}-in-pipeline-split",
                    f"the {piece} piece's layers are given (--decoder-{piece}-pipeline-num-layers): there is no even "
                    f"split for the {flag} to count in",
                )
            )
    if plan.grad_dtype == "bf16" and plan.dtype == "fp32":
        out.append(("--grad-dtype", "bf16 gradients are a 16-bit training's (--dtype bf16 or fp16)"))
    if plan.global_batch % (plan.mbs * plan.dp):
        out.append(("--global-batch", f"{plan.global_batch} sequences do not split into mbs·dp = {plan.mbs}·{plan.dp}"))
    elif plan.microbatches > MAX_MICROBATCHES:
        out.append(
            (
                "--global-batch",
                f"{plan.microbatches:,} micro-batches per step per DP rank is more than {MAX_MICROBATCHES:,} (the "
                "schedule is simulated micro-batch by micro-batch): give a smaller --global-batch or --microbatches, "
                "or a longer --seqlen",
            )
        )
    elif plan.vpp > 1 and plan.schedule not in V_SHAPED and plan.microbatches % plan.pp:  # ZB-V takes any count
        out.append(("--microbatches", f"{plan.microbatches} micro-batches: interleaving needs a multiple of pp"))
    if plan.cp > 1 and plan.seqlen % (2 * plan.cp):
        out.append(("--cp", f"seqlen {plan.seqlen} is not a multiple of 2·cp (load-balanced causal context parallel)"))
    if plan.cp > 1:
        out += scan_cp_problems(cfg, plan, layers if layers is not None else decoder_layers(cfg))
    if plan.ep > 1 and not cfg.is_moe:
        out.append(("--ep", f"{cfg.name} has no experts"))
    elif plan.etp is not None and not cfg.is_moe:
        out.append(("--etp", f"{cfg.name} has no experts"))
    elif cfg.is_moe and (plan.tp * plan.cp * plan.dp) % (plan.ep * plan.expert_tp):
        out.append(
            ("--ep", f"ep·etp = {plan.ep * plan.expert_tp} does not divide tp·cp·dp = {plan.tp * plan.cp * plan.dp}")
        )
    if plan.moe_a2a_overlap:
        out += a2a_overlap_problems(cfg, plan)
    if plan.dispatcher != "alltoall":
        out += flex_problems(cfg, plan)
    if plan.recompute == "op":
        kinds = {g.layer for lay in (layers if layers is not None else decoder_layers(cfg)) for g in lay.gemms}
        if not kinds <= set(OP_SAC_GEMMS):
            out.append(
                (
                    "--recompute",
                    "op (torchtitan's per-op checkpointing) is modelled for dense attention + MLP layers only; "
                    f"{cfg.name} has {', '.join(sorted(kinds - set(OP_SAC_GEMMS)))}",
                )
            )
    if plan.fp8 != "none" and plan.dtype not in ("bf16", "fp16"):
        out.append(("--fp8", f"FP8 GEMMs run inside bf16/fp16 mixed precision, not --dtype {plan.dtype}"))
    if plan.fp8_recipe != "delayed" and plan.fp8 != "te":
        out.append(("--fp8-recipe", "a scaling recipe is Transformer Engine's: give --fp8 te"))
    if plan.fp8_param_gather and plan.fp8 != "te":
        out.append(("--fp8-param-gather", "FP8 parameters are Transformer Engine's: give --fp8 te"))
    if plan.fp8_param_gather and plan.sharding == "fsdp":
        out.append(("--fp8-param-gather", "FP8 parameters under FSDP are not modelled (Megatron's: --zero 1)"))
    try:
        check_parallel(cfg, plan.tokens, plan.model_parallel(), layers if layers is not None else decoder_layers(cfg))
    except UsageError as exc:  # its text names the field already ("field '--tp': …")
        out.append(("", str(exc)))
    return out


def a2a_overlap_problems(cfg: ModelConfig, plan: Plan) -> list[tuple[str, str]]:
    """Where Megatron-Core refuses --overlap-moe-expert-parallel-comm (its TransformerConfig's checks); the field
    named is the one to change (only a model without experts refuses it in every layout --search tries)."""
    why = "--moe-a2a-overlap hides the expert-parallel all-to-all"
    if not cfg.is_moe:
        return [("--moe-a2a-overlap", f"{why}: {cfg.name} has no experts")]
    if plan.ep == 1:
        return [("--ep", f"{why}: give --ep 2 or more")]
    if plan.pp > 1 and plan.vpp == 1:
        return [("--vpp", "under a pipeline, Megatron runs --moe-a2a-overlap in the interleaved schedule only")]
    if plan.pp > 1 and plan.schedule != "interleaved":
        return [("--schedule", "Megatron's --moe-a2a-overlap is an interleaved schedule of its own (combined 1F1B)")]
    if plan.recompute in ("full", "op"):
        return [
            ("--recompute", f"Megatron runs --moe-a2a-overlap without whole-layer recomputation ({plan.recompute})")
        ]
    if plan.dtype not in ("bf16", "fp16"):
        return [("--dtype", f"Megatron runs --moe-a2a-overlap in bf16 or fp16 mixed precision, not {plan.dtype}")]
    if plan.fp8 == "torchao":
        return [("--fp8", "--moe-a2a-overlap is Megatron's, and torchao's float8 torchtitan's: give --fp8 te")]
    if plan.mtp_layers > 1:
        return [("--mtp-num-layers", "Megatron runs --moe-a2a-overlap with one MTP depth at most")]
    if plan.sharding == "fsdp" and plan.pp > 1:
        return [("--fsdp", "Megatron's FSDP runs --moe-a2a-overlap without a pipeline only")]
    if plan.recompute == "selective" and "moe" in plan.recompute_modules:
        return [("--recompute-modules", "Megatron runs --moe-a2a-overlap without recomputing the MoE block (moe)")]
    return []


def flex_problems(cfg: ModelConfig, plan: Plan) -> list[tuple[str, str]]:
    """Where the flex dispatcher (DeepEP, HybridEP) does not run: no experts, no expert parallelism (Megatron
    refuses it), or an expert group (ep·etp GPUs) that neither fits in one node nor fills whole nodes."""
    if not cfg.is_moe:
        return [("--moe-token-dispatcher-type", f"{cfg.name} has no experts to dispatch tokens to")]
    if plan.ep == 1:
        return [("--ep", "the flex dispatcher dispatches over expert-parallel ranks: give --ep 2 or more")]
    group = plan.ep * plan.expert_tp
    if plan.spans_nodes(group, 1) and group % plan.domain:  # some expert group straddles domains, filling none
        where = "NVLink domains" if plan.nvlink_domain else "nodes"
        return [
            (
                "--ep",
                f"the flex dispatcher's expert group (ep·etp = {group}) must fill whole {where} of {plan.domain} or "
                "fit in one (ranks fill domains in order)",
            )
        ]
    return []


def check_domain(plan: Plan, source: str = "") -> None:
    """An NVLink domain is whole nodes (NVL72: 18 nodes of 4) or a part of one that splits it evenly (two 4-GPU
    islands in a node of 8): anything else has no placement of consecutive ranks. ``source``: where an implied
    domain came from (the device), said in the line."""
    d, node = plan.nvlink_domain, plan.gpus_per_node
    if d and d % node and node % d:
        raise UsageError(
            f"a domain of {d} GPUs{source} neither fills whole nodes of {node} (--gpus-per-node) nor splits one evenly",
            field="--nvlink-domain",
        )


@functools.lru_cache(maxsize=4096)
def domain_shares(world: int, domain: int, group: int, stride: int) -> tuple[int, bool]:
    """(the fewest ranks of one group in one domain it touches, whether any group touches two domains) for the
    groups of ``group`` ranks ``stride`` apart (plan.py's rank order: group ``(b, a)`` holds ranks
    ``b·group·stride + a + stride·j``) when ranks fill NVLink domains in order, rank r in domain ``r // domain``:
    what a scheduler hands out and Megatron-Core numbers (docs/project.md, "NVLink domains"). A group fits inside
    one domain only when its block of ``group·stride`` ranks does, i.e. when the block divides the domain (or the
    world is one domain); a domain larger than the block but not a multiple of it leaves some block straddling."""
    span = group * stride
    if group <= 1 or world <= domain or (span <= domain and domain % span == 0):
        return max(1, min(group, world)), False
    fewest = group
    for start in range(0, world - span + 1, span):  # one block of ``span`` ranks: ``stride`` interleaved groups
        for a in range(stride):
            first = start + a
            last = first + stride * (group - 1)
            for d in range(first // domain, last // domain + 1):  # ranks of this group in domain d
                lo = max(first, d * domain)
                hi = min(last, (d + 1) * domain - 1)
                n = (hi - first) // stride - (lo - first + stride - 1) // stride + 1
                fewest = min(fewest, n)
    return fewest, True


def check(cfg: ModelConfig, plan: Plan, layers: Sequence[Layer] | None = None) -> None:
    """Refuse an impossible layout with one line (the first reason)."""
    found = problems(cfg, plan, layers)
    if found:
        flag, why = found[0]
        raise UsageError(why, field=flag or None)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _model_chunks(cfg: ModelConfig, pp: int) -> list[int]:
    """The vpp values worth trying with ``pp`` stages: 2 and 4, and every other count up to 8 that splits each
    stage's layers evenly (Megatron's recipes use 5 for 80 layers on 4 stages)."""
    if pp == 1:
        return [1]
    layers = cfg.num_hidden_layers or 0
    per_stage = layers // pp if layers % pp == 0 else 0
    return sorted({1, 2, 4} | {v for v in range(3, 9) if per_stage and per_stage % v == 0})


def layouts(cfg: ModelConfig, base: Plan, max_tp: int | None = None) -> Iterator[Plan]:
    """Every layout of ``base.world`` GPUs worth trying: tp up to a node (TP across nodes is never faster), or up
    to 8 inside an NVLink domain larger than the node (GB200's nodes of 4 in an NVL72 rack), pp, cp, ep (MoE), vpp,
    mbs, sharding and recompute, each combination yielded once (validity is checked later, so the caller can say why
    each was rejected)."""
    world = base.world
    widest = max(base.gpus_per_node, min(base.domain, 8))  # Megatron's recipes stop at TP 8 on NVL72 as on HGX
    tps = [t for t in _divisors(world) if t <= (max_tp or widest)]
    for tp in tps:
        for pp in _divisors(world // tp):
            for cp in _divisors(world // (tp * pp)):
                if cp > 1 and cp * tp > widest * 8:
                    continue
                eps = _divisors(world) if cfg.is_moe else [1]
                for ep in eps:
                    if ep > 1 and (cfg.n_routed_experts % ep or ep > cfg.n_routed_experts):
                        continue
                    for vpp in _model_chunks(cfg, pp):
                        for mbs in (1, 2, 4):
                            for sharding in SHARDINGS:
                                for recompute in RECOMPUTE:
                                    yield replace(
                                        base,
                                        tp=tp,
                                        pp=pp,
                                        cp=cp,
                                        ep=ep,
                                        vpp=vpp,
                                        mbs=mbs,
                                        sharding=sharding,
                                        recompute=recompute,
                                        schedule=_schedule(base.schedule, vpp),
                                    )


def _schedule(asked: str, vpp: int) -> str:
    """The search's schedule for ``vpp`` chunks: interleaved with more than one, zero-bubble where asked (ZB-V: its
    two chunks, the other counts the zero-bubble form of their schedule)."""
    if asked in V_SHAPED and vpp == 2:
        return asked
    zero_bubble = asked in (*ZERO_BUBBLE, *V_SHAPED)
    if vpp > 1:
        return "interleaved-zero-bubble" if zero_bubble else "interleaved"
    return "zero-bubble" if zero_bubble else "1f1b"


def check_part(plan: Plan, device: str | None) -> None:
    """What the target part itself cannot run, refused in one line (every entry point that projects calls it):
    MXFP8 off the parts with MXFP8 tensor cores (``core.peaks.MX_PARTS``; docs/project.md, "FP8")."""
    if plan.fp8 == "te" and plan.fp8_recipe == "mxfp8" and not has_mxfp8(device):
        raise UsageError(
            f"MXFP8 runs on Blackwell (B200, GB200, B300, GB300) and MI350X/MI355X, not on {device or 'this part'}"
            " (docs/project.md, 'FP8')",
            field="--fp8-recipe",
        )


def fp8_gemm(plan: Plan, name: str, n: int, k: int, groups: int = 1) -> bool:
    """Whether a decoder layer's GEMM ``name`` (weight n × k on this rank) runs in FP8 under ``plan.fp8``: every
    linear layer but the router, and none with a dimension FP8 GEMMs cannot take (not a multiple of 16, as
    torchtitan's float8 converter and Transformer Engine require; of 32 under MXFP8, its scale blocks'). torchao
    converts nn.Linear only: grouped (routed-expert) GEMMs stay 16-bit there (docs/project.md, "FP8")."""
    align = 32 if plan.fp8 == "te" and plan.fp8_recipe == "mxfp8" else 16
    if plan.fp8 == "none" or name in FP8_EXCLUDED or n % align or k % align:
        return False
    return not (plan.fp8 == "torchao" and groups > 1)
