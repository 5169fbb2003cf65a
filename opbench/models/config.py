"""The loaders of ModelConfig (the type itself: fields.py).

Accepted inputs (docs/models.md): Primus' ``model_configs.json`` (a list of objects), one object in that schema,
or a Hugging Face ``config.json`` (the file or its model folder) of an architecture in ``architectures.py``; any
other ``model_type`` is refused by name. Field-name variants are normalised here and nowhere else. Reading a
config never touches the network.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from opbench.core.errors import UsageError
from opbench.core.inputs import parse_json, read_small_text
from opbench.core.limits import MAX_LAYERS

from .architectures import ARCHITECTURES, TEXT_CONFIG_WRAPPERS, check_layer_types, unsupported
from .fields import ALIASES, MAX_CONFIG_INT, PRIMUS_NAMES, FieldReader, ModelConfig, _where  # noqa: F401 - used here and imported from here

BUILTIN_CONFIGS = Path(__file__).resolve().parent.parent / "shapes" / "model_configs.json"


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
    f["extra"]["rope_type"], f["extra"]["rope_factor"] = r.rope()
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


# A Hugging Face Hub id as people copy it from the model's page: owner/name, nothing else.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def refuse_hub_id(path: Path) -> None:
    """A --model-config-path that is not here but reads like a Hub id (``Qwen/Qwen3-8B``: owner/name, neither a
    file nor its folder exists, no .json) is one line saying what opbench reads instead and how to fetch it:
    opbench never downloads (module docstring); 'file not found' alone leaves the user guessing."""
    text = str(path)
    if path.exists() or not _HUB_ID.fullmatch(text) or text.endswith(".json") or path.parent.exists():
        return
    local = text.split("/")[1]
    raise UsageError(
        f"'{text}' is not a file or folder here; it looks like a Hugging Face model id: opbench reads a local "
        f"config.json (no network) — fetch it with `hf download {text} config.json --local-dir {local}` and pass "
        f"--model-config-path {local}",
        field="--model-config-path",
    )


def config_file(path: Path) -> tuple[Path, str]:
    """(the JSON file, the model name it defaults to): a Hugging Face model folder means its ``config.json``, and
    a file called ``config.json`` is named after its folder (``~/hf/Llama-3.1-8B/config.json`` → Llama-3.1-8B)."""
    refuse_hub_id(path)
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
    refuse_hub_id(p)
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
