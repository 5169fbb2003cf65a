"""``python -m opbench.project`` / ``opbench project``: a training step's time and memory per GPU, and the best
parallel layout, from this cluster's own measurements (docs/project.md).

Give a model, a batch and a layout, and the CSVs opbench measured on the target (``--results``): every GEMM,
attention operator and collective of the step is looked up there (interpolated where a size was not measured,
estimated from the peak table where no CSV covers it, and said so). ``--search`` ranks every valid layout of
``--world-size`` GPUs; ``--validate`` trains the model for real on this machine and sets the projection beside
what it measured. Torch is imported only by ``--validate``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from opbench.core import cli, outputs
from opbench.core.cli import finite_float, positive_int
from opbench.core.errors import UsageError, run_cli
from opbench.core.redact import redact_text
from opbench.core.results import CsvReport, environment, summary_table
from opbench.core.units import counted, one_line
from opbench.models import ModelConfig, load_model_configs, select_models

from .memory import GIB
from .pipeline import SCHEDULES, in_flight
from .plan import (
    ATTENTION_BACKENDS,
    DISPATCHERS,
    FP8_RECIPES,
    FP8_SCALINGS,
    MAX_MICROBATCHES,
    RECOMPUTE_CHOICES,
    RECOMPUTE_MODULES,
    Plan,
    a2a_overlap_problems,
    flex_problems,
    layouts,
    problems,
)
from .rates import ESTIMATED, Assumptions, Rates
from .schema import COMM_KINDS, SCHEMA
from .step import Projection, Projector

CSV_NAME = "project.csv"
# The layout flags --search chooses itself (plan.layouts), by their argparse names
SEARCH_VARIES = ("tp", "pp", "cp", "ep", "vpp", "mbs", "recompute", "fsdp", "zero")
# Flags --search keeps as given in every layout it tries (the rest it varies)
SEARCH_KEEPS = frozenset(
    {
        "--fp8",
        "--fp8-recipe",
        "--fp8-param-gather",
        "--grad-dtype",
        "--etp",
        "--account-for-embedding-in-pipeline-split",
        "--account-for-loss-in-pipeline-split",
        "--moe-a2a-overlap",
        "--moe-token-dispatcher-type",
    }
)
DEFAULT_GLOBAL_BATCH_TOKENS = 4 << 20  # 4 Mi tokens per step when neither --global-batch nor --microbatches
DEFAULT_RESERVE_GIB = 4.0


# Hugging Face config fields of a residual (hidden) dropout, as architectures name it
DROPOUT_FIELDS = ("hidden_dropout", "resid_pdrop", "residual_dropout", "hidden_dropout_prob")


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def dropout(text: str) -> float:
    value = finite_float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, got {text}")
    return value


fraction = cli.within(0, 1)
efficiency = cli.within(0.01, 1)  # a share of a peak a kernel reaches: below 1 % is a typo, and 0 a division by zero


def recompute_modules(text: str) -> tuple[str, ...]:
    names = {n.strip() for n in text.split(",") if n.strip()}
    unknown = sorted(names - set(RECOMPUTE_MODULES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{', '.join(repr(n) for n in unknown) or repr(text)}: give modules of {', '.join(RECOMPUTE_MODULES)}"
        )
    return tuple(m for m in RECOMPUTE_MODULES if m in names)  # one order: one label, one cache entry


def mtp_depths(text: str) -> int:
    value = cli.integer(text)
    if not 0 <= value <= 16:
        raise argparse.ArgumentTypeError(f"must be between 0 and 16 prediction depths, got {text}")
    return value


# a calibration factor: a step cannot be 100 times faster or slower than its kernels say
scale_factor = cli.within(0.01, 100)


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("opbench project", __doc__)
    m = p.add_argument_group("model and batch")
    cli.add_model_args(m, model_help="the model (one name from the configs)")
    m.add_argument("--seqlen", type=cli.sequence_length, default=None, help="sequence length (default: the config's)")
    m.add_argument(
        "--mbs",
        type=cli.at_most(MAX_MICROBATCHES, "sequences per micro-batch"),
        default=1,
        help="micro-batch size, sequences (default: 1)",
    )
    m.add_argument(
        "--global-batch",
        type=positive_int,
        default=None,
        help=f"sequences per optimizer step (default: {DEFAULT_GLOBAL_BATCH_TOKENS >> 20} Mi tokens' worth, or "
        "--microbatches × mbs × dp)",
    )
    m.add_argument("--microbatches", type=positive_int, default=None, help="micro-batches per step per DP rank")
    m.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16", help="training precision")
    lay = p.add_argument_group("layout (data parallel = the rest: world / (tp·pp·cp))")
    lay.add_argument("--world-size", type=cli.world_size, required=True, help="GPUs in the job")
    lay.add_argument("--gpus-per-node", type=positive_int, default=8, help="GPUs per node (default: 8)")
    for flag, what in (
        ("--tp", "tensor parallel"),
        ("--pp", "pipeline parallel"),
        ("--cp", "context parallel"),
        ("--ep", "expert parallel"),
    ):
        lay.add_argument(flag, type=positive_int, default=1, help=f"{what} size (default: 1)")
    lay.add_argument("--etp", type=positive_int, default=None, help="expert tensor parallel (default: --tp)")
    lay.add_argument(
        "--vpp",
        type=cli.at_most(cli.MAX_LAYERS, "model chunks per stage"),
        default=1,
        help="model chunks per pipeline stage (interleaved)",
    )
    lay.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=None,
        help="pipeline schedule (default: interleaved when --vpp > 1); zero-bubble = ZB-H1, "
        "interleaved-zero-bubble, zbv = ZB-V with --vpp 2 (docs/project.md, 'A step')",
    )
    lay.add_argument("--fsdp", action="store_true", help="shard parameters, gradients and optimizer (FSDP2/ZeRO-3)")
    lay.add_argument("--zero", type=cli.integer, choices=[0, 1], default=0, help="1: shard the optimizer only (ZeRO-1)")
    lay.add_argument(
        "--recompute",
        choices=RECOMPUTE_CHOICES,
        default="none",
        help="activation recomputation: selective = Megatron's core attention; op = torchtitan's per-op "
        "checkpointing (every second matmul output and attention kept)",
    )
    lay.add_argument(
        "--recompute-modules",
        type=recompute_modules,
        default=None,
        metavar="M[,M...]",
        help="with --recompute selective, Megatron's flag: what it recomputes, of "
        f"{', '.join(RECOMPUTE_MODULES)} (default: core_attn)",
    )
    lay.add_argument(
        "--recompute-method",
        choices=["uniform", "block"],
        default=None,
        help="with --recompute full, Megatron's flag: uniform checkpoints groups of --recompute-num-layers layers "
        "(each keeps its input only), block the first --recompute-num-layers layers of each model chunk and no "
        "others (default: uniform)",
    )
    lay.add_argument(
        "--recompute-num-layers",
        type=cli.positive_int,
        default=None,
        metavar="N",
        help="with --recompute full, Megatron's flag: the group size (uniform) or the layers recomputed per chunk "
        "(block) (default: 1 with uniform; block needs it)",
    )
    lay.add_argument(
        "--no-sequence-parallel", action="store_true", help="TP without sequence parallelism (all-reduces)"
    )
    # Megatron-Core's uneven pipeline split, under its own flag names (docs/project.md, "Layouts")
    for end in ("first", "last"):
        lay.add_argument(
            f"--decoder-{end}-pipeline-num-layers",
            type=cli.layer_count,
            default=None,
            metavar="N",
            help=f"decoder layers of the {end} pipeline piece (the rest split evenly)",
        )
    for part, piece in (("embedding", "first"), ("loss", "last")):
        lay.add_argument(
            f"--account-for-{part}-in-pipeline-split",
            action="store_true",
            help=f"the {part} counts as one layer of the {piece} piece when layers are split",
        )
    lay.add_argument(
        "--fp8",
        choices=FP8_RECIPES,
        default="none",
        help="the decoder layers' GEMMs in FP8 (docs/project.md, 'FP8'): te = Transformer Engine as Megatron-LM, "
        "NeMo and Primus run it; torchao = torchtitan's float8 (tensorwise, FP8 FSDP all-gathers)",
    )
    lay.add_argument(
        "--fp8-recipe",
        choices=FP8_SCALINGS,
        default=None,
        help="with --fp8 te, Megatron's --fp8-recipe: delayed scaling (default) or tensorwise current scaling "
        "(Megatron-Bridge's FP8-CS), whose casts take each tensor's amax in a pass of their own",
    )
    lay.add_argument(
        "--fp8-param-gather",
        action="store_true",
        help="with --fp8 te: the FP8 weights are the parameters (Megatron's --fp8-param-gather, NeMo's fp8_params): "
        "no 16-bit copy beside them, and the distributed optimizer all-gathers them in FP8",
    )
    lay.add_argument(
        "--grad-dtype",
        choices=("fp32", "bf16"),
        default="fp32",
        help="main gradients and their data-parallel reduction without --fsdp (default fp32: Megatron's "
        "--accumulate-allreduce-grads-in-fp32 under bf16; bf16: NeMo's grad_reduce_in_fp32=False)",
    )
    lay.add_argument(
        "--hidden-dropout",
        type=dropout,
        default=0.0,
        metavar="P",
        help="dropout on the embedding and each block's output, as Megatron's flag (default 0, as LLM recipes "
        "train; Megatron's own default is 0.1): each keeps a 1-byte mask for backward",
    )
    lay.add_argument(
        "--cross-entropy-loss-fusion",
        action="store_true",
        help="Megatron's flag of that name (native; Megatron-Bridge and NeMo 2 turn it on): its exponentials are a "
        "second fp32 copy of the logits at the last stage's peak",
    )
    lay.add_argument(
        "--mtp-num-layers",
        type=mtp_depths,
        default=0,
        metavar="N",
        help="Megatron's flag: multi-token prediction depths (DeepSeek-V3's; Megatron-Bridge's DeepSeek recipes use "
        "1): each a layer like the last, eh_proj and another output layer and loss, on the last stage",
    )
    lay.add_argument(
        "--moe-a2a-overlap",
        "--overlap-moe-expert-parallel-comm",
        action="store_true",
        help="Megatron's --overlap-moe-expert-parallel-comm (Megatron-Bridge's moe_a2a_overlap): one micro-batch's "
        "forward runs beside another's backward, each all-to-all hidden behind the other's compute (needs --ep, "
        "and --vpp under a pipeline)",
    )
    lay.add_argument(
        "--moe-token-dispatcher-type",
        choices=DISPATCHERS,
        default="alltoall",
        help="Megatron's flag: alltoall (NCCL; top-k copies of each token, the default) or flex (DeepEP or "
        "HybridEP: a token crosses the network once to each node its experts are on, then NVLink to each GPU)",
    )
    lay.add_argument(
        "--attention-backend",
        choices=ATTENTION_BACKENDS,
        default="auto",
        help="Megatron's flag: unfused (or local) keeps the softmax of every score for backward, a·s²·b elements "
        "a layer; auto, flash and fused keep a log-sum-exp (default: auto). Memory only: the time is the "
        "attention rates'",
    )
    lay.add_argument(
        "--attention-dropout",
        type=dropout,
        default=0.0,
        metavar="P",
        help="Megatron's flag (default 0 here, as LLM recipes train; Megatron's own default is 0.1): with "
        "--attention-backend unfused, a 1-byte mask and the dropped-out softmax kept per score",
    )
    lay.add_argument(
        "--memory-gib",
        type=cli.within(0.01, 1 << 20, "GiB"),
        default=None,
        help="memory per GPU (default: the device's)",
    )
    lay.add_argument(
        "--memory-reserve-gib",
        type=non_negative_float,
        default=DEFAULT_RESERVE_GIB,
        help="memory a step cannot use: the CUDA/HIP context, NCCL/RCCL buffers and allocator fragmentation, none "
        f"of which max_memory_allocated counts (default: {DEFAULT_RESERVE_GIB:g})",
    )
    r = p.add_argument_group("rates (docs/project.md, 'Rates'; every assumption below is one of them)")
    r.add_argument(
        "--results",
        nargs="+",
        action="extend",
        default=[],
        metavar="DIR",
        help="folders of opbench CSVs from the target (the flag may be repeated: every folder named is read); "
        "with --validate, rates this machine measured already, used instead of measuring again",
    )
    r.add_argument(
        "--device",
        default=None,
        help="the target GPU for the peak and link tables, e.g. 'H100' "
        "(default: the device the --results were measured on)",
    )
    a = Assumptions()
    r.add_argument(
        "--gemm-efficiency",
        type=efficiency,
        default=None,
        help="share of the dense peak a GEMM reaches without a row (default: 0.934 of the part's best published "
        "matmul in that dtype: 0.75 of an H100's bf16 peak, 0.66 of its FP8 peak, 0.48 of an MI300X's bf16 peak; "
        "docs/project.md, 'Rates')",
    )
    r.add_argument(
        "--attention-efficiency",
        type=efficiency,
        default=None,
        help="share of the bf16 peak attention (forward + backward) reaches without a row (default: 0.45 on an H100, "
        "another part scaled as its best published matmul is: 0.29 on an MI300X; docs/project.md, 'Rates')",
    )
    for flag, default, what, kind in (
        ("--memory-efficiency", a.memory_efficiency, "share of HBM bandwidth a streaming kernel reaches", efficiency),
        ("--link-efficiency", a.link_efficiency, "share of a link's peak a collective's busbw reaches", efficiency),
        ("--nic-gbs", a.nic_gbs, "network GB/s per GPU per direction", cli.within(0.01, 1e6, "GB/s")),
        (
            "--latency-us-intra",
            a.latency_us_intra,
            "a collective's fixed cost inside a node, µs",
            cli.within(1e-3, 1e6, "µs"),
        ),
        ("--latency-us-inter", a.latency_us_inter, "... across nodes, µs", cli.within(1e-3, 1e6, "µs")),
        (
            "--tp-overlap",
            a.tp_overlap,
            "share of the exposed TP collectives hidden (TE userbuffers, async TP)",
            fraction,
        ),
        ("--ep-overlap", a.ep_overlap, "share of the EP all-to-all hidden", fraction),
    ):
        r.add_argument(flag, type=kind, default=default, help=f"{what} (default: {default:g})")
    r.add_argument(
        "--memory-bandwidth-gbs", type=cli.within(1, 1e6, "GB/s"), default=None, help="memory bandwidth, GB/s"
    )
    r.add_argument(
        "--compute-scale",
        type=scale_factor,
        default=1.0,
        help="calibration: every compute time × this (--validate on one node of the target prints it: what a real "
        "step spends beyond its kernels' rates) (default: 1)",
    )
    r.add_argument(
        "--optimizer-bytes-per-param",
        type=cli.within(1e-3, 1024, "bytes"),
        default=None,
        help="bytes the optimizer moves per parameter (default: 30 fused mixed precision, 28 fp32, "
        "80 eager PyTorch AdamW)",
    )
    r.add_argument("--no-cp-overlap", action="store_true", help="the CP ring's sends are not hidden by attention")
    r.add_argument("--no-dp-overlap", action="store_true", help="gradient reduction is not overlapped")
    r.add_argument(
        "--activation-profile",
        choices=["fused", "eager"],
        default="fused",
        help="what layers save for backward: fused kernels (Megatron/TE) or PyTorch eager (transformers)",
    )
    r.add_argument(
        "--memory-ops",
        choices=["fused", "eager"],
        default="fused",
        help="what the memory-bound operators move: fused kernels (Megatron/TE, torch.compile) or PyTorch eager op "
        "by op, as transformers' model runs them (--validate always)",
    )
    s = p.add_argument_group("search and validation")
    s.add_argument("--search", action="store_true", help="rank every valid layout of --world-size GPUs")
    cli.add_top_arg(s, 10)
    s.add_argument("--validate", action="store_true", help="train the model here for real and compare")
    s.add_argument("--nproc-per-node", type=positive_int, default=1, help="--validate: ranks (2: real FSDP2)")
    s.add_argument("--steps", type=positive_int, default=3, help="--validate: timed training steps")
    cli.add_timeout_arg(s, 300.0)
    cli.add_output_args(
        p,
        dir_help=f"write DIR/{CSV_NAME}",
        csv_help="the CSV itself (wins over --report-dir-path)",
    )
    cli.add_earlier_args(p)
    return p


def assumptions(args: argparse.Namespace) -> Assumptions:
    return Assumptions(
        gemm_efficiency=args.gemm_efficiency,
        attention_efficiency=args.attention_efficiency,
        memory_efficiency=args.memory_efficiency,
        link_efficiency=args.link_efficiency,
        nic_gbs=args.nic_gbs,
        latency_us_intra=args.latency_us_intra,
        latency_us_inter=args.latency_us_inter,
        memory_bandwidth_gbs=args.memory_bandwidth_gbs,
        tp_overlap=args.tp_overlap,
        ep_overlap=args.ep_overlap,
        cp_overlap=not args.no_cp_overlap,
        dp_overlap=not args.no_dp_overlap,
        optimizer_bytes_per_param=args.optimizer_bytes_per_param,
        memory_ops=args.memory_ops,
        compute_scale=args.compute_scale,
    )


def base_plan(cfg: ModelConfig, args: argparse.Namespace) -> Plan:
    seqlen = args.seqlen or cfg.seqlen
    if not seqlen:
        raise UsageError(f"{cfg.name} has no seqlen; pass --seqlen", field="--seqlen")
    if args.fsdp and args.zero:
        raise UsageError("give --fsdp or --zero 1, not both", field="--zero")
    for flag, value in (("--activation-profile", args.activation_profile), ("--memory-ops", args.memory_ops)):
        if args.moe_a2a_overlap and value == "eager":
            raise UsageError(
                "eager is PyTorch as transformers runs it; --moe-a2a-overlap is Megatron's (fused kernels)", field=flag
            )
    if args.moe_a2a_overlap and args.ep_overlap:
        raise UsageError(
            "--moe-a2a-overlap works out what Megatron's overlap hides; --ep-overlap is a share given by hand: give "
            "one",
            field="--ep-overlap",
        )
    if args.recompute_modules and args.recompute != "selective" and not args.search:  # the search tries selective
        raise UsageError(
            "names what --recompute selective recomputes: give --recompute selective", field="--recompute-modules"
        )
    if (args.recompute_method or args.recompute_num_layers) and args.recompute != "full" and not args.search:
        raise UsageError(
            "says which layers --recompute full recomputes: give --recompute full",
            field="--recompute-method" if args.recompute_method else "--recompute-num-layers",
        )
    if args.recompute_method == "block" and not args.recompute_num_layers:
        raise UsageError("block recomputes the first N layers of each chunk: give N", field="--recompute-num-layers")
    if args.fp8_recipe is not None and args.fp8 != "te":  # torchao's float8 is tensorwise, with no recipe to choose
        raise UsageError("a scaling recipe is Transformer Engine's: give --fp8 te", field="--fp8-recipe")
    plan = Plan(
        world=args.world_size,
        seqlen=seqlen,
        global_batch=1,
        mbs=args.mbs,
        tp=args.tp,
        pp=args.pp,
        cp=args.cp,
        ep=args.ep,
        etp=args.etp,
        vpp=args.vpp,
        sharding="fsdp" if args.fsdp else ("zero1" if args.zero else "none"),
        recompute=args.recompute,
        schedule=args.schedule or ("interleaved" if args.vpp > 1 else "1f1b"),
        sequence_parallel=not args.no_sequence_parallel,
        grad_dtype=args.grad_dtype,
        fp8=args.fp8,
        fp8_param_gather=args.fp8_param_gather,
        fp8_recipe=args.fp8_recipe or "delayed",
        hidden_dropout=args.hidden_dropout,
        ce_fusion=args.cross_entropy_loss_fusion,
        attention_backend=args.attention_backend,
        attention_dropout=args.attention_dropout,
        mtp_layers=args.mtp_num_layers,
        moe_a2a_overlap=args.moe_a2a_overlap,
        dispatcher=args.moe_token_dispatcher_type,
        recompute_modules=args.recompute_modules or ("core_attn",),
        recompute_method=args.recompute_method or "uniform",
        recompute_num_layers=args.recompute_num_layers or 1,
        first_layers=args.decoder_first_pipeline_num_layers,
        last_layers=args.decoder_last_pipeline_num_layers,
        embedding_as_layer=args.account_for_embedding_in_pipeline_split,
        loss_as_layer=args.account_for_loss_in_pipeline_split,
        gpus_per_node=args.gpus_per_node,
        dtype=args.dtype,
    )
    if args.global_batch and args.microbatches:
        raise UsageError("give --global-batch or --microbatches, not both", field="--microbatches")
    if args.microbatches:
        if plan.world % (plan.tp * plan.pp * plan.cp):
            raise UsageError(f"{plan.world} GPUs do not split into tp·pp·cp", field="--world-size")
        return replace(plan, global_batch=args.microbatches * plan.mbs * plan.dp)
    return replace(plan, global_batch=args.global_batch or default_global_batch(plan))


def default_global_batch(plan: Plan) -> int:
    """As near 4 Mi tokens' worth of sequences as whole micro-batches on every DP rank allow (24 DP ranks take 504
    of 8,192 tokens, not 512, which no layout of them splits), at least one each and at most MAX_MICROBATCHES (a
    short --seqlen on few GPUs would ask for hundreds of thousands)."""
    per_step = plan.mbs * max(1, plan.dp)
    return per_step * max(1, min(DEFAULT_GLOBAL_BATCH_TOKENS // plan.seqlen // per_step, MAX_MICROBATCHES))


def row(
    cfg: ModelConfig, r: Projection, rank: int | None, device: str | None, memory_gib: float | None
) -> dict[str, Any]:
    p, m = r.plan, r.memory
    out: dict[str, Any] = {
        "model": cfg.name,
        "layout": p.label(),
        "world_size": p.world,
        "tp": p.tp,
        "pp": p.pp,
        "dp": p.dp,
        "cp": p.cp,
        "ep": p.ep,
        "etp": p.expert_tp,
        "vpp": p.vpp,
        "mbs": p.mbs,
        "microbatches": p.microbatches,
        "global_batch": p.global_batch,
        "seqlen": p.seqlen,
        "sharding": p.sharding,
        "recompute": p.recompute,
        "schedule": p.schedule,
        "dtype": p.dtype,
        "fp8": p.fp8,
        "device": device,
        "rank": rank,
        "step_time_s": r.step_s,
        "compute_s": r.compute_s,
        "exposed_comm_s": r.exposed_comm_total,
        **{f"{k}_s": r.exposed_comm_s.get(k, 0.0) for k in COMM_KINDS},
        "bubble_s": r.bubble_s,
        "optimizer_s": r.optimizer_s,
        "tokens_per_s": r.tokens_per_s,
        "mfu": r.mfu,
        "mem_params_gib": m.params / GIB,
        "mem_grads_gib": m.grads / GIB,
        "mem_optimizer_gib": m.optimizer / GIB,
        "mem_activations_gib": m.activations / GIB,
        "mem_buffers_gib": m.buffers / GIB,
        "mem_total_gib": m.total / GIB,
        "memory_gib": memory_gib,
        "fits": r.fits,
        "estimated_share": r.estimated_share,
        "rates": "; ".join(f"{k}: {v}" for k, v in sorted(r.sources.items())),
        "status": "ok" if r.fits else "does not fit",
        "error": None,
    }
    return out


def breakdown(
    cfg: ModelConfig, r: Projection, device: str | None, memory_gib: float | None, reserve_gib: float = 0.0
) -> str:
    """The console view of one projection: where a step's time goes and what a GPU holds."""
    p, m = r.plan, r.memory
    name, target = (one_line(redact_text(str(x))) for x in (cfg.name, device or "the target"))
    lines = [
        f"{name} on {p.world} × {target} ({p.dtype}): {p.label()}, {p.microbatches} "
        f"micro-batch(es) of {p.mbs} × {p.seqlen} tokens per DP rank, global batch {p.global_batch}",
        f"step {r.step_s:.4g} s   {r.tokens_per_s:,.0f} tokens/s"
        + (f"   MFU {100 * r.mfu:.1f} %" if r.mfu is not None else "")
        + (f" (of the {p.dtype} peak)" if r.mfu is not None and p.fp8 != "none" else "")
        + f"   ({100 * r.estimated_share:.0f} % of the time from estimated rates)",
        "",
    ]
    if r.mfu is not None and r.mfu > 1 and p.fp8 == "none":
        lines.insert(2, "note: MFU above 100 %: --compute-scale or the rates put the step's FLOPs beyond the peak")
    parts = [("compute (GEMM, attention, memory-bound)", r.compute_s)]
    parts += [(f"exposed {k.replace('_', ' ')}", v) for k, v in r.exposed_comm_s.items() if v > 0]
    parts += [("pipeline bubble", r.bubble_s)] if p.pp > 1 else []
    parts += [("optimizer", r.optimizer_s)]
    width = max(len(n) for n, _ in parts)
    for name, seconds in parts:
        lines.append(f"  {name:<{width}}  {seconds:10.4g} s  {100 * seconds / r.step_s:5.1f} %")
    limit = f" (+{reserve_gib:g} GiB reserved) of {memory_gib:g} GiB" if memory_gib else ""
    verdict = ("fits" if r.fits else "DOES NOT FIT") if memory_gib else "no limit given"
    stage = f"stage {r.memory_stage} of {p.pp}, the fullest" if p.pp > 1 else "per rank"
    lines += [
        "",
        f"memory ({stage}): {m.total / GIB:.2f} GiB{limit}: {verdict}",
        f"  params {m.params / GIB:.2f}  grads {m.grads / GIB:.2f}  optimizer {m.optimizer / GIB:.2f}  "
        f"activations {m.activations / GIB:.2f}  buffers {m.buffers / GIB:.2f} GiB"
        + (f"  (never all at once: -{m.not_at_peak / GIB:.2f})" if m.not_at_peak else ""),
        "rates: " + "; ".join(f"{k} {v}" for k, v in sorted(r.sources.items())),
    ]
    return "\n".join(lines)


def search(
    cfg: ModelConfig, base: Plan, projector: Projector, top: int | None, global_batch_set: bool
) -> tuple[list[Projection], Counter[str], int]:
    """Every layout of the world, screened (closed-form schedule), the best ``top`` (None: all) re-projected op by
    op."""
    rejected: Counter[str] = Counter()
    fitting: list[Projection] = []
    seen = 0
    for plan in layouts(cfg, base):
        seen += 1
        if not global_batch_set:  # the default, for this layout's DP ranks and micro-batch
            plan = replace(plan, global_batch=default_global_batch(plan))
        found = problems(cfg, plan, projector.layers)
        if plan.pp > 1 and plan.sharding == ("zero1" if projector.profile == "eager" else "fsdp"):
            # under a pipeline ZeRO-1 (Megatron-Core's, the fused profile) and FSDP (torchtitan's, eager) project
            # the same: one row, the profile's framework's
            found = [("--zero", "under a pipeline, ZeRO-1 is the fused profile's sharding and FSDP the eager one's")]
        if found:
            rejected[_reason_class(found[0])] += 1
            continue
        flight = in_flight(plan.pp, plan.microbatches, plan.vpp, plan.schedule)
        memory, _ = projector.memory(plan, flight)
        if not projector.fits(memory.total):
            rejected[f"does not fit in {projector.memory_gib:g} GiB"] += 1
            continue
        fitting.append(projector.project(plan, exact=False))
        fewer = fewest_recomputed(cfg, plan, projector, flight)
        if fewer is not None:
            fitting.append(projector.project(fewer, exact=False))
    fitting.sort(key=lambda r: -r.tokens_per_s)
    best = [projector.project(r.plan) for r in fitting[: 3 * top if top else None]]
    best.sort(key=lambda r: -r.tokens_per_s)
    return best[:top], rejected, seen


def fewest_recomputed(cfg: ModelConfig, plan: Plan, projector: Projector, flight: tuple[int, ...]) -> Plan | None:
    """For a layout that fits with every layer recomputed (Megatron's fused profile), the same layout recomputing
    only the first N layers of each chunk (--recompute-method block), N the fewest that still fit; None when no
    fewer fit (or the layout is not one of these). Memory only falls as N grows, so N is found by bisection."""
    if projector.profile != "fused" or plan.recompute != "full" or plan.recompute_method != "uniform":
        return None
    if plan.recompute_num_layers != 1 or plan.moe_a2a_overlap or plan.sharding == "fsdp":
        return None
    pieces = plan.piece_layers(cfg.num_hidden_layers or 0) or []
    most = max(pieces, default=0)

    def fits(n: int) -> bool:
        trial = replace(plan, recompute_method="block", recompute_num_layers=n)
        return projector.fits(projector.memory(trial, flight)[0].total)

    if most < 2 or not fits(most - 1) or fits(0):  # none fit with fewer, or all fit without (its own layout)
        return None
    low, high = 0, most - 1  # fits(high); the fewest N in (low, high] that fits
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return replace(plan, recompute_method="block", recompute_num_layers=high)


def _reason_class(found: tuple[str, str]) -> str:
    flag, why = found
    if "not divisible by --tp" in why:
        return "heads or widths do not split over tp"
    if "--moe-a2a-overlap" in why or "flex dispatcher" in why:  # the layouts Megatron runs them in
        return why
    if "--ep" in why or flag == "--ep":
        return "experts do not split over ep / etp"
    if "split a pipeline: give --pp 2" in why:
        return "first/last pipeline layers given without a pipeline"
    return {
        "--pp": "layers do not split over pp·vpp",
        "--global-batch": "global batch does not split over mbs·dp",
        "--microbatches": "interleaving needs micro-batches a multiple of pp",
        "--cp": "seqlen does not split over 2·cp",
        "--zero": "same layout, other pipeline sharding (--profile fused shards zero1, eager fsdp)",
    }.get(flag, why)


SEARCH_COLUMNS = [
    "rank",
    "layout",
    "step_time_s",
    "tokens_per_s",
    "mfu",
    "compute_s",
    "exposed_comm_s",
    "bubble_s",
    "mem_total_gib",
    "estimated_share",
]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.model_config_path is None and args.model is None:
        raise UsageError("name the model (--model, from the built-in configs, or --model-config-path)", field="--model")
    configs = select_models(load_model_configs(args.model_config_path, args.model_name), args.model)
    if len(configs) != 1:
        raise UsageError(f"projects one model at a time, got {len(configs)}", field="--model")
    (cfg,) = configs
    plan = base_plan(cfg, args)
    if args.search:
        if args.microbatches:
            raise UsageError(
                "--search ranks every layout at one global batch (each layout's micro-batches follow from its "
                "mbs·dp): give --global-batch",
                field="--microbatches",
            )
        # a flag the search keeps for every layout: a problem with it would reject them all, and print nothing
        fixed = [(flag, why) for flag, why in problems(cfg, plan) if flag in SEARCH_KEEPS]
        if fixed:
            raise UsageError(fixed[0][1], field=fixed[0][0])
        varied = [f"--{name}" for name in SEARCH_VARIES if getattr(args, name) != build_parser().get_default(name)]
        if varied:
            print(
                f"note: --search tries its own {', '.join(varied)} (every layout of the world): the values given are "
                "not used",
                file=sys.stderr,
            )
    splits = args.search or not plan.world % (plan.tp * plan.pp * plan.cp)  # else that is the first thing to say
    if plan.gpus_per_node < plan.world and plan.world % plan.gpus_per_node and splits:
        raise UsageError(
            f"{plan.world} GPUs do not fill nodes of {plan.gpus_per_node} (--gpus-per-node)", field="--world-size"
        )
    config_dropout = next((k for k in DROPOUT_FIELDS if _positive(cfg.raw.get(k))), None)
    if config_dropout and not plan.hidden_dropout and not args.validate:
        print(
            f"note: the config's {config_dropout} is {cfg.raw[config_dropout]}; --hidden-dropout (default 0) counts "
            "the dropout masks a run with it keeps",
            file=sys.stderr,
        )
    if args.validate:
        if plan.fp8 != "none":
            raise UsageError(
                "--validate trains in 16 or 32 bits here; project --fp8 without it (docs/project.md, 'FP8')",
                field="--fp8",
            )
        if plan.recompute != "none":
            raise UsageError(
                "--validate trains without recomputation: project --recompute without it", field="--recompute"
            )
        if plan.unfused_attention or plan.ce_fusion or plan.mtp_layers:
            raise UsageError(
                "--validate trains transformers' model with SDPA and torch's cross-entropy: project Megatron's "
                "kernels without it",
                field="--attention-backend"
                if plan.unfused_attention
                else ("--cross-entropy-loss-fusion" if plan.ce_fusion else "--mtp-num-layers"),
            )
        if plan.dispatcher != "alltoall":
            for flag, why in flex_problems(cfg, plan):  # first what Megatron itself would refuse
                raise UsageError(why, field=flag)
            raise UsageError(
                "--validate trains with torch's all-to-all, not DeepEP or HybridEP: project it without --validate",
                field="--moe-token-dispatcher-type",
            )
        if plan.moe_a2a_overlap:
            for flag, why in a2a_overlap_problems(cfg, plan):  # first what Megatron itself would refuse
                raise UsageError(why, field=flag)
            raise UsageError(
                "--validate trains with torch's schedules, which have no combined 1F1B: project it without --validate",
                field="--moe-a2a-overlap",
            )
        from .validate import validate

        return validate(cfg, plan, args)
    rates = Rates(args.results, args.device, args.dtype, assumptions(args), args.gpus_per_node)
    for note in rates.notes:  # rows of --results left out for bad values: counted, the first named
        from opbench.report.inert import one_line  # names from the folder: one line, credentials masked

        print(f"note: {one_line(note)}", file=sys.stderr)
    if plan.dispatcher != "alltoall" and not rates.comm.empty:
        print(
            "note: the flex dispatcher's time is estimated from link rates: the --results all-to-all rows are NCCL's",
            file=sys.stderr,
        )
    memory_gib: float | None = args.memory_gib or _device_memory_gib(rates.device)
    if memory_gib is not None and args.memory_reserve_gib >= memory_gib:
        raise UsageError(
            f"{args.memory_reserve_gib:g} GiB kept free leaves nothing of {memory_gib:g} GiB for a step",
            field="--memory-reserve-gib",
        )
    projector = Projector(cfg, rates, args.activation_profile, memory_gib, args.memory_reserve_gib)
    csv_path = cli.output_csv(args, CSV_NAME)
    with outputs.claimed(*([csv_path] if csv_path else [])):  # a bad or busy output path stops before the search
        _project(args, cfg, plan, rates, projector, memory_gib, csv_path)
    return 0


def _project(
    args: argparse.Namespace,
    cfg: ModelConfig,
    plan: Plan,
    rates: Rates,
    projector: Projector,
    memory_gib: float | None,
    csv_path: str | None,
) -> None:
    """Project (or search) and print; write the CSV when one is asked for (its writer lock is held)."""
    meta = environment(
        None,
        {
            "model_config": cfg.to_dict(),
            "results": args.results,
            "device": rates.device,
            "assumptions": {
                **vars(rates.a),
                "gemm_efficiency": {d: rates.gemm_efficiency(d) for d in dict.fromkeys((args.dtype, "fp8"))},
                "attention_efficiency": rates.attention_efficiency,
            },
        },
    )
    if args.search:
        best, rejected, seen = search(cfg, plan, projector, args.top, args.global_batch is not None)
        rows = [row(cfg, r, i + 1, rates.device, memory_gib) for i, r in enumerate(best)]
        print(
            f"{cfg.name}, {plan.world} × {rates.device or 'the target'}, seqlen {plan.seqlen}, global batch "
            f"{plan.global_batch}: {seen} layouts, {sum(rejected.values())} rejected, {len(rows)} best shown"
        )
        print(summary_table(rows, SEARCH_COLUMNS))
        if rejected:
            print("rejected: " + "; ".join(f"{n} × {why}" for why, n in rejected.most_common()))
        if best:
            print("\nbest:\n" + breakdown(cfg, best[0], rates.device, memory_gib, args.memory_reserve_gib))
    else:
        result = projector.project(plan)
        rows = [row(cfg, result, None, rates.device, memory_gib)]
        print(breakdown(cfg, result, rates.device, memory_gib, args.memory_reserve_gib))
        best = [result]
    gemm = any(r.sources.get("gemm") == ESTIMATED for r in best)
    attention = any(r.sources.get("attention") == ESTIMATED for r in best)
    note = rates.efficiency_note(fp8=plan.fp8 != "none", gemm=gemm, attention=attention)
    if note:
        print(f"note: {note}", file=sys.stderr)
    if rates.a.compute_scale != 1.0:
        print(f"calibrated: every compute time × {rates.a.compute_scale:g} (--compute-scale)")
    if csv_path:
        with CsvReport(csv_path, SCHEMA, meta, earlier=cli.earlier_policy(args)) as report:
            for r in rows:
                report.append(r)
        print(f"wrote {one_line(csv_path)} ({counted(len(rows), 'row')})")


def _device_memory_gib(device: str | None) -> float | None:
    """The memory of the GPUs the peak table knows, by name (datasheets; HBM stacks come in binary sizes): H100
    80 GiB (NVL 94), H200 141, MI300X 192, MI325X 256, MI350X/MI355X 288, A100 80 (40), and what torch reports
    for B200 (178) and GB200 (185, nvidia-smi's)."""
    import re

    low = (device or "").lower()
    sizes = [(r"mi35", 288), (r"mi325", 256), (r"mi300", 192), (r"h200", 141), (r"h100.*nvl", 94), (r"h100", 80)]
    sizes += [(r"gb200", 185), (r"b200", 178), (r"a100.*40gb", 40), (r"a100", 80)]
    for pattern, gib in sizes:
        if re.search(pattern, low):
            return float(gib)
    return None


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.project"))
