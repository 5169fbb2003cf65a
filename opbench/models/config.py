"""ModelConfig and its loaders.

Accepted inputs (docs/models.md): Primus' ``model_configs.json`` (a list of objects), one object in that schema,
or a Hugging Face ``config.json`` (the file or its model folder) of an architecture in ``architectures.py``; any
other ``model_type`` is refused by name. Field-name variants are normalised here and nowhere else. Reading a
config never touches the network.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opbench.core.cli import MAX_LAYERS
from opbench.core.errors import UsageError
from opbench.core.inputs import parse_json, read_small_text

from .architectures import ARCHITECTURES, TEXT_CONFIG_WRAPPERS, check_layer_types, unsupported

BUILTIN_CONFIGS = Path(__file__).resolve().parent.parent / "shapes" / "model_configs.json"

# canonical field -> accepted spellings, first found wins
ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "d_model", "n_embd", "dim"),
    "num_attention_heads": ("num_attention_heads", "n_heads", "n_head", "num_heads"),
    "num_key_value_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "num_query_groups"),
    "head_dim": ("head_dim", "kv_channels"),
    "intermediate_size": ("intermediate_size", "ffn_hidden_size", "ffn_dim", "n_inner"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "seqlen": ("seqlen", "seq_length", "seq_len"),
    "num_hidden_layers": ("num_hidden_layers", "num_layers", "n_layers", "n_layer"),
    "n_routed_experts": ("n_routed_experts", "num_local_experts", "num_experts", "num_moe_experts", "moe_num_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "moe_router_topk", "top_k", "moe_k"),
    "moe_intermediate_size": ("moe_intermediate_size", "moe_ffn_hidden_size"),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"),
    "n_shared_experts": ("n_shared_experts", "moe_num_shared_experts"),
}

# Every integer a config gives is bounded like a command-line flag: 2**24 is far above any real dimension (the
# largest vocabularies are ~262k, hidden sizes ~16k), and keeps every product the tools form finite and printable.
MAX_CONFIG_INT = 1 << 24


@dataclass(frozen=True)
class ModelConfig:
    """The dimensions every benchmark derives shapes from. MoE/MLA fields are zero/None for dense models; what one
    architecture alone reads (gpt-oss's sinks, Qwen3-Next's linear-attention heads, …) is in ``extra``, and what
    each layer is made of comes from its description in architectures.py (``decoder_layers``)."""

    name: str
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    seqlen: int | None = None
    num_hidden_layers: int | None = None
    architecture: str = "llama"  # a model_type of architectures.ARCHITECTURES
    tie_word_embeddings: bool = False
    attention_bias: bool = False
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
    moe_layers: tuple[int, ...] | None = None  # an explicit list of MoE layers (Llama 4, ERNIE, DeepSeek-V3.2)
    # DeepSeek multi-head latent attention
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    # attention kind per layer (layout.ATTENTION_KINDS; empty = every layer full causal) and its windows
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    from_hf: bool = False  # read from a transformers config.json (whose fields rebuild the real model, models/hf.py)
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    notes: tuple[str, ...] = field(default=(), compare=False)  # what the config left out and what that changes

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    def is_moe_layer(self, index: int) -> bool:
        """Which decoder layers carry routed experts: an explicit list, else DeepSeek's first_k_dense_replace /
        moe_layer_freq and Qwen's mlp_only_layers / decoder_sparse_step."""
        if not self.is_moe:
            return False
        if self.moe_layers is not None:
            return index in self.moe_layers
        return (
            index >= self.first_k_dense_replace
            and index % self.moe_layer_freq == 0
            and index not in self.mlp_only_layers
            and (index + 1) % self.decoder_sparse_step == 0
        )

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def shared_intermediate_size(self) -> int:
        """Qwen names it directly; DeepSeek, GLM and ERNIE use moe_intermediate × n_shared_experts."""
        if self.shared_expert_intermediate_size:
            return self.shared_expert_intermediate_size
        return self.expert_intermediate_size * self.n_shared_experts

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("raw")
        d["extra"] = dict(self.extra)
        return d


# Primus' names for models the built-in configs name otherwise (lower case): its scripts call Mixtral "Mistral".
PRIMUS_NAMES = {"mistral_8x7b": "mixtral_8x7b", "mistral_8x22b": "mixtral_8x22b"}


def _where(source: str, name: str | None) -> str:
    return f"{source}: model '{name}'" if name else source


class FieldReader:
    """Validated access to one config object's fields; every error names the file, the model and the field.

    ``hf``: the object is a Hugging Face config.json, so a field it leaves out takes transformers' default for its
    model_type (``hf_default``); a Primus-schema entry leaves it unset instead."""

    def __init__(self, obj: Mapping[str, Any], where: str, hf: bool) -> None:
        self.obj, self.where, self.hf = obj, where, hf

    def hf_default(self, value: Any) -> Any:
        return value if self.hf else None

    def given(self, key: str) -> bool:
        """Whether the object names the field at all (``null`` included: transformers gives None its own meaning,
        as a DeepSeek-V2-Lite config's ``"q_lora_rank": null`` for no query compression)."""
        return any(k in self.obj for k in ALIASES.get(key, (key,)))

    def pick(self, key: str, alias: Sequence[str] = ()) -> tuple[str | None, Any]:
        for k in (*ALIASES.get(key, (key,)), *alias):
            if k in self.obj and self.obj[k] is not None:
                return k, self.obj[k]
        return None, None

    def _check_int(self, key: str, value: Any, *, zero: bool, signed: bool = False) -> int:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (isinstance(value, float) and not value.is_integer())
        ):
            raise UsageError(f"must be an integer, got {value!r}", source=self.where, field=key)
        if abs(value) > MAX_CONFIG_INT:
            raise UsageError(f"{value:.4g} is out of range (at most {MAX_CONFIG_INT:,})", source=self.where, field=key)
        value = int(value)
        if not signed and (value < 0 or (value == 0 and not zero)):
            raise UsageError(f"must be positive, got {value}", source=self.where, field=key)
        return value

    def number(
        self, key: str, default: int | None = None, *, zero: bool = False, alias: Sequence[str] = ()
    ) -> int | None:
        found, value = self.pick(key, alias)
        return default if found is None else self._check_int(found, value, zero=zero)

    def signed(self, key: str, default: int) -> int:
        found, value = self.pick(key)
        return default if found is None else self._check_int(found, value, zero=True, signed=True)

    def flag(self, key: str, default: bool) -> bool:
        value = self.obj.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise UsageError(f"must be true or false, got {value!r}", source=self.where, field=key)
        return value

    def strings(self, key: str) -> list[str] | None:
        value = self.obj.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UsageError("must be a list of strings", source=self.where, field=key)
        return value

    def indices(self, key: str) -> tuple[int, ...] | None:
        value = self.obj.get(key)
        if value is None:
            return None
        if not isinstance(value, list):
            raise UsageError("must be a list of integers", source=self.where, field=key)
        return tuple(self._check_int(key, v, zero=True) for v in value)


def _architecture(obj: Mapping[str, Any], name: str, where: str) -> tuple[str, str | None]:
    """(model_type, note). A config's ``model_type`` (or a Primus entry's ``architecture``) must be one opbench
    models exactly; only a config without one is guessed from its name (the note says what was guessed)."""
    given = obj.get("model_type") or obj.get("architecture")
    if given is not None:
        mt = str(given).lower()
        if mt not in ARCHITECTURES:
            raise unsupported(mt, where)
        return mt, None
    archs = " ".join(str(a) for a in obj.get("architectures") or []).lower()
    hint = f"{archs} {name}".lower().replace("-", "_").replace(".", "")
    has_experts = any(obj.get(k) for k in ALIASES["n_routed_experts"])  # an expert count of 0 says dense
    guess = None
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
            guess = {"qwen3": "qwen3_moe", "qwen2": "qwen2_moe"}.get(arch, arch) if has_experts else arch
            break
    if guess is None:
        guess = "deepseek_v3" if obj.get("kv_lora_rank") is not None else ("mixtral" if has_experts else "llama")
    return guess, f"{where}: no model_type, so the architecture is guessed from the name and fields: '{guess}'"


def _text_config(obj: Mapping[str, Any], where: str) -> tuple[Mapping[str, Any], str | None]:
    """A multimodal Gemma 3 / Llama 4 config.json holds its language model in ``text_config``: read that."""
    mt = str(obj.get("model_type", "")).lower()
    if mt not in TEXT_CONFIG_WRAPPERS:
        return obj, None
    text = obj.get("text_config")
    if not isinstance(text, Mapping):
        raise UsageError(
            f"a '{mt}' config without text_config: pass the language model's config ({TEXT_CONFIG_WRAPPERS[mt]})",
            source=where,
            field="text_config",
        )
    inner = {**text, "model_type": TEXT_CONFIG_WRAPPERS[mt]}
    for key in ("model", "name"):
        if key in obj:
            inner[key] = obj[key]
    note = f"{where}: a multimodal '{mt}' config; its language model (text_config, {inner['model_type']}) is modelled"
    return inner, note


def parse_model_config(
    obj: Mapping[str, Any], source: str, default_name: str | None = None, *, hf: bool = False
) -> ModelConfig:
    """Normalise one object (Primus entry, or an HF config.json when ``hf``) into a validated ModelConfig."""
    if not isinstance(obj, Mapping):
        raise UsageError(f"expected a JSON object, got {type(obj).__name__}", source=source)
    name = obj.get("model") or obj.get("name") or default_name
    if not name or not isinstance(name, str):
        raise UsageError("missing (a name for the model)", source=source, field="model")
    where = _where(source, name)
    obj, wrapper_note = _text_config(obj, where)
    arch_name, guess_note = _architecture(obj, name, where)
    arch = ARCHITECTURES[arch_name]
    r = FieldReader(obj, where, hf)
    f: dict[str, Any] = {"name": name, "architecture": arch_name, "source": source, "raw": dict(obj), "extra": {}}
    f["from_hf"] = hf
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size"):
        f[key] = r.number(key)
    for key in ("vocab_size", "seqlen", "num_hidden_layers", "moe_intermediate_size"):
        f[key] = r.number(key)
    for key in ("n_routed_experts", "num_experts_per_tok", "n_shared_experts", "first_k_dense_replace"):
        f[key] = r.number(key, 0, zero=True)
    f["shared_expert_intermediate_size"] = r.number("shared_expert_intermediate_size", zero=True) or None
    f["moe_layer_freq"] = r.number("moe_layer_freq", 1)
    f["decoder_sparse_step"] = r.number("decoder_sparse_step", 1)
    f["mlp_only_layers"] = r.indices("mlp_only_layers") or ()
    for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        f[key] = r.number(key)
    f["tie_word_embeddings"] = r.flag("tie_word_embeddings", arch.tie_default if hf else False)
    for key, value in arch.hf_defaults.items() if hf else ():  # what transformers builds for a field left out
        if not r.given(key):
            f[key] = value
    if arch.moe:  # a MoE model's expert count and top-k, where the config gives them, are at least 1
        for key in ("n_routed_experts", "num_experts_per_tok"):
            found, _ = r.pick(key)
            if found is not None and f[key] < 1:
                raise UsageError(
                    f"must be at least 1 for a MoE model ({arch_name}), got {f[key]}", source=where, field=found
                )
    check_layer_types(r, f, arch)
    arch.read(r, f)

    hidden, heads = f["hidden_size"], f["num_attention_heads"]
    for key in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
        if f[key] is None:
            raise UsageError("missing", source=where, field=key)
    if f["num_key_value_heads"] is None:
        f["num_key_value_heads"] = heads
    if heads % f["num_key_value_heads"]:
        raise UsageError(
            f"{heads} attention heads are not a multiple of {f['num_key_value_heads']} KV heads",
            source=where,
            field="num_key_value_heads",
        )
    if f["head_dim"] is None:
        if hf and arch.head_dim_default:
            f["head_dim"] = arch.head_dim_default
        elif hf:
            f["head_dim"] = hidden // heads  # transformers' getattr(config, "head_dim", hidden // heads)
        elif hidden % heads:
            raise UsageError(
                f"absent, and hidden_size {hidden} is not divisible by {heads} heads", source=where, field="head_dim"
            )
        else:
            f["head_dim"] = hidden // heads
    if f["head_dim"] < 1:  # hidden_size // heads with more heads than hidden units
        raise UsageError(
            f"hidden_size {hidden} over {heads} heads leaves a head_dim of 0; give head_dim",
            source=where,
            field="head_dim",
        )
    layers = f["num_hidden_layers"]
    if layers is not None and layers > MAX_LAYERS:
        raise UsageError(
            f"{layers} layers is more than {MAX_LAYERS:,}; is that a typo?", source=where, field="num_hidden_layers"
        )
    experts, top_k = f["n_routed_experts"], f["num_experts_per_tok"]
    if experts and not top_k:
        raise UsageError("missing for a MoE model", source=where, field="num_experts_per_tok")
    if top_k > experts and experts:
        raise UsageError(
            f"top-k {top_k} exceeds {experts} experts", source=where, field=r.pick("num_experts_per_tok")[0]
        )
    if f["kv_lora_rank"] is not None:
        for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if f[key] is None:
                raise UsageError("missing for an MLA (kv_lora_rank) model", source=where, field=key)
    notes = [n for n in (wrapper_note, guess_note) if n]
    if not experts and (arch_name == "mixtral" or name.lower() in PRIMUS_NAMES):
        # Primus' own model_configs.json lists Mistral_8x7B/8x22B with dense keys only
        notes.append(
            f"{where}: no expert fields (n_routed_experts/num_local_experts), so this Mixtral is timed as a dense "
            "model; the built-in config of the same name has its 8 experts (leave out --model-config-path)"
        )
    elif not experts and arch.moe:  # a MoE model_type with no expert fields (a Primus-style entry: no defaults)
        notes.append(
            f"{where}: no expert fields (n_routed_experts/num_local_experts), so this {arch_name} model is timed as "
            "a dense one"
        )
    if experts and arch_name.startswith("deepseek") and "first_k_dense_replace" not in obj and not hf:
        # Primus' own model_configs.json has DeepSeek entries without it; DeepSeek's configs have 1 (V2, V2-Lite), 3 (V3)
        notes.append(
            f"{where}: no first_k_dense_replace, so every layer is taken as MoE and the dense MLP GEMMs "
            "of DeepSeek's first layers are left out (DeepSeek's own configs say 1 for V2/V2-Lite, 3 for V3)"
        )
    return ModelConfig(**f, notes=tuple(notes))


MAX_CONFIG_BYTES = 64 << 20  # a model config file (Primus' whole model_configs.json is ~100 KiB)


def read_json(path: Path) -> Any:
    """Parse a JSON file; a missing/unreadable/malformed file is a UsageError naming it (and line/column). Only a
    regular file of at most MAX_CONFIG_BYTES is read (core.inputs)."""
    return parse_json(read_small_text(path, MAX_CONFIG_BYTES, "a JSON file"), source=str(path))


def config_file(path: Path) -> tuple[Path, str]:
    """(the JSON file, the model name it defaults to): a Hugging Face model folder means its ``config.json``, and
    a file called ``config.json`` is named after its folder (``~/hf/Llama-3.1-8B/config.json`` → Llama-3.1-8B)."""
    if path.is_dir():
        inner = path / "config.json"
        if not inner.is_file():
            raise UsageError(
                "is a directory without a config.json (a Hugging Face model folder has one)", source=str(path)
            )
        return inner, path.resolve().name
    if path.name == "config.json" and path.resolve().parent.name:
        return path, path.resolve().parent.name
    return path, path.stem


def check_config_path(path: str | None) -> None:
    """Fail early, before any rank starts, on a --model-config-path that is neither 'builtin', a file, nor a
    model folder with a config.json."""
    if not path or path == "builtin":
        return
    p = Path(path)
    if not p.exists():
        raise UsageError("no such file", source=path, field="--model-config-path")
    config_file(p)


def load_model_configs(path: str | os.PathLike | None = None, model_name: str | None = None) -> list[ModelConfig]:
    """Load a Primus list, a single Primus object, or an HF config.json (or its model folder); ``None`` or 'builtin'
    loads the built-in list."""
    p, stem = config_file(Path(path)) if path and str(path) != "builtin" else (BUILTIN_CONFIGS, "")
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
        hf = "model" not in data and "model_type" in data  # a transformers config.json: its defaults apply
        name = model_name or (None if is_primus else stem)
        obj = dict(data)
        if model_name:
            obj["model"] = model_name
        return [parse_model_config(obj, str(p), default_name=name, hf=hf)]
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
        found = [c for c in map(find, wanted) if c is not None]
        chosen = list({id(c): c for c in found}.values())  # a model named twice (two spellings): once
    for cfg in chosen:
        for note in cfg.notes:
            print(f"warning: {note}", file=sys.stderr)
    return chosen
