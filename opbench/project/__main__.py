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
from collections.abc import Sequence
from dataclasses import replace

from opbench.core import cli, outputs
from opbench.core.cli import finite_float, positive_int
from opbench.core.errors import UsageError, run_cli
from opbench.core.peaks import node_gpus_of, nvlink_domain_of
from opbench.core.results import CsvReport, environment, summary_table
from opbench.core.units import counted, one_line
from opbench.models import ModelConfig, load_model_configs, select_models

from .megatron_flags import NCCL_ALGOS, check_flags
from .pipeline import SCHEDULES
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
    check_domain,
    check_part,
    flex_problems,
    problems,
)
from .rates import ESTIMATED, Assumptions, Rates
from .schema import SCHEMA
from .search import (  # noqa: F401 - their home was here (tests and callers import some from here)
    CSV_NAME,
    DEFAULT_GLOBAL_BATCH_TOKENS,
    DEFAULT_RESERVE_GIB,
    DROPOUT_FIELDS,
    SEARCH_COLUMNS,
    SEARCH_KEEPS,
    SEARCH_VARIES,
    assumptions,
    base_plan,
    breakdown,
    default_global_batch,
    fewest_recomputed,
    implausible,
    resolve_compile,
    row,
    search,
)
from .step import Projector


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
    lay.add_argument(
        "--gpus-per-node",
        type=positive_int,
        default=None,
        help="GPUs per node (default: 4 for GB200/GB300, a compute tray of the NVL72 rack; else 8)",
    )
    lay.add_argument(
        "--nvlink-domain",
        type=cli.world_size,
        default=None,
        help="GPUs sharing one NVLink/NVSwitch or xGMI fabric: TP/CP/EP groups inside one use the link, groups "
        "crossing domains the NICs; ranks fill domains in order; a multiple or a divisor of --gpus-per-node "
        "(default: 72 for GB200/GB300 NVL72, else the node, --gpus-per-node)",
    )
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
        "interleaved-zero-bubble, zbv = ZB-V with --vpp 2; v-half, v-min = Primus' V-Half and V-Min with --vpp 2 "
        "(V-Half 0.75, 0.62, 0.56 and V-Min 0.5, 0.5, 0.38 of 1F1B's activations at p = 4, 8, 16; at odd p "
        "V-Min holds as much as V-Half; more bubble) (docs/project.md, 'A step')",
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
    lay.add_argument(
        "--cpu-offloading-num-layers",
        type=cli.positive_int,
        default=None,
        metavar="N",
        help="Megatron's flag (with its --cpu-offloading): the activations of the first N decoder layers go to the "
        "host in forward and come back for backward, over the part's host link (docs/project.md, 'CPU offloading'); "
        "--pp 1 and --recompute none, as Megatron requires",
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
        help="with --fp8 te, Megatron's --fp8-recipe: delayed scaling (default), tensorwise current scaling "
        "(Megatron-Bridge's FP8-CS), whose casts take each tensor's amax in a pass of their own, or mxfp8 (block "
        "scaling, Megatron-Bridge's FP8-MX/MXFP8; Blackwell and MI350X/MI355X only)",
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
        "--attention-backend unfused, a 1-byte mask and the dropped-out softmax kept per score; with "
        "--deterministic-mode on Blackwell, FlashAttention-2's deterministic kernels (TE keeps no cuDNN there)",
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
    r.add_argument(
        "--host-link-gbs",
        type=cli.within(0.01, 1e6, "GB/s"),
        default=None,
        help="a GPU's link to its host's memory, GB/s per direction, for --cpu-offloading-num-layers (default by "
        "part: PCIe Gen5 x16's 64; NVLink-C2C's 450 on GH200 and, shared by two GPUs, 225 on GB200/GB300, an "
        "estimate; docs/project.md, 'CPU offloading')",
    )
    r.add_argument(
        "--nic-gbs",
        type=cli.within(0.01, 1e6, "GB/s"),
        default=None,
        help="network GB/s per GPU per direction (default by part: one 400 Gb/s NIC a GPU, 50; an 800 Gb/s "
        "ConnectX-8 a GPU on B300/GB300, 100; docs/project.md, 'Parts')",
    )
    for flag, default, what, kind in (
        ("--memory-efficiency", a.memory_efficiency, "share of HBM bandwidth a streaming kernel reaches", efficiency),
        ("--link-efficiency", a.link_efficiency, "share of a link's peak a collective's busbw reaches", efficiency),
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
        "--kernel-us",
        type=cli.within(0, 1e5, "µs"),
        default=None,
        help="a kernel's fixed cost, µs: no GEMM, attention or memory-bound kernel takes less (default: measured "
        "from a tiny GEMM and a tiny copy row in --results, else 3.8 on a GPU, NVIDIA's figure; 0 on a CPU; "
        "docs/project.md, 'Fixed cost per kernel')",
    )
    r.add_argument(
        "--host-us-per-op",
        type=cli.within(0, 1e5, "µs"),
        default=None,
        help="the host's time to issue one operator, µs: a step takes the longer of its GPU work and its host's issue "
        "(default: 13.48 on x86 hosts, 37.08 on Grace (GB200/GB300/GH200), TransformerEngine #2053's measured torch "
        "Linear; a TE module's GEMM × 2.69; 0 on a CPU; the MoE phases that GPU rows of opbench moe in --results "
        "time take those rows' measured host_s instead; a MoE layer's synchronisation stalls the GPU for its host. "
        "0: no host issue at all, measured or synchronising (graphs of whole layers); docs/project.md, "
        "'Host-bound steps')",
    )
    r.add_argument(
        "--moe-imbalance",
        type=cli.within(1.0, 1e4, "(max / mean)"),
        default=a.moe_imbalance,
        help="the busiest expert-parallel rank's routed tokens over the mean: its experts' GEMMs and activation and "
        "its all-to-all take this much longer (default: 1, balanced, as published benchmarks force it; give a real "
        "run's from its logged tokens per expert; docs/project.md, 'MoE cost model')",
    )
    r.add_argument(
        "--moe-a2a-hidden",
        type=fraction,
        default=a.moe_a2a_hidden,
        help="the most of each all-to-all --moe-a2a-overlap hides (default: 0.3655, what Nsight measured on "
        "Megatron-Bridge's Qwen3-30B-A3B; docs/project.md, 'MoE cost model')",
    )
    r.add_argument(
        "--compute-scale",
        type=scale_factor,
        default=1.0,
        help="calibration: every compute time × this (--validate on one node of the target prints it: what a real "
        "step spends beyond its kernels' rates) (default: 1)",
    )
    r.add_argument(
        "--calibration",
        type=cli.path_text,
        default=None,
        metavar="FILE",
        help="per-class calibration written by `opbench step --calibrate` from a profiled step: GEMM, attention "
        "and memory-bound times × their own factors (replaces --compute-scale; docs/step.md)",
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
        default=None,  # resolved by search.resolve_compile: fused, or eager under --compile
        help="what layers save for backward: fused kernels (Megatron/TE) or PyTorch eager (transformers) "
        "(default: fused; eager under --compile, which refuses fused)",
    )
    r.add_argument(
        "--memory-ops",
        choices=["fused", "eager"],
        default=None,
        help="what the memory-bound operators move: fused kernels (Megatron/TE) or PyTorch eager op "
        "by op, as transformers' model runs them (--validate always; torch.compile: --compile) "
        "(default: fused; eager under --compile, which refuses fused)",
    )
    r.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile of every decoder block (torchtitan's): implies --memory-ops eager and "
        "--activation-profile eager, then the blocks' memory-bound time x --compile-memory-time and their "
        "activations as Inductor saves them; with --validate, trains eager and compiled and measures the effect "
        "(docs/project.md, 'torch.compile')",
    )
    r.add_argument(
        "--compile-memory-time",
        type=cli.within(0.0, 10.0, "of eager's time"),
        default=None,
        metavar="R",
        help="--compile: the blocks' memory-bound time under compile, of eager's (implies --compile; --validate "
        "--compile prints the measured one; default 0.614, from torchtitan's published Llama-3.1-8B ratio)",
    )
    meg = p.add_argument_group("Megatron flags that cost time (docs/project.md, 'Flags that cost time')")
    meg.add_argument(
        "--deterministic-mode",
        action="store_true",
        help="Megatron's flag: NCCL_ALGO=Ring (--nccl-algo ring), no --cross-entropy-loss-fusion or --tp-overlap "
        "(refused, as Megatron refuses them); on Blackwell with --attention-dropout, FlashAttention-2's "
        "deterministic attention (timed); on Hopper cuDNN's deterministic backward (not modelled)",
    )
    meg.add_argument(
        "--no-gradient-accumulation-fusion",
        action="store_false",
        dest="gradient_accumulation_fusion",
        help="Megatron's flag: weight gradients added into the main gradients by a separate pass per micro-batch "
        "(gradient + main gradient read, main gradient written), not in the GEMM",
    )
    meg.add_argument(
        "--nccl-algo",
        choices=NCCL_ALGOS,
        default="default",
        help="NCCL_ALGO the job pins: all-reduces take NCCL's own tuning model's time of that algorithm over the "
        "one NCCL would choose of Ring and Tree (default: NCCL's choice)",
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


def check_nodes(plan: Plan, splits: bool) -> None:
    """A world of several nodes fills them (``splits``: its layout divides it, else that is said first)."""
    if plan.gpus_per_node < plan.world and plan.world % plan.gpus_per_node and splits:
        raise UsageError(
            f"{plan.world} GPUs do not fill nodes of {plan.gpus_per_node} (--gpus-per-node)", field="--world-size"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    resolve_compile(args)  # torch.compile starts from PyTorch's own ops; an explicit fused with it is refused
    check_flags(args)  # what Megatron itself refuses with --deterministic-mode, --no-gradient-accumulation-fusion
    if args.deterministic_mode:
        print(
            "note: --deterministic-mode: attention's deterministic backward (NVTE_ALLOW_NONDETERMINISTIC_ALGO=0) is "
            "timed only where TE falls back to FlashAttention-2 (Blackwell with --attention-dropout, head dim 128); "
            "cuDNN's (Hopper, or no dropout) is not modelled: no published figure of its cost",
            file=sys.stderr,
        )
    if args.model_config_path is None and args.model is None:
        raise UsageError("name the model (--model, from the built-in configs, or --model-config-path)", field="--model")
    configs = select_models(load_model_configs(args.model_config_path, args.model_name), args.model)
    if len(configs) != 1:
        raise UsageError(f"projects one model at a time, got {len(configs)}", field="--model")
    (cfg,) = configs
    plan = base_plan(cfg, args)
    check_domain(plan, "" if args.nvlink_domain else f" ({args.device}'s)")
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
        layers = cfg.num_hidden_layers or 0
        if args.recompute_num_layers and layers and args.recompute_num_layers > layers:  # above every layout's chunk
            raise UsageError(
                f"{args.recompute_num_layers:,} is more than {cfg.name}'s {layers} decoder layers (Megatron counts it "
                "per pipeline stage, per model chunk with --vpp)",
                field="--recompute-num-layers",
            )
        varied = [f"--{name}" for name in SEARCH_VARIES if getattr(args, name) != build_parser().get_default(name)]
        if varied:
            print(
                f"note: --search tries its own {', '.join(varied)} (every layout of the world): the values given are "
                "not used",
                file=sys.stderr,
            )
    splits = args.search or not plan.world % (plan.tp * plan.pp * plan.cp)  # else that is the first thing to say
    node_from_rows = args.gpus_per_node_from_part and not args.device and bool(args.results)
    if not node_from_rows:  # else the part, and so its node, is known once --results is read (below)
        check_nodes(plan, splits)
    config_dropout = next((k for k in DROPOUT_FIELDS if _positive(cfg.raw.get(k))), None)
    if config_dropout and not plan.hidden_dropout and not args.validate:
        print(
            f"note: the config's {config_dropout} is {cfg.raw[config_dropout]}; --hidden-dropout (default 0) counts "
            "the dropout masks a run with it keeps",
            file=sys.stderr,
        )
    if args.validate:
        if args.calibration:
            raise UsageError(
                "--validate measures this machine's own step and prints its --compute-scale; a --calibration of "
                "another step's kernels does not apply to it: project without --validate",
                field="--calibration",
            )
        if plan.fp8 != "none":
            raise UsageError(
                "--validate trains in 16 or 32 bits here; project --fp8 without it (docs/project.md, 'FP8')",
                field="--fp8",
            )
        if plan.recompute != "none":
            raise UsageError(
                "--validate trains without recomputation: project --recompute without it", field="--recompute"
            )
        if plan.cpu_offload_layers:
            raise UsageError(
                "--validate trains without offloading activations: project --cpu-offloading-num-layers without it",
                field="--cpu-offloading-num-layers",
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
    check_part(plan, rates.device)
    if node_from_rows:  # the part the rows were measured on sets the node (a GB200 tray holds 4)
        plan = replace(plan, gpus_per_node=node_gpus_of(rates.device))
        args.gpus_per_node = rates.gpus_per_node = plan.gpus_per_node
        check_nodes(plan, splits)
        check_domain(plan, "")
    if args.nvlink_domain is None and nvlink_domain_of(rates.device):  # the part's own domain (GB200 NVL72)
        plan = replace(plan, nvlink_domain=nvlink_domain_of(rates.device))
        check_domain(plan, f" ({rates.device}'s)")
        print(
            f"note: {rates.device}: a {plan.nvlink_domain}-GPU NVLink domain (its NVL{plan.nvlink_domain} rack); "
            "groups inside one use NVLink, not the NIC (--nvlink-domain to change)",
            file=sys.stderr,
        )
    from opbench.report.inert import one_line as inert_line  # names from the folder: one line, credentials masked

    notes = [inert_line(note) for note in rates.notes]  # rows of --results left out, rates no part has: named
    if plan.dispatcher != "alltoall" and not rates.comm.empty:
        notes.append(
            "the flex dispatcher's time is estimated from link rates: the --results all-to-all rows are NCCL's"
        )
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    memory_gib: float | None = args.memory_gib or _device_memory_gib(rates.device)
    if memory_gib is not None and args.memory_reserve_gib >= memory_gib:
        raise UsageError(
            f"{args.memory_reserve_gib:g} GiB kept free leaves nothing of {memory_gib:g} GiB for a step",
            field="--memory-reserve-gib",
        )
    projector = Projector(cfg, rates, args.activation_profile, memory_gib, args.memory_reserve_gib)
    csv_path = cli.output_csv(args, CSV_NAME)
    with outputs.claimed(*([csv_path] if csv_path else [])):  # a bad or busy output path stops before the search
        _project(args, cfg, plan, rates, projector, memory_gib, csv_path, notes)
    return 0


def _project(
    args: argparse.Namespace,
    cfg: ModelConfig,
    plan: Plan,
    rates: Rates,
    projector: Projector,
    memory_gib: float | None,
    csv_path: str | None,
    notes: list[str],
) -> None:
    """Project (or search) and print; write the CSV when one is asked for (its writer lock is held). ``notes``:
    those printed so far; with this function's own they go into the sidecar too."""
    meta = environment(
        None,
        {
            "model_config": cfg.to_dict(),
            "results": args.results,
            "device": rates.device,
            "assumptions": {
                **vars(rates.a),
                "nic_gbs": rates.nic_gbs,  # --nic-gbs, else the part's
                "gemm_efficiency": {d: rates.gemm_efficiency(d) for d in dict.fromkeys((args.dtype, "fp8"))},
                "attention_efficiency": rates.attention_efficiency,
            },
        },
    )
    if args.search:
        best, rejected, seen = search(cfg, plan, projector, args.top, args.global_batch is not None)
        rows = [row(cfg, r, i + 1, rates.device, memory_gib) for i, r in enumerate(best)]
        print(
            f"{cfg.name}, {plan.world} × {rates.device or 'the target'}, NVLink domain {plan.domain} GPUs, seqlen "
            f"{plan.seqlen}, global batch {plan.global_batch}: {seen} layouts, {sum(rejected.values())} rejected, {len(rows)} best shown"
        )
        flagged = any(r["status"] == "implausible" for r in rows)  # the column says which are no result
        print(summary_table(rows, SEARCH_COLUMNS + (["status"] if flagged else [])))
        if rejected:
            print("rejected: " + "; ".join(f"{n} × {why}" for why, n in rejected.most_common()))
        if best:
            marks = implausible(rows[0])
            print("\nbest:\n" + breakdown(cfg, best[0], rates.device, memory_gib, args.memory_reserve_gib, marks))
    else:
        result = projector.project(plan)
        rows = [row(cfg, result, None, rates.device, memory_gib)]
        print(breakdown(cfg, result, rates.device, memory_gib, args.memory_reserve_gib, implausible(rows[0])))
        best = [result]
    gemm = any(r.sources.get("gemm") == ESTIMATED for r in best)
    attention = any(r.sources.get("attention") == ESTIMATED for r in best)
    own = [rates.efficiency_note(fp8=plan.fp8 != "none", gemm=gemm, attention=attention)]
    marked = [r for r in rows if r["status"] == "implausible"]
    if marked:  # figures no real part gives: said once, with the rates behind them where those are named
        why = "the rates named above are no real part's" if rates.far else "check the rates and flags it was given"
        first = str(marked[0]["error"]).split("; ")[0]
        what = "the projection is" if len(rows) == 1 else f"{len(marked)} of {len(rows)} layouts shown are"
        own.append(
            f"{what} implausible, no result ({first}): {why}"
            + ("; project.csv marks it status implausible" if csv_path else "")
        )
    for note in own:
        if note:
            notes.append(note)
            print(f"note: {note}", file=sys.stderr)
    if rates.a.compute_scale != 1.0:
        print(f"calibrated: every compute time × {rates.a.compute_scale:g} (--compute-scale)")
    if rates.a.calibration:
        factors = ", ".join(f"{k} × {v:.3g}" for k, v in rates.a.calibration)
        print(f"calibrated: {factors} (--calibration {one_line(args.calibration)})")
    if csv_path:
        meta["notes"] = notes  # what stderr said, beside the rows it is about
        with CsvReport(csv_path, SCHEMA, meta, earlier=cli.earlier_policy(args)) as report:
            for r in rows:
                report.append(r)
        print(f"wrote {one_line(csv_path)} ({counted(len(rows), 'row')})")


def _device_memory_gib(device: str | None) -> float | None:
    """The memory of the GPUs the peak table knows, by name (datasheets; HBM stacks come in binary sizes): H100
    80 GiB (NVL 94), H200 141, MI300X 192, MI325X 256, MI350X/MI355X 288, A100 80 (40), and what torch reports
    for B200 (178) and GB200 (185, nvidia-smi's); GB300 279 and B300 270 of their 288 GiB (Verda's per-GPU table,
    verda.com/blog/gb300-nvl72-architecture: an estimate of what the device reports)."""
    import re

    low = (device or "").lower()
    sizes = [(r"mi35", 288), (r"mi325", 256), (r"mi300", 192), (r"h200", 141), (r"h100.*nvl", 94), (r"h100", 80)]
    sizes += [(r"gb300", 279), (r"b300", 270), (r"gb200", 185), (r"b200", 178), (r"a100.*40gb", 40), (r"a100", 80)]
    for pattern, gib in sizes:
        if re.search(pattern, low):
            return float(gib)
    return None


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.project"))
