"""What one MoE block of a model is, from its ModelConfig: sizes, and how its router scores and picks experts.
No torch import (a dry run and every usage error stay fast).

The routing rules are transformers' own (5.x modeling files), per ``model_type``:

- ``qwen3_moe``, ``qwen2_moe``, ``qwen3_next``, ``mixtral``: softmax over the experts, top-k of the probabilities,
  renormalised over the k when ``norm_topk_prob`` (Mixtral always). Qwen2-MoE and Qwen3-Next add a shared expert
  behind a sigmoid gate.
- ``deepseek_v3`` / ``deepseek_v32`` / ``glm4_moe``: sigmoid scores; the choice adds the aux-loss-free bias
  ``e_score_correction_bias``; group-limited routing keeps the ``topk_group`` of ``n_group`` groups with the largest
  sum of their two best scores; the weights are the chosen (unbiased) scores, renormalised (``norm_topk_prob``) and
  times ``routed_scaling_factor``. A config's ``scoring_func`` other than sigmoid (``sqrtsoftplus``, DeepSeek-V4's;
  ``softmax``) is honoured, although transformers' DeepseekV3 itself always uses sigmoid.
- ``deepseek_v4``: ``sqrtsoftplus`` scores (or the config's ``scoring_func``) of a GEMM in the model dtype; top-k
  of scores + ``e_score_correction_bias``, never group-limited (transformers' DeepseekV4TopKRouter reads no
  ``n_group``); the chosen scores always renormalised (+1e-20), times ``routed_scaling_factor`` (1.5). Its
  hash-routed first layers and its clamped SwiGLU (``swiglu_limit``) are timed as this router and a plain SwiGLU.
- ``deepseek_v2``: softmax; ``topk_method`` greedy, or group_limited_greedy (group score = its best expert);
  times ``routed_scaling_factor``.
- ``gpt_oss``: top-k of the router's logits (the router has a bias), softmax over the k; the experts have biases and
  a clamped SwiGLU (``swiglu_limit``, ``swiglu_alpha``: ``(up + 1) · gate · σ(alpha · gate)``, gate and up
  interleaved).
- ``ernie4_5_moe``, ``llama4_text``: timed as softmax top-k (renormalised); their own details (ERNIE's statistics
  bias, Llama 4's sigmoid-scaled inputs) are left out and the note says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from opbench.core.errors import UsageError
from opbench.models.fields import ModelConfig

SCORINGS = ("softmax", "sigmoid", "sqrtsoftplus", "logits")


@dataclass(frozen=True)
class RouterSpec:
    scoring: str  # softmax | sigmoid | sqrtsoftplus | logits (gpt-oss: top-k of the logits, softmax over the k)
    top_k: int
    n_group: int = 1  # group-limited routing when > 1 (and topk_group < n_group)
    topk_group: int = 1
    group_score: str = "top2"  # top2: sum of a group's two best (V3 noaux_tc); max: its best (V2)
    correction_bias: bool = False  # e_score_correction_bias added to the scores for the choice only
    norm_topk_prob: bool = False
    norm_eps: float = 0.0  # DeepSeek adds 1e-20 to the denominator
    scaling: float = 1.0  # routed_scaling_factor
    router_bias: bool = False  # gpt-oss's router linear has a bias
    fp32_logits: bool = False  # DeepSeek computes the router GEMM in fp32

    @property
    def grouped(self) -> bool:
        return self.n_group > 1 and self.topk_group < self.n_group


@dataclass(frozen=True)
class BlockSpec:
    architecture: str
    hidden: int
    experts: int
    top_k: int
    expert_intermediate: int
    shared_intermediate: int  # 0: no shared experts
    shared_gate: bool  # Qwen2-MoE / Qwen3-Next: the shared expert's output times sigmoid(x · w)
    activation: str  # swiglu | gpt_oss (clamped)
    swiglu_limit: float
    swiglu_alpha: float
    expert_bias: bool
    router: RouterSpec
    note: str = ""

    def as_meta(self) -> dict[str, Any]:
        return asdict(self)


SOFTMAX_TOPK = ("qwen3_moe", "qwen2_moe", "qwen3_next", "mixtral", "ernie4_5_moe", "llama4_text")
SIGMOID_GROUPED = ("deepseek_v3", "deepseek_v32", "glm4_moe")


def _raw(cfg: ModelConfig, key: str, default: Any) -> Any:
    value = cfg.raw.get(key)
    return default if value is None else value


def _int(cfg: ModelConfig, key: str, default: int) -> int:
    value = _raw(cfg, key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"must be a positive integer, got {value!r}", source=cfg.source, field=key)
    return value


def _float(cfg: ModelConfig, key: str, default: float) -> float:
    value = _raw(cfg, key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UsageError(f"must be a positive number, got {value!r}", source=cfg.source, field=key)
    return float(value)


def _flag(cfg: ModelConfig, key: str, default: bool) -> bool:
    value = _raw(cfg, key, default)
    if not isinstance(value, bool):
        raise UsageError(f"must be true or false, got {value!r}", source=cfg.source, field=key)
    return value


def router_spec(cfg: ModelConfig) -> tuple[RouterSpec, str]:
    """The router of ``cfg`` (module docstring) and a note on what is approximated ("" when nothing is)."""
    arch, k = cfg.architecture, cfg.num_experts_per_tok
    scoring = _raw(cfg, "scoring_func", None)
    if scoring is not None and scoring not in SCORINGS[:3]:
        raise UsageError(
            f"unknown scoring function {scoring!r}; opbench moe knows {', '.join(SCORINGS[:3])}",
            source=cfg.source,
            field="scoring_func",
        )
    if arch in SIGMOID_GROUPED:
        v3 = arch != "glm4_moe"
        spec = RouterSpec(
            scoring=scoring or "sigmoid",
            top_k=k,
            n_group=_int(cfg, "n_group", 8 if v3 else 1),
            topk_group=_int(cfg, "topk_group", 4 if v3 else 1),
            correction_bias=_raw(cfg, "topk_method", "noaux_tc") == "noaux_tc",
            norm_topk_prob=_flag(cfg, "norm_topk_prob", True),
            norm_eps=1e-20,
            scaling=_float(cfg, "routed_scaling_factor", 2.5 if v3 else 1.0),
            fp32_logits=True,
        )
        note = ""
    elif arch == "deepseek_v4":
        spec = RouterSpec(
            scoring=scoring or "sqrtsoftplus",
            top_k=k,
            correction_bias=True,
            norm_topk_prob=True,
            norm_eps=1e-20,
            scaling=_float(cfg, "routed_scaling_factor", 1.5),
        )
        note = (
            "deepseek_v4: the hash-routed layers (a token -> expert table) are timed with the top-k router and the "
            "clamped SwiGLU (swiglu_limit) as a plain SwiGLU"
        )
    elif arch == "deepseek_v2":
        method = _raw(cfg, "topk_method", "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise UsageError(
                f"unknown top-k method {method!r} (greedy, group_limited_greedy)",
                source=cfg.source,
                field="topk_method",
            )
        grouped = method == "group_limited_greedy"
        spec = RouterSpec(
            scoring=scoring or "softmax",
            top_k=k,
            n_group=_int(cfg, "n_group", 1) if grouped else 1,
            topk_group=_int(cfg, "topk_group", 1) if grouped else 1,
            group_score="max",
            scaling=_float(cfg, "routed_scaling_factor", 1.0),
        )
        note = ""
    elif arch == "gpt_oss":
        spec = RouterSpec(scoring="logits", top_k=k, router_bias=True)
        note = ""
    else:
        spec = RouterSpec(
            scoring=scoring or "softmax",
            top_k=k,
            norm_topk_prob=arch in ("mixtral", "ernie4_5_moe", "llama4_text")
            or _flag(cfg, "norm_topk_prob", arch == "qwen3_next"),
        )
        note = (
            ""
            if arch in SOFTMAX_TOPK[:4]
            else f"{arch}'s router is timed as softmax top-k (its own scoring details are left out)"
        )
    if spec.grouped and cfg.n_routed_experts % spec.n_group:
        raise UsageError(
            f"{cfg.n_routed_experts} experts do not split into {spec.n_group} groups",
            source=cfg.source,
            field="n_group",
        )
    if spec.grouped and spec.topk_group * (cfg.n_routed_experts // spec.n_group) < k:
        raise UsageError(
            f"topk_group {spec.topk_group} of {spec.n_group} groups leaves fewer than top-k {k} experts",
            source=cfg.source,
            field="topk_group",
        )
    return spec, note


def block_spec(cfg: ModelConfig) -> BlockSpec:
    """The MoE block of ``cfg``; a dense model is refused in one line."""
    if not cfg.is_moe:
        raise UsageError(
            f"model '{cfg.name}' ({cfg.architecture}) is dense (no routed experts): opbench moe needs an MoE model "
            "(qwen3_moe, deepseek_v3, gpt_oss, mixtral, …)",
            field="--model",
        )
    router, note = router_spec(cfg)
    shared = cfg.shared_intermediate_size if (cfg.n_shared_experts or cfg.shared_expert_intermediate_size) else 0
    gpt_oss = cfg.architecture == "gpt_oss"
    return BlockSpec(
        architecture=cfg.architecture,
        hidden=cfg.hidden_size,
        experts=cfg.n_routed_experts,
        top_k=cfg.num_experts_per_tok,
        expert_intermediate=cfg.expert_intermediate_size,
        shared_intermediate=shared,
        shared_gate=cfg.architecture in ("qwen2_moe", "qwen3_next"),
        activation="gpt_oss" if gpt_oss else "swiglu",
        swiglu_limit=_float(cfg, "swiglu_limit", 7.0) if gpt_oss else 0.0,
        swiglu_alpha=_float(cfg, "swiglu_alpha", 1.702) if gpt_oss else 0.0,
        expert_bias=gpt_oss,
        router=router,
        note=note,
    )
