"""Every parameter of a decoder-only model, named and shaped exactly as Hugging Face transformers builds it.

Why: FSDP pads each parameter separately (FSDP2) or each unit's flat buffer (FSDP1), and a checkpoint holds
every tensor by name, so "layer weights" in aggregate is not enough. Names, shapes and registration order come
from each architecture's description (architectures.py), which follows its transformers 5.x modeling file, and
are checked against ``model.named_parameters()`` of real models in tests/test_architectures.py and
tests/test_params.py. Buffers (rotary tables, DeepSeek-V3's ``e_score_correction_bias``) are not parameters and
are not listed. This module needs no torch and no transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from opbench.core.errors import UsageError

from .architectures import architecture
from .config import ModelConfig
from .layout import Named, weight

ROOT = "root"


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: its fully-qualified HF name, shape, and FSDP unit ('root' or 'layers.<i>')."""

    name: str
    shape: tuple[int, ...]
    unit: str

    @property
    def numel(self) -> int:
        return prod(self.shape)


def layer_parameters(cfg: ModelConfig, index: int) -> Named:
    """(name, shape) of decoder layer ``index``, names relative to the layer (``self_attn.q_proj.weight``)."""
    return architecture(cfg).layer(cfg, index).params


def parameter_shapes(cfg: ModelConfig) -> list[ParamSpec]:
    """All parameters in ``model.named_parameters()`` order; tied embeddings list no ``lm_head.weight``."""
    if cfg.num_hidden_layers is None:
        raise UsageError(
            "missing; needed to list every decoder layer's parameters",
            source=cfg.source or cfg.name,
            field="num_hidden_layers",
        )
    arch = architecture(cfg)
    specs = [ParamSpec(name, shape, ROOT) for name, shape in arch.embeddings(cfg)]
    for i in range(cfg.num_hidden_layers):
        unit = f"layers.{i}"
        specs += [
            ParamSpec(f"{arch.layers_prefix}.{i}.{name}", shape, unit) for name, shape in arch.layer(cfg, i).params
        ]
    specs += [ParamSpec(name, shape, ROOT) for name, shape in arch.final(cfg)]
    head = weight("lm_head", cfg.vocab_size, cfg.hidden_size, arch.lm_head_bias(cfg))
    # tied: lm_head's weight is the embedding's and is listed once, but a bias is its own parameter (ERNIE)
    specs += [ParamSpec(n, s, ROOT) for n, s in (head[1:] if cfg.tie_word_embeddings else head)]
    return specs


def units(specs: list[ParamSpec]) -> dict[str, list[ParamSpec]]:
    """Parameters grouped by FSDP unit, in first-appearance order (root first, then layers.0, layers.1, …)."""
    grouped: dict[str, list[ParamSpec]] = {}
    for spec in specs:
        grouped.setdefault(spec.unit, []).append(spec)
    return grouped
