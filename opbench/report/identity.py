"""Which columns make two rows of a benchmark different measurements (their identity), declared once per kind.

Two rows that differ in any identity column are different measurements: every table the report draws keeps such a
column when its values differ among the rows shown, and every plot keeps them apart (its groups and labels carry
the distinguishing values); nothing is ever a median or mean across them. Rows equal in every identity column are
repeats of one measurement (a folder may hold several runs) and may be summarised together.

``IDENTITY`` is keyed by benchmark name. A kind not named there (a new tool's CSV) falls back to the rule: every
column that is not a measurement (the schema's metrics, units and kinds of quantity, the timing statistics) and
not bookkeeping (status, error, note, device, file) is identity.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from opbench.core.schema import Schema

IDENTITY: dict[str, tuple[str, ...]] = {
    "gemm": (
        "model",
        "layer",
        "pass",
        "mbs",
        "m",
        "n",
        "k",
        "groups",
        "transA",
        "transB",
        "dtype",
        "backend",
        "seqlen",
        "tp",
        "ep",
        "cp",
        "etp",
    ),
    "attention": (
        "model",
        "batch_size",
        "seqlen_q",
        "seqlen_kv",
        "num_head_q",
        "num_head_kv",
        "head_dim_qk",
        "head_dim_v",
        "causal",
        "attn_kind",
        "window",
        "sinks",
        "dtype",
        "backend",
        "pass",
        "tp",
        "cp",
    ),
    "moe": (
        "model",
        "routing",
        "backend",
        "phase",
        "pass",
        "mbs",
        "seqlen",
        "tokens",
        "hidden",
        "experts",
        "top_k",
        "expert_intermediate",
        "shared_intermediate",
        "dtype",
        "capacity_factor",
    ),
    "project": ("model", "layout", "world_size", "global_batch", "seqlen"),
    "project_validate": ("model", "layout", "world_size", "quantity"),
}

# Never identity under the fallback rule: what a row says about its measurement, not which one it is.
BOOKKEEPING = frozenset({"status", "error", "note", "device", "file", "impl", "seed"})
# Timing statistics and results every tool names alike (besides each schema's declared metrics and units).
MEASURED_NAMES = (
    "time",
    "tflops",
    "flops",
    "gbs",
    "busbw",
    "algbw",
    "bandwidth",
    "err",
    "pct_",
    "iters",
    "ratio",
    "imbalance",
    "tokens_",
    "mfu",
    "step_",
    "mem_",
)
INPUT_SIZES = frozenset({"size_bytes"})
MEASURED_ENDS = ("_s", "_ms", "_us", "_gbs", "_gib")

# Display columns that stand for schema columns (tables.DERIVE): a table showing the display column shows them.
SHOWN_AS: dict[str, dict[str, str]] = {
    "attention": {
        "seqlen_q": "seqlen q/kv",
        "seqlen_kv": "seqlen q/kv",
        "num_head_q": "heads q/kv",
        "num_head_kv": "heads q/kv",
        "head_dim_qk": "head_dim qk/v",
        "head_dim_v": "head_dim qk/v",
    },
}


def is_measured(kind: Schema, column: str) -> bool:
    """A measurement column of the kind (or a display column made from one: ``fwd_ms``, ``time_ms``); a message
    size (``size_bytes``) is what was measured at, not a result, though its unit is declared."""
    if column in INPUT_SIZES:
        return False
    if column in kind.metrics or column in kind.units or column in kind.kinds or column.endswith(MEASURED_ENDS):
        return True
    return any(part in column for part in MEASURED_NAMES)


def identity_of(kind: Schema) -> tuple[str, ...]:
    """The kind's identity columns: declared in IDENTITY, else every schema column that is not a measurement nor
    bookkeeping."""
    declared = IDENTITY.get(kind.benchmark)
    if declared is not None:
        return declared
    return tuple(c for c in kind.columns if c not in BOOKKEEPING and not is_measured(kind, c))


def differing(frame: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    """The columns (present in the frame) whose values differ among its rows; a missing value counts as a value."""
    return [c for c in columns if c in frame and frame[c].astype(str).nunique(dropna=False) > 1]


def differing_within(frame: pd.DataFrame, by: Sequence[str], columns: Sequence[str]) -> list[str]:
    """The columns whose values differ among rows that agree on ``by``: those a plot grouped by ``by`` must add
    to its groups so that no group holds two different measurements."""
    by = [c for c in by if c in frame]
    cols = [c for c in columns if c in frame and c not in by]
    if frame.empty or not cols:
        return []
    if not by:
        return differing(frame, cols)
    text = frame[by + cols].astype(str)
    counts = text.groupby(by, sort=False, dropna=False)[cols].nunique(dropna=False)
    return [c for c in cols if (counts[c] > 1).any()]


def missing_identity(kind: Schema, frame: pd.DataFrame, shown: Sequence[str]) -> list[str]:
    """Identity columns whose values differ among the frame's rows but that the shown columns leave out (neither
    the column nor the display column standing for it is shown), in identity order."""
    swap = SHOWN_AS.get(kind.benchmark, {})
    return [c for c in differing(frame, identity_of(kind)) if c not in shown and swap.get(c) not in shown]
