"""Expert parallelism (``opbench moe --ep N``): one MoE block over an EP group of N ranks, tokens exchanged as
Megatron-Core's all-to-all token dispatcher does (``megatron/core/transformer/moe/token_dispatcher.py``,
``MoEAlltoAllTokenDispatcher``), forward and backward.

Every rank has its own ``T`` tokens and the same weights (one seed); the ``E`` experts are placed contiguously, rank
``r`` running experts ``r·E/N … (r+1)·E/N − 1``. One forward:

    route        the router and top-k on this rank's tokens (or the synthetic routing's experts, seeded per rank)
    permute      sort this rank's ``T·k`` copies by expert: the copies for each rank are then contiguous
    dispatch     (1) one all_to_all of the per-expert counts: each rank learns how many rows every source sends
                     each of its local experts (Megatron: ``num_global_tokens_per_local_expert``), one host sync;
                 (2) all_to_all_single of the rows with those uneven splits (all-to-all-v);
                 (3) the received chunks (source-major) sorted to local-expert-major (Megatron: sort_chunks_by_idxs)
    experts      the local experts' grouped GEMMs on the rows they received
    combine      the chunks sorted back to source-major, all_to_all_single back with the splits swapped
    unpermute    out[t] = Σ weight · y over t's copies (+ shared experts), on the token's own rank

Backward: the all-to-alls are differentiable (``AllToAllV``): the dispatch's backward is the combine's all-to-all
on the gradients (received rows back to their tokens' ranks) and the combine's backward the dispatch's (the rows'
gradients out to the experts' ranks again), with the same splits; the counts are not exchanged again (Megatron's
dispatcher keeps them from the forward). The router and shared experts are replicated, so each rank's gradient of
them covers its own tokens: summed over the group they are the single-rank block's.

The output, and the gradients of the tokens and of every weight, are checked against the single-rank block
(block.forward, full weights) on the gathered tokens and experts of every rank. No capacity factor (no drops).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from . import block as B
from .spec import BlockSpec


def local_weights(w: B.MoEWeights, first: int, last: int) -> B.MoEWeights:
    """The experts ``first … last − 1`` of the full weights (views); router and shared experts as they are."""

    def cut(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[first:last]

    return B.MoEWeights(
        **{
            **vars(w),
            "gate_up": w.gate_up[first:last],
            "down": w.down[first:last],
            "gate_up_bias": cut(w.gate_up_bias),
            "down_bias": cut(w.down_bias),
        }
    )


def local_routed(counts: list[int], device: torch.device) -> B.Routed:
    """The grouped GEMMs' view of rows already sorted by local expert (no permutation of their own)."""
    c = torch.tensor(counts, dtype=torch.int64, device=device)
    rows = sum(counts)
    return B.Routed(
        order=torch.arange(rows, device=device),
        counts=counts,
        offsets=torch.cumsum(c, 0).to(torch.int32),
        expert_of_row=torch.repeat_interleave(torch.arange(len(counts), device=device), c),
        routed_counts=counts,
        dropped=0,
        top_k=1,
    )


def sort_chunks(t: torch.Tensor, sizes: list[int], order: list[int]) -> torch.Tensor:
    """``t`` cut into chunks of ``sizes`` rows, put back in ``order`` (Megatron's ``sort_chunks_by_idxs``)."""
    chunks = torch.split(t, sizes)
    return torch.cat([chunks[i] for i in order])


class AllToAllV(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits that autograd can run back: the backward sends each rank's
    gradient rows back where the forward's rows came from (the splits swapped)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = t.new_empty((sum(out_splits), *t.shape[1:]))
        dist.all_to_all_single(out, t.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


@dataclass
class Exchange:
    """One dispatch's bookkeeping: rows from each source to each local expert, and the chunk orders."""

    recv: list[list[int]]  # [source][local expert] rows
    send_splits: list[int]  # rows to each rank
    recv_splits: list[int]  # rows from each rank

    @property
    def expert_counts(self) -> list[int]:
        return [sum(col) for col in zip(*self.recv)]

    def by_expert(self, rows: torch.Tensor) -> torch.Tensor:
        """Received rows, (source, expert)-ordered, to (expert, source) order."""
        n, per = len(self.recv), len(self.recv[0])
        sizes = [c for row in self.recv for c in row]
        return sort_chunks(rows, sizes, [q * per + e for e in range(per) for q in range(n)])

    def by_source(self, rows: torch.Tensor) -> torch.Tensor:
        """The inverse of ``by_expert``."""
        n, per = len(self.recv), len(self.recv[0])
        sizes = [self.recv[q][e] for e in range(per) for q in range(n)]
        return sort_chunks(rows, sizes, [e * n + q for q in range(n) for e in range(per)])


class EpBlock:
    """This rank's part of the block over the EP group ``group`` (``ep`` ranks, this one ``rank``)."""

    def __init__(
        self,
        spec: BlockSpec,
        weights: B.MoEWeights,
        x: torch.Tensor,
        idx: torch.Tensor,
        linear: B.GroupedLinear,
        ep: int,
        rank: int,
        group: Any = None,
    ) -> None:
        self.spec, self.x, self.idx, self.linear = spec, x, idx, linear
        self.ep, self.rank, self.group = ep, rank, group
        self.per = spec.experts // ep
        self.full = weights
        self.local = local_weights(weights, rank * self.per, (rank + 1) * self.per)
        with torch.no_grad():
            self.routed = B.plan_rows(idx, spec.experts, None)
            self.x_perm = B.permute(x, self.routed)
        self.exchange = self.exchange_counts()

    # -- dispatch -----------------------------------------------------------------------------------------------
    def exchange_counts(self) -> Exchange:
        """One all_to_all of the per-expert counts (Megatron's dispatcher exchanges them before the tokens)."""
        mine = torch.tensor(self.routed.counts, dtype=torch.int64, device=self.x.device)  # [E], rank-major blocks
        theirs = torch.empty_like(mine)  # [ep · per]: from source q, the rows for each of my experts
        dist.all_to_all_single(theirs, mine, group=self.group)
        recv = theirs.view(self.ep, self.per).tolist()  # the host sync Megatron's dispatcher has too
        counts = self.routed.counts
        send = [sum(counts[j * self.per : (j + 1) * self.per]) for j in range(self.ep)]
        return Exchange(recv, send, [sum(r) for r in recv])

    def dispatch(self) -> torch.Tensor:
        """Counts, then rows, to the experts' ranks; rows sorted by local expert. [rows received, h]"""
        ex = self.exchange_counts()
        return ex.by_expert(AllToAllV.apply(self.x_perm, ex.recv_splits, ex.send_splits, self.group))

    def experts(self, rows: torch.Tensor) -> torch.Tensor:
        routed = local_routed(self.exchange.expert_counts, rows.device)
        return B.experts(rows, self.local, routed, self.spec, self.linear)

    def combine(self, y: torch.Tensor) -> torch.Tensor:
        """The experts' rows back to their tokens' ranks, in this rank's expert-sorted copy order. [T·k, h]"""
        ex = self.exchange
        return AllToAllV.apply(ex.by_source(y), ex.send_splits, ex.recv_splits, self.group)

    def dispatch_backward(self, grad_rows: torch.Tensor) -> torch.Tensor:
        """The dispatch's backward: the received rows' gradients (by local expert) back to their tokens' ranks, the
        combine's all-to-all (no count exchange: the forward's splits). [T·k, h]"""
        ex = self.exchange
        out = grad_rows.new_empty((sum(ex.send_splits), grad_rows.shape[1]))
        dist.all_to_all_single(out, ex.by_source(grad_rows), ex.send_splits, ex.recv_splits, group=self.group)
        return out

    def combine_backward(self, grad_back: torch.Tensor) -> torch.Tensor:
        """The combine's backward: the gradients of this rank's copies out to the experts' ranks again, the
        dispatch's all-to-all, sorted by local expert. [rows received, h]"""
        ex = self.exchange
        out = grad_back.new_empty((sum(ex.recv_splits), grad_back.shape[1]))
        dist.all_to_all_single(out, grad_back.contiguous(), ex.recv_splits, ex.send_splits, group=self.group)
        return ex.by_expert(out)

    def forward(self) -> torch.Tensor:
        """The whole block on this rank's tokens, through the EP group; differentiable where grad is on (the
        routing weights come from this call's scores). [T, h]"""
        scores = B.router_scores(self.x, self.full, self.spec.router)
        weights, _ = B.route(scores, self.full, self.spec.router, self.idx)  # the selection runs, as on one rank
        self.x_perm = B.permute(self.x, B.plan_rows(self.idx, self.spec.experts, None))
        y_back = self.combine(self.experts(self.dispatch()))
        return B.combine(y_back, weights, self.routed, self.x.shape[0], B.shared(self.x, self.full))

    def grads(self, grad_out: torch.Tensor, x: torch.Tensor) -> list[torch.Tensor]:
        """Forward and backward with output gradient ``grad_out``: [d x, then d of every trainable weight] (zeros
        where this rank's part does not reach a weight: other ranks' experts)."""
        leaves = [x.detach().requires_grad_(), *self.full.trainable()]
        kept, self.x = self.x, leaves[0]
        try:
            with torch.enable_grad():
                got = torch.autograd.grad(self.forward(), leaves, grad_out, allow_unused=True)
        finally:
            self.x = kept
        return [torch.zeros_like(p) if g is None else g for p, g in zip(leaves, got)]

    # -- what the rows say ----------------------------------------------------------------------------------------
    def traffic(self) -> dict[str, Any]:
        """This rank's dispatch: rows sent to and received from each rank (the combine is the reverse)."""
        return {"send_rows": self.exchange.send_splits, "recv_rows": self.exchange.recv_splits}


def reference_error(block: EpBlock, out: torch.Tensor, linear: B.GroupedLinear) -> float:
    """The EP output against the single-rank block (block.forward, full weights) on every rank's tokens and experts,
    gathered: max relative error over the group (every rank gets the same number)."""
    n = block.ep

    def gather(t: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(n)]
        dist.all_gather(parts, t.contiguous(), group=block.group)
        return torch.cat(parts)

    xs, idxs, outs = gather(block.x), gather(block.idx), gather(out)
    with torch.no_grad():
        ref = B.forward(xs, block.full, block.spec, linear, None, idxs)
    return B.rel_err(outs, ref)


def grads_reference_error(block: EpBlock, grad_out: torch.Tensor, linear: B.GroupedLinear) -> float:
    """The EP backward against the single-rank block's on every rank's tokens, gathered: the tokens' gradients
    (this rank's rows of the reference's) and every weight's, summed over the group (a replicated weight's partial
    gradients add up; a rank's experts are its own); the max relative error over all of them and the group."""
    n, rank, t = block.ep, block.rank, block.x.shape[0]
    x = block.x.detach()
    mine = block.grads(grad_out, x)

    def gather(v: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(v) for _ in range(n)]
        dist.all_gather(parts, v.contiguous(), group=block.group)
        return torch.cat(parts)

    xs, idxs, gs = gather(x), gather(block.idx), gather(grad_out)
    params = block.full.trainable()
    with torch.enable_grad():
        xs.requires_grad_()
        ref = torch.autograd.grad(B.forward(xs, block.full, block.spec, linear, None, idxs), [xs, *params], gs)
    errors = [B.rel_err(mine[0], ref[0][rank * t : (rank + 1) * t])]
    for got, want in zip(mine[1:], ref[1:]):
        total = got.detach().clone()
        dist.all_reduce(total, group=block.group)
        errors.append(B.rel_err(total, want))
    worst = torch.tensor([max(errors)], dtype=torch.float64, device=x.device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=block.group)
    return float(worst.item())


def time_call(
    call: Callable[[], Any], device: torch.device, warmup: int, iters: int, trials: int, group: Any = None
) -> tuple[list[float], list[list[float]]]:
    """Seconds per call, nccl-tests style: every rank the same number of calls (an adaptive stop would let the ranks
    disagree and deadlock), a barrier before each trial's loop of ``iters`` calls. Returns (per trial: the rank mean;
    every rank's per-trial times), the same on every rank."""
    from opbench.comm.bench import timed_loop
    from opbench.core.device import synchronize

    with torch.no_grad():
        for _ in range(warmup):
            call()
        synchronize(device)
        mine = []
        for _ in range(trials):
            dist.barrier(group=group)
            mine.append(timed_loop(call, iters, device)[0])
    t = torch.tensor(mine, dtype=torch.float64, device=device)
    every = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, t, group=group)
    table = [e.cpu().tolist() for e in every]
    return [statistics.fmean(col) for col in zip(*table)], table


# -- the sweep: every rank runs it; rank 0 writes the rows --------------------------------------------------------
EP_TRIALS = 3


def ep_sweep(args: Any, plan: tuple[Any, BlockSpec, int], path: str, ranks: Any) -> list[dict[str, Any]]:
    """Every (routing, phase[, backend]) of one model over the EP group: rows with the rank-mean time per call and
    the slowest rank in the note. ``args`` is opbench moe's namespace; ``ranks`` a core.dist.Ranks of ``args.ep``."""
    from opbench.core import cli
    from opbench.core.cli import timing_config
    from opbench.core.device import default_dtype_name, device_info, torch_dtype
    from opbench.core.results import environment, summary_table
    from opbench.core.sweep import STATUS_OK, STATUS_UNSUPPORTED, Unsupported

    from . import backends
    from .routing import assign, load_stats, target_counts
    from .schema import COMMON_BACKEND, SCHEMA

    cfg, spec, seqlen = plan
    device, ep, rank = ranks.device, ranks.world_size, ranks.rank
    info = device_info(device)
    dtype = args.dtype or default_dtype_name(device)
    tdt = torch_dtype(dtype)
    tokens = args.mbs * seqlen
    timing = timing_config(args)
    warmup, iters = timing.warmup_iters, max(3, timing.min_iters)
    meta: dict[str, Any] = {
        "model": cfg.name,
        "model_config": cfg.to_dict(),
        "block": spec.as_meta(),
        "tokens": tokens,
        "seed": args.seed,
        "expert_parallel": {
            "ep": ep,
            "backend": ranks.backend,
            "placement": f"contiguous: rank r runs experts r·{spec.experts // ep} … (r+1)·{spec.experts // ep} − 1",
            "dispatcher": "Megatron-Core all-to-all: per-expert counts exchanged with one all_to_all, then the rows "
            "with all_to_all_single(output_split_sizes, input_split_sizes); combine is the reverse",
            "tokens": f"{tokens} per rank, drawn with seed {args.seed} + 1 + rank; weights with seed {args.seed}",
            "timing": f"{warmup} warm-up calls, {EP_TRIALS} trials of {iters} calls, a barrier before each trial; "
            "time_s = median over trials of the rank mean",
            "passes": f"{', '.join(args.passes)}: the backward (bwd) of dispatch and combine is the reverse "
            "all-to-all with the forward's splits; the block's is autograd's over the whole block, timed on a "
            "retained graph",
            "grad_output": f"standard normal, seed {args.seed} + 1 + ep + rank",
        },
        "routings": {},
    }
    meta = environment(device, meta)
    extra = {"model": cfg.name, "mbs": args.mbs, "seqlen": seqlen, "device": info.name, "ep": ep}
    rows: list[dict[str, Any]] = []
    slowest_ms: dict[int, float] = {}  # console only: id(row) -> the slowest rank's time (the CSV has it in the note)
    report = ranks.open_report(str(path), SCHEMA, meta, earlier=cli.earlier_policy(args))
    with report:
        for routing in args.routing:
            gen = torch.Generator(device=device).manual_seed(args.seed)
            w = B.make_weights(spec, tdt, device, gen)
            xgen = torch.Generator(device=device).manual_seed(args.seed + 1 + rank)
            x = torch.randn((tokens, spec.hidden), generator=xgen, device=device, dtype=torch.float32).to(tdt)
            note = ""
            with torch.no_grad():
                if routing.kind == "model":
                    idx = B.select(B.router_scores(x, w, spec.router), w, spec.router)
                else:
                    counts, note = target_counts(routing, tokens, spec.top_k, spec.experts)
                    idx = torch.from_numpy(assign(counts, tokens, spec.top_k, args.seed + rank)).to(device)
            block = EpBlock(spec, w, x, idx, backends.torch_loop, ep, rank)
            per_expert = [c for part in ranks.gather(block.exchange.expert_counts) for c in part]
            sent = [t["send_rows"] for t in ranks.gather(block.traffic())]
            received = [sum(sent[q][j] for q in range(ep)) for j in range(ep)]
            meta["routings"][routing.label] = {
                "routing": routing.text,
                "tokens_per_expert": per_expert,
                "rows_sent": sent,  # [source rank][destination rank], dispatch; combine sends them back
                "rows_received_per_rank": received,
                "note": note,
            }
            report.write_meta(meta)
            load = {
                **load_stats(per_expert),
                "tokens_dropped": 0,
                "capacity": None,
                "gemm_rows": sum(per_expert),
                "capacity_factor": None,
            }
            rank_load = f"rows received per rank {received} (max/mean {max(received) * ep / max(1, sum(received)):.3g})"

            def row(phase: str, backend: str, times: tuple[list[float], list[list[float]]] | None, **more: Any):
                r: dict[str, Any] = {
                    "routing": routing.label,
                    "backend": backend,
                    "phase": phase,
                    "pass": more.pop("pass_", "fwd"),
                    "tokens": tokens,
                    "hidden": spec.hidden,
                    "experts": spec.experts,
                    "top_k": spec.top_k,
                    "expert_intermediate": spec.expert_intermediate,
                    "shared_intermediate": spec.shared_intermediate,
                    "dtype": dtype,
                    "seed": args.seed,
                    **extra,
                    **load,
                    **more,
                }
                if times is not None:
                    mean, table = times
                    slowest = [max(col) for col in zip(*table)]
                    who = max(range(ep), key=lambda q: statistics.median(table[q]))
                    slowest_ms[id(r)] = statistics.median(slowest) * 1e3
                    r.update(
                        time_s=statistics.median(mean),
                        time_min_s=min(mean),
                        time_max_s=max(mean),
                        iters=iters * EP_TRIALS,
                        status=STATUS_OK,
                        note="; ".join(
                            n
                            for n in (
                                f"rank mean; slowest rank {who}: {statistics.median(slowest) * 1e3:.4g} ms",
                                rank_load,
                                note,
                            )
                            if n
                        ),
                    )
                rows.append(r)
                report.append(r)
                return r

            timed = lambda call: time_call(call, device, warmup, iters, EP_TRIALS)  # noqa: E731
            with torch.no_grad():
                rows_in = block.dispatch()
                y = block.experts(rows_in)
            built: dict[str, tuple[B.GroupedLinear, str, float]] = {}
            for name in args.backends:
                try:
                    linear, impl = backends.build(name, device, tdt, [block.local.gate_up, block.local.down])
                except Unsupported as exc:
                    row("experts", name, None, status=STATUS_UNSUPPORTED, error=str(exc))
                    continue
                block.linear = linear
                with torch.no_grad():
                    built[name] = (linear, impl, reference_error(block, block.forward(), backends.torch_loop))
            comm = f"all_to_all_single ({ranks.backend})"
            fwd, bwd = "fwd" in args.passes, "bwd" in args.passes
            ggen = torch.Generator(device=device).manual_seed(args.seed + 1 + ep + rank)
            grad_out = torch.randn((tokens, spec.hidden), generator=ggen, device=device).to(tdt)
            grad_rows = torch.randn(rows_in.shape, generator=ggen, device=device).to(tdt)
            grad_back = torch.randn((tokens * spec.top_k, spec.hidden), generator=ggen, device=device).to(tdt)
            if fwd:
                row("dispatch", COMMON_BACKEND, timed(block.dispatch), impl=comm)
            if bwd:
                row(
                    "dispatch",
                    COMMON_BACKEND,
                    timed(lambda: block.dispatch_backward(grad_rows)),
                    impl=comm,
                    pass_="bwd",
                )
            for name, (linear, impl, err) in built.items():
                block.linear = linear
                if fwd:
                    row("experts", name, timed(lambda: block.experts(rows_in)), impl=impl, max_rel_err=err)
            if fwd:
                row("combine", COMMON_BACKEND, timed(lambda: block.combine(y)), impl=comm)
            if bwd:
                row("combine", COMMON_BACKEND, timed(lambda: block.combine_backward(grad_back)), impl=comm, pass_="bwd")
            for name, (linear, impl, err) in built.items():
                block.linear = linear
                if fwd:
                    row("block", name, timed(block.forward), impl=impl, max_rel_err=err)
                if bwd:
                    try:
                        g_err = grads_reference_error(block, grad_out, backends.torch_loop)
                        leaves = [x.detach().requires_grad_(), *block.full.trainable()]
                        block.x = leaves[0]
                        with torch.enable_grad():
                            out = block.forward()
                        again = lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True)  # noqa: E731
                        row("block", name, timed(again), impl=impl, max_rel_err=g_err, pass_="bwd")
                    except (RuntimeError, NotImplementedError) as exc:  # a backend without autograd on this device
                        row("block", name, None, status=STATUS_UNSUPPORTED, error=f"backward: {exc}", pass_="bwd")
                    finally:
                        block.x = x
    if ranks.is_main:
        title = f"{cfg.name} MoE block over ep={ep} ranks ({ranks.backend}, {dtype}, {tokens} tokens per rank)"
        table = [
            {
                **r,
                "time_ms": None if r.get("time_s") is None else r["time_s"] * 1e3,
                "slowest_ms": slowest_ms.get(id(r)),
                "max/mean": r.get("imbalance"),
                "status": r["status"] if r["status"] == STATUS_OK else f"{r['status']}: {r.get('error') or ''}"[:80],
            }
            for r in rows
        ]
        cols = [
            "routing",
            "backend",
            "phase",
            "pass",
            "time_ms",
            "slowest_ms",
            "tokens_max",
            "max/mean",
            "max_rel_err",
            "status",
        ]
        print(f"\n{title}")
        print(summary_table(table, cols))
        print(f"wrote {path} ({len(rows)} rows)")
    return rows
