"""Attention shapes: Primus' JSON schema, derivation from model configs, and the CPU seqlen cap.

Pure Python, no torch, so ``--dry-run`` and the shape tests are instant. One shape is what one attention
kernel call sees on one rank: ``num_head_q`` query heads attend over ``seqlen_kv`` keys/values of
``num_head_kv`` heads (GQA/MQA when fewer), with ``head_dim_qk`` for q·k and ``head_dim_v`` for the values
(DeepSeek MLA: 192 / 128). Causal masks align bottom-right (flash-attn's convention) when
seqlen_q ≠ seqlen_kv: query row i sees key j iff j ≤ i + seqlen_kv − seqlen_q. ``attn_kind`` narrows the mask
(sliding window, chunks, an indexer's top-k) or names another operator (gated DeltaNet linear attention, the
DSA indexer, Mamba-2's state-space scan); docs/models.md, "Attention kinds", says what each means for the timings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from opbench.core.errors import UsageError
from opbench.models import ModelConfig
from opbench.models.architectures import decoder_layers
from opbench.models.config import read_json
from opbench.models.layout import ATTENTION_KINDS, CSA, FULL, HC, HCA, INDEXER, KDA, LINEAR, MAMBA2, Attention

BUILTIN_SHAPES = Path(__file__).resolve().parent.parent / "shapes" / "attention_shapes.json"

# Primus' attention shape schema, in its key order.
SCHEMA_INT_FIELDS = ("seqlen_q", "seqlen_kv", "num_head_q", "num_head_kv", "head_dim_qk", "head_dim_v")
OPTIONAL_FIELDS = ("attn_kind", "window", "sinks")  # opbench's additions; Primus' files have none of them
V4_FIELDS = ("compress", "topk")  # DeepSeek-V4's csa, hca and compressed indexer (docs/models.md, "DeepSeek-V4")


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
    attn_kind: str = FULL
    window: int = 0  # sliding window, chunk size, top-k keys, or the linear and mamba2 kinds' chunk size
    sinks: bool = False  # gpt-oss: a learned logit per head joins the softmax (not applied when timed)
    compress: int = 0  # DeepSeek-V4: keys pooled compress:1 (csa, hca; the indexer scoring the pooled keys)
    topk: int = 0  # DeepSeek-V4's csa: pooled keys the indexer keeps per query
    layer_count: int | None = None  # layers of the model with this operator (derived shapes; None: unknown)

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 = MHA, num_head_q = MQA)."""
        return self.num_head_q // self.num_head_kv

    @property
    def key(self) -> tuple:
        """Everything but the model name and layer count: two models with the same key run the same kernel."""
        d = asdict(self)
        return tuple(v for k, v in d.items() if k not in ("model", "layer_count"))

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
    unknown = sorted(set(obj) - {"model", "causal", *SCHEMA_INT_FIELDS, *OPTIONAL_FIELDS, *V4_FIELDS})
    if unknown:
        raise UsageError(
            f"unknown field(s) {unknown}; the schema is model, {', '.join(SCHEMA_INT_FIELDS)}, causal "
            f"(and optionally {', '.join(OPTIONAL_FIELDS)})",
            source=where,
            field=unknown[0],
        )
    kind = obj.get("attn_kind", FULL)
    if kind not in ATTENTION_KINDS:
        raise UsageError(f"must be one of {', '.join(ATTENTION_KINDS)}, got {kind!r}", source=where, field="attn_kind")
    window = obj.get("window", 0)
    if isinstance(window, bool) or not isinstance(window, int) or window < 0 or window > 1 << 24:
        raise UsageError(f"must be an integer from 0 to {1 << 24}, got {window!r}", source=where, field="window")
    if kind != FULL and kind != INDEXER and not window:
        raise UsageError(f"a '{kind}' shape needs its window (size, chunk or top-k)", source=where, field="window")
    if kind != FULL and not causal:
        raise UsageError(f"a '{kind}' shape is causal", source=where, field="causal")
    sinks = obj.get("sinks", False)
    if not isinstance(sinks, bool):
        raise UsageError(f"must be true or false, got {sinks!r}", source=where, field="sinks")
    v4: dict[str, int] = {}
    for name in V4_FIELDS:
        v = obj.get(name, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > 1 << 24:
            raise UsageError(f"must be an integer from 0 to {1 << 24}, got {v!r}", source=where, field=name)
        v4[name] = v
    if kind in (CSA, HCA) and not v4["compress"]:
        raise UsageError(f"a '{kind}' shape needs its compress rate", source=where, field="compress")
    if kind == CSA and not v4["topk"]:
        raise UsageError("a 'csa' shape needs the indexer's top-k", source=where, field="topk")
    return AttentionShape(model=model, causal=causal, attn_kind=kind, window=window, sinks=sinks, **values, **v4)


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


def operator_shape(cfg: ModelConfig, op: Attention, seqlen: int, tp: int, cp: int) -> AttentionShape:
    """One rank's kernel of ``op``: tensor parallel splits heads (not the replicated DSA indexer's); context
    parallel is Megatron's ring, each step a kernel over seqlen/cp queries and one seqlen/cp block of keys."""
    local = _split(seqlen, cp, "seqlen", "--cp", cfg.name)
    seqlen_q = seqlen_kv = local
    if op.kind in (CSA, HCA) or op.compress:
        # DeepSeek-V4 under Megatron-Core's context parallelism (contiguous THD split, the window's keys exchanged
        # at the boundary): a rank's queries see every earlier pooled key; the shape is the last rank's, whose
        # queries end the sequence (bottom-right causal over all seqlen keys), the longest of the ranks
        seqlen_kv = seqlen
    if op.kind == HC:  # a hyper-connection runs where the residual lives: the rank's sequence-parallel tokens
        seqlen_q = seqlen_kv = _split(local, tp, "seqlen / cp (sequence parallel)", "--tp", cfg.name)
        heads_q, heads_kv = op.heads_q, op.heads_kv
    elif op.kind == INDEXER:
        heads_q, heads_kv = op.heads_q, op.heads_kv
    elif op.kind == LINEAR:
        heads_q = _split(op.heads_q, tp, "linear_num_value_heads", "--tp", cfg.name)
        heads_kv = _split(op.heads_kv, tp, "linear_num_key_heads", "--tp", cfg.name)
    elif op.kind == MAMBA2:  # Megatron-Core's MambaMixer: heads and B/C groups split over TP ranks
        heads_q = _split(op.heads_q, tp, "mamba_num_heads", "--tp", cfg.name)
        heads_kv = _split(op.heads_kv, tp, "n_groups", "--tp", cfg.name)
    elif op.kind == KDA:  # column-parallel over heads, as the gated DeltaNet (docs/models.md, "Kimi Linear")
        heads_q = heads_kv = _split(op.heads_q, tp, "linear_num_heads", "--tp", cfg.name)
    else:
        heads_q = _split(op.heads_q, tp, "num_attention_heads", "--tp", cfg.name)
        heads_kv = _split(op.heads_kv, tp, "num_key_value_heads", "--tp", cfg.name)
    return AttentionShape(
        model=cfg.name,
        seqlen_q=seqlen_q,
        seqlen_kv=seqlen_kv,
        num_head_q=heads_q,
        num_head_kv=heads_kv,
        head_dim_qk=op.head_dim_qk,
        head_dim_v=op.head_dim_v,
        causal=True,
        attn_kind=op.kind,
        window=op.window,
        sinks=op.sinks,
        compress=op.compress,
        topk=op.topk,
    )


def model_attention_shapes(
    cfg: ModelConfig, seqlen: int | None = None, tp: int = 1, cp: int = 1
) -> list[AttentionShape]:
    """The distinct attention operators one rank runs in a training step, in model order, each with the number
    of layers that run it: one shape for a Llama; sliding and full for Gemma 3 and gpt-oss, chunked and full for
    Llama 4, linear and full for Qwen3-Next, the indexer and sparse attention for DeepSeek-V3.2. MLA (DeepSeek)
    attends with qk_nope+qk_rope dims for q·k, v_head_dim for values and as many KV heads as query heads."""
    if tp < 1 or cp < 1:
        raise UsageError(f"parallel sizes must be positive, got tp={tp} cp={cp}", field="--tp" if tp < 1 else "--cp")
    s = seqlen or cfg.seqlen
    if not s:
        raise UsageError("the model config has no seqlen; pass --seqlen", source=cfg.source or cfg.name, field="seqlen")
    counts: dict[AttentionShape, int] = {}
    for lay in decoder_layers(cfg):
        for op in lay.attention:
            shape = operator_shape(cfg, op, s, tp, cp)
            counts[shape] = counts.get(shape, 0) + 1
    counted = cfg.num_hidden_layers is not None
    return [replace(shape, layer_count=n if counted else None) for shape, n in counts.items()]


def cap_seqlen(shape: AttentionShape, max_seqlen: int | None) -> AttentionShape:
    """Shrink both seqlens by one factor so the longer is at most ``max_seqlen`` (keeps the q:kv ratio and so
    the causal structure; a sliding window, chunk or top-k shrinks by the same factor, so a windowed layer stays
    windowed; the linear and Mamba-2 kinds' chunk size is the algorithm's and stays); used to make CPU runs finish.
    ``None``/0 leaves the shape alone."""
    longest = max(shape.seqlen_q, shape.seqlen_kv)
    if not max_seqlen or longest <= max_seqlen:
        return shape
    scale = max_seqlen / longest
    keep = shape.attn_kind in (LINEAR, MAMBA2, KDA, HC) or not shape.window
    window = shape.window if keep else max(1, math.floor(shape.window * scale))
    topk = max(1, math.floor(shape.topk * scale)) if shape.topk else 0  # csa's compress rate is the model's: kept
    return replace(
        shape,
        topk=topk,
        seqlen_q=max(1, math.floor(shape.seqlen_q * scale)),
        seqlen_kv=max(1, math.floor(shape.seqlen_kv * scale)),
        window=window,
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
