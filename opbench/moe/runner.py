"""Times one MoE block phase by phase: the routing's setup (weights, tokens, the experts each token goes to) is
built once per routing and shared by every backend, so the backends see the same tokens, counts and weights."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from opbench.core.device import DeviceInfo, torch_dtype
from opbench.core.sweep import STATUS_OK, Unsupported
from opbench.core.timing import Stats, TimingConfig, issue_time, measure, timing_note

from . import backends
from . import block as B
from .routing import Routing, assign, capacity, load_stats, target_counts
from .schema import COMMON_BACKEND
from .spec import BlockSpec

GEMM_PHASES = ("router", "gate_up", "down", "experts", "shared", "block")


@dataclass(frozen=True)
class MoeCase:
    routing: Routing
    backend: str  # schema.COMMON_BACKEND for the phases no backend changes
    phase: str
    pass_: str


@dataclass
class Setup:
    """One routing's tensors: the block's weights, the tokens, what the router and the routing made of them."""

    routing: Routing
    weights: B.MoEWeights
    x: torch.Tensor
    forced: torch.Tensor | None  # the synthetic routing's experts [T, k]; None: the router's own
    idx: torch.Tensor
    scores: torch.Tensor
    topk_weights: torch.Tensor
    routed: B.Routed
    capacity: int | None
    note: str
    x_perm: torch.Tensor = field(init=False)
    _inter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None] | None = field(
        init=False, default=None
    )

    def __post_init__(self) -> None:
        self.x_perm = B.permute(self.x, self.routed)

    def intermediates(self, spec: BlockSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The experts' gate_up output, activation and down output, and the shared experts' output: the inputs
        of the later phases, computed once (torch_loop) per routing."""
        if self._inter is None:
            w = self.weights
            with torch.no_grad():
                h = B.gate_up(self.x_perm, w, self.routed, backends.torch_loop)
                a = B.activation(h, spec)
                y = B.down(a, w, self.routed, backends.torch_loop)
                self._inter = (h, a, y, B.shared(self.x, w))
        return self._inter

    def load_columns(self) -> dict[str, Any]:
        return {
            **load_stats(self.routed.routed_counts),
            "tokens_dropped": self.routed.dropped,
            "capacity": self.capacity,
            "gemm_rows": self.routed.rows,
        }

    def meta(self) -> dict[str, Any]:
        return {
            "routing": self.routing.text,
            "tokens_per_expert": self.routed.routed_counts,
            "rows_per_expert_run": self.routed.counts,
            "capacity": self.capacity,
            "tokens_dropped": self.routed.dropped,
            "note": self.note,
        }


class MoeRun:
    """Everything one model's sweep shares; ``measure(case)`` is one CSV row."""

    def __init__(
        self,
        spec: BlockSpec,
        tokens: int,
        dtype: str,
        info: DeviceInfo,
        timing: TimingConfig,
        seed: int,
        capacity_factor: float | None,
        on_setup: Callable[[Setup], None] | None = None,
    ) -> None:
        self.spec, self.tokens, self.dtype, self.info, self.timing = spec, tokens, dtype, info, timing
        self.seed, self.capacity_factor, self.on_setup = seed, capacity_factor, on_setup
        self.device = info.device
        self.torch_dtype = torch_dtype(dtype)
        self._setups: dict[str, Setup] = {}
        self._linears: dict[str, tuple[B.GroupedLinear, str, float]] = {}

    # --- setup ---------------------------------------------------------------------------------------------------

    def setup(self, routing: Routing) -> Setup:
        found = self._setups.get(routing.text)
        if found is not None:
            return found
        spec, t = self.spec, self.tokens
        gen = torch.Generator(device=self.device).manual_seed(self.seed)
        w = B.make_weights(spec, self.torch_dtype, self.device, gen)
        x = torch.randn((t, spec.hidden), generator=gen, device=self.device, dtype=torch.float32).to(self.torch_dtype)
        with torch.no_grad():
            scores = B.router_scores(x, w, spec.router)
            if routing.kind == "model":
                forced, note = None, ""
                idx = B.select(scores, w, spec.router)
            else:
                counts, note = target_counts(routing, t, spec.top_k, spec.experts)
                forced = torch.from_numpy(assign(counts, t, spec.top_k, self.seed)).to(self.device)
                idx = forced
            topk_weights = B.weigh(scores, idx, spec.router)
        cap = capacity(self.capacity_factor, t, spec.top_k, spec.experts)
        routed = B.plan_rows(idx, spec.experts, cap)
        made = Setup(routing, w, x, forced, idx, scores, topk_weights, routed, cap, note)
        self._setups[routing.text] = made
        if self.on_setup is not None:
            self.on_setup(made)
        return made

    def linear(self, backend: str, setup: Setup) -> tuple[B.GroupedLinear, str, float]:
        """The backend's grouped linear, what it runs, and its experts' output error against an fp64 loop."""
        key = f"{backend}/{setup.routing.text}"
        if key not in self._linears:
            w = setup.weights
            fn, impl = backends.build(backend, self.device, self.torch_dtype, [w.gate_up, w.down])
            with torch.no_grad():
                got = B.experts(setup.x_perm, w, setup.routed, self.spec, fn)
                w64 = B.MoEWeights(**{k: (None if v is None else v.double()) for k, v in vars(w).items()})  # type: ignore[arg-type]
                ref = B.experts(setup.x_perm.double(), w64, setup.routed, self.spec, backends.torch_loop)
            self._linears[key] = (fn, impl, B.rel_err(got, ref))
        return self._linears[key]

    # --- one row -------------------------------------------------------------------------------------------------

    def phase_fn(
        self, case: MoeCase, s: Setup
    ) -> tuple[Callable[[], torch.Tensor], list[torch.Tensor], str, float | None]:
        """(forward of the phase, its differentiable inputs, impl, max_rel_err)."""
        spec, w, r = self.spec, s.weights, self.spec.router
        linear: B.GroupedLinear = backends.torch_loop
        impl, err = "eager torch", None
        if case.backend != COMMON_BACKEND:
            linear, impl, err = self.linear(case.backend, s)

        def leaf(t: torch.Tensor | None) -> torch.Tensor:
            assert t is not None
            return t.detach().clone().requires_grad_()

        h, a, y, sh = s.intermediates(spec)
        x, scores = leaf(s.x), leaf(s.scores)
        phase = case.phase
        params: list[torch.Tensor | None]
        if phase == "router":
            params = [x, w.router, w.router_bias]
            fn = lambda: B.router_scores(x, w, r)  # noqa: E731
        elif phase == "topk":
            params = [scores]
            fn = lambda: B.route(scores, w, r, s.forced)[0]  # noqa: E731
        elif phase == "permute":
            params = [x]
            fn = lambda: B.permute_phase(x, s.idx, spec.experts, s.capacity)[0]  # noqa: E731
        elif phase == "gate_up":
            xp = leaf(s.x_perm)
            params = [xp, w.gate_up, w.gate_up_bias]
            fn = lambda: B.gate_up(xp, w, s.routed, linear)  # noqa: E731
        elif phase == "activation":
            hl = leaf(h)
            params = [hl]
            fn = lambda: B.activation(hl, spec)  # noqa: E731
        elif phase == "down":
            al = leaf(a)
            params = [al, w.down, w.down_bias]
            fn = lambda: B.down(al, w, s.routed, linear)  # noqa: E731
        elif phase == "experts":
            xp = leaf(s.x_perm)
            params = [xp, w.gate_up, w.down, w.gate_up_bias, w.down_bias]
            fn = lambda: B.experts(xp, w, s.routed, spec, linear)  # noqa: E731
        elif phase == "shared":
            if sh is None:
                raise Unsupported("this model has no shared experts")
            params = [x, w.shared_gate_proj, w.shared_up_proj, w.shared_down_proj, w.shared_expert_gate]
            fn = lambda: B.shared(x, w)  # type: ignore[assignment,return-value]  # noqa: E731
        elif phase == "unpermute_combine":
            yl, wl = leaf(y), leaf(s.topk_weights)
            sl = None if sh is None else leaf(sh)
            params = [yl, wl, sl]
            fn = lambda: B.combine(yl, wl, s.routed, self.tokens, sl)  # noqa: E731
        elif phase == "block":
            params = [x, *w.trainable()]
            fn = lambda: B.forward(x, w, spec, linear, s.capacity, s.forced)  # noqa: E731
        else:
            raise ValueError(f"unknown phase {phase}")
        return fn, [p for p in params if p is not None and p.requires_grad], impl, err

    def measure(self, case: MoeCase) -> dict[str, Any]:
        s = self.setup(case.routing)
        fn, leaves, impl, err = self.phase_fn(case, s)
        call: Callable[[], Any]
        if case.pass_ == "fwd":
            call = fn
        else:
            out = fn()
            grad = torch.randn(out.shape, dtype=out.dtype, device=out.device)  # contiguous (grouped_mm needs it on CPU)
            call = lambda: torch.autograd.grad(out, leaves, grad, retain_graph=True, allow_unused=True)  # noqa: E731
        stats = measure(call, self.device, self.timing)
        host = issue_time(call, self.device) if self.device.type != "cpu" else stats.median
        flops = self.flops(case, s)
        notes = [n for n in (timing_note(stats), s.note, self.spec.note) if n]
        return {
            **self.base_row(case),
            **s.load_columns(),
            "flops": flops,
            **stats_columns(stats),
            "tflops": flops / stats.median / 1e12 if flops and stats.median > 0 else None,
            "host_s": host,
            "max_rel_err": err,
            "impl": impl,
            "status": STATUS_OK,
            "error": None,
            "note": "; ".join(notes) or None,
        }

    def flops(self, case: MoeCase, s: Setup) -> int | None:
        fwd = B.gemm_flops(self.spec, self.tokens, s.routed.rows).get(case.phase)
        if not fwd:
            return None
        return fwd if case.pass_ == "fwd" else 2 * fwd

    def base_row(self, case: MoeCase) -> dict[str, Any]:
        spec = self.spec
        return {
            "routing": case.routing.label,
            "backend": case.backend,
            "phase": case.phase,
            "pass": case.pass_,
            "tokens": self.tokens,
            "hidden": spec.hidden,
            "experts": spec.experts,
            "top_k": spec.top_k,
            "expert_intermediate": spec.expert_intermediate,
            "shared_intermediate": spec.shared_intermediate,
            "dtype": self.dtype,
            "capacity_factor": self.capacity_factor,
            "seed": self.seed,
        }


def stats_columns(stats: Stats) -> dict[str, Any]:
    return {
        "time_s": stats.median,
        "time_min_s": stats.min,
        "time_p10_s": stats.p10,
        "time_p90_s": stats.p90,
        "time_max_s": stats.max,
        "time_std_s": stats.std,
        "time_iqr_rel": stats.iqr_rel,
        "iters": stats.iters,
    }


def unsupported_backends(names: Sequence[str], device: torch.device, dtype: str) -> dict[str, str]:
    """The backends that cannot run here, and why (checked once, before the sweep)."""
    out = {}
    for name in names:
        reason = backends.unsupported_reason(name, device, torch_dtype(dtype))
        if reason:
            out[name] = reason
    return out
