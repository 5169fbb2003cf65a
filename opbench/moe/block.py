"""One MoE block in plain torch, phase by phase, as transformers computes it (spec.py says per architecture).

Every phase is a function of tensors, so the runner can time each alone, forward and backward:

    router             scores = score(x · W_rᵀ (+ b_r))                                  [T, E]
    topk               (weights, idx) = the config's selection and weighting of scores   [T, k]
    permute            x_perm = x[token of each kept copy, sorted by expert]             [R, h]
    gate_up            h = x_perm_e · W_gate_upᵀ_e per expert (grouped GEMM)             [R, 2F]
    activation         a = SwiGLU(h)                                                     [R, F]
    down               y = a_e · W_downᵀ_e per expert (grouped GEMM)                     [R, h]
    shared             s = shared experts' MLP of x (× sigmoid gate for Qwen2-MoE)       [T, h]
    unpermute_combine  out[t] = Σ_copies weight · y  (+ s)                               [T, h]

``R`` is the number of copies the experts run: ``T·k`` less those dropped under a capacity factor. One rank: no
expert-parallel dispatch/combine all-to-all is in any phase (``--ep`` adds them around these: ep.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .spec import BlockSpec, RouterSpec

GroupedLinear = Callable[[torch.Tensor, torch.Tensor, "Routed"], torch.Tensor]  # (x [R,K], w [E,N,K], routed) -> [R,N]


@dataclass
class MoEWeights:
    """The block's parameters in transformers' layouts (gate_up [E, 2F, h] with gate first, down [E, h, F])."""

    router: torch.Tensor  # [E, h]
    router_bias: torch.Tensor | None  # [E] (gpt-oss)
    correction_bias: torch.Tensor  # [E], not trained by backprop (DeepSeek updates it from the load)
    gate_up: torch.Tensor  # [E, 2F, h]
    down: torch.Tensor  # [E, h, F]
    gate_up_bias: torch.Tensor | None  # [E, 2F] (gpt-oss)
    down_bias: torch.Tensor | None  # [E, h] (gpt-oss)
    shared_gate_proj: torch.Tensor | None  # [Fs, h]
    shared_up_proj: torch.Tensor | None  # [Fs, h]
    shared_down_proj: torch.Tensor | None  # [h, Fs]
    shared_expert_gate: torch.Tensor | None  # [1, h] (Qwen2-MoE / Qwen3-Next)

    def trainable(self) -> list[torch.Tensor]:
        names = (
            "router",
            "router_bias",
            "gate_up",
            "down",
            "gate_up_bias",
            "down_bias",
            "shared_gate_proj",
            "shared_up_proj",
            "shared_down_proj",
            "shared_expert_gate",
        )
        return [t for t in (getattr(self, n) for n in names) if t is not None]


def make_weights(
    spec: BlockSpec, dtype: torch.dtype, device: torch.device, generator: torch.Generator, std: float = 0.02
) -> MoEWeights:
    """Random weights (normal, ``std`` as transformers' initializer_range); leaves that require grad."""
    h, e, f, fs = spec.hidden, spec.experts, spec.expert_intermediate, spec.shared_intermediate

    def param(*shape: int, scale: float = std) -> torch.Tensor:
        t = torch.randn(shape, generator=generator, device=device, dtype=torch.float32) * scale
        return t.to(dtype).requires_grad_()

    router_dtype = torch.float32 if spec.router.fp32_logits else dtype
    router = (torch.randn((e, h), generator=generator, device=device) * std).to(router_dtype).requires_grad_()
    return MoEWeights(
        router=router,
        router_bias=param(e) if spec.router.router_bias else None,
        correction_bias=torch.zeros(e, device=device, dtype=torch.float32),
        gate_up=param(e, 2 * f, h),
        down=param(e, h, f),
        gate_up_bias=param(e, 2 * f) if spec.expert_bias else None,
        down_bias=param(e, h) if spec.expert_bias else None,
        shared_gate_proj=param(fs, h) if fs else None,
        shared_up_proj=param(fs, h) if fs else None,
        shared_down_proj=param(h, fs) if fs else None,
        shared_expert_gate=param(1, h) if fs and spec.shared_gate else None,
    )


# --- router and top-k -------------------------------------------------------------------------------------------


def router_scores(x: torch.Tensor, w: MoEWeights, r: RouterSpec) -> torch.Tensor:
    """[T, E] scores in fp32 (gpt-oss: the logits themselves, in the input dtype)."""
    if r.fp32_logits:
        logits = F.linear(x.float(), w.router.float())
    else:
        logits = F.linear(x, w.router, w.router_bias)
    if r.scoring == "softmax":
        return torch.softmax(logits, dim=-1, dtype=torch.float32)
    if r.scoring == "sigmoid":
        return logits.float().sigmoid()
    if r.scoring == "sqrtsoftplus":
        return F.softplus(logits.float()).sqrt()
    return logits  # "logits": gpt-oss picks on the raw logits


def select(scores: torch.Tensor, w: MoEWeights, r: RouterSpec) -> torch.Tensor:
    """The experts the config's rule picks: [T, k] indices."""
    if r.scoring == "logits":
        return torch.topk(scores, r.top_k, dim=-1).indices
    choice = scores + w.correction_bias if r.correction_bias else scores
    if r.grouped:
        t, e = choice.shape
        per = choice.view(t, r.n_group, e // r.n_group)
        group = per.topk(2, dim=-1)[0].sum(dim=-1) if r.group_score == "top2" else per.max(dim=-1).values
        keep = torch.topk(group, k=r.topk_group, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(group).scatter_(1, keep, 1).bool()
        choice = choice.masked_fill(~mask.unsqueeze(-1).expand_as(per).reshape(t, e), float("-inf"))
    return torch.topk(choice, k=r.top_k, dim=-1, sorted=r.scoring == "softmax").indices


def weigh(scores: torch.Tensor, idx: torch.Tensor, r: RouterSpec) -> torch.Tensor:
    """The combine weights of the chosen experts [T, k]: their scores, renormalised and scaled as the config says
    (gpt-oss: softmax over the chosen logits)."""
    chosen = scores.gather(1, idx)
    if r.scoring == "logits":
        return torch.softmax(chosen, dim=1, dtype=chosen.dtype)
    if r.norm_topk_prob:
        chosen = chosen / (chosen.sum(dim=-1, keepdim=True) + r.norm_eps)
    return chosen * r.scaling if r.scaling != 1.0 else chosen


def route(
    scores: torch.Tensor, w: MoEWeights, r: RouterSpec, forced: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, idx). The selection always runs (its cost is the same whatever it picks); ``forced`` indices (a
    synthetic routing) replace what it picked, and the weights are the scores at those."""
    idx = select(scores, w, r)
    if forced is not None:
        idx = forced
    return weigh(scores, idx, r), idx


# --- permutation ------------------------------------------------------------------------------------------------


@dataclass
class Routed:
    """Where the experts' rows come from: copies sorted by expert, those over capacity dropped."""

    order: torch.Tensor  # [R] flat copy index (token · k + slot) of each expert row, grouped by expert
    counts: list[int]  # rows per expert actually run (after drops), on the host
    offsets: torch.Tensor  # int32 cumulative counts on the device (torch._grouped_mm's offs)
    expert_of_row: torch.Tensor  # [R] expert of each row (for per-expert biases)
    routed_counts: list[int]  # copies per expert before drops
    dropped: int
    top_k: int

    @property
    def rows(self) -> int:
        return sum(self.counts)


def plan_rows(idx: torch.Tensor, experts: int, cap: int | None) -> Routed:
    """Sort the copies by expert (stable: within an expert in token order) and drop those past ``cap`` (the later
    tokens, Megatron's ``moe_token_drop_policy=position``)."""
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    routed = torch.bincount(flat, minlength=experts)
    counts = routed
    if cap is not None:
        sorted_expert = flat[order]
        start = torch.cumsum(routed, 0) - routed
        rank = torch.arange(flat.numel(), device=flat.device) - start[sorted_expert]
        order = order[rank < cap]
        counts = routed.clamp(max=cap)
    counts_host = counts.tolist()
    routed_host = routed.tolist()
    return Routed(
        order=order,
        counts=counts_host,
        offsets=torch.cumsum(counts, 0).to(torch.int32),
        expert_of_row=torch.repeat_interleave(torch.arange(experts, device=idx.device), counts),
        routed_counts=routed_host,
        dropped=sum(routed_host) - sum(counts_host),
        top_k=idx.shape[1],
    )


def permute(x: torch.Tensor, routed: Routed) -> torch.Tensor:
    return x.index_select(0, torch.div(routed.order, routed.top_k, rounding_mode="floor"))


def permute_phase(x: torch.Tensor, idx: torch.Tensor, experts: int, cap: int | None) -> tuple[torch.Tensor, Routed]:
    """The permute phase as a step runs it: the sort, the counts (one host sync) and the gather."""
    routed = plan_rows(idx, experts, cap)
    return permute(x, routed), routed


# --- experts ----------------------------------------------------------------------------------------------------


def activation(h: torch.Tensor, spec: BlockSpec) -> torch.Tensor:
    if spec.activation == "gpt_oss":  # gpt-oss: interleaved gate/up, clamped, (up + 1) · gate · σ(alpha · gate)
        gate, up = h[..., ::2], h[..., 1::2]
        limit = spec.swiglu_limit
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * spec.swiglu_alpha))
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def gate_up(x_perm: torch.Tensor, w: MoEWeights, routed: Routed, linear: GroupedLinear) -> torch.Tensor:
    h = linear(x_perm, w.gate_up, routed)
    if w.gate_up_bias is not None:
        h = h + w.gate_up_bias[routed.expert_of_row]
    return h


def down(a: torch.Tensor, w: MoEWeights, routed: Routed, linear: GroupedLinear) -> torch.Tensor:
    y = linear(a, w.down, routed)
    if w.down_bias is not None:
        y = y + w.down_bias[routed.expert_of_row]
    return y


def experts(
    x_perm: torch.Tensor, w: MoEWeights, routed: Routed, spec: BlockSpec, linear: GroupedLinear
) -> torch.Tensor:
    return down(activation(gate_up(x_perm, w, routed, linear), spec), w, routed, linear)


def shared(x: torch.Tensor, w: MoEWeights) -> torch.Tensor | None:
    if w.shared_gate_proj is None or w.shared_up_proj is None or w.shared_down_proj is None:
        return None
    s = F.linear(F.silu(F.linear(x, w.shared_gate_proj)) * F.linear(x, w.shared_up_proj), w.shared_down_proj)
    if w.shared_expert_gate is not None:
        s = torch.sigmoid(F.linear(x, w.shared_expert_gate)) * s
    return s


def combine(
    y: torch.Tensor, weights: torch.Tensor, routed: Routed, tokens: int, shared_out: torch.Tensor | None
) -> torch.Tensor:
    """out[t] = Σ over t's kept copies of weight · y, plus the shared experts' output."""
    w_rows = weights.reshape(-1).index_select(0, routed.order).to(y.dtype)
    token = torch.div(routed.order, routed.top_k, rounding_mode="floor")
    out = torch.zeros((tokens, y.shape[-1]), dtype=y.dtype, device=y.device)
    out = out.index_add(0, token, y * w_rows[:, None])
    return out if shared_out is None else out + shared_out


def forward(
    x: torch.Tensor,
    w: MoEWeights,
    spec: BlockSpec,
    linear: GroupedLinear,
    cap: int | None = None,
    forced: torch.Tensor | None = None,
) -> torch.Tensor:
    """The whole block: x [T, h] → out [T, h]."""
    scores = router_scores(x, w, spec.router)
    weights, idx = route(scores, w, spec.router, forced)
    x_perm, routed = permute_phase(x, idx, spec.experts, cap)
    y = experts(x_perm, w, routed, spec, linear)
    return combine(y, weights, routed, x.shape[0], shared(x, w))


# --- FLOPs (docs/moe.md) ----------------------------------------------------------------------------------------


def gemm_flops(spec: BlockSpec, tokens: int, rows: int) -> dict[str, int]:
    """Forward FLOPs of each phase's GEMMs, 2·m·n·k each (backward: twice, dgrad + wgrad)."""
    h, f, fs, e = spec.hidden, spec.expert_intermediate, spec.shared_intermediate, spec.experts
    gate_up_f = 2 * rows * (2 * f) * h
    down_f = 2 * rows * h * f
    router_f = 2 * tokens * e * h
    shared_f = 2 * tokens * (2 * fs) * h + 2 * tokens * h * fs + (2 * tokens * h if spec.shared_gate and fs else 0)
    return {
        "router": router_f,
        "gate_up": gate_up_f,
        "down": down_f,
        "experts": gate_up_f + down_f,
        "shared": shared_f,
        "block": router_f + gate_up_f + down_f + shared_f,
    }


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().item()
    err = (got.double() - ref.double()).abs().max().item()
    return err / scale if scale > 0 else err
