"""Plots that carry spread and ``report --compare``'s regression table (issue 26 item 7; docs/report.md).

Small result folders are written with the benchmarks' own CSV writer (CsvReport and their schemas), with times and
p10/p90 bands chosen so each rule has one case that meets it and one that does not. The regression table is read
back from report.md; the plots are drawn onto a matplotlib Figure and their bars, whiskers, hatching and lines are
compared with the CSV values.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from opbench.attention.schema import SCHEMA as ATTENTION
from opbench.comm.schema import SCHEMA as COMM
from opbench.core.results import CsvReport
from opbench.gemm.schema import SCHEMA as GEMM
from opbench.report.build import build_report

pytest.importorskip("matplotlib")

MNK = 256
FLOPS = 2 * MNK**3
# (layer, pass): this run's (time, p10, p90) and the other run's, in ms; None = no band recorded
GEMM_TIMES = {
    ("a", "fwd"): ((2.0, 1.9, 2.1), (1.0, 0.9, 1.1)),  # slower beyond both bands: 2x
    ("a", "dgrad"): ((1.0, 0.9, 1.1), (1.0, 0.9, 1.1)),  # same
    ("b", "fwd"): ((1.2, 0.8, 1.5), (1.1, 1.0, 1.2)),  # median slower, but the bands overlap: within
    ("c", "fwd"): ((0.5, 0.45, 0.55), (1.0, 0.9, 1.1)),  # faster beyond
    ("d", "fwd"): ((1.0, 0.9, 1.1), (3.0, None, None)),  # the other run has no band: not judged
    ("e", "fwd"): ((1.0, 0.9, 1.1), None),  # only in this run
}
NOISY = ("b", "fwd")
# size_bytes: this run's (time_us, trial min, trial max) and the other's
COMM_TIMES = {1024: ((150.0, 140.0, 160.0), (50.0, 48.0, 52.0)), 4096: ((60.0, 50.0, 70.0), (62.0, 55.0, 66.0))}


def gemm_rows(run: int) -> list[dict]:
    rows = []
    for (layer, pass_), runs in GEMM_TIMES.items():
        if runs[run] is None:
            continue
        t, p10, p90 = runs[run]
        rows.append(
            {
                **dict(model="m1", layer=layer, mbs=1, m=MNK, n=MNK, k=MNK, dtype="fp32", backend="torch"),
                **{"pass": pass_, "status": "ok", "time_s": t / 1e3, "tflops": FLOPS / (t / 1e3) / 1e12},
                "time_p10_s": None if p10 is None else p10 / 1e3,
                "time_p90_s": None if p90 is None else p90 / 1e3,
                "note": "noisy: IQR 40% of the median" if run == 0 and (layer, pass_) == NOISY else None,
            }
        )
    return rows


def comm_rows(run: int) -> list[dict]:
    return [
        {
            **dict(collective="all_reduce", backend="gloo", world_size=2, dtype="fp32", inplace=False, status="ok"),
            **{"size_bytes": size, "time_us": t[run][0], "time_us_trial_min": t[run][1]},
            **{"time_us_trial_max": t[run][2], "busbw_gbs": size / t[run][0] / 1e3},
        }
        for size, t in COMM_TIMES.items()
    ]


def attention_rows() -> list[dict]:
    """Models A and B at one length (bars), tiny at two (lines); two backends each."""
    shapes = [("A", 128), ("B", 128), ("tiny", 64), ("tiny", 128)]
    return [
        {
            **dict(model=model, batch_size=1, seqlen_q=seq, seqlen_kv=seq, num_head_q=4, num_head_kv=2),
            **dict(head_dim_qk=64, head_dim_v=64, causal=True, dtype="fp32", backend=backend, status="ok"),
            **{f"{p}_time": 1e-3 for p in ("fwd", "bwd")},
            **{f"{p}_time_p10": 0.8e-3 for p in ("fwd", "bwd")},
            **{f"{p}_time_p90": 1.25e-3 for p in ("fwd", "bwd")},
            **{f"{p}_tflops": 0.01 * (i + 1) + 0.001 * seq / 64 for p in ("fwd", "bwd")},
        }
        for i, backend in enumerate(("math", "sdpa"))
        for model, seq in shapes
    ]


def write(folder: Path, name: str, schema, rows: list[dict]) -> None:
    with CsvReport(folder / name, schema) as report:
        report.extend(rows)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    this, other = tmp_path_factory.mktemp("this"), tmp_path_factory.mktemp("other")
    for n, folder in enumerate((this, other)):
        write(folder, "benchmark_gemm_m1.csv", GEMM, gemm_rows(n))
        write(folder, "all_reduce_benchmark.csv", COMM, comm_rows(n))
    write(this, "attention_benchmark.csv", ATTENTION, attention_rows())
    return this, other


@pytest.fixture(scope="module")
def compared(runs, tmp_path_factory):
    built = build_report(runs[0], tmp_path_factory.mktemp("cmp"), compare=runs[1], plots=False)
    return built, built.path.read_text()


def drawn(built, filename: str):
    from matplotlib.figure import Figure

    plot = next(p for p in build_plots(built) if p.filename == filename)
    fig = Figure(figsize=plot.figsize, layout="constrained")
    plot.draw(fig)
    return fig


def build_plots(built):
    from opbench.report.plots import plan_plots

    return plan_plots(built.sections)


def bar_containers(ax):
    from matplotlib.container import BarContainer

    return [c for c in ax.containers if isinstance(c, BarContainer)]


# ---- the regression table -------------------------------------------------------------------------------------


def test_regression_table_opens_the_report_and_lists_only_rows_slower_beyond_their_spread(compared):
    built, text = compared
    assert text.index("## Regressions: slower beyond their spread") < text.index("## Environment")
    summary = re.search(
        r"Compared (\d+) timing\(s\) .*?: (\d+) slower .*?, (\d+) faster .*?, (\d+) within it; (\d+)", text
    )
    assert summary and [int(g) for g in summary.groups()] == [6, 2, 1, 3, 1]
    table = re.search(r"## Regressions.*?\n(\|.*?)\n\n", text, re.S).group(1).splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in table[2:]]
    assert [(r["benchmark"], r["pass"]) for r in rows] == [("Collectives", ""), ("GEMM", "fwd")]
    comm, gemm = rows
    assert "size_bytes=1024" in comm["row"] and float(comm["slower_x"]) == pytest.approx(3.0)
    assert (comm["spread_ms"], comm["spread_ms_other"], comm["band"]) == ("0.14–0.16", "0.048–0.052", "trial min–max")
    assert gemm["row"].startswith("m1 a") and float(gemm["slower_x"]) == pytest.approx(2.0)
    assert (float(gemm["median_ms"]), float(gemm["median_ms_other"])) == (2.0, 1.0)
    assert (gemm["spread_ms"], gemm["spread_ms_other"], gemm["band"]) == ("1.9–2.1", "0.9–1.1", "p10–p90")


def test_no_overlap_no_regression(runs, tmp_path):
    """A run compared with itself: everything within its spread, and the table says so."""
    built = build_report(runs[1], tmp_path, compare=runs[1], plots=False)
    assert built.regressions is not None and built.regressions.slower.empty
    assert "No regressions." in built.path.read_text()


# ---- plots ------------------------------------------------------------------------------------------------------


def test_gemm_bars_have_p10_p90_whiskers_and_noisy_bars_hatched(runs, tmp_path):
    built = build_report(runs[0], tmp_path)
    assert {p.filename for p in built.plots} == {
        "gemm_tflops_m1.png",
        "busbw_all_reduce.png",
        "attention_tflops.png",
        "attention_tflops_tiny.png",
    }
    for p in built.plots:
        data = (tmp_path / p.filename).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000
    fig = drawn(built, "gemm_tflops_m1.png")
    (ax,) = [a for a in fig.axes if a.patches]
    fwd = next(c for c in bar_containers(ax) if c.get_label() == "fwd")
    layers = [t.get_text() for t in ax.get_xticklabels()]
    assert layers == ["a", "b", "c", "d", "e"]
    for layer, bar, whisker in zip(layers, fwd.patches, fwd.errorbar.lines[2][0].get_segments()):
        t, p10, p90 = GEMM_TIMES[(layer, "fwd")][0]
        tflops = FLOPS / (t / 1e3) / 1e12
        assert bar.get_height() == pytest.approx(tflops)
        low, high = sorted(y for _, y in whisker)
        assert (low, high) == (pytest.approx(tflops * t / p90), pytest.approx(tflops * t / p10))
        assert (bar.get_hatch() == "///") == ((layer, "fwd") == NOISY)
    assert "noisy" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_compare_draws_both_runs_side_by_side(compared):
    built, _ = compared
    fig = drawn(built, "gemm_tflops_m1.png")
    panels = [a for a in fig.axes if a.patches]
    assert len(panels) == 2  # fwd, dgrad
    mine, theirs = bar_containers(panels[0])
    assert (mine.get_label(), theirs.get_label()) == ("fwd this run", "fwd other run")
    other_ms = [GEMM_TIMES[(layer, "fwd")][1] for layer in "abcde"]
    for bar, times in zip(theirs.patches, other_ms):
        want = math.nan if times is None else FLOPS / (times[0] / 1e3) / 1e12
        assert bar.get_height() == pytest.approx(want, nan_ok=True)
        assert bar.get_alpha() < 1  # the other run is the faded one
    assert all(b.get_alpha() in (None, 1) for b in mine.patches)

    ax = drawn(built, "busbw_all_reduce.png").axes[0]
    assert ax.get_legend_handles_labels()[1] == ["opbench gloo out-of-place", "opbench gloo out-of-place (other run)"]
    (band,) = ax.collections[:1]  # this run's trial band, shaded
    ys = band.get_paths()[0].vertices[:, 1]
    for size, ((t, fast, slow), _) in COMM_TIMES.items():  # busbw at the slowest and the fastest trial
        busbw = size / t / 1e3
        for end in (busbw * t / slow, busbw * t / fast):
            assert min(abs(ys - end)) < 1e-6 * end


def test_attention_one_length_is_bars_several_lengths_are_lines(runs, tmp_path):
    built = build_report(runs[0], tmp_path, plots=False)
    names = [p.filename for p in build_plots(built) if p.kind == "attention"]
    assert names == ["attention_tflops_tiny.png", "attention_tflops.png"]  # not one plot per model
    fig = drawn(built, "attention_tflops.png")
    panels = [a for a in fig.axes if a.patches]
    assert [a.get_title() for a in panels] == ["fwd", "bwd"]
    widths = {c.get_label(): [round(b.get_width(), 6) for b in c.patches] for c in bar_containers(panels[0])}
    assert widths == {"math": [0.012, 0.012], "sdpa": [0.022, 0.022]}  # models A and B, one bar per backend
    lines = drawn(built, "attention_tflops_tiny.png")
    xs = {tuple(line.get_xdata()) for a in lines.axes for line in a.get_lines() if len(line.get_xdata()) > 1}
    assert xs == {(64, 128)}
