"""ModelConfig and its loaders.

Accepted inputs (docs/conventions.md, "Model configs"): Primus' ``model_configs.json`` (a list of objects), one object in that schema,
or a Hugging Face ``config.json`` (Llama, Mistral/Mixtral, Qwen2/Qwen3 dense and MoE, DeepSeek V2/V3).
Field-name variants are normalised here and nowhere else. Reading a config never touches the network.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opbench.core.errors import UsageError

BUILTIN_CONFIGS = Path(__file__).resolve().parent.parent / "shapes" / "model_configs.json"

# canonical field -> accepted spellings, first found wins
ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "d_model", "n_embd", "dim"),
    "num_attention_heads": ("num_attention_heads", "n_heads", "n_head", "num_heads"),
    "num_key_value_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "num_query_groups"),
    "head_dim": ("head_dim", "kv_channels"),
    "intermediate_size": ("intermediate_size", "ffn_hidden_size", "ffn_dim"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "seqlen": ("seqlen", "seq_length", "seq_len"),
    "num_hidden_layers": ("num_hidden_layers", "num_layers", "n_layers", "n_layer"),
    "n_routed_experts": ("n_routed_experts", "num_local_experts", "num_experts", "num_moe_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "moe_router_topk", "top_k"),
    "moe_intermediate_size": ("moe_intermediate_size", "moe_ffn_hidden_size"),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"),
}

KNOWN_ARCHS = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3")


@dataclass(frozen=True)
class ModelConfig:
    """The dimensions every benchmark derives shapes from. MoE/MLA fields are zero/None for dense models."""

    name: str
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    seqlen: int | None = None
    num_hidden_layers: int | None = None
    architecture: str = "llama"
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v (and o for Llama's flag) biases
    qk_norm: bool = False  # Qwen3 per-head q_norm / k_norm weights
    # MoE
    n_routed_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int | None = None
    n_shared_experts: int = 0
    shared_expert_intermediate_size: int | None = None
    first_k_dense_replace: int = 0
    moe_layer_freq: int = 1
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # DeepSeek multi-head latent attention
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    source: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    notes: tuple[str, ...] = field(default=(), compare=False)  # what the config left out and what that changes

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    def is_moe_layer(self, index: int) -> bool:
        """Which decoder layers carry routed experts (DeepSeek first_k_dense_replace/moe_layer_freq, Qwen sparse step)."""
        if not self.is_moe:
            return False
        return (
            index >= self.first_k_dense_replace
            and index % self.moe_layer_freq == 0
            and index not in self.mlp_only_layers
            and (index + 1) % self.decoder_sparse_step == 0
        )

    @property
    def has_dense_mlp_layers(self) -> bool:
        if not self.is_moe:
            return True
        if self.num_hidden_layers is not None:
            return any(not self.is_moe_layer(i) for i in range(self.num_hidden_layers))
        return (
            self.first_k_dense_replace > 0
            or bool(self.mlp_only_layers)
            or self.decoder_sparse_step > 1
            or self.moe_layer_freq > 1
        )

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def shared_intermediate_size(self) -> int:
        """Qwen2-MoE names it directly; DeepSeek uses moe_intermediate × n_shared_experts."""
        if self.shared_expert_intermediate_size:
            return self.shared_expert_intermediate_size
        return self.expert_intermediate_size * self.n_shared_experts

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("raw")
        return d


# Primus' names for models the built-in configs name otherwise (lower case): its scripts call Mixtral "Mistral".
PRIMUS_NAMES = {"mistral_8x7b": "mixtral_8x7b", "mistral_8x22b": "mixtral_8x22b"}


def _where(source: str, name: str | None) -> str:
    return f"{source}: model '{name}'" if name else source


def _pick(obj: Mapping[str, Any], canonical: str) -> tuple[str | None, Any]:
    for key in ALIASES.get(canonical, (canonical,)):
        if key in obj and obj[key] is not None:
            return key, obj[key]
    return None, None


def _int_field(
    obj: Mapping[str, Any], canonical: str, where: str, *, required: bool, allow_zero: bool = False
) -> int | None:
    key, value = _pick(obj, canonical)
    if key is None:
        if required:
            raise UsageError("missing", source=where, field=canonical)
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not value.is_integer())
    ):
        raise UsageError(f"must be an integer, got {value!r}", source=where, field=key)
    value = int(value)
    if value < 0 or (value == 0 and not allow_zero):
        raise UsageError(f"must be positive, got {value}", source=where, field=key)
    return value


def _architecture(obj: Mapping[str, Any], name: str) -> str:
    mt = str(obj.get("model_type", "")).lower()
    if mt in KNOWN_ARCHS:
        return mt
    archs = " ".join(obj.get("architectures") or []).lower()
    hint = f"{mt} {archs} {name}".lower().replace("-", "_").replace(".", "")
    for arch, needles in (
        ("deepseek_v3", ("deepseek_v3", "deepseekv3")),
        ("deepseek_v2", ("deepseek",)),
        ("mixtral", ("mixtral",)),
        ("qwen3_moe", ("qwen3_moe", "qwen3moe")),
        ("qwen2_moe", ("qwen2_moe", "qwen2moe")),
        ("qwen3", ("qwen3",)),
        ("qwen2", ("qwen2", "qwen")),
        ("mistral", ("mistral",)),
        ("llama", ("llama",)),
    ):
        if any(n in hint for n in needles):
            if arch == "qwen3" and _pick(obj, "n_routed_experts")[0]:
                return "qwen3_moe"
            if arch == "qwen2" and _pick(obj, "n_routed_experts")[0]:
                return "qwen2_moe"
            return arch
    if obj.get("kv_lora_rank") is not None:
        return "deepseek_v3"
    return "mixtral" if _pick(obj, "n_routed_experts")[0] else "llama"


def parse_model_config(obj: Mapping[str, Any], source: str, default_name: str | None = None) -> ModelConfig:
    """Normalise one object (Primus entry or HF config.json) into a validated ModelConfig."""
    if not isinstance(obj, Mapping):
        raise UsageError(f"expected a JSON object, got {type(obj).__name__}", source=source)
    name = obj.get("model") or obj.get("name") or default_name
    if not name or not isinstance(name, str):
        raise UsageError("missing (a name for the model)", source=source, field="model")
    where = _where(source, name)

    def req(field_name: str) -> int:
        value = _int_field(obj, field_name, where, required=True)
        assert value is not None  # a missing required field raised UsageError above
        return value

    def opt(field_name: str, allow_zero: bool = False) -> int | None:
        return _int_field(obj, field_name, where, required=False, allow_zero=allow_zero)

    hidden = req("hidden_size")
    heads = req("num_attention_heads")
    kv_heads = opt("num_key_value_heads") or heads
    if heads % kv_heads:
        raise UsageError(
            f"{heads} attention heads are not a multiple of {kv_heads} KV heads",
            source=where,
            field="num_key_value_heads",
        )
    head_dim = opt("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise UsageError(
                f"absent, and hidden_size {hidden} is not divisible by {heads} heads", source=where, field="head_dim"
            )
        head_dim = hidden // heads
    arch = _architecture(obj, name)
    experts = opt("n_routed_experts", allow_zero=True) or 0
    top_k = opt("num_experts_per_tok", allow_zero=True) or 0
    if experts and not top_k:
        raise UsageError("missing for a MoE model", source=where, field="num_experts_per_tok")
    if top_k > experts and experts:
        raise UsageError(f"top-k {top_k} exceeds {experts} experts", source=where, field="num_experts_per_tok")
    mla_fields = {
        f: opt(f) for f in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    }
    if mla_fields["kv_lora_rank"] is not None:
        for f in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if mla_fields[f] is None:
                raise UsageError("missing for an MLA (kv_lora_rank) model", source=where, field=f)
    mlp_only = obj.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list) or not all(isinstance(i, int) and i >= 0 for i in mlp_only):
        raise UsageError("must be a list of layer indices", source=where, field="mlp_only_layers")
    tie = obj.get("tie_word_embeddings", False)
    attention_bias = bool(obj.get("attention_bias", arch in ("qwen2", "qwen2_moe")))
    notes = []
    if not experts and (arch == "mixtral" or name.lower() in PRIMUS_NAMES):
        # Primus' own model_configs.json lists Mistral_8x7B/8x22B with dense keys only
        notes.append(
            f"{where}: no expert fields (n_routed_experts/num_local_experts), so this Mixtral is timed as a dense "
            "model; the built-in config of the same name has its 8 experts (leave out --model-config-path)"
        )
    if experts and arch.startswith("deepseek") and "first_k_dense_replace" not in obj:
        # Primus' own model_configs.json has DeepSeek entries without it; DeepSeek's configs have 1 (V2, V2-Lite), 3 (V3)
        notes.append(
            f"{where}: no first_k_dense_replace, so every layer is taken as MoE and the dense MLP GEMMs "
            "of DeepSeek's first layers are left out (DeepSeek's own configs say 1 for V2/V2-Lite, 3 for V3)"
        )
    return ModelConfig(
        name=name,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=req("intermediate_size"),
        vocab_size=req("vocab_size"),
        seqlen=opt("seqlen"),
        num_hidden_layers=opt("num_hidden_layers"),
        architecture=arch,
        tie_word_embeddings=bool(tie),
        attention_bias=attention_bias,
        qk_norm=bool(obj.get("qk_norm", arch in ("qwen3", "qwen3_moe"))),
        n_routed_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=opt("moe_intermediate_size"),
        n_shared_experts=opt("n_shared_experts", allow_zero=True) or 0,
        shared_expert_intermediate_size=opt("shared_expert_intermediate_size", allow_zero=True) or None,
        first_k_dense_replace=opt("first_k_dense_replace", allow_zero=True) or 0,
        moe_layer_freq=opt("moe_layer_freq") or 1,
        decoder_sparse_step=opt("decoder_sparse_step") or 1,
        mlp_only_layers=tuple(mlp_only),
        source=source,
        raw=dict(obj),
        notes=tuple(notes),
        **mla_fields,
    )


def read_json(path: Path) -> Any:
    """Parse a JSON file; a missing/unreadable/malformed file is a UsageError naming it (and line/column)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError("file not found", source=str(path)) from None
    except IsADirectoryError:
        raise UsageError("is a directory, expected a JSON file", source=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read: {exc}", source=str(path)) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", source=str(path)
        ) from None
    except RecursionError:
        raise UsageError("JSON nested too deeply to be a config", source=str(path)) from None


def load_model_configs(path: str | os.PathLike | None = None, model_name: str | None = None) -> list[ModelConfig]:
    """Load a Primus list, a single Primus object or an HF config.json; ``None`` or 'builtin' loads the built-in list."""
    p = Path(path) if path and str(path) != "builtin" else BUILTIN_CONFIGS
    data = read_json(p)
    if isinstance(data, list):
        if not data:
            raise UsageError("the model list is empty", source=str(p))
        configs = [parse_model_config(obj, f"{p}[{i}]") for i, obj in enumerate(data)]
        names = [c.name for c in configs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise UsageError(f"duplicate model names {dupes}", source=str(p), field="model")
        return configs
    if isinstance(data, dict):
        is_primus = "model" in data and "model_type" not in data
        name = model_name or (None if is_primus else p.stem)
        obj = dict(data)
        if model_name:
            obj["model"] = model_name
        return [parse_model_config(obj, str(p), default_name=name)]
    raise UsageError(f"expected a list of models or one config object, got {type(data).__name__}", source=str(p))


def select_models(configs: Sequence[ModelConfig], selection: str | Iterable[str] | None) -> list[ModelConfig]:
    """``None``/'all' keeps every model; otherwise names (comma-separated) must exist, case-insensitively, or be a
    Primus name of one (``PRIMUS_NAMES``: Primus calls Mixtral "Mistral_8x7B"). Each chosen model's notes (what its
    config left out) are printed to stderr, one line each."""
    if selection is None or selection == "all":
        chosen = list(configs)
    else:
        wanted = [s.strip() for s in (selection.split(",") if isinstance(selection, str) else selection) if s.strip()]
        by_name = {c.name.lower(): c for c in configs}

        def find(name: str) -> ModelConfig | None:
            return by_name.get(name.lower()) or by_name.get(PRIMUS_NAMES.get(name.lower(), ""))

        missing = [w for w in wanted if find(w) is None]
        if missing:
            raise UsageError(
                f"unknown model {', '.join(repr(m) for m in missing)}; available: {', '.join(c.name for c in configs)}",
                field="--model",
            )
        chosen = [c for c in map(find, wanted) if c is not None]
    for cfg in chosen:
        for note in cfg.notes:
            print(f"warning: {note}", file=sys.stderr)
    return chosen
