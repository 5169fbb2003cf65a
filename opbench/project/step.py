"""One training step of a layout, put together: each pipeline stage's forward and backward per micro-batch (from
workload.py, timed by rates.py), the pipeline schedule (pipeline.py), data-parallel gradient reduction or FSDP's
gathers with what overlaps, the optimizer, and memory per GPU (memory.py) (docs/project.md, "A step").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from opbench.attention.flops import attention_flops
from opbench.attention.shapes import model_attention_shapes
from opbench.cluster.links import host_link
from opbench.core.dtypes import element_size
from opbench.core.errors import UsageError
from opbench.gemm.shapes import gemm_shapes, padded_vocab
from opbench.models import ModelConfig
from opbench.models.architectures import decoder_layers
from opbench.models.layout import Layer

from . import memory as mem
from .megatron_flags import pinned_allreduce, unfused_accumulation_bytes
from .pipeline import ScheduleResult, StageTimes, estimate, simulate
from .plan import Plan, check
from .rates import ESTIMATED, INTERPOLATED, MEASURED, TE_MODULE_HOST, Rates, Timed
from .workload import (
    COMPUTE_KINDS,
    GEMM,
    MEASURED_PERMUTATION,
    MEMORY,
    Item,
    Unfused,
    Work,
    embedding_work,
    head_work,
    layer_work,
    megatron_unfused,
    memory_kernels,
    mtp_work,
)

# Bytes the optimizer reads and writes per parameter (docs/project.md, "Optimizer"): a fused Adam reads gradient,
# master weight and two moments and writes the last three (and the 16-bit copy in mixed precision); PyTorch's
# default (foreach) AdamW makes about ten passes over fp32 tensors.
OPTIMIZER_BYTES = {("fused", True): 30.0, ("fused", False): 28.0, ("eager", True): 80.0, ("eager", False): 80.0}
# The memory-bound item layer_work times per pass, whose operators memory_kernels counts
LAYER_MEMORY_ITEM = "norms, residuals, rotary, activations"
# The optimizer's host operators (docs/project.md, "Host-bound steps"): apex/TE's multi_tensor_apply launches one
# kernel per 320 chunks of 65,536 elements (its CHUNK_SIZE and the kernel's block count); Megatron's step runs three
# such passes (the gradient norm, the clip's scale, Adam) besides a few single ops (the norm's all-reduce, found-inf)
MTA_ELEMENTS, OPTIMIZER_PASSES, OPTIMIZER_SINGLE_OPS = 320 * 65536, 3, 6


@dataclass(frozen=True)
class Projection:
    plan: Plan
    step_s: float
    compute_s: float
    exposed_comm_s: dict[str, float]
    bubble_s: float
    optimizer_s: float
    tokens_per_s: float
    mfu: float | None
    memory: mem.Memory  # the fullest stage's
    memory_stage: int
    fits: bool
    estimated_share: float
    schedule: ScheduleResult
    sources: dict[str, str] = field(default_factory=dict)  # category -> where its rates came from
    # the critical stage's host: its time issuing the step's operators, and what the step waits on it beyond the
    # GPU's work (docs/project.md, "Host-bound steps")
    host_s: float = 0.0
    host_wait_s: float = 0.0
    sync_wait_s: float = 0.0  # of host_wait_s, what layers that synchronise the host leave the GPU waiting

    @property
    def host_bound(self) -> bool:
        """Whether the step is its host's issue time (not only the stalls at synchronisations)."""
        return self.host_wait_s > self.sync_wait_s

    @property
    def exposed_comm_total(self) -> float:
        return sum(self.exposed_comm_s.values())


MEMORY_CACHE = 65536  # layouts whose memory a Projector keeps (a 256-GPU search tries tens of thousands)


def _layer_key(lay) -> int:
    return lay.kind  # the layer's GEMMs, attention and routing, interned (Layer.kind)


class Projector:
    """Projects layouts of one model on one set of rates; caches per-layer work across layouts (the search asks
    for thousands of layouts that share their layers' work)."""

    def __init__(
        self,
        cfg: ModelConfig,
        rates: Rates,
        profile: str = "fused",
        memory_gib: float | None = None,
        reserve_gib: float = 0.0,
    ):
        """``memory_gib``: what a GPU has; ``reserve_gib``: what the step cannot use of it (context, collective
        buffers, fragmentation), so a layout fits when its peak plus the reserve is at most ``memory_gib``."""
        self.cfg, self.rates, self.profile, self.memory_gib = cfg, rates, profile, memory_gib
        self.reserve_gib = reserve_gib
        self.layers = decoder_layers(cfg)
        self._work: dict[tuple, Work] = {}
        self._params: dict[tuple, mem.StageParams] = {}
        self._fp8: dict[tuple, tuple[int, int]] = {}
        self._flops: dict[int, float] = {}
        self._host: dict[tuple, float] = {}
        self._host_measured: dict[tuple, float] = {}
        self._stall: dict[tuple, float] = {}
        self._memory: dict[tuple, tuple[mem.Memory, int]] = {}  # the search asks each layout's memory twice or more

    def fits(self, total_bytes: int) -> bool:
        return self.memory_gib is None or total_bytes + self.reserve_gib * mem.GIB <= self.memory_gib * mem.GIB

    def stage_params(self, plan: Plan, stage: int) -> mem.StageParams:
        split = (plan.first_layers, plan.last_layers, plan.embedding_as_layer, plan.loss_as_layer, plan.last_stage)
        key = (plan.tp, plan.pp, plan.vpp, plan.ep, plan.expert_tp, plan.dp * plan.cp, stage, split, plan.mtp_layers)
        if key not in self._params:
            self._params[key] = mem.stage_params(self.cfg, plan, stage, self.layers)
        return self._params[key]

    def fp8_weights(self, plan: Plan, stage: int) -> tuple[int, int]:
        """memory.fp8_weights, cached per layout."""
        split = (plan.first_layers, plan.last_layers, plan.embedding_as_layer, plan.loss_as_layer, plan.last_stage)
        key: tuple = (plan.fp8, plan.tp, plan.pp, plan.vpp, plan.ep, plan.expert_tp, plan.mbs, plan.cp, stage, split)
        key += (plan.mtp_layers,)
        if key not in self._fp8:
            self._fp8[key] = mem.fp8_weights(self.cfg, plan, stage, self.layers)
        return self._fp8[key]

    def _layer(self, lay, plan: Plan) -> Work:
        key = self._layer_key(lay, plan)
        if key not in self._work:
            self._work[key] = layer_work(self.cfg, lay, plan, self.rates, self.profile)
        return self._work[key]

    def _layer_key(self, lay, plan: Plan) -> tuple:
        """What a layer's work depends on of the layout (the cache key of ``_layer`` and ``_layer_ops``)."""
        te_microbatches = plan.microbatches if plan.fp8 == "te" else 0  # te casts its weights once per step
        key: tuple = (_layer_key(lay), plan.tp, plan.cp, plan.ep, plan.expert_tp, plan.mbs, plan.sp, plan.recompute)
        key += (plan.recompute_modules,)
        key += (plan.fp8, plan.fp8_recipe, plan.fp8_param_gather, te_microbatches, plan.hidden_dropout > 0)
        key += (plan.moe_a2a_overlap, plan.microbatches, plan.pp, plan.vpp) if plan.moe_a2a_overlap else ()
        return key + (plan.dispatcher,)

    def _layer_ops(self, lay, plan: Plan) -> float:
        """Operators the host issues for one layer and micro-batch, forward and backward, each GEMM weighted by what
        issuing it costs over a plain operator (TE_MODULE_HOST under Megatron-Core's TE modules, the fused profile):
        a GEMM, an attention call, a collective one each; the memory-bound item its kernels (memory_kernels)."""
        key = self._layer_key(lay, plan)
        if key not in self._host:
            work = self._layer(lay, plan)
            k_fwd, k_bwd = self._memory_kernels(lay, plan, work)
            self._host[key] = _issued(work.fwd, k_fwd, k_fwd, self._gemm_weight) + _issued(
                work.bwd, k_bwd, k_fwd, self._gemm_weight
            )
        return self._host[key]

    def _memory_kernels(self, lay, plan: Plan, work: Work) -> tuple[int, int]:
        """(forward, backward) kernels of the layer's memory-bound item, as layer_work counts them: memory_kernels
        (without the MoE phases measured rows hold) and Megatron-Core's unfused pieces."""
        measured = any(i.name == MEASURED_PERMUTATION for i in work.fwd)
        eager = self.rates.a.memory_ops == "eager"
        k_fwd, k_bwd = memory_kernels(self.cfg, lay, eager, measured)
        un = Unfused() if eager else megatron_unfused(self.cfg, lay, plan, experts=not measured)
        return k_fwd + un.k_fwd, k_bwd + un.k_bwd

    def _layer_host_measured(self, lay, plan: Plan) -> float:
        """Seconds of host issue for one layer and micro-batch that measured rows hold (an item's ``host_s``:
        ``opbench moe``'s own figure for the MoE phases it times); ``_layer_ops`` leaves those items out."""
        key = self._layer_key(lay, plan)
        if key not in self._host_measured:
            work = self._layer(lay, plan)
            self._host_measured[key] = sum(i.host_s for i in (*work.fwd, *work.bwd) if i.host_s is not None)
        return self._host_measured[key]

    @property
    def _gemm_weight(self) -> float:
        return TE_MODULE_HOST if self.profile == "fused" else 1.0

    def _per_stage(self, plan: Plan, per_layer: Callable[[Layer, Plan], float]) -> list[float]:
        """sum[stage] of ``per_layer`` over a stage's decoder layers, each with the layout it runs under (--recompute
        as given, or none beyond --recompute-method block's first layers)."""
        plain = replace(plan, recompute="none")
        out = []
        for s in range(plan.pp):
            total, index = 0.0, [0] * plan.vpp
            for chunk, lay in mem.stage_layers(self.cfg, plan, s, self.layers):
                total += per_layer(lay, plan if plan.recomputes(index[chunk]) else plain)
                index[chunk] += 1
            out.append(total)
        return out

    def stage_host_ops(self, plan: Plan) -> list[float]:
        """ops[stage]: the operators one micro-batch's forward and backward through all of a stage's chunks issue
        (``_layer_ops``; embedding, head and MTP depths an operator an item)."""
        out = self._per_stage(plan, self._layer_ops)
        last_piece = plan.pp * plan.vpp - 1
        for s in range(plan.pp):
            extra = [embedding_work(self.cfg, plan, self.rates)] if s == 0 else []
            if any(plan.piece(c, s) == last_piece for c in range(plan.vpp)):
                extra += [head_work(self.cfg, plan, self.rates)]
                extra += [mtp_work(self.cfg, plan, self.rates)] * plan.mtp_layers
            out[s] += sum(_issued(w.fwd + w.bwd, 1, 1, self._gemm_weight) for w in extra)
        return out

    @staticmethod
    def _syncs(lay) -> bool:
        """Whether a layer's forward synchronises the host with the GPU (docs/project.md, "Host-bound steps"): a MoE
        layer does, under Megatron-Core (its dropless dispatchers read the token counts on the host:
        ``token_dispatcher.py``, ``cuda_sync_point``), in transformers' eager experts (``nonzero()`` on the expert
        mask) and under torchtitan's expert parallelism (its all-to-all takes its splits as a list)."""
        return bool(lay.moe)

    def _layer_sync_stall(self, lay, plan: Plan, cost: float) -> float:
        """Seconds one micro-batch's forward of ``lay`` leaves the GPU waiting on the host when it synchronises
        (``_syncs``): the host's lead is gone there, so the GPU waits for the first operator after the sync to be
        issued (one operator's cost), and the whole forward takes its host's issue time where that is the longer
        (its operators × ``cost`` and its measured host_s against its GPU work). 0 for a layer without a sync."""
        if not self._syncs(lay):
            return 0.0
        key = self._layer_key(lay, plan)
        if key not in self._stall:
            work = self._layer(lay, plan)
            k_fwd, _ = self._memory_kernels(lay, plan, work)
            host = cost * _issued(work.fwd, k_fwd, k_fwd, self._gemm_weight)
            host += sum(i.host_s for i in work.fwd if i.host_s is not None)
            self._stall[key] = cost + max(0.0, host - work.fwd_s)
        return self._stall[key]

    def stage_sync_stall(self, plan: Plan, cost: float) -> list[float]:
        """seconds[stage]: what one micro-batch's forward through a stage's chunks leaves its GPU waiting on the host
        at the layers that synchronise (``_layer_sync_stall``)."""
        return self._per_stage(plan, lambda lay, p: self._layer_sync_stall(lay, p, cost))

    def stage_host_measured(self, plan: Plan) -> list[float]:
        """seconds[stage]: the host issue one micro-batch's forward and backward through a stage's chunks spends in
        items whose host time was measured (``_layer_host_measured``), beside ``stage_host_ops``' count."""
        return self._per_stage(plan, self._layer_host_measured)

    def _unfused_accumulation(self, plan: Plan, stage: int, chunk: int) -> Work:
        """Megatron's gradient accumulation without its fusion, one micro-batch of chunk ``chunk``: the backward hook
        adds each linear weight's gradient into its main gradient (megatron_flags.py). Counted over the chunk's
        decoder layers (norms and biases, a few per mille, included) and lm_head on the last piece."""
        weights = sum(mem.layer_numel(lay, plan) for c, lay in mem.stage_layers(self.cfg, plan, stage, self.layers)
                      if c == chunk)  # fmt: skip
        if plan.piece(chunk, stage) == plan.pp * plan.vpp - 1:
            weights += padded_vocab(self.cfg.vocab_size, plan.tp) // plan.tp * self.cfg.hidden_size
        nbytes = unfused_accumulation_bytes(weights, plan.dtype, mem.grad_bytes_per_param(plan))
        timed = self.rates.memory_time(nbytes)
        return Work((), (Item(MEMORY, "gradient accumulation (unfused)", timed, timed.seconds),))

    def _offload_exposed(self, plan: Plan) -> float:
        """What one micro-batch's activation offloading adds to the step (--cpu-offloading-num-layers; docs/project.md,
        "CPU offloading"), as Transformer Engine 2.9's offload handler (``AsyncDoubleBufferGroupOffloadHandler``,
        Megatron-Bridge 25.11's pin) schedules the copies: one at a time, each layer's activations sent out after the
        previous copy is waited for and due by the end of layer ``te_offload_windows``' entry, brought back in
        backward the same way, over the part's host link (cluster.links.host_link, or --host-link-gbs) at
        --link-efficiency. A copy longer than the layers' compute between its start and its deadline stalls the
        GPU by the difference."""
        if not plan.cpu_offload_layers:
            return 0.0
        rates = self.rates
        compiled = rates.a.compile_memory_time is not None
        layers = mem.stage_layers(self.cfg, plan, 0, self.layers)
        gbs = rates.a.host_link_gbs or host_link(rates.device or "").intra_gbs  # --host-link-gbs, else the part's
        bandwidth = gbs * 1e9 * rates.a.link_efficiency
        copies = [size / bandwidth for size in mem.offloaded_bytes(self.cfg, plan, layers, self.profile, compiled)]
        work = [self._layer(lay, plan) for _, lay in layers]
        due = te_offload_windows(len(layers), len(copies))
        exposed = 0.0
        for k, copy in enumerate(copies):
            # out: starts after layer 0 (the first) or at the previous copy's deadline, runs beside the layers up to
            # its own; back: beside the backward of the layers from its deadline down to the next one's
            start = 0 if k == 0 else due[k - 1]
            exposed += max(0.0, copy - sum(w.fwd_s for w in work[start + 1 : due[k] + 1]))
            lower = due[k - 1] if k else -1
            exposed += max(0.0, copy - sum(w.bwd_s for w in work[lower + 1 : due[k] + 1]))
        return exposed

    def stage_work(self, plan: Plan) -> list[list[Work]]:
        """work[stage][chunk]: one micro-batch through that piece of the model."""
        out = []
        last_piece = plan.pp * plan.vpp - 1
        for s in range(plan.pp):
            chunks = [Work((), ()) for _ in range(plan.vpp)]
            index = [0] * plan.vpp  # each layer's place in its chunk (--recompute-method block)
            plain = replace(plan, recompute="none")
            for chunk, lay in mem.stage_layers(self.cfg, plan, s, self.layers):
                chunks[chunk] = chunks[chunk] + self._layer(lay, plan if plan.recomputes(index[chunk]) else plain)
                index[chunk] += 1
            if s == 0:
                chunks[0] = embedding_work(self.cfg, plan, self.rates) + chunks[0]
            for c in range(plan.vpp):
                if plan.piece(c, s) == last_piece:
                    chunks[c] = chunks[c] + head_work(self.cfg, plan, self.rates)
                    if plan.mtp_layers:  # each depth's eh_proj and its own head (its layer: stage_layers)
                        depth = mtp_work(self.cfg, plan, self.rates)
                        for _ in range(plan.mtp_layers):
                            chunks[c] = chunks[c] + depth
            if not self.rates.a.grad_accum_fusion:  # --no-gradient-accumulation-fusion (megatron_flags.py)
                chunks = [w + self._unfused_accumulation(plan, s, c) for c, w in enumerate(chunks)]
            out.append(chunks)
        return out

    def stage_memory(self, plan: Plan, stage: int, in_flight: int) -> mem.Memory:
        """One stage's memory per GPU at its peak, holding ``in_flight`` micro-batch chunks."""
        sp = self.stage_params(plan, stage)
        overlap = self.rates.a.tp_overlap
        compiled = self.rates.a.compile_memory_time is not None  # --compile: the blocks keep what Inductor saves
        return mem.memory(
            self.cfg, plan, stage, in_flight, self.profile, sp, self.layers, overlap, self.rates.on_gpu, compiled
        )

    def memory(self, plan: Plan, in_flight: tuple[int, ...]) -> tuple[mem.Memory, int]:
        """The peak stage's memory and its index (cached per layout and micro-batches in flight: the search asks
        for it to screen a layout, again to project it, and for each recompute depth it tries)."""
        key = (plan, tuple(in_flight))
        if key not in self._memory:
            if len(self._memory) >= MEMORY_CACHE:
                self._memory.clear()
            per_stage = [self.stage_memory(plan, s, in_flight[s]) for s in range(plan.pp)]
            worst = max(range(plan.pp), key=lambda s: per_stage[s].total)
            self._memory[key] = (per_stage[worst], worst)
        return self._memory[key]

    def project(self, plan: Plan, exact: bool = True) -> Projection:
        """``exact``: simulate the schedule op by op; else its closed form (the search screens with it)."""
        check(self.cfg, plan, self.layers)
        if plan.cpu_offload_layers and not self.rates.on_gpu:
            raise UsageError(
                "a CPU target has no device memory to offload activations from", field="--cpu-offloading-num-layers"
            )
        cfg, rates, e = self.cfg, self.rates, element_size(plan.dtype)
        work = self.stage_work(plan)
        times = [[StageTimes(w.fwd_s, w.bwd_s, w.wgrad_s) for w in chunks] for chunks in work]
        act = plan.tokens // (plan.tp if plan.sp else 1) * cfg.hidden_size * e
        m = plan.microbatches
        send = 0.0
        if plan.pp > 1:
            send = rates.collective_time("send_recv", act, 2, plan.spans_nodes(2, plan.tp * plan.cp * plan.dp)).seconds
        if exact:
            sched = simulate(times, m, send, plan.schedule)
            # the sends' exposed cost: how much longer the schedule is than with free sends
            pp_exposed = sched.total_s - simulate(times, m, 0.0, plan.schedule).total_s if plan.pp > 1 else 0.0
        else:
            sched = estimate(times, m, send, plan.schedule)
            pp_exposed = 2 * (plan.pp - 1) * send

        offload = self._offload_exposed(plan) * m  # one stage (Megatron offloads only without a pipeline)

        # per stage: data-parallel exposure and the optimizer, after the pipeline drains
        tail, dp_exposed, opt_time = [], [], []
        shard = plan.dp * plan.cp
        dp_inter = plan.spans_nodes(shard, plan.tp)
        dp_share = plan.node_share(shard, plan.tp)  # DP ranks on one node: the NICs a DP collective drives
        bw = rates.memory_bandwidth()
        impl = "eager" if self.profile == "eager" else "fused"
        per_param = rates.a.optimizer_bytes_per_param or OPTIMIZER_BYTES[(impl, plan.dtype in ("bf16", "fp16"))]
        dp_items: list[Item] = []
        opt_numels: list[int] = []
        for s in range(plan.pp):
            sp = self.stage_params(plan, s)
            last_bwd = sum(w.bwd_s for w in work[s])
            first_fwd = sum(w.fwd_s for w in work[s])
            exposed = 0.0
            once_a_step = plan.sharding == "zero1" or (plan.sharding == "fsdp" and plan.pp > 1)
            fsdp = plan.sharding == "fsdp"
            # the routed experts' gradients are reduced over the expert data-parallel ranks (world / (pp·ep·etp),
            # one under EP = DP: nothing to send), the rest over DP·CP, as their state is sharded (memory.py)
            expert_group = sp.expert_numel
            groups = [
                (numel, ranks, plan.spans_nodes(ranks, stride), plan.node_share(ranks, stride))
                for numel, ranks, stride in (
                    (sp.numel - expert_group, shard, plan.tp),
                    (expert_group, sp.expert_shard, plan.ep * plan.expert_tp),
                )
                if numel and ranks > 1
            ]
            if groups and once_a_step:
                # ZeRO-1, and FSDP under a pipeline schedule: the gradients are reduce-scattered once (after the
                # last backward) and the parameters all-gathered once (FSDP: at the first forward), FP8 weights at
                # 1 byte where they are the parameters (--fp8-param-gather) or torchao gathers them in FP8
                fp8_share = 0.0
                if plan.fp8_param_gather or (fsdp and plan.fp8 == "torchao"):
                    fp8_share = self.fp8_weights(plan, s)[0] / sp.numel
                grad_bytes = 4 if fsdp else mem.grad_bytes_per_param(plan)  # FSDP reduces in fp32
                rs = _summed(rates.collective_time("reduce_scatter", n * grad_bytes, r, i, k) for n, r, i, k in groups)
                ag = _summed(
                    rates.collective_time("all_gather", n * e - (e - 1) * n * fp8_share, r, i, k)
                    for n, r, i, k in groups
                )
                hidden_rs = last_bwd if rates.a.dp_overlap else 0.0
                exposed = max(0.0, rs.seconds - hidden_rs) + max(0.0, ag.seconds - first_fwd)
                who = "FSDP" if fsdp else "DP"
                dp_items += [Item("dp_comm", f"{who} reduce-scatter", rs, max(0.0, rs.seconds - hidden_rs))]
                dp_items += [Item("dp_comm", f"{who} all-gather", ag, max(0.0, ag.seconds - first_fwd))]
            elif shard > 1 and fsdp:
                for w in work[s]:
                    fsdp_comm = self._fsdp(plan, s, sp, w, m, dp_inter, dp_share)
                    exposed += fsdp_comm[1]
                    dp_items.append(Item("dp_comm", "FSDP gathers and reduce-scatters", fsdp_comm[0], fsdp_comm[1]))
            elif groups and not fsdp:
                grad_bytes = mem.grad_bytes_per_param(plan)
                ar = _summed(
                    pinned_allreduce(rates.a, rates.collective_time("all_reduce", n * g, r, i, k), n * g, r, i, k)
                    for n, r, i, k in groups
                    for g in (grad_bytes,)
                )  # --nccl-algo: NCCL's model of the pinned algorithm (megatron_flags.py)
                exposed = max(0.0, ar.seconds - (last_bwd if rates.a.dp_overlap else 0.0))
                dp_items.append(Item("dp_comm", "DP all-reduce", ar, exposed))
            opt_numel = (
                sp.fsdp_local
                if plan.sharding == "fsdp"
                else (sp.zero1(self.profile)[0] if plan.sharding == "zero1" else sp.numel)
            )
            opt = opt_numel * per_param / bw.seconds
            opt_numels.append(opt_numel)
            dp_exposed.append(exposed)
            opt_time.append(opt)
            tail.append(exposed + opt + (offload if s == 0 else 0.0))
        crit = max(range(plan.pp), key=lambda s: sched.busy_s[s] + tail[s])
        gpu_step = sched.total_s + tail[crit]
        step, host_s, crit, sync_wait = self._host_bound(plan, gpu_step, crit, opt_numels)

        # breakdown of the critical stage
        items = [i for w in work[crit] for i in (*w.fwd, *w.bwd)]
        compute = sum(i.exposed for i in items if i.category in COMPUTE_KINDS) * m
        comm: dict[str, float] = {}
        for i in items:
            if i.category not in COMPUTE_KINDS:
                comm[i.category] = comm.get(i.category, 0.0) + i.exposed * m
        if plan.pp > 1:
            comm["pp_comm"] = pp_exposed
        comm["dp_comm"] = dp_exposed[crit]
        if offload:
            comm["offload"] = offload
        host_wait = step - gpu_step
        sync_wait = host_wait if sync_wait else 0.0  # the same figure, not a difference's rounding beside it
        bubble = step - host_wait - compute - sum(comm.values()) - opt_time[crit]
        bubble = 0.0 if abs(bubble) < 1e-9 * step else bubble  # floating-point dust when nothing waits

        all_items = [i for chunks in work for w in chunks for i in (*w.fwd, *w.bwd)] + dp_items
        spent = sum(i.timed.seconds for i in all_items) or 1.0
        estimated = sum(i.timed.seconds for i in all_items if i.timed.source == ESTIMATED)
        if bw.source == ESTIMATED:
            estimated += sum(opt_time)
            spent += sum(opt_time)
        sources: dict[str, str] = {}
        for i in all_items:
            sources.setdefault(i.category, i.timed.source)
            if i.timed.source == ESTIMATED:
                sources[i.category] = ESTIMATED

        memory, worst = self.memory(plan, sched.in_flight)
        tokens = plan.global_batch * plan.seqlen
        peak = rates.peak.tflops(plan.dtype) if rates.peak else None
        mfu = self.model_flops(plan) / (step * plan.world * peak * 1e12) if peak else None
        fits = self.fits(memory.total)
        return Projection(
            plan,
            step,
            compute,
            comm,
            bubble,
            opt_time[crit],
            tokens / step,
            mfu,
            memory,
            worst,
            fits,
            estimated / spent,
            sched,
            sources,
            host_s,
            host_wait,
            sync_wait,
        )

    def _host_bound(
        self, plan: Plan, gpu_step: float, crit: int, opt_numels: list[int]
    ) -> tuple[float, float, int, float]:
        """(step, the critical stage's host time, the critical stage, the stalls at synchronisations in the step)
        with the host's issue time per stage: the
        micro-batches' operators and the optimizer's, × Rates.host_cost. On a GPU the host runs ahead of the GPU by
        up to the launch queue's depth (CUDA's 1,024 pending launches, more than a layer issues), so a stage takes
        the longer of its GPU work and its host's issue: the step is host-bound when Σ host > Σ GPU (docs/project.md,
        "Host-bound steps"), and a layer that synchronises adds its stall (``stage_sync_stall``). On a CPU the host
        is the device: issue adds to the work."""
        cost = self.rates.host_cost().seconds
        if not cost:
            return gpu_step, 0.0, crit, 0.0
        per_stage = [
            plan.microbatches * ops + _optimizer_ops(n) for ops, n in zip(self.stage_host_ops(plan), opt_numels)
        ]
        measured = self.stage_host_measured(plan)
        host = [cost * ops + plan.microbatches * m for ops, m in zip(per_stage, measured)]
        if not self.rates.on_gpu:
            return gpu_step + host[crit], host[crit], crit, 0.0
        # where a layer synchronises, the host's lead is lost: the slowest stage's stalls add to the GPU's step
        stalls = plan.microbatches * max(self.stage_sync_stall(plan, cost))
        slowest = max(range(plan.pp), key=lambda s: host[s])
        if host[slowest] > gpu_step + stalls:
            return host[slowest], host[slowest], slowest, 0.0
        return gpu_step + stalls, host[crit], crit, stalls

    def _fsdp(
        self, plan: Plan, stage: int, sp: mem.StageParams, w: Work, microbatches: int, inter: bool, per_node: int
    ) -> tuple[Timed, float]:
        """FSDP2 per micro-batch: every unit all-gathers in forward and again in backward (reshard after forward)
        and reduce-scatters its gradient (fp32); each is prefetched behind the neighbouring unit's compute, so a
        unit's collectives are exposed only where they outlast its compute (the first gather always is)."""
        rates, shard = self.rates, plan.dp * plan.cp
        units = max(1, len(self.layers) // plan.pp) + 1
        unit = sp.fsdp_padded / units
        e: float = element_size(plan.dtype)
        if plan.fp8 == "torchao" and sp.numel:  # FP8 weights are all-gathered in FP8 (docs/project.md, "FP8")
            e -= (e - 1) * self.fp8_weights(plan, stage)[0] / sp.numel
        ag = rates.collective_time("all_gather", unit * shard * e, shard, inter, per_node)
        rs = rates.collective_time("reduce_scatter", unit * shard * 4, shard, inter, per_node)
        per_unit_fwd, per_unit_bwd = w.fwd_s / units, w.bwd_s / units
        total = units * (2 * ag.seconds + rs.seconds)
        if not rates.a.dp_overlap:
            return Timed(total * microbatches, ag.source, ag.note), total * microbatches
        exposed = units * (max(0.0, ag.seconds - per_unit_fwd) + max(0.0, ag.seconds + rs.seconds - per_unit_bwd))
        exposed += ag.seconds
        return Timed(total * microbatches, ag.source, ag.note), exposed * microbatches

    def model_flops(self, plan: Plan) -> float:
        """Model FLOPs of one step (all replicas): every GEMM's forward × 3 (forward, input and weight gradients)
        and attention forward + backward by the convention (× 3.5), without recomputation: MFU's numerator."""
        if plan.seqlen not in self._flops:
            self._flops[plan.seqlen] = self._sequence_flops(plan.seqlen)
        return self._flops[plan.seqlen] * plan.global_batch

    def _sequence_flops(self, seqlen: int) -> float:
        gemm = sum(r.flops * (r.layer_count or 1) for r in gemm_shapes(self.cfg, seqlen=seqlen, passes=["fwd"]))
        attn = sum(
            attention_flops(s, 1, "fwdbwd") * (s.layer_count or 1) for s in model_attention_shapes(self.cfg, seqlen)
        )
        return 3 * gemm + attn


def te_offload_windows(layers: int, offloaded: int) -> list[int]:
    """The layer by whose end each offloaded layer's copy must be done: Transformer Engine 2.9's
    ``AsyncDoubleBufferGroupOffloadHandler.layer_window_map`` (``transformer_engine/pytorch/cpu_offload.py``), which
    spreads ``offloaded`` copies over the ``layers`` (``layers // offloaded`` apart, the remainder's extra layer to
    the first ones)."""
    step, extra, out, constant = layers // offloaded, layers % offloaded, [], 0
    for i in range(offloaded):
        window = step * (i + 1) - 1
        if i < extra:
            constant = i + 1
        out.append(window + constant)
    return out


def _issued(items: Iterable[Item], layer_kernels: int, recompute_kernels: int, gemm_weight: float) -> float:
    """Operators the host issues for ``items`` (Projector._layer_ops): the layer's memory-bound item its kernels
    (``recompute_kernels`` where recomputed), a GEMM ``gemm_weight``, anything else one; none for an item whose
    host time was measured (its ``host_s``)."""
    n = 0.0
    for i in items:
        if i.host_s is not None:  # measured: Projector._layer_host_measured adds its seconds
            continue
        if i.category == MEMORY and i.name.endswith(LAYER_MEMORY_ITEM):
            n += recompute_kernels if i.name.startswith("recompute ") else layer_kernels
        else:
            n += gemm_weight if i.category == GEMM else 1.0
    return n


def _optimizer_ops(numel: int) -> float:
    """The optimizer's host operators for ``numel`` local parameters (MTA_ELEMENTS, OPTIMIZER_PASSES)."""
    return OPTIMIZER_PASSES * max(1, -(-numel // MTA_ELEMENTS)) + OPTIMIZER_SINGLE_OPS


def _summed(parts: Iterable[Timed]) -> Timed:
    """Collectives run one after the other (the dense and the experts' groups): their times added, the least exact
    source of them, their notes."""
    timed = list(parts)
    rank = {MEASURED: 0, INTERPOLATED: 1, ESTIMATED: 2}
    source = max((t.source for t in timed), key=lambda x: rank.get(x, 2))
    return Timed(sum(t.seconds for t in timed), source, "; ".join(t.note for t in timed if t.note))
