"""PNG plots for the report (matplotlib, the optional ``plot`` extra, imported only when drawing).

Plots are planned from the report's sections without matplotlib, so a report written without it can still
name every plot it could not make. Drawing uses the Agg canvas on a fresh ``Figure`` (no pyplot state, no
display needed).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from opbench.core.units import human_bytes

from .tables import Section

PLOT_EXTRA_HINT = "matplotlib is not installed (pip install 'opbench[plot]')"
PASS_ORDER = ("fwd", "dgrad", "wgrad")


@dataclass
class Plot:
    kind: str
    filename: str
    title: str
    draw: Callable[[Any], None]  # draws onto a matplotlib Figure
    group: str | None = None  # the split table it belongs under (a collective), None = after the tables


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
        extra = _varying(
            frame, ("model", "storage_kind", "world_size", "thread_count", "single_file_per_rank", "drop_cache")
        )
        labels = frame.apply(lambda r: " ".join([str(r["method"]), *[f"{c}={r[c]}" for c in extra]]), axis=1)
        x = range(len(frame))
        ax.bar([i - 0.2 for i in x], frame["save_bandwidth_in_mbps"], 0.4, label="save")
        ax.bar([i + 0.2 for i in x], frame["load_bandwidth_in_mbps"], 0.4, label="load")
        ax.set_xticks(list(x), list(labels), rotation=20 if len(frame) > 4 else 0, fontsize="small")
        ax.set_ylabel("MiB/s")
        ax.set_title("Checkpoint bandwidth per method")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend()

    return draw


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
        fig = Figure(figsize=(8, 4.5), layout="constrained")
        FigureCanvasAgg(fig)
        try:
            plot.draw(fig)
            fig.savefig(out_dir / plot.filename, dpi=100)
        except (ValueError, TypeError, KeyError) as exc:  # odd data must not cost the whole report
            missing[plot.filename] = f"could not draw: {type(exc).__name__}: {exc}"
            continue
        made.append(plot)
    return made, missing
