"""Routing distributions as users see them: how many token copies each expert gets, and which tokens they are.
No torch import: numpy only (a dry run plans, and a bad --routing fails, before torch loads).

- ``balanced``: every expert gets ``T·k/E`` copies (the remainder to the first experts): today's assumption.
- ``zipf:S``: expert ``e`` (0-based) gets a share proportional to ``1/(e+1)^S``; expert 0 is the hottest.
- ``max-mean:R``: one expert gets ``R`` times the mean, the others share the rest equally (a straggler).
- ``histogram:FILE``: per-expert counts as Megatron / torchtitan log them (``tokens_per_expert``): a JSON list of
  integers, or a CSV with one column (a header optional) or a ``tokens``/``count``/``counts`` column. Counts that sum
  to ``T·k`` are used exactly; others are scaled to ``T·k`` (largest remainder), and the sidecar says so.
- ``model``: what the model's router picks on random tokens (runner.py; counts known only after routing).

A token picks an expert at most once, so no expert gets more than ``T`` copies: a distribution that asks for more
is capped at ``T`` and its excess shared among the others in proportion (the sidecar's note says so).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from opbench.core.errors import UsageError
from opbench.core.inputs import read_small_text

KINDS = ("balanced", "zipf", "max-mean", "histogram", "model")
SYNTAX = "balanced, zipf:S, max-mean:R, histogram:FILE or model"
MAX_HISTOGRAM_BYTES = 16 << 20
HISTOGRAM_COLUMNS = ("tokens", "count", "counts", "tokens_per_expert")


@dataclass(frozen=True)
class Routing:
    """One --routing entry as typed; ``histogram`` holds the file's counts once read (``load``)."""

    kind: str
    text: str
    value: float | None = None
    path: str | None = None
    histogram: tuple[int, ...] = field(default=(), compare=False)

    @property
    def label(self) -> str:
        return f"histogram:{Path(self.path).name}" if self.kind == "histogram" and self.path else self.text


def parse_routing(text: str) -> Routing:
    """One --routing entry; a bad one raises ValueError with the reason (the CLI names the flag)."""
    text = text.strip()
    kind, _, arg = text.partition(":")
    if kind in ("balanced", "model"):
        if arg:
            raise ValueError(f"'{text}': {kind} takes no argument")
        return Routing(kind, text)
    if kind == "histogram":
        if not arg:
            raise ValueError("histogram needs a file: histogram:FILE")
        return Routing(kind, text, path=arg)
    if kind in ("zipf", "max-mean"):
        try:
            value = float(arg)
        except ValueError:
            raise ValueError(f"'{text}': {kind} needs a number, as {kind}:{'1.2' if kind == 'zipf' else '2'}") from None
        if not math.isfinite(value) or (kind == "zipf" and value < 0) or (kind == "max-mean" and value < 1):
            bound = "at least 0" if kind == "zipf" else "at least 1 (the max is never below the mean)"
            raise ValueError(f"'{text}': the {'exponent' if kind == 'zipf' else 'ratio'} must be finite and {bound}")
        return Routing(kind, text, value=value)
    raise ValueError(f"unknown routing '{text}'; choose from {SYNTAX}")


def load_histogram(path: str) -> tuple[int, ...]:
    """A histogram file's per-expert counts; bad input is one line naming the file and the field."""
    text = read_small_text(Path(path), MAX_HISTOGRAM_BYTES, "a histogram file", field="--routing")
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"not valid JSON: {exc.msg} (line {exc.lineno})", source=path) from None
        where = "the list"
        if isinstance(data, dict):
            keys = [k for k in HISTOGRAM_COLUMNS if k in data]
            if not keys:
                raise UsageError(f"a JSON object needs one of the keys {', '.join(HISTOGRAM_COLUMNS)}", source=path)
            where, data = keys[0], data[keys[0]]
        if not isinstance(data, list):
            raise UsageError("must be a list of integers", source=path, field=where)
        return _counts(data, path, where)
    rows = [r for r in csv.reader(io.StringIO(text)) if any(c.strip() for c in r)]
    if not rows:
        raise UsageError("is empty: expected a JSON list or a CSV column of integers", source=path)
    header = [c.strip().lower() for c in rows[0]]
    has_header = not all(_is_int(c) for c in header)
    if has_header:
        named = [i for i, c in enumerate(header) if c in HISTOGRAM_COLUMNS]
        if named:
            col = named[0]
        elif len(header) == 1:
            col = 0
        else:
            raise UsageError(
                f"a CSV with columns {', '.join(header)}: name the counts column one of {', '.join(HISTOGRAM_COLUMNS)}",
                source=path,
            )
        body, name = rows[1:], header[col]
    else:
        if len(header) != 1:
            raise UsageError(f"a CSV without a header must have one column, found {len(header)}", source=path)
        col, body, name = 0, rows, "column 1"
    values: list[object] = []
    for i, row in enumerate(body):
        cell = row[col].strip() if col < len(row) else ""
        values.append(int(cell) if _is_int(cell) else cell)
        if not _is_int(cell):
            raise UsageError(
                f"row {i + 1 + has_header}: {cell!r} is not a non-negative integer", source=path, field=name
            )
    return _counts(values, path, name)


def _is_int(text: str) -> bool:
    return text.strip().isascii() and text.strip().isdigit()


def _counts(values: Sequence[object], path: str, where: str) -> tuple[int, ...]:
    if not values:
        raise UsageError("holds no counts", source=path, field=where)
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise UsageError(f"entry {i}: {v!r} is not a non-negative integer", source=path, field=where)
    counts = tuple(int(v) for v in values)  # type: ignore[call-overload]
    if sum(counts) == 0:
        raise UsageError("all counts are 0", source=path, field=where)
    return counts


def load(routing: Routing) -> Routing:
    """The entry with its histogram read (others as they are)."""
    if routing.kind != "histogram" or routing.histogram:
        return routing
    assert routing.path is not None
    return Routing(routing.kind, routing.text, path=routing.path, histogram=load_histogram(routing.path))


def apportion(weights: Sequence[float], total: int, cap: int) -> list[int]:
    """Integer counts summing to ``total`` in proportion to ``weights`` (largest remainder, ties to the lower
    index), none above ``cap``: a capped expert's excess goes to the others in proportion."""
    w = np.asarray(weights, dtype=np.float64)
    if total > cap * len(w):
        raise ValueError(f"{total} copies do not fit {len(w)} experts of at most {cap}")
    counts = np.zeros(len(w), dtype=np.int64)
    free = np.ones(len(w), dtype=bool)
    remaining = total
    while remaining > 0:
        idx = np.flatnonzero(free & (w > 0))
        if idx.size == 0:  # every weighted expert is full: the rest go evenly to the unweighted ones
            idx = np.flatnonzero(free)
            share = np.ones(idx.size)
        else:
            share = w[idx]
        ideal = remaining * share / share.sum()
        base = np.floor(ideal).astype(np.int64)
        left = remaining - int(base.sum())
        order = np.lexsort((idx, -(ideal - base)))  # largest remainder first, then the lower index
        base[order[:left]] += 1
        over = base > cap
        if not over.any():
            counts[idx] += base
            break
        for i in idx[over]:  # cap, take out, and share the rest again
            counts[i] = cap
            free[i] = False
            remaining -= cap
    return [int(c) for c in counts]


def target_counts(routing: Routing, tokens: int, top_k: int, experts: int) -> tuple[list[int], str]:
    """Copies per expert for a synthetic routing (not ``model``), summing to ``tokens·top_k``, and a note on what
    was adjusted ("" when nothing was)."""
    total = tokens * top_k
    note = ""
    if routing.kind == "balanced":
        weights = [1.0] * experts
    elif routing.kind == "zipf":
        assert routing.value is not None
        weights = [1.0 / (e + 1) ** routing.value for e in range(experts)]
    elif routing.kind == "max-mean":
        assert routing.value is not None
        r, limit = routing.value, experts / top_k
        if r > limit:
            raise UsageError(
                f"'{routing.text}': a max/mean of {r:g} needs one expert to get {r:g}·{total / experts:g} copies, more "
                f"than the {tokens} tokens (each picks an expert once): at most E/k = {limit:g}",
                field="--routing",
            )
        mean = total / experts
        hot = min(tokens, round(r * mean))
        rest = total - hot
        if experts == 1:
            return [total], note
        counts = [hot] + apportion([1.0] * (experts - 1), rest, cap=tokens)
        return counts, note
    elif routing.kind == "histogram":
        hist = routing.histogram
        if len(hist) != experts:
            raise UsageError(
                f"has {len(hist)} counts, the model has {experts} experts", source=routing.path, field="--routing"
            )
        if sum(hist) == total and max(hist) <= tokens:
            return list(hist), note
        note = f"histogram {Path(routing.path or '').name} sums to {sum(hist)}; scaled to {total} (T·k)"
        weights = [float(h) for h in hist]
    else:
        raise ValueError(f"{routing.kind} routing has no target counts")
    counts = apportion(weights, total, cap=tokens)
    if routing.kind == "zipf":
        counts.sort(reverse=True)  # rounding may leave two neighbours a copy out of order
    ideal_max = max(weights) / sum(weights) * total
    if ideal_max > tokens + 0.5:
        note = (note + "; " if note else "") + (
            f"the hottest expert is capped at the {tokens} tokens (a token picks an expert once)"
        )
    return counts, note


def assign(counts: Sequence[int], tokens: int, top_k: int, seed: int) -> np.ndarray:
    """Expert indices [tokens, top_k] with exactly ``counts[e]`` copies of each expert and no token picking an
    expert twice: the experts' copies are laid out expert by expert over slot ``j`` → token ``j mod T``, position
    ``j div T`` (a run of at most T consecutive slots covers distinct tokens), then the tokens are shuffled (seeded)."""
    if sum(counts) != tokens * top_k or max(counts) > tokens:
        raise ValueError(f"counts {list(counts)} do not fit {tokens} tokens × top-{top_k}")
    slots = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    idx = slots.reshape(top_k, tokens).T.copy()
    rng = np.random.default_rng(seed)
    return idx[rng.permutation(tokens)]


def capacity(factor: float | None, tokens: int, top_k: int, experts: int) -> int | None:
    """Copies an expert may take under a capacity factor (Megatron's ``moe_expert_capacity_factor``:
    ``ceil(T·k/E · factor)``); None: no limit."""
    if factor is None:
        return None
    return math.ceil(tokens * top_k / experts * factor)


def dropped(counts: Sequence[int], cap: int | None) -> int:
    """Copies over capacity, dropped (their tokens keep the other experts' outputs and the shared experts')."""
    return 0 if cap is None else sum(max(0, c - cap) for c in counts)


def load_stats(counts: Sequence[int]) -> dict[str, float]:
    """tokens per expert: min / mean / max, and the imbalance max/mean."""
    mean = sum(counts) / len(counts)
    return {
        "tokens_min": min(counts),
        "tokens_mean": mean,
        "tokens_max": max(counts),
        "imbalance": max(counts) / mean if mean else 0.0,
    }
