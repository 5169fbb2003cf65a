"""The model description's types: ``ModelConfig`` (the dimensions every tool derives shapes from) and
``FieldReader`` (validated access to a config's fields). At the bottom of opbench.models: the architecture
descriptions (architectures.py) are written against these types, and the loaders (config.py) build them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from opbench.core.errors import UsageError

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

    def rope(self) -> tuple[str, float | None]:
        """(type, factor) of the config's RoPE scaling (``rope_scaling``, or transformers 5's ``rope_parameters``):
        ("", None) when it has none. The projection times YaRN's rotary as Megatron runs it (docs/project.md,
        "Memory-bound operators"); a YaRN factor that is not a number from 1 to 10⁴ is refused."""
        found, value = self.pick("rope_scaling", ("rope_parameters",))
        if not isinstance(value, dict):
            return "", None
        kind = value.get("rope_type", value.get("type")) or ""
        if not isinstance(kind, str):
            raise UsageError(f"must be a string, got {kind!r}", source=self.where, field=f"{found}.rope_type")
        factor = value.get("factor")
        if factor is None or kind != "yarn":  # only YaRN's factor is used (workload.megatron_unfused)
            return kind, None
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 <= factor <= 1e4:
            raise UsageError(f"must be a number from 1 to 10000, got {factor!r}", source=self.where,
                             field=f"{found}.factor")  # fmt: skip
        return kind, float(factor)

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
