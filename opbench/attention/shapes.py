"""Attention shapes: Primus' JSON schema, derivation from model configs, and the CPU seqlen cap.

Pure Python, no torch, so ``--dry-run`` and the shape tests are instant. One shape is what one attention
kernel call sees on one rank: ``num_head_q`` query heads attend over ``seqlen_kv`` keys/values of
``num_head_kv`` heads (GQA/MQA when fewer), with ``head_dim_qk`` for q·k and ``head_dim_v`` for the values
(DeepSeek MLA: 192 / 128). Causal masks align bottom-right (flash-attn's convention) when
seqlen_q ≠ seqlen_kv: query row i sees key j iff j ≤ i + seqlen_kv − seqlen_q.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from opbench.core.errors import UsageError
from opbench.models import ModelConfig
from opbench.models.config import read_json

BUILTIN_SHAPES = Path(__file__).resolve().parent.parent / "shapes" / "attention_shapes.json"

# Primus' attention shape schema, in its key order.
SCHEMA_INT_FIELDS = ("seqlen_q", "seqlen_kv", "num_head_q", "num_head_kv", "head_dim_qk", "head_dim_v")


@dataclass(frozen=True)
class AttentionShape:
    model: str
    seqlen_q: int
    seqlen_kv: int
    num_head_q: int
    num_head_kv: int
    head_dim_qk: int
    head_dim_v: int
    causal: bool

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 = MHA, num_head_q = MQA)."""
        return self.num_head_q // self.num_head_kv

    @property
    def key(self) -> tuple:
        """Everything but the model name: two models with the same key run the same kernel."""
        return tuple(asdict(self).values())[1:]

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def parse_shape(obj: Any, where: str) -> AttentionShape:
    """Validate one Primus-schema object; every problem names the file, the entry and the field."""
    if not isinstance(obj, Mapping):
        raise UsageError(f"expected a JSON object, got {type(obj).__name__}", source=where)
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        raise UsageError("missing (a model name string)", source=where, field="model")
    where = f"{where} ({model})"
    values: dict[str, int] = {}
    for name in SCHEMA_INT_FIELDS:
        if name not in obj or obj[name] is None:
            raise UsageError("missing", source=where, field=name)
        v = obj[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
            raise UsageError(f"must be an integer, got {v!r}", source=where, field=name)
        if v <= 0:
            raise UsageError(f"must be positive, got {v}", source=where, field=name)
        values[name] = int(v)
    if "causal" not in obj:
        raise UsageError("missing (true or false)", source=where, field="causal")
    causal = obj["causal"]
    if not isinstance(causal, bool):
        raise UsageError(f"must be true or false, got {causal!r}", source=where, field="causal")
    if values["num_head_q"] % values["num_head_kv"]:
        raise UsageError(
            f"{values['num_head_q']} query heads are not a multiple of {values['num_head_kv']} KV heads",
            source=where,
            field="num_head_kv",
        )
    unknown = sorted(set(obj) - {"model", "causal", *SCHEMA_INT_FIELDS})
    if unknown:
        raise UsageError(
            f"unknown field(s) {unknown}; the schema is model, {', '.join(SCHEMA_INT_FIELDS)}, causal",
            source=where,
            field=unknown[0],
        )
    return AttentionShape(model=model, causal=causal, **values)


def load_attention_shapes(path: str | Path | None = None) -> list[AttentionShape]:
    """Read a Primus attention-shapes list (``None`` = the shipped shapes/attention_shapes.json)."""
    p = Path(path) if path else BUILTIN_SHAPES
    data = read_json(p)  # the model loader's reader: same one-line errors for missing/malformed files
    if isinstance(data, Mapping):
        data = [data]
    if not isinstance(data, list):
        raise UsageError(f"expected a list of shape objects, got {type(data).__name__}", source=str(p))
    if not data:
        raise UsageError("the shape list is empty", source=str(p))
    return [parse_shape(obj, f"{p}[{i}]") for i, obj in enumerate(data)]


def _split(total: int, parts: int, what: str, flag: str, model: str) -> int:
    if total % parts:
        raise UsageError(f"{what} {total} of {model} is not divisible by {flag} {parts}", field=flag)
    return total // parts


def model_attention_shape(
    cfg: ModelConfig, seqlen: int | None = None, tp: int = 1, cp: int = 1, causal: bool = True
) -> AttentionShape:
    """The self-attention kernel one rank runs in training.

    Tensor parallel splits query and KV heads (Megatron requires both to divide by tp). Context parallel is
    modelled as Megatron's default ring (p2p) exchange: each step is a kernel over the rank's seqlen/cp
    queries and one seqlen/cp block of keys, so seqlen_q = seqlen_kv = seqlen/cp. MLA (DeepSeek) attends with
    qk_nope+qk_rope dims for q·k, v_head_dim for values and as many KV heads as query heads after up-projection.
    """
    if tp < 1 or cp < 1:
        raise UsageError(f"parallel sizes must be positive, got tp={tp} cp={cp}", field="--tp" if tp < 1 else "--cp")
    s = seqlen or cfg.seqlen
    if not s:
        raise UsageError("the model config has no seqlen; pass --seqlen", source=cfg.source or cfg.name, field="seqlen")
    if cfg.is_mla:
        d_qk = (cfg.qk_nope_head_dim or 0) + (cfg.qk_rope_head_dim or 0)
        d_v = cfg.v_head_dim or d_qk
        heads, kv_heads = cfg.num_attention_heads, cfg.num_attention_heads
    else:
        d_qk = d_v = cfg.head_dim
        heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    local = _split(s, cp, "seqlen", "--cp", cfg.name)
    return AttentionShape(
        model=cfg.name,
        seqlen_q=local,
        seqlen_kv=local,
        num_head_q=_split(heads, tp, "num_attention_heads", "--tp", cfg.name),
        num_head_kv=_split(kv_heads, tp, "num_key_value_heads", "--tp", cfg.name),
        head_dim_qk=d_qk,
        head_dim_v=d_v,
        causal=causal,
    )


def cap_seqlen(shape: AttentionShape, max_seqlen: int | None) -> AttentionShape:
    """Shrink both seqlens by one factor so the longer is at most ``max_seqlen`` (keeps the q:kv ratio and so
    the causal structure); used to make CPU runs finish. ``None``/0 leaves the shape alone."""
    longest = max(shape.seqlen_q, shape.seqlen_kv)
    if not max_seqlen or longest <= max_seqlen:
        return shape
    scale = max_seqlen / longest
    return replace(
        shape,
        seqlen_q=max(1, math.floor(shape.seqlen_q * scale)),
        seqlen_kv=max(1, math.floor(shape.seqlen_kv * scale)),
    )


def select_shapes(shapes: Iterable[AttentionShape], models: str | Sequence[str] | None) -> list[AttentionShape]:
    """Keep shapes whose model is named (comma-separated, case-insensitive); None/'all' keeps everything."""
    shapes = list(shapes)
    if models is None or models == "all":
        return shapes
    wanted = [m.strip() for m in (models.split(",") if isinstance(models, str) else models) if m.strip()]
    known = {s.model.lower() for s in shapes}
    missing = [w for w in wanted if w.lower() not in known]
    if missing:
        names = ", ".join(dict.fromkeys(s.model for s in shapes))
        raise UsageError(f"no shapes for model(s) {', '.join(missing)}; the shapes list has: {names}", field="--model")
    keep = {w.lower() for w in wanted}
    return [s for s in shapes if s.model.lower() in keep]
