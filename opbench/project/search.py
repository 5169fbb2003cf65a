"""The layouts ``opbench project`` projects: the plan its flags describe (``base_plan``), the stated assumptions,
a projection's CSV row and console breakdown, and ``--search`` over every layout that fits (docs/project.md).
The command line (``__main__``) and ``--validate`` (validate.py) both build on these; neither imports the other.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from opbench.core.errors import UsageError
from opbench.core.peaks import node_gpus_of, nvlink_domain_of
from opbench.core.redact import redact_text
from opbench.core.units import one_line
from opbench.models import ModelConfig

from .calibration import read_factors
from .megatron_flags import nccl_algo
from .memory import GIB
from .pipeline import in_flight
from .plan import (
    MAX_MICROBATCHES,
    Plan,
    layouts,
    problems,
)
from .rates import Assumptions
from .schema import COMM_KINDS, SCHEMA
from .step import Projection, Projector
from .torch_compile import compile_factor

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


def calibration(args: argparse.Namespace) -> tuple[tuple[str, float], ...]:
    """--calibration's per-class factors (calibration.py), in the order the file gives them; never with
    --compute-scale, which scales every class at once."""
    path = getattr(args, "calibration", None)
    if not path:
        return ()
    if args.compute_scale != 1.0:
        raise UsageError("give --calibration or --compute-scale, not both", field="--calibration")
    return tuple(read_factors(path).items())


def resolve_compile(args: argparse.Namespace) -> tuple[str, str]:
    """--memory-ops and --activation-profile as the run uses them, set on ``args``: torch.compile (--compile or
    --compile-memory-time) starts from PyTorch's own ops, so both are eager under it and an explicit ``fused`` is a
    contradiction, refused; unset (None), they are fused without it. The one place the override is made: the
    command line, ``assumptions`` and ``base_plan`` all call it (it is idempotent)."""
    compiled = compile_factor(args) is not None
    for name, flag in (("memory_ops", "--memory-ops"), ("activation_profile", "--activation-profile")):
        given = getattr(args, name, None)
        if compiled and given == "fused":
            raise UsageError(
                "fused is Megatron/TE's kernels; torch.compile (--compile) starts from PyTorch's eager ops: give one",
                field=flag,
            )
        setattr(args, name, "eager" if compiled else given or "fused")
    if compiled:
        args.compile = True
    return args.memory_ops, args.activation_profile


def assumptions(args: argparse.Namespace) -> Assumptions:
    memory_ops, _ = resolve_compile(args)
    return Assumptions(
        gemm_efficiency=args.gemm_efficiency,
        attention_efficiency=args.attention_efficiency,
        memory_efficiency=args.memory_efficiency,
        link_efficiency=args.link_efficiency,
        nic_gbs=args.nic_gbs,
        host_link_gbs=getattr(args, "host_link_gbs", None),
        latency_us_intra=args.latency_us_intra,
        latency_us_inter=args.latency_us_inter,
        memory_bandwidth_gbs=args.memory_bandwidth_gbs,
        tp_overlap=args.tp_overlap,
        ep_overlap=args.ep_overlap,
        moe_imbalance=args.moe_imbalance,
        moe_a2a_hidden=args.moe_a2a_hidden,
        cp_overlap=not args.no_cp_overlap,
        dp_overlap=not args.no_dp_overlap,
        optimizer_bytes_per_param=args.optimizer_bytes_per_param,
        memory_ops=memory_ops,  # --compile: torch's own ops (resolve_compile)
        compute_scale=args.compute_scale,
        calibration=calibration(args),
        compile_memory_time=compile_factor(args),
        nccl_algo=nccl_algo(args),
        grad_accum_fusion=getattr(args, "gradient_accumulation_fusion", True),
        deterministic_attention=getattr(args, "deterministic_mode", False),
        kernel_us=getattr(args, "kernel_us", None),
        host_us_per_op=getattr(args, "host_us_per_op", None),
    )


def base_plan(cfg: ModelConfig, args: argparse.Namespace) -> Plan:
    seqlen = args.seqlen or cfg.seqlen
    if not seqlen:
        raise UsageError(f"{cfg.name} has no seqlen; pass --seqlen", field="--seqlen")
    if args.fsdp and args.zero:
        raise UsageError("give --fsdp or --zero 1, not both", field="--zero")
    resolve_compile(args)
    # the part's node (a GB200 tray holds 4); 8 where --device does not name one (project's main then takes the
    # node of the part --results was measured on)
    args.gpus_per_node_from_part = args.gpus_per_node is None or getattr(args, "gpus_per_node_from_part", False)
    if args.gpus_per_node_from_part:
        args.gpus_per_node = node_gpus_of(args.device)
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
        cpu_offload_layers=getattr(args, "cpu_offloading_num_layers", None) or 0,
        recompute_modules=args.recompute_modules or ("core_attn",),
        recompute_method=args.recompute_method or "uniform",
        recompute_num_layers=args.recompute_num_layers or 1,
        first_layers=args.decoder_first_pipeline_num_layers,
        last_layers=args.decoder_last_pipeline_num_layers,
        embedding_as_layer=args.account_for_embedding_in_pipeline_split,
        loss_as_layer=args.account_for_loss_in_pipeline_split,
        gpus_per_node=args.gpus_per_node,
        nvlink_domain=getattr(args, "nvlink_domain", None) or nvlink_domain_of(getattr(args, "device", None)),
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
    marks = implausible(out)
    if marks:  # no result: the report lists it with why, as it lists a layout that does not fit
        out.update(status="implausible", error="; ".join(marks))
    return out


def implausible(out: dict[str, Any]) -> list[str]:
    """The projected figures of a row outside their kind's plausible range (the schema's kinds, docs/conventions.md
    "Plausible numbers"): 'step_time_s 6.394e+11: outside the plausible range of a time: more than 0 s and at most
    1 year'. A projection built on rates no real part has (Rates.far) ends up here."""
    found = []
    for column, value in out.items():
        judged = SCHEMA.plausible(column)
        if judged is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        kind, scale = judged
        if math.isnan(value):
            continue
        if not (math.isfinite(value) and kind.plausible(value * scale)):
            found.append(f"{column} {value:.4g}: outside the plausible range of {kind.rule}")
    return found


def breakdown(
    cfg: ModelConfig,
    r: Projection,
    device: str | None,
    memory_gib: float | None,
    reserve_gib: float = 0.0,
    marks: Sequence[str] = (),
) -> str:
    """The console view of one projection: where a step's time goes and what a GPU holds; ``marks``: its figures
    outside their plausible range (``implausible``), which mark it as no result."""
    p, m = r.plan, r.memory
    name, target = (one_line(redact_text(str(x))) for x in (cfg.name, device or "the target"))
    lines = [
        f"{name} on {p.world} × {target} ({p.dtype}): {p.label()}, {p.microbatches} "
        f"micro-batch(es) of {p.mbs} × {p.seqlen} tokens per DP rank, global batch {p.global_batch}",
        *([f"IMPLAUSIBLE, no result: {'; '.join(marks)}"] if marks else []),
        ("[implausible] " if marks else "")
        + f"step {r.step_s:.4g} s   {r.tokens_per_s:,.0f} tokens/s"
        + (f"   MFU {100 * r.mfu:.1f} %" if r.mfu is not None else "")
        + (f" (of the {p.dtype} peak)" if r.mfu is not None and p.fp8 != "none" else "")
        + f"   ({100 * r.estimated_share:.0f} % of the time from estimated rates)",
        "",
    ]
    if r.mfu is not None and r.mfu > 1 and p.fp8 == "none":
        lines.insert(
            2 + bool(marks), "note: MFU above 100 %: --compute-scale or the rates put the step's FLOPs beyond the peak"
        )
    parts = [("compute (GEMM, attention, memory-bound)", r.compute_s)]
    parts += [(f"exposed {k.replace('_', ' ')}", v) for k, v in r.exposed_comm_s.items() if v > 0]
    parts += [("pipeline bubble", r.bubble_s)] if p.pp > 1 else []
    parts += [("optimizer", r.optimizer_s)]
    if r.host_wait_s > 0:  # the host's issue: the whole step's, or the stalls where layers synchronise
        what = "host-bound" if r.host_bound else "synchronisations"
        parts += [(f"waiting on the host ({what})", r.host_wait_s)]
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
        "--recompute-num-layers": "--recompute-num-layers is more than a model chunk's layers",
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
