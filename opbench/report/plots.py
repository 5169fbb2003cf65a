"""PNG plots for the report (matplotlib, the optional ``plot`` extra, imported only when drawing).

Plots are planned from the report's sections without matplotlib, so a report written without it can still
name every plot it could not make. Drawing uses the Agg canvas on a fresh ``Figure`` (no pyplot state, no
display needed).
"""

from __future__ import annotations

import io
import math
import re
import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from opbench.core.outputs import write_file
from opbench.core.units import human_bytes

from .discover import SCHEMAS
from .identity import differing_within, identity_of
from .tables import Section, cell

PLOT_EXTRA_HINT = "matplotlib is not installed (pip install 'opbench[plot]')"
PASS_ORDER = ("fwd", "dgrad", "wgrad")
MAX_BARS = 60  # rows drawn in one bar plot (the slowest, or the best layouts); more are unreadable and cost GBs
MAX_PLOTS = 24  # plots per benchmark (one per model or GEMM); report.md says how many more were left out


@dataclass
class Plot:
    kind: str
    filename: str
    title: str
    draw: Callable[[Any], None]  # draws onto a matplotlib Figure
    group: str | None = None  # the split table it belongs under (a collective), None = after the tables
    figsize: tuple[float, float] = (8, 4.5)  # inches; heatmaps grow with their grid


def _safe(name: object) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("_") or "plot"


def _label(row: pd.Series, varying: Sequence[str], fmt: dict[str, Callable[[Any], str]] | None = None) -> str:
    fmt = fmt or {}
    return " ".join(fmt.get(c, str)(row[c]) for c in varying)


def _numbers(frame: pd.DataFrame, column: str) -> pd.Series:
    """The column as numbers (text and missing cells NaN); all NaN when the CSV has no such column."""
    if column not in frame:
        return pd.Series(math.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[column], errors="coerce")


def capped(frame: pd.DataFrame, column: str, largest: bool = True, limit: int = MAX_BARS) -> pd.DataFrame:
    """At most ``limit`` rows: those with the largest (or smallest) ``column``, in the frame's order."""
    if len(frame) <= limit:
        return frame
    values = _numbers(frame, column).fillna(-math.inf if largest else math.inf)
    keep = values.sort_values(ascending=not largest, kind="stable").index[:limit]
    return frame.loc[frame.index.isin(keep)]


def cap_note(shown: int, total: int, what: str) -> str:
    """'' when every row is drawn, else ' (the 60 slowest of 20000 rows drawn)' for a title."""
    return "" if shown >= total else f" (the {shown} {what} of {total} drawn)"


def _varying(frame: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    return [c for c in columns if c in frame and frame[c].nunique(dropna=True) > 1]


def _size_axis(ax: Any) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: human_bytes(v)))
    ax.grid(True, which="major", alpha=0.3)


# ---- collectives: busbw vs size ----------------------------------------------------------------------------


Band = tuple[pd.Series, pd.Series] | None  # low and high ends of a line's spread, None when not recorded
BusbwLine = tuple[str, pd.Series, pd.Series, str, Band]


def _trial_band(part: pd.DataFrame) -> Band:
    """busbw at the slowest and the fastest trial's time (same bytes over each); None when the CSV has no trials."""
    if not {"time_us", "time_us_trial_min", "time_us_trial_max"} <= set(part) or part["time_us_trial_max"].isna().all():
        return None
    scale = part["busbw_gbs"] * part["time_us"]
    return scale / part["time_us_trial_max"], scale / part["time_us_trial_min"]


def _busbw_lines(comm: pd.DataFrame, tests: pd.DataFrame) -> list[BusbwLine]:
    """(label, x, y, linestyle, band) per opbench variant and per nccl-tests block (which has no band)."""
    lines: list[BusbwLine] = []
    group_cols = [c for c in ("backend", "world_size", "nnodes", "dtype", "source", "inplace") if c in comm]
    shown = [c for c in _varying(comm, group_cols) if c != "inplace"]
    for _, part in comm.groupby(group_cols, sort=True, dropna=False) if not comm.empty else []:
        row = part.iloc[0]
        variant = "in-place" if bool(row["inplace"]) else "out-of-place"
        name = " ".join(["opbench", str(row["backend"]), *[str(row[c]) for c in shown if c != "backend"], variant])
        part = part.sort_values("size_bytes")
        lines.append((name, part["size_bytes"], part["busbw_gbs"], "-", _trial_band(part)))
    if not tests.empty:
        t_cols = _varying(tests, ("type", "nranks", "redop"))
        for _, part in tests.groupby(t_cols, sort=True, dropna=False) if t_cols else [((), tests)]:
            part = part.sort_values("size_bytes")
            extra = _label(part.iloc[0], t_cols)
            for block, variant in (("oop", "out-of-place"), ("ip", "in-place")):
                y = part[f"{block}_busbw_gbs"]
                if y.notna().any():
                    lines.append(
                        (
                            " ".join(p for p in ("nccl/rccl-tests", extra, variant) if p),
                            part["size_bytes"],
                            y,
                            "--",
                            None,
                        )
                    )
    return lines


def _draw_busbw(
    collective: str, comm: pd.DataFrame, tests: pd.DataFrame, other: pd.DataFrame | None = None
) -> Callable[[Any], None]:
    """busbw vs size per variant, the fastest-to-slowest-trial band shaded; with --compare the other run's opbench
    lines dotted in the same colours, their band as whiskers."""

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        mine = _busbw_lines(comm, tests)
        for i, (label, x, y, style, band) in enumerate(mine):
            ax.plot(x, y, style, marker="o", markersize=3, label=label, color=f"C{i % 10}")
            if band is not None:
                ax.fill_between(x, band[0], band[1], color=f"C{i % 10}", alpha=0.15)
        colors = {line[0]: f"C{i % 10}" for i, line in enumerate(mine)}
        theirs = _busbw_lines(other, pd.DataFrame()) if other is not None and not other.empty else []
        for label, x, y, _, band in theirs:
            spread = None if band is None else [(y - band[0]).clip(lower=0), (band[1] - y).clip(lower=0)]
            ax.errorbar(x, y, yerr=spread, fmt=":s", markersize=3, alpha=0.8, capsize=3, color=colors.get(label),
                        label=f"{label} (other run)")  # fmt: skip
        _size_axis(ax)
        ax.set_xlabel("message size (nccl-tests -b, bytes per rank)")
        ax.set_ylabel("busbw (GB/s)")
        shaded = "; shaded: fastest to slowest trial" if any(line[4] is not None for line in mine) else ""
        ax.set_title(f"{collective}: bus bandwidth vs message size{shaded}")
        ax.legend(fontsize="small")

    return draw


# ---- bars and lines with their spread ----------------------------------------------------------------------

BAND_NOTE = "whiskers: p10–p90 of the timed calls; hatched: noisy (spread above --max-spread)"
OTHER_ALPHA = 0.45  # --compare: the other run's bars and lines, in the same colour but faded


@dataclass(frozen=True)
class Timed:
    """Where a TFLOPS figure and its time band live in a row, and how a row says it was noisy."""

    tflops: str
    time: str
    p10: str
    p90: str
    noisy: str  # regex on the row's note


GEMM_TIMED = Timed("tflops", "time_s", "time_p10_s", "time_p90_s", r"noisy")


def attention_timed(pass_: str) -> Timed:
    """A pass' columns; its note says ``noisy <pass>: …`` (or names the pass in a consistency note)."""
    return Timed(
        f"{pass_}_tflops", f"{pass_}_time", f"{pass_}_time_p10", f"{pass_}_time_p90", rf"noisy[^;]*\b{pass_}\b"
    )


def with_band(frame: pd.DataFrame, t: Timed) -> pd.DataFrame:
    """``_v`` (TFLOPS at the median time), ``_lo``/``_hi`` (TFLOPS at the p90/p10 time: the same FLOPs over the
    slow and the fast end of the timed calls) and ``_noisy`` per row; a band not recorded is NaN."""

    def col(name: str) -> pd.Series:
        return pd.to_numeric(frame[name], errors="coerce") if name in frame else pd.Series(math.nan, index=frame.index)

    value, time = col(t.tflops), col(t.time)
    note = frame["note"].astype(str) if "note" in frame else pd.Series("", index=frame.index)
    return frame.assign(
        _v=value,
        _lo=value * time / col(t.p90),
        _hi=value * time / col(t.p10),
        _noisy=note.str.contains(t.noisy, regex=True, na=False),
    )


@dataclass
class Bars:
    """One bar per category (NaN: none there) with its band and noisy flag: one legend entry."""

    label: str
    values: list[float]
    low: list[float]
    high: list[float]
    noisy: list[bool]
    color: str
    faded: bool = False


def bars_of(banded: pd.DataFrame, cats: Sequence[str], label: str, color: str, faded: bool = False) -> Bars:
    """Per category the median of the rows there (a folder may hold repeats) and whether any of them was noisy."""
    per = banded.groupby("_x")[["_v", "_lo", "_hi"]].median() if not banded.empty else pd.DataFrame()
    noisy = banded.groupby("_x")["_noisy"].any() if not banded.empty else pd.Series(dtype=bool)

    def pick(column: str) -> list[float]:
        return [float(per.at[c, column]) if c in per.index else math.nan for c in cats]

    flags = [bool(noisy.get(c, False)) for c in cats]
    return Bars(label, pick("_v"), pick("_lo"), pick("_hi"), flags, color, faded)


def draw_bars(ax: Any, cats: Sequence[str], sets: Sequence[Bars], horizontal: bool = False) -> None:
    """Grouped bars, one group per category, whiskers from each bar's band, noisy bars hatched."""
    width = 0.8 / max(1, len(sets))
    for i, b in enumerate(sets):
        offset = (i - (len(sets) - 1) / 2) * width * (-1 if horizontal else 1)  # first set on top when horizontal
        where = [j + offset for j in range(len(cats))]
        low = [max(0.0, v - lo) if math.isfinite(v - lo) else 0.0 for v, lo in zip(b.values, b.low)]
        high = [max(0.0, hi - v) if math.isfinite(hi - v) else 0.0 for v, hi in zip(b.values, b.high)]
        style = {"color": b.color, "alpha": OTHER_ALPHA if b.faded else 1.0, "edgecolor": "black", "linewidth": 0.4}
        err = {"ecolor": "black", "capsize": 2, "error_kw": {"linewidth": 0.8}}
        made = (ax.barh(where, b.values, width, xerr=[low, high], label=b.label, **style, **err) if horizontal
                else ax.bar(where, b.values, width, yerr=[low, high], label=b.label, **style, **err))  # fmt: skip
        for patch, noisy in zip(made.patches, b.noisy):
            if noisy:
                patch.set_hatch("///")
    axis = ax.yaxis if horizontal else ax.xaxis
    axis.set_ticks(range(len(cats)), list(cats), fontsize="small")
    if not horizontal and len(cats) > 6:
        ax.tick_params(axis="x", labelrotation=30)
        for tick in ax.get_xticklabels():
            tick.set_ha("right")
    if horizontal:
        ax.invert_yaxis()
    ax.grid(True, axis="x" if horizontal else "y", alpha=0.3)


def legend_with_noisy(where: Any, sets: Sequence[Bars], **kwargs: Any) -> None:
    """On an axes or a figure: one plain swatch per bar set (a hatched first bar must not make its entry look
    noisy), plus one hatched entry when any bar is noisy."""
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor=b.color, alpha=OTHER_ALPHA if b.faded else 1.0, edgecolor="black", label=b.label) for b in sets
    ]
    if any(n for b in sets for n in b.noisy):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="///", label="noisy"))
    where.legend(handles=handles, fontsize="small", **kwargs)


def _named(name: str, value: Any) -> str:
    return f"{name} {value}"


def _categories(
    frames: Sequence[pd.DataFrame], first: str, extra: Sequence[str], named: bool = False
) -> list[pd.DataFrame]:
    """Each frame with ``_x``: the category label (first column, then the varying extras, each after its short
    name when ``named``), the same for every run."""
    fmt: dict[str, Callable[[Any], str]] | None = (
        {c: partial(_named, SHORT.get(c, c)) for c in extra} if named else None
    )
    return [
        f.assign(_x=f[first].map(str) + (f.apply(lambda r: "\n" + _label(r, extra, fmt), axis=1) if extra else ""))
        if not f.empty
        else f.assign(_x=pd.Series(dtype=object))
        for f in frames
    ]


# ---- GEMM: TFLOPS per layer and pass -----------------------------------------------------------------------


def gemm_categories(runs: Sequence[pd.DataFrame]) -> list[pd.DataFrame]:
    """Each run with ``_x``, its bar's category: the layer, the extras that vary over the runs, and every other
    GEMM identity column (identity.IDENTITY: m, n, k, dtype …) whose values differ among rows of one layer and
    pass, after its name: a bar is one measurement (or its repeats), never a median over different shapes."""
    both = pd.concat(list(runs))
    extra = _varying(both, ("mbs", "backend", "dtype", "tp", "ep", "cp"))
    within = [c for c in differing_within(both, ("layer", "pass"), identity_of(SCHEMAS["gemm"])) if c != "model"]
    named = [c for c in within if c not in extra]
    fmt: dict[str, Callable[[Any], str]] = {c: partial(_named, c) for c in named}
    cols = [*extra, *named]
    return [
        f.assign(_x=f["layer"].map(str) + (f.apply(lambda r: "\n" + _label(r, cols, fmt), axis=1) if cols else ""))
        if not f.empty
        else f.assign(_x=pd.Series(dtype=object))
        for f in runs
    ]


def _draw_gemm(
    model: str, frame: pd.DataFrame, other: pd.DataFrame | None = None, note: str = ""
) -> Callable[[Any], None]:
    """Bars per layer and pass with p10–p90 whiskers and noisy bars hatched; with --compare, one panel per
    pass and the other run's bar (faded) beside this run's."""

    def draw(fig: Any) -> None:
        runs = [frame] if other is None else [frame, other]
        runs = [with_band(f, GEMM_TIMED) for f in gemm_categories(runs)]
        cats = list(dict.fromkeys(x for f in runs for x in f["_x"]))
        seen = set().union(*(set(f["pass"]) for f in runs))
        passes = [p for p in PASS_ORDER if p in seen] + sorted(seen - set(PASS_ORDER))
        colors = {p: f"C{i}" for i, p in enumerate(passes)}
        if other is None:
            ax = fig.add_subplot()
            sets = [bars_of(runs[0][runs[0]["pass"] == p], cats, p, colors[p]) for p in passes]
            draw_bars(ax, cats, sets)
            ax.set_ylabel("TFLOPS")
            legend_with_noisy(ax, sets, title="pass", loc="upper left", bbox_to_anchor=(1.01, 1.0))
            ax.set_title(f"GEMM TFLOPS per layer and pass: {model}{note}\n{BAND_NOTE}", fontsize="medium")
            return
        axes = fig.subplots(len(passes), 1, sharex=True, squeeze=False)[:, 0]
        for ax, p in zip(axes, passes):
            sets = [
                bars_of(run[run["pass"] == p], cats, f"{p} {name}", colors[p], faded=faded)
                for run, name, faded in ((runs[0], "this run", False), (runs[1], "other run", True))
            ]
            draw_bars(ax, cats, sets)
            ax.set_ylabel("TFLOPS")
            legend_with_noisy(ax, sets, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.suptitle(
            f"GEMM TFLOPS per layer and pass: {model}{note}, this run vs the other\n{BAND_NOTE}", fontsize="medium"
        )

    return draw


# ---- attention: TFLOPS vs sequence length, or per model when one length was run -----------------------------

SHORT = {"seqlen q/kv": "seq", "heads q/kv": "heads", "head_dim qk/v": "dim", "batch_size": "mbs"}
ATTENTION_EXTRA = ("batch_size", "heads q/kv", "head_dim qk/v", "causal", "dtype", "tp", "cp")
ATTENTION_KIND = ("attn_kind", "window", "sinks")  # a full and a sliding-window layer are different measurements


def _window_text(value: Any, alone: bool) -> str:
    """'128' after a kind name ('sliding 128'), 'window 128' alone; '' for no window (0 or missing: full)."""
    number = pd.to_numeric(pd.Series([value]), errors="coerce").iloc[0]
    if pd.isna(number) or number <= 0:
        return "" if pd.isna(number) or number == 0 else str(value)
    return f"{int(number)}" if not alone else f"window {int(number)}"


def attention_kind_label(row: Any, cols: Sequence[str]) -> str:
    """The varying attention-kind values of a row: 'full', 'sliding 128', 'sliding 128 sinks'."""
    parts = []
    for c in cols:
        value = row[c]
        if c == "window":
            parts.append(_window_text(value, alone="attn_kind" not in cols))
        elif c == "sinks":
            parts.append("sinks" if str(value).strip().lower() in ("true", "1", "1.0") else "no sinks")
        else:
            parts.append(cell(value))
    return " ".join(p for p in parts if p)


def attention_series(runs: Sequence[pd.DataFrame]) -> tuple[list[str], list[str]]:
    """The columns that split attention rows into separate lines or bar sets: the backend and the attention kind
    columns that vary (attn_kind, window, sinks); and the other extras that vary (shape, dtype, parallelism)."""
    both = pd.concat(list(runs))
    return ["backend", *_varying(both, ATTENTION_KIND)], [c for c in _varying(both, ATTENTION_EXTRA) if c != "backend"]


def series_label(row: Any, cols: Sequence[str]) -> str:
    """'sdpa full', 'sdpa sliding 128': the backend, then the attention kind values, then any other column."""
    kinds = [c for c in cols if c in ATTENTION_KIND]
    rest = [cell(row[c]) for c in cols if c not in ATTENTION_KIND]
    return " ".join(p for p in (*rest, attention_kind_label(row, kinds)) if p)


def with_series(runs: Sequence[pd.DataFrame], split: Sequence[str]) -> list[pd.DataFrame]:
    """Each run with ``_s``: its row's series label (series_label over ``split``)."""
    return [
        f.assign(_s=f.apply(lambda r: series_label(r, split), axis=1) if not f.empty else pd.Series(dtype=object))
        for f in runs
    ]


def attention_bar_sets(runs: Sequence[pd.DataFrame], pass_: str) -> tuple[list[str], list[Bars]]:
    """The categories (model, then each varying shape extra after its short name) and one bar set per backend
    and attention kind ('sdpa full', 'sdpa sliding 128'), this run's then the other run's: each bar is one
    measurement's TFLOPS (a median only over repeats equal in every identity column)."""
    split, _ = attention_series(runs)
    both = pd.concat(list(runs))
    extra = [c for c in _varying(both, ("seqlen q/kv", *ATTENTION_EXTRA)) if c != "backend"]
    # any other identity column still differing inside one bar (seqlen_kv at one seqlen_q …) joins the category
    raw = {"seqlen_q", "seqlen_kv", "num_head_q", "num_head_kv", "head_dim_qk", "head_dim_v"}
    inside = differing_within(both, ["model", *split, *extra], identity_of(SCHEMAS["attention"]))
    extra += [c for c in inside if c not in raw and c not in extra]
    if raw & set(inside) and "seqlen q/kv" not in extra:
        extra += [c for c in ("seqlen q/kv", "heads q/kv", "head_dim qk/v") if c not in extra]
    runs = with_series(_categories(runs, "model", extra, named=True), split)
    cats = list(dict.fromkeys(x for f in runs for x in f["_x"]))
    labels = sorted({s for f in runs for s in f["_s"]})
    sets = []
    for i, label in enumerate(labels):
        for j, run in enumerate(runs):
            part = with_band(run[run["_s"] == label], attention_timed(pass_))
            name = label + ("" if len(runs) == 1 else (" this run", " other run")[j])
            sets.append(bars_of(part, cats, name, f"C{i % 10}", faded=j == 1))
    return cats, sets


def _attention_passes(*frames: pd.DataFrame) -> list[str]:
    return [p for p in ("fwd", "bwd") if any(f"{p}_tflops" in f and f[f"{p}_tflops"].notna().any() for f in frames)]


def _as_tuple(key: Any) -> tuple[Any, ...]:
    """A groupby key as a tuple (pandas gives a scalar or a 1-tuple for one column, depending on the call)."""
    return key if isinstance(key, tuple) else (key,)


def _draw_attention(model: str, frame: pd.DataFrame, other: pd.DataFrame | None = None) -> Callable[[Any], None]:
    """TFLOPS vs seqlen_q, one line per backend with its p10–p90 band shaded; with --compare the other run's
    lines dashed in the same colours, their band as whiskers (two shaded bands on top of each other are mud)."""

    def draw(fig: Any) -> None:
        from matplotlib.lines import Line2D
        from matplotlib.ticker import FuncFormatter

        runs = [frame] + ([other] if other is not None and not other.empty else [])
        passes = _attention_passes(*runs)
        split, extra = attention_series(runs)
        by = [*split, *extra]  # one line per backend, attention kind and varying shape: never a median across them
        groups = sorted({_as_tuple(k) for f in runs for k, _ in f.groupby(by, sort=True)})
        colors = {k: f"C{i % 10}" for i, k in enumerate(groups)}
        axes = fig.subplots(1, max(1, len(passes)), sharey=True, squeeze=False)[0]
        any_noisy = False
        for ax, p in zip(axes, passes):
            for n, run in enumerate(runs):
                banded = with_band(run, attention_timed(p))
                for group, part in banded.groupby(by, sort=True):
                    key = _as_tuple(group)
                    points = part.groupby("seqlen_q")[["_v", "_lo", "_hi"]].median()  # repeated shapes: one point
                    x, y, color = points.index, points["_v"], colors[key]
                    if n == 0:
                        ax.plot(x, y, "-", marker="o", color=color)
                        ax.fill_between(x, points["_lo"], points["_hi"], color=color, alpha=0.15)
                    else:
                        spread = [(y - points["_lo"]).clip(lower=0), (points["_hi"] - y).clip(lower=0)]
                        ax.errorbar(x, y, yerr=spread, fmt="--s", color=color, alpha=0.7, capsize=3, markersize=4)
                    noisy = part[part["_noisy"]]
                    any_noisy |= not noisy.empty
                    ax.plot(noisy["seqlen_q"], noisy["_v"], "x", color="black", markersize=8)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            ax.set_xlabel("seqlen_q")
            ax.set_title(p)
            ax.grid(True, alpha=0.3)
        axes[0].set_ylabel("TFLOPS")
        handles = [
            Line2D([], [], color=colors[k], marker="o", label=series_label(dict(zip(by, k)), by)) for k in groups
        ] + ([Line2D([], [], color="gray", linestyle="--", marker="s", label="other run")] if len(runs) > 1 else [])
        handles += [Line2D([], [], color="black", marker="x", linestyle="", label="noisy")] if any_noisy else []
        fig.legend(handles=handles, loc="outside lower center", ncols=min(6, len(handles)), fontsize="small")
        fig.suptitle(
            f"Attention TFLOPS vs sequence length: {model}\nshaded: p10–p90 of the timed calls"
            + ("; dashed with whiskers: the other run" if len(runs) > 1 else ""),
            fontsize="medium",
        )

    return draw


def _draw_attention_bars(frame: pd.DataFrame, other: pd.DataFrame | None = None) -> Callable[[Any], None]:
    """One length per model: horizontal bars per model (and shape) and backend, fwd and bwd side by side."""

    def draw(fig: Any) -> None:
        runs = [frame] if other is None or other.empty else [frame, other]
        passes = _attention_passes(*runs)
        axes = fig.subplots(1, max(1, len(passes)), sharey=True, squeeze=False)[0]
        sets: list[Bars] = []
        for ax, p in zip(axes, passes):
            cats, sets = attention_bar_sets(runs, p)
            draw_bars(ax, cats, sets, horizontal=True)
            ax.set_xlabel("TFLOPS")
            ax.set_title(p)
        legend_with_noisy(fig, sets, loc="outside lower center", ncols=min(6, len(sets) + 1))
        lengths = "/".join(sorted({str(v) for f in runs for v in f.get("seqlen q/kv", [])}))
        fig.suptitle(
            f"Attention TFLOPS per model and backend (one sequence length each: {lengths})\n{BAND_NOTE}",
            fontsize="medium",
        )

    return draw


def _attention_plots(attn: pd.DataFrame, other: pd.DataFrame | None) -> list[Plot]:
    """A line plot per model run at several lengths; the models run at one length share one bar chart."""
    plots, single = [], []
    for model, part in attn.groupby("model", sort=True):
        theirs = other[other["model"] == model] if other is not None and "model" in other else None
        if part["seqlen_q"].nunique() > 1:
            plots.append(
                Plot(
                    "attention",
                    f"attention_tflops_{_safe(model)}.png",
                    f"Attention TFLOPS vs sequence length: {model}",
                    _draw_attention(str(model), part, theirs),
                )
            )
        else:
            single.append(model)
    if single:
        mine = attn[attn["model"].isin(single)]
        theirs = other[other["model"].isin(single)] if other is not None and "model" in other else None
        cats = mine.groupby(["model", *_varying(mine, ("seqlen q/kv", *ATTENTION_EXTRA))]).ngroups
        bars = (
            cats
            * mine.groupby(["backend", *_varying(mine, ATTENTION_KIND)]).ngroups
            * (1 if theirs is None or theirs.empty else 2)
        )
        plots.append(
            Plot(
                "attention",
                "attention_tflops.png",
                "Attention TFLOPS per model and backend",
                _draw_attention_bars(mine, theirs),
                figsize=(10.0, min(40.0, max(4.0, 0.16 * bars + 2.0))),
            )
        )
    return plots


# ---- checkpoint: bandwidth per method ----------------------------------------------------------------------


def _draw_ckpt(frame: pd.DataFrame) -> Callable[[Any], None]:
    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        labels = _ckpt_labels(frame)
        x = range(len(frame))
        ax.bar([i - 0.2 for i in x], frame["save_bandwidth_mib_per_s"], 0.4, label="save")
        ax.bar([i + 0.2 for i in x], frame["load_bandwidth_mib_per_s"], 0.4, label="load")
        ax.set_xticks(list(x), list(labels), rotation=20 if len(frame) > 4 else 0, fontsize="small")
        ax.set_ylabel("MiB/s")
        ax.set_title("Checkpoint bandwidth per method")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend()

    return draw


CKPT_PHASES = ("staging", "planning", "writing", "finishing")  # ckpt/runner.PHASES, the CSV's save_<phase>_time


def _ckpt_labels(frame: pd.DataFrame) -> pd.Series:
    extra = _varying(
        frame, ("model", "storage_kind", "world_size", "thread_count", "single_file_per_rank", "drop_cache")
    )
    return frame.apply(lambda r: " ".join([str(r["method"]), *[f"{c}={cell(r[c])}" for c in extra]]), axis=1)


def _draw_ckpt_phases(frame: pd.DataFrame) -> Callable[[Any], None]:
    """One stacked bar per DCP row: its median save's time by phase; an async row's block time as a marker."""

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        labels = _ckpt_labels(frame)
        y = list(range(len(frame)))
        left = pd.Series(0.0, index=frame.index)
        for phase in CKPT_PHASES:
            values = _numbers(frame, f"save_{phase}_time").fillna(0.0)
            ax.barh(y, values, left=left, label=phase)
            left = left + values
        if "save_block_time" in frame and "async_save" in frame:
            asy = frame["async_save"].astype(str) == "True"
            ax.scatter(frame.loc[asy, "save_block_time"], [i for i, a in zip(y, asy) if a], marker="|", s=400,
                       color="black", label="training blocked until")  # fmt: skip
        ax.set_yticks(y, list(labels), fontsize="small")
        ax.invert_yaxis()
        ax.set_xlabel("seconds (slowest rank, median save)")
        ax.set_title("Checkpoint save time by phase")
        ax.grid(True, axis="x", alpha=0.3)
        ax.legend(fontsize="small")

    return draw


PROJECT_PARTS = (
    ("compute_s", "compute"),
    ("tp_comm_s", "TP comm"),
    ("ep_comm_s", "EP comm"),
    ("cp_comm_s", "CP comm"),
    ("pp_comm_s", "PP sends"),
    ("dp_comm_s", "DP / FSDP comm"),
    ("offload_s", "activation offload"),
    ("bubble_s", "pipeline bubble"),
    ("optimizer_s", "optimizer"),
)


def project_labels(frame: pd.DataFrame) -> list[str]:
    """One bar label per projected row: its layout, and every other identity column (world size, batch, seqlen)
    whose values differ among rows of one layout, after its name: two bars never read alike."""
    within = [c for c in differing_within(frame, ("layout",), identity_of(SCHEMAS["project"])) if c != "model"]
    return [" ".join([str(r["layout"]), *(f"{c} {cell(r[c])}" for c in within)]) for _, r in frame.iterrows()]


def _draw_project(frame: pd.DataFrame, note: str = "") -> Callable[[Any], None]:
    """One stacked bar per projected layout: where its step's time goes."""
    frame = frame.sort_values("rank") if "rank" in frame and frame["rank"].notna().any() else frame

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        y = list(range(len(frame)))
        left = pd.Series(0.0, index=frame.index)
        for col, label in PROJECT_PARTS:
            values = _numbers(frame, col).fillna(0.0).clip(lower=0.0)
            if values.any():
                ax.barh(y, values, left=left, label=label)
                left = left + values
        ax.set_yticks(y, project_labels(frame), fontsize="small")
        ax.invert_yaxis()
        ax.set_xlabel("seconds per step")
        ax.set_title(f"Projected step time by layout{note}")
        ax.grid(True, axis="x", alpha=0.3)
        if left.any():  # no part with a time (all missing or zero): no legend to show
            fig.legend(loc="outside lower center", ncols=4, fontsize="small")

    return draw


STEP_PARTS = (
    ("gemm", "GEMM"),
    ("attention", "attention"),
    ("memory", "memory-bound"),
    ("optimizer", "optimizer"),
    ("other", "other"),
    ("comm", "exposed comm"),
    ("memcpy", "copies"),
    ("bubble", "pipeline bubble"),
    ("idle", "idle"),
)


def _draw_step(frame: pd.DataFrame) -> Callable[[Any], None]:
    """``opbench step``: one stacked bar per rank's measured step and one for the projection (when the CSV has
    it), by line item; the collectives' kinds (``comm:<kind>``) are summed into exposed comm."""
    item = frame["item"].astype(str)
    measured_s, projected_s = _numbers(frame, "measured_s"), _numbers(frame, "projected_s")
    bars: list[tuple[str, dict[str, float]]] = []
    for (trace, rank), part in frame.groupby(["trace", "rank"], sort=True):
        parts: dict[str, float] = {}
        for i in part.index:
            name = "comm" if item[i].startswith("comm:") else item[i]
            if item[i] != "comm" and pd.notna(measured_s[i]):
                parts[name] = parts.get(name, 0.0) + float(measured_s[i])
        bars.append((f"{trace} rank {rank}", parts))
    if projected_s.notna().any():
        first = frame.index[(frame["trace"] == frame["trace"].iloc[0]) & (frame["rank"] == frame["rank"].iloc[0])]
        projected = {
            item[i]: float(projected_s[i])
            for i in first
            if pd.notna(projected_s[i]) and not item[i].startswith("comm:")
        }
        bars.append(("projected", projected))

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        y = list(range(len(bars)))
        left = [0.0] * len(bars)
        for key, label in STEP_PARTS:
            values = [max(0.0, parts.get(key, 0.0)) for _, parts in bars]
            if any(values):
                ax.barh(y, values, left=left, label=label)
                left = [a + b for a, b in zip(left, values)]
        ax.set_yticks(y, [name for name, _ in bars], fontsize="small")
        ax.invert_yaxis()
        ax.set_xlabel("seconds per step")
        ax.set_title("Training step by line item (opbench step)")
        ax.grid(True, axis="x", alpha=0.3)
        if any(left):
            fig.legend(loc="outside lower center", ncols=5, fontsize="small")

    return draw


TIMELINE_COLORS = {  # one colour per class of the timeline picture; comm:<kind> on the step lane is exposed comm
    "gemm": "tab:blue",
    "attention": "tab:orange",
    "memory": "tab:green",
    "optimizer": "tab:purple",
    "other": "tab:brown",
    "comm exposed": "tab:red",
    "comm overlapped": "pink",
    "memcpy": "tab:olive",
    "bubble": "black",
    "idle": "lightgrey",
}
MAX_TIMELINE_ROWS = 40  # bars (streams, or ranks) in one timeline picture


def timeline_colour_class(label: str) -> str:
    return "comm exposed" if label.startswith("comm:") else label if label in TIMELINE_COLORS else "other"


def timeline_bars(frame: pd.DataFrame) -> list[tuple[str, list[tuple[str, float, float]]]]:
    """``opbench step``'s timeline pieces as bars: (bar label, [(class, start s, width s)]). One trace: a bar per
    lane, the step's own cut first; several traces: a bar per rank, its step's cut (the picture compares ranks)."""
    start, end = _numbers(frame, "start_s"), _numbers(frame, "end_s")
    ok = frame[start.notna() & end.notna()]
    ranks = sorted({(str(t), str(r)) for t, r in zip(ok["trace"], ok["rank"])}, key=lambda tr: _natural(tr[1]))
    one = len(ranks) == 1
    if not one:
        ok = ok[ok["lane"].astype(str) == "step"]
    bars: list[tuple[str, list[tuple[str, float, float]]]] = []
    keyed = ok.assign(_t=ok["trace"].astype(str), _r=ok["rank"].astype(str), _l=ok["lane"].astype(str))
    for key, part in keyed.groupby(["_l"] if one else ["_t", "_r"], sort=False):
        name = str(key[0]) if one else f"rank {key[1]} ({key[0]})"
        pieces = [
            (str(c), float(a), float(b) - float(a))
            for c, a, b in zip(part["class"], _numbers(part, "start_s"), _numbers(part, "end_s"))
        ]
        bars.append((name, sorted(pieces, key=lambda p: p[1])))
    if one:
        bars.sort(key=lambda b: (b[0] != "step", _natural(b[0])))
    return bars[:MAX_TIMELINE_ROWS]


def _draw_timeline(bars: list[tuple[str, list[tuple[str, float, float]]]], title: str) -> Callable[[Any], None]:
    def draw(fig: Any) -> None:
        from matplotlib.patches import Patch

        ax = fig.add_subplot()
        seen: dict[str, None] = {}
        for y, (_, pieces) in enumerate(bars):
            spans = [(a * 1e3, w * 1e3) for _, a, w in pieces]
            colours = [TIMELINE_COLORS[timeline_colour_class(c)] for c, _, _ in pieces]
            ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colours, linewidth=0)
            seen.update(dict.fromkeys(timeline_colour_class(c) for c, _, _ in pieces))
        ax.set_yticks(range(len(bars)), [name for name, _ in bars], fontsize="small")
        ax.invert_yaxis()
        ax.set_xlabel("ms from the step's start")
        ax.set_title(title)
        ax.grid(True, axis="x", alpha=0.3)
        shown = [k for k in TIMELINE_COLORS if k in seen]
        if shown:
            handles = [Patch(facecolor=TIMELINE_COLORS[k], label=k) for k in shown]
            fig.legend(handles=handles, loc="outside lower center", ncols=5, fontsize="small")

    return draw


# ---- cluster: heatmaps of GPUs and of pairs ----------------------------------------------------------------

HEATMAP_ANNOTATE_MAX = 400  # cells; above this the numbers would not fit and only the colours remain
HEATMAP_TICKS_MAX = 48  # labels per axis; above this every k-th is named


def _natural(label: object) -> tuple[Any, ...]:
    """node2 before node10, and node0:2 before node0:10 (the launcher's names carry numbers)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", cell(label)))


def _members(*frames: pd.DataFrame, columns: Sequence[str]) -> list[Hashable]:
    """Every distinct value of these columns in these frames, in natural order."""
    seen = {v for f in frames for c in columns if c in f for v in f[c].dropna()}
    return sorted(seen, key=_natural)


def _grid(
    measured: pd.DataFrame, row: str, col: str, value: str, rows: list[Hashable], cols: list[Hashable]
) -> pd.DataFrame:
    """value at (row, col), the median where a folder holds repeats; members without a value stay NaN, so a
    failed or missing GPU or pair is a blank cell instead of vanishing from the grid."""
    cells = measured.groupby([row, col])[value].median().unstack() if not measured.empty else pd.DataFrame()
    return cells.reindex(index=rows, columns=cols).astype(float)


def _heatmap_size(grid: pd.DataFrame) -> tuple[float, float]:
    width = min(20.0, max(6.0, 0.9 * len(grid.columns) + 3.0))
    height = min(20.0, max(3.5, 0.5 * len(grid.index) + 1.8))
    return width, height


def _name_ticks(ax: Any, labels: Sequence[Hashable], axis: str) -> None:
    step = max(1, math.ceil(len(labels) / HEATMAP_TICKS_MAX))
    where = list(range(0, len(labels), step))
    names = [cell(labels[i]) for i in where]
    if axis == "x":
        ax.set_xticks(where, names, rotation=90 if len(where) > 12 else 0, fontsize="small")
    else:
        ax.set_yticks(where, names, fontsize="small")


def _draw_heatmap(grid: pd.DataFrame, title: str, xlabel: str, ylabel: str, unit: str) -> Callable[[Any], None]:
    """One coloured cell per (row, column), its value written in it while the grid is small; NaN stays white.
    The colour scale starts at 0, so a cell reads as far from its neighbours only when it really is (a min-to-max
    scale paints a 1 % difference as black against white)."""

    def draw(fig: Any) -> None:
        import numpy as np
        from matplotlib import colormaps

        values = grid.to_numpy(dtype=float)
        ax = fig.add_subplot()
        image = ax.imshow(
            np.ma.masked_invalid(values),
            cmap=colormaps["viridis"].with_extremes(bad="white"),
            aspect="auto",
            vmin=0.0,
            vmax=float(np.nanmax(values)) if np.isfinite(values).any() else 1.0,
        )
        fig.colorbar(image, ax=ax, label=unit)
        _name_ticks(ax, list(grid.columns), "x")
        _name_ticks(ax, list(grid.index), "y")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        if values.size <= HEATMAP_ANNOTATE_MAX:
            for (i, j), v in np.ndenumerate(values):
                if math.isfinite(v):  # dark low end of viridis: white text there, black on the light end
                    shade = "white" if image.norm(v) < 0.5 else "black"
                    ax.text(j, i, f"{v:.4g}", ha="center", va="center", fontsize="small", color=shade)

    return draw


def _compute_heatmaps(section: Section) -> list[Plot]:
    """Per GEMM (and dtype, when a folder mixes them): TFLOPS with nodes in rows and local GPUs in columns.
    Rows and columns come from every compute row, failed ones included, so a GPU without a result is blank."""
    ok, failed = section.ok, section.failed
    rows = _members(ok, failed, columns=("node",))
    cols = _members(ok, failed, columns=("local_rank",))
    many_dtypes = ok["dtype"].nunique(dropna=True) > 1
    plots = []
    for (gemm, dtype), part in ok.groupby(["gemm", "dtype"], sort=True, dropna=False):
        first = part.iloc[0]
        title = f"GEMM {gemm} ({cell(first['m'])}×{cell(first['n'])}×{cell(first['k'])}, {dtype}): TFLOPS per GPU"
        grid = _grid(part, "node", "local_rank", "tflops", rows, cols)
        plots.append(
            Plot(
                section.kind.benchmark,
                f"cluster_tflops_{_safe(gemm)}" + (f"_{_safe(dtype)}" if many_dtypes else "") + ".png",
                title,
                _draw_heatmap(grid, title, "local rank (GPU on the node)", "node", "TFLOPS"),
                group=str(gemm),
                figsize=_heatmap_size(grid),
            )
        )
    return plots


# scope -> (what the title says, what one row / column is); another scope is drawn with its own name
PAIR_SCOPES = {"inter": ("node → node", "node"), "gpu": ("GPU → GPU inside each node", "GPU")}


def _pair_heatmaps(section: Section) -> list[Plot]:
    """Per scope and message size: GB/s per GPU, senders in rows, receivers in columns, one label set for
    both so the diagonal lines up; pairs not measured (including each member with itself) are blank."""
    ok, failed = section.ok, section.failed
    plots = []
    for (scope, size), part in ok.groupby(["scope", "size_bytes"], sort=True):
        what, member = PAIR_SCOPES.get(str(scope), (str(scope), "member"))
        same_scope = failed[failed["scope"] == scope] if "scope" in failed else failed
        labels = _members(ok[ok["scope"] == scope], same_scope, columns=("src", "dst"))
        title = f"Pairs {what} at {human_bytes(size)}: GB/s per GPU"
        grid = _grid(part, "src", "dst", "gbs_per_gpu", labels, labels)
        plots.append(
            Plot(
                section.kind.benchmark,
                f"cluster_pairs_{_safe(scope)}_{_safe(human_bytes(size).replace(' ', ''))}.png",
                title,
                _draw_heatmap(grid, title, f"receiving {member} (dst)", f"sending {member} (src)", "GB/s per GPU"),
                group=str(scope),
                figsize=_heatmap_size(grid),
            )
        )
    return plots


# ---- planning and rendering --------------------------------------------------------------------------------


def plan_plots(sections: Sequence[Section]) -> list[Plot]:
    """Every plot the sections call for, in section order (no matplotlib needed)."""
    by_kind = {s.kind.benchmark: s.ok for s in sections}
    others = {s.kind.benchmark: s.other_ok for s in sections if s.other_ok is not None and not s.other_ok.empty}
    tests = by_kind.get("nccl_tests", pd.DataFrame())
    plots: list[Plot] = []
    comm = by_kind.get("comm", pd.DataFrame())
    collectives = sorted(set(comm.get("collective", [])) | set(tests.get("collective", [])))
    home = "comm" if not comm.empty else "nccl_tests"  # without opbench rows the plot goes with nccl-tests
    other_comm = others.get("comm")
    for coll in collectives:
        c = comm[comm["collective"] == coll] if not comm.empty else comm
        t = tests[tests["collective"] == coll] if not tests.empty else tests
        o = other_comm[other_comm["collective"] == coll] if other_comm is not None else None
        plots.append(
            Plot(
                home,
                f"busbw_{_safe(coll)}.png",
                f"{coll} busbw vs message size",
                _draw_busbw(coll, c, t, o),
                group=str(coll),
            )
        )
    gemm, other_gemm = by_kind.get("gemm", pd.DataFrame()), others.get("gemm")
    for model, part in gemm.groupby("model", sort=True) if not gemm.empty else []:
        mine = capped(part, "time_s")
        note = cap_note(len(mine), len(part), "slowest rows")
        theirs = other_gemm[other_gemm["model"] == model] if other_gemm is not None else None
        if theirs is not None:  # the other run's rows of the layers drawn, no more of them than of this run's
            theirs = capped(theirs[theirs["layer"].isin(set(mine["layer"]))], "time_s")
        passes = mine["pass"].nunique() if theirs is not None and not theirs.empty else 0
        plots.append(
            Plot(
                "gemm",
                f"gemm_tflops_{_safe(model)}.png",
                f"GEMM TFLOPS per layer and pass: {model}{note}",
                _draw_gemm(str(model), mine, theirs if passes else None, note),
                figsize=(9.0, 2.4 * passes + 1.2) if passes else (8, 4.5),
            )
        )
    attn = by_kind.get("attention", pd.DataFrame())
    plots += _attention_plots(attn, others.get("attention")) if not attn.empty else []
    ckpt = by_kind.get("ckpt", pd.DataFrame())
    if not ckpt.empty:
        plots.append(Plot("ckpt", "ckpt_bandwidth.png", "Checkpoint bandwidth per method", _draw_ckpt(ckpt)))
        phased = (
            ckpt[ckpt.get("save_writing_time", pd.Series(dtype=float)).notna()] if "save_writing_time" in ckpt else None
        )
        if phased is not None and not phased.empty:
            plots.append(Plot("ckpt", "ckpt_phases.png", "Checkpoint save time by phase", _draw_ckpt_phases(phased)))
    project = by_kind.get("project", pd.DataFrame())
    for model, part in project.groupby("model", sort=True) if not project.empty else []:
        best = capped(part, "rank" if _numbers(part, "rank").notna().any() else "step_time_s", largest=False)
        note = cap_note(len(best), len(part), "best layouts")
        height = max(3.0, 0.4 * len(best) + 1.5)
        plots.append(
            Plot(
                "project",
                f"project_{_safe(model)}.png",
                f"Projected step by layout: {model}{note}",
                _draw_project(best, note),
                figsize=(9.0, height),
            )
        )
    step = by_kind.get("step", pd.DataFrame())
    if not step.empty:
        plots.append(
            Plot("step", "step_items.png", "Training step from its trace: measured vs projected", _draw_step(step))
        )
    timeline = by_kind.get("step_timeline", pd.DataFrame())
    if not timeline.empty:
        bars = timeline_bars(timeline)
        steps = ", ".join(sorted({str(v) for v in timeline.get("step", pd.Series(dtype=str)).dropna()}))
        title = f"One step by stream and class{': ' + steps if steps else ''}"
        plots.append(
            Plot(
                "step_timeline",
                "step_timeline.png",
                title,
                _draw_timeline(bars, title),
                figsize=(10.0, max(2.5, 0.35 * len(bars) + 1.8)),
            )
        )
    for section in sections:
        if section.ok.empty:
            continue
        if section.kind.benchmark == "cluster_compute":
            plots += _compute_heatmaps(section)
        elif section.kind.benchmark == "cluster_pairs":
            plots += _pair_heatmaps(section)
    return cap_plots(plots, sections)


def cap_plots(plots: list[Plot], sections: Sequence[Section]) -> list[Plot]:
    """At most MAX_PLOTS per benchmark (3000 models are not 3000 PNGs); the section's notes say how many more."""
    kept: list[Plot] = []
    drawn: dict[str, int] = {}
    left: dict[str, int] = {}
    for plot in plots:
        if drawn.get(plot.kind, 0) >= MAX_PLOTS:
            left[plot.kind] = left.get(plot.kind, 0) + 1
        else:
            drawn[plot.kind] = drawn.get(plot.kind, 0) + 1
            kept.append(plot)
    for section in sections:
        if section.kind.benchmark in left:
            section.notes.append(
                f"{left[section.kind.benchmark]} more plot(s) not drawn: at most {MAX_PLOTS} per benchmark "
                "(the first in name order are drawn)."
            )
    return kept


MAX_PLOT_TEXT = 60  # characters of one line of a label, tick or title drawn from a CSV's names
MAX_PLOT_LINES = 4  # lines of one such text (a category label is a name and its varying extras)


def plot_text(value: object) -> str:
    """A text drawn into a plot, made inert: each line with credentials masked and control characters written out
    (``\\x01``: no glyph is missing, no escape reaches a viewer), cut to MAX_PLOT_TEXT characters, at most
    MAX_PLOT_LINES lines (a 5,000-character layout name collapsed the figure's layout)."""
    from .inert import one_line

    lines = str(value).split("\n")
    shown = [one_line(line) for line in lines[:MAX_PLOT_LINES]]
    shown = [t if len(t) <= MAX_PLOT_TEXT else t[: MAX_PLOT_TEXT - 1] + "…" for t in shown]
    return "\n".join(shown) + ("\n…" if len(lines) > MAX_PLOT_LINES else "")


def _inert_texts(fig: Any) -> None:
    """Every text of a drawn figure through ``plot_text``: titles, axis labels, legends, annotations, and the tick
    labels of named ticks (drawing makes the tick texts again from the axis' formatter: a FixedFormatter's list, or
    the FuncFormatter ``set_ticks(..., labels)`` makes), so those formatters are wrapped."""
    from matplotlib.text import Text
    from matplotlib.ticker import FixedFormatter, FuncFormatter

    def inert(formatter: Any) -> Any:
        if isinstance(formatter, FixedFormatter):
            return FixedFormatter([plot_text(t) for t in formatter.seq])
        if isinstance(formatter, FuncFormatter):  # stateless: one call per tick
            return FuncFormatter(lambda value, pos, inner=formatter: plot_text(inner(value, pos)))
        return formatter  # numbers only (Scalar, Log): opbench's own text

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            major, minor = axis.get_major_formatter(), axis.get_minor_formatter()
            if inert(major) is not major:
                axis.set_major_formatter(inert(major))
            if inert(minor) is not minor:
                axis.set_minor_formatter(inert(minor))
    for artist in fig.findobj(Text):
        text = artist.get_text()
        if text:
            artist.set_text(plot_text(text))


def render(plots: Sequence[Plot], out_dir: Path, notes: list[str] | None = None) -> tuple[list[Plot], dict[str, str]]:
    """Draw each plot to ``out_dir/<filename>``; returns the plots made and {filename: why not} for the rest. A
    warning the plotting library raises while drawing (a glyph no font has, a layout it could not make) reaches
    no console: they are counted into one line added to ``notes``."""
    if not plots:
        return [], {}
    try:
        from matplotlib import rc_context
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return [], {p.filename: PLOT_EXTRA_HINT for p in plots}
    made, missing = [], {}
    warned: dict[str, list[str]] = {}  # warning text -> plots it came from
    for plot in plots:
        fig = Figure(figsize=plot.figsize, layout="constrained")
        FigureCanvasAgg(fig)
        caught: list[warnings.WarningMessage] = []
        try:
            # Titles, labels and ticks hold names read from CSVs (a model called 'a$b$'): text between two '$'
            # would be read as math and fail. Every text in these plots is plain (axis formatters are opbench's).
            with rc_context({"text.parse_math": False}), warnings.catch_warnings(record=True) as recorded:
                caught = recorded
                warnings.simplefilter("always")
                plot.draw(fig)
                _inert_texts(fig)
                png = io.BytesIO()
                fig.savefig(png, format="png", dpi=100)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:  # odd data: not the report
            missing[plot.filename] = f"could not draw: {type(exc).__name__}: {exc}"
            continue
        finally:
            for w in caught:
                warned.setdefault(" ".join(str(w.message).split()), []).append(plot.filename)
        write_file(out_dir / plot.filename, png.getvalue())  # a folder or FIFO at that name: one line, no hang
        made.append(plot)
    if warned and notes is not None:
        (first, where), count = next(iter(warned.items())), sum(len(v) for v in warned.values())
        more = f"; and {len(warned) - 1} other kind(s)" if len(warned) > 1 else ""
        notes.append(
            f"matplotlib warned {count} time(s) while drawing the plots (first, in {where[0]}: {first[:120]}{more}); "
            "the plots were drawn"
        )
    return made, missing
