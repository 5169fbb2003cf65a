"""PNG plots for the report (matplotlib, the optional ``plot`` extra, imported only when drawing).

Plots are planned from the report's sections without matplotlib, so a report written without it can still
name every plot it could not make. Drawing uses the Agg canvas on a fresh ``Figure`` (no pyplot state, no
display needed).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from opbench.core.units import human_bytes

from .tables import Section, cell

PLOT_EXTRA_HINT = "matplotlib is not installed (pip install 'opbench[plot]')"
PASS_ORDER = ("fwd", "dgrad", "wgrad")


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


def _varying(frame: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    return [c for c in columns if c in frame and frame[c].nunique(dropna=True) > 1]


def _size_axis(ax: Any) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: human_bytes(v)))
    ax.grid(True, which="major", alpha=0.3)


# ---- collectives: busbw vs size ----------------------------------------------------------------------------


def _busbw_lines(comm: pd.DataFrame, tests: pd.DataFrame) -> list[tuple[str, pd.Series, pd.Series, str]]:
    """(label, x, y, linestyle) per opbench variant and per nccl-tests block."""
    lines = []
    group_cols = [c for c in ("backend", "world_size", "nnodes", "dtype", "source", "inplace") if c in comm]
    shown = [c for c in _varying(comm, group_cols) if c != "inplace"]
    for _, part in comm.groupby(group_cols, sort=True, dropna=False) if not comm.empty else []:
        row = part.iloc[0]
        variant = "in-place" if bool(row["inplace"]) else "out-of-place"
        name = " ".join(["opbench", str(row["backend"]), *[str(row[c]) for c in shown if c != "backend"], variant])
        part = part.sort_values("size_bytes")
        lines.append((name, part["size_bytes"], part["busbw_gbs"], "-"))
    if not tests.empty:
        t_cols = _varying(tests, ("type", "nranks", "redop"))
        for _, part in tests.groupby(t_cols, sort=True, dropna=False) if t_cols else [((), tests)]:
            part = part.sort_values("size_bytes")
            extra = _label(part.iloc[0], t_cols)
            for block, variant in (("oop", "out-of-place"), ("ip", "in-place")):
                y = part[f"{block}_busbw_gbs"]
                if y.notna().any():
                    lines.append(
                        (" ".join(p for p in ("nccl/rccl-tests", extra, variant) if p), part["size_bytes"], y, "--")
                    )
    return lines


def _draw_busbw(collective: str, comm: pd.DataFrame, tests: pd.DataFrame) -> Callable[[Any], None]:
    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        for label, x, y, style in _busbw_lines(comm, tests):
            ax.plot(x, y, style, marker="o", markersize=3, label=label)
        _size_axis(ax)
        ax.set_xlabel("message size (nccl-tests -b, bytes per rank)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{collective}: bus bandwidth vs message size")
        ax.legend(fontsize="small")

    return draw


# ---- GEMM: TFLOPS per layer and pass -----------------------------------------------------------------------


def _draw_gemm(model: str, frame: pd.DataFrame) -> Callable[[Any], None]:
    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        extra = _varying(frame, ("mbs", "backend", "dtype", "tp", "ep", "cp"))
        cats = frame.assign(
            _x=frame["layer"].astype(str) + frame.apply(lambda r: ("\n" + _label(r, extra)) if extra else "", axis=1)
        )
        xs = list(dict.fromkeys(cats["_x"]))
        passes = [p for p in PASS_ORDER if p in set(cats["pass"])] + sorted(set(cats["pass"]) - set(PASS_ORDER))
        width = 0.8 / max(1, len(passes))
        for i, p in enumerate(passes):
            vals = cats[cats["pass"] == p].groupby("_x")["tflops"].median()
            ax.bar(
                [j + (i - (len(passes) - 1) / 2) * width for j in range(len(xs))],
                [vals.get(x, float("nan")) for x in xs],
                width,
                label=p,
            )
        ax.set_xticks(
            range(len(xs)),
            xs,
            rotation=30 if len(xs) > 6 else 0,
            ha="right" if len(xs) > 6 else "center",
            fontsize="small",
        )
        ax.set_ylabel("TFLOPS")
        ax.set_title(f"GEMM TFLOPS per layer and pass: {model}")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(title="pass")

    return draw


# ---- attention: TFLOPS vs sequence length ------------------------------------------------------------------


def _draw_attention(model: str, frame: pd.DataFrame) -> Callable[[Any], None]:
    def draw(fig: Any) -> None:
        from matplotlib.ticker import FuncFormatter

        passes = [p for p in ("fwd", "bwd") if f"{p}_tflops" in frame and frame[f"{p}_tflops"].notna().any()]
        extra = _varying(frame, ("batch_size", "heads q/kv", "head_dim qk/v", "causal", "dtype", "tp", "cp"))
        axes = fig.subplots(1, max(1, len(passes)), sharey=True, squeeze=False)[0]
        for ax, p in zip(axes, passes):
            for key, part in frame.groupby(["backend", *extra], sort=True):
                points = part.groupby("seqlen_q")[f"{p}_tflops"].median()  # repeated shapes: one point
                label = " ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
                ax.plot(points.index, points.values, marker="o", label=label)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
            ax.set_xlabel("seqlen_q")
            ax.set_title(p)
            ax.grid(True, alpha=0.3)
        axes[0].set_ylabel("TFLOPS")
        axes[-1].legend(fontsize="small")
        fig.suptitle(f"Attention TFLOPS vs sequence length: {model}")

    return draw


# ---- checkpoint: bandwidth per method ----------------------------------------------------------------------


def _draw_ckpt(frame: pd.DataFrame) -> Callable[[Any], None]:
    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        labels = _ckpt_labels(frame)
        x = range(len(frame))
        ax.bar([i - 0.2 for i in x], frame["save_bandwidth_in_mbps"], 0.4, label="save")
        ax.bar([i + 0.2 for i in x], frame["load_bandwidth_in_mbps"], 0.4, label="load")
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
            values = pd.to_numeric(frame.get(f"save_{phase}_time"), errors="coerce").fillna(0.0)
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
    ("bubble_s", "pipeline bubble"),
    ("optimizer_s", "optimizer"),
)


def _draw_project(frame: pd.DataFrame) -> Callable[[Any], None]:
    """One stacked bar per projected layout: where its step's time goes."""
    frame = frame.sort_values("rank") if "rank" in frame and frame["rank"].notna().any() else frame

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        y = list(range(len(frame)))
        left = pd.Series(0.0, index=frame.index)
        for col, label in PROJECT_PARTS:
            values = pd.to_numeric(frame.get(col), errors="coerce").fillna(0.0).clip(lower=0.0)
            if values.any():
                ax.barh(y, values, left=left, label=label)
                left = left + values
        ax.set_yticks(y, [str(v) for v in frame["layout"]], fontsize="small")
        ax.invert_yaxis()
        ax.set_xlabel("seconds per step")
        ax.set_title("Projected step time by layout")
        ax.grid(True, axis="x", alpha=0.3)
        fig.legend(loc="outside lower center", ncols=4, fontsize="small")

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
    tests = by_kind.get("nccl_tests", pd.DataFrame())
    plots: list[Plot] = []
    comm = by_kind.get("comm", pd.DataFrame())
    collectives = sorted(set(comm.get("collective", [])) | set(tests.get("collective", [])))
    home = "comm" if not comm.empty else "nccl_tests"  # without opbench rows the plot goes with nccl-tests
    for coll in collectives:
        c = comm[comm["collective"] == coll] if not comm.empty else comm
        t = tests[tests["collective"] == coll] if not tests.empty else tests
        plots.append(
            Plot(
                home,
                f"busbw_{_safe(coll)}.png",
                f"{coll} busbw vs message size",
                _draw_busbw(coll, c, t),
                group=str(coll),
            )
        )
    gemm = by_kind.get("gemm", pd.DataFrame())
    for model, part in gemm.groupby("model", sort=True) if not gemm.empty else []:
        plots.append(
            Plot(
                "gemm",
                f"gemm_tflops_{_safe(model)}.png",
                f"GEMM TFLOPS per layer and pass: {model}",
                _draw_gemm(str(model), part),
            )
        )
    attn = by_kind.get("attention", pd.DataFrame())
    for model, part in attn.groupby("model", sort=True) if not attn.empty else []:
        plots.append(
            Plot(
                "attention",
                f"attention_tflops_{_safe(model)}.png",
                f"Attention TFLOPS vs sequence length: {model}",
                _draw_attention(str(model), part),
            )
        )
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
        height = max(3.0, 0.4 * len(part) + 1.5)
        plots.append(
            Plot(
                "project",
                f"project_{_safe(model)}.png",
                f"Projected step by layout: {model}",
                _draw_project(part),
                figsize=(9.0, height),
            )
        )
    for section in sections:
        if section.ok.empty:
            continue
        if section.kind.benchmark == "cluster_compute":
            plots += _compute_heatmaps(section)
        elif section.kind.benchmark == "cluster_pairs":
            plots += _pair_heatmaps(section)
    return plots


def render(plots: Sequence[Plot], out_dir: Path) -> tuple[list[Plot], dict[str, str]]:
    """Draw each plot to ``out_dir/<filename>``; returns the plots made and {filename: why not} for the rest."""
    if not plots:
        return [], {}
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return [], {p.filename: PLOT_EXTRA_HINT for p in plots}
    made, missing = [], {}
    for plot in plots:
        fig = Figure(figsize=plot.figsize, layout="constrained")
        FigureCanvasAgg(fig)
        try:
            plot.draw(fig)
            fig.savefig(out_dir / plot.filename, dpi=100)
        except (ValueError, TypeError, KeyError) as exc:  # odd data must not cost the whole report
            missing[plot.filename] = f"could not draw: {type(exc).__name__}: {exc}"
            continue
        made.append(plot)
    return made, missing
