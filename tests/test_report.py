"""opbench report on a results folder built from real small benchmark runs.

The GEMM, attention and FSDP-model CLIs run in this process (their real ``main``), the collective and
checkpoint benchmarks under torchrun with 2 gloo ranks, the NCCL-log and nccl-tests parsers on text in the
documented formats (there is no GPU here to run nccl-tests or NCCL itself). The report's tables are parsed back and compared with the CSVs.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from opbench.core.errors import run_cli
from opbench.report.__main__ import main as report_main
from opbench.report.build import build_report

ROOT = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
COMM_SIZES = (1024, 4096, 16384)

# nccl-tests v2.13+ table (docs/conventions.md, "Collectives: sizes, counts and bus bandwidth") for the comm run's all_reduce sizes; the numbers are made up.
NCCL_TESTS_OUTPUT = """\
# nThread 1 nGpus 2 minBytes 1024 maxBytes 16384 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           256     float     sum      -1    10.50    0.10    0.10      0    10.20    0.11    0.11      0
        4096          1024     float     sum      -1    10.80    0.38    0.38      0    10.60    0.39    0.39      0
       16384          4096     float     sum      -1    11.90    1.38    1.38      0    11.70    1.40    1.40      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.6267
"""

# NCCL_DEBUG=INFO COLL lines in the documented format (docs/conventions.md, "NCCL debug-log lines"): 2 ranks' AllGather, one ReduceScatter.
NCCL_LOG = """\
node1:1234:1300 [0] NCCL INFO AllGather: opCount 0 sendbuff 0x7f00 recvbuff 0x7f10 count 1966368 datatype 9 op 0 \
root 0 comm 0x55aa00 [nranks=8] stream 0x55bb00
node1:1235:1301 [1] NCCL INFO AllGather: opCount 0 sendbuff 0x7f00 recvbuff 0x7f10 count 1966368 datatype 9 op 0 \
root 0 comm 0x55aa10 [nranks=8] stream 0x55bb00
node1:1234:1300 [0] NCCL INFO ReduceScatter: opCount 1 sendbuff 0x7f00 recvbuff 0x7f10 count 1966368 datatype 7 \
op 4 root 0 comm 0x55aa00 [nranks=8] stream 0x55bb00
"""

ATTENTION_SHAPES = """[
 {"model": "tiny", "seqlen_q": 32, "seqlen_kv": 32, "num_head_q": 2, "num_head_kv": 1, "head_dim_qk": 32,
  "head_dim_v": 32, "causal": true},
 {"model": "tiny", "seqlen_q": 64, "seqlen_kv": 64, "num_head_q": 2, "num_head_kv": 1, "head_dim_qk": 32,
  "head_dim_v": 32, "causal": true}
]"""


def run_gemm(out: Path) -> None:
    from opbench.gemm.__main__ import main

    assert (
        main(
            [
                "--model",
                "Qwen3_0.6B",
                "--seqlen",
                "16",
                "--layers",
                "qkv,attn_out",
                "--backends",
                "torch,fp8",
                "--cache",
                "warm",
                "--quick",
                "--device",
                "cpu",
                "--report-dir-path",
                str(out),
            ]
        )
        == 0
    )


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """A results folder as a user would have it after a small run of each benchmark (plus one foreign CSV)."""
    from opbench.attention.__main__ import main as attention_main
    from opbench.fsdp_model.__main__ import main as fsdp_main
    from opbench.trace.__main__ import main as trace_main
    from opbench.trace.nccl_tests import main as nccl_tests_main

    res = tmp_path_factory.mktemp("results")
    launched = [  # torchrun jobs, in the background while the single-process benchmarks run
        [
            "comm",
            "--nproc-per-node",
            "2",
            "--collectives",
            "all_reduce,all_gather",
            "-b",
            "1K",
            "-e",
            "16K",
            "-f",
            "4",
            "-w",
            "1",
            "-n",
            "3",
            "--report-dir-path",
            str(res / "comm"),
        ],
        [
            "ckpt",
            "--nproc-per-node",
            "2",
            "--size-mb",
            "4",
            "--iterations",
            "1",
            "--methods",
            "torch_save,dcp",
            "--storage",
            str(res.parent / "ckpt_data"),
            "--report-dir-path",
            str(res / "ckpt"),
        ],
    ]
    jobs = [
        subprocess.Popen(
            [sys.executable, "-m", "opbench", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        for args in launched
    ]
    try:
        run_gemm(res)
        shapes = res.parent / "attention_shapes.json"
        shapes.write_text(ATTENTION_SHAPES)
        assert (
            attention_main(
                [
                    "--shapes-json-path",
                    str(shapes),
                    "--backends",
                    "math,sdpa,flash_attn",
                    "--quick",
                    "--device",
                    "cpu",
                    "--report-csv-path",
                    str(res / "attn_tiny.csv"),
                ]
            )
            == 0
        )
        log = res.parent / "all_reduce_perf.out"
        log.write_text(NCCL_TESTS_OUTPUT)
        assert nccl_tests_main([str(log), "--csv", str(res / "nccl_tests.csv")]) == 0
        assert fsdp_main(["--model", "Qwen3_0.6B", "--world-size", "4", "--csv", str(res / "fsdp_qwen.csv")]) == 0
        log = res.parent / "nccl.log"
        log.write_text(NCCL_LOG)
        assert trace_main([str(log), "--csv", str(res / "trace" / "sizes.csv")]) == 0
        (res / "notes.csv").write_text("a,b\n1,2\n")
        for job in jobs:
            output, _ = job.communicate(timeout=300)
            assert job.returncode == 0, output[-3000:]
    finally:
        for job in jobs:
            job.kill()
    return res


@pytest.fixture(scope="module")
def report(results, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    built = build_report(results, out, top=None)
    return built, built.path.read_text()


# ---- reading report.md back ---------------------------------------------------------------------------------


def md_tables(text: str) -> dict[str, list[pd.DataFrame]]:
    """{heading: [tables under it]} where heading is the nearest '## ' or '### ' line above a table."""
    found: dict[str, list[pd.DataFrame]] = {}
    heading, block = "", []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if block:
            header, rows = block[0], [r for r in block[2:]]
            found.setdefault(heading, []).append(pd.DataFrame(rows, columns=header))
            block = []
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
    return found


def section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no section {title!r}"
    return match.group(0)


def ok_rows(path: Path) -> pd.DataFrame:
    frame = pd.read_csv(path)
    return frame[frame["status"] == "ok"]


def one(frame: pd.DataFrame, **equal) -> pd.Series:
    """The single CSV row with these column values."""
    rows = frame[(frame[list(equal)] == pd.Series(equal)).all(axis=1)]
    assert len(rows) == 1, equal
    return rows.iloc[0]


def shown_and_csv(text: str, title: str, csv: Path, rows: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The first table of a section and the CSV's ok rows, which must be as many."""
    table, ok = md_tables(section(text, title))[title][0], ok_rows(csv)
    assert len(table) == len(ok) == rows
    return table, ok


def close(shown: str, value: float) -> bool:
    return math.isclose(float(shown), value, rel_tol=1e-3, abs_tol=1e-12)


# ---- tables -------------------------------------------------------------------------------------------------


def test_gemm_table_matches_csv_least_efficient_first(results, report):
    table, ok = shown_and_csv(report[1], "GEMM", results / "benchmark_gemm_Qwen3_0.6B.csv", 6)
    for _, row in table.iterrows():
        src = one(ok, layer=row["layer"], **{"pass": row["pass"]}, backend=row["backend"])
        assert close(row["tflops"], src["tflops"]) and close(row["time_ms"], src["time_s"] * 1e3)
        assert (int(row["m"]), int(row["n"]), int(row["k"])) == tuple(src[["m", "n", "k"]])
        assert row["pct_of_peak"] == ""  # no CPU peak: an empty cell, not a zero
    shown = [float(v) for v in table["tflops"]]
    assert shown == sorted(shown)  # no peak known on CPU: least TFLOPS first


def test_failed_rows_are_listed_with_their_error(results, report):
    _, text = report
    csv = pd.read_csv(results / "benchmark_gemm_Qwen3_0.6B.csv")
    bad = csv[csv["status"] != "ok"]
    assert len(bad) == 6 and set(bad["backend"]) == {"fp8"}
    gemm = section(text, "GEMM")
    assert "### Rows not measured (6: unsupported: 6)" in gemm
    failed = md_tables(gemm)["Rows not measured (6: unsupported: 6)"][0]
    assert sorted(zip(failed["layer"], failed["pass"])) == sorted(zip(bad["layer"], bad["pass"]))
    assert set(failed["error"]) == set(bad["error"])
    attention = section(text, "Attention")
    failed = next(t for h, ts in md_tables(attention).items() if h.startswith("Rows not measured") for t in ts)
    assert set(failed["backend"]) == {"flash_attn"} and (failed["status"] == "unsupported").all()
    assert all(e for e in failed["error"])


def test_attention_table_matches_csv(results, report):
    table, ok = shown_and_csv(report[1], "Attention", results / "attn_tiny.csv", 4)
    for _, row in table.iterrows():
        seq_q, seq_kv = (int(x) for x in row["seqlen q/kv"].split("/"))
        src = one(ok, seqlen_q=seq_q, seqlen_kv=seq_kv, backend=row["backend"])
        assert close(row["fwd_tflops"], src["fwd_tflops"]) and close(row["bwd_tflops"], src["bwd_tflops"])
        assert close(row["bwd_ms"], src["bwd_time"] * 1e3)
        assert row["heads q/kv"] == "2/1"


def test_comm_table_has_busbw_and_nccl_tests_beside_it(results, report):
    _, text = report
    tables = md_tables(section(text, "Collectives"))
    tests = pd.read_csv(results / "nccl_tests.csv")
    for coll in ("all_reduce", "all_gather"):
        ok = ok_rows(results / "comm" / f"{coll}_benchmark.csv")
        table = tables[coll][0]
        assert len(table) == len(ok) and set(ok["size_bytes"]) == set(COMM_SIZES)
        for _, row in table.iterrows():
            src = ok[(ok["size_bytes"] == int(row["size_bytes"])) & (ok["inplace"].astype(str) == row["inplace"])]
            assert len(src) == 1
            assert close(row["busbw_gbs"], src["busbw_gbs"].iloc[0])
            if coll == "all_reduce":  # the nccl-tests output only has all_reduce: matched on collective + size
                ref = tests[tests["size_bytes"] == int(row["size_bytes"])]
                col = "ip_busbw_gbs" if row["inplace"] == "True" else "oop_busbw_gbs"
                assert close(row["tests_busbw_gbs"], ref[col].iloc[0])
                assert close(row["busbw_vs_tests"], src["busbw_gbs"].iloc[0] / ref[col].iloc[0])
        assert ("tests_busbw_gbs" in table) == (coll == "all_reduce")


def test_fsdp_rows_collapse_identical_layers_and_sum_per_step(results, report):
    fsdp = section(report[1], "FSDP collectives")
    csv = pd.read_csv(results / "fsdp_qwen.csv")
    tables = md_tables(fsdp)
    units = tables["FSDP collectives"][0]
    layers = csv[csv["unit"].str.startswith("layers.")]
    assert len(units) == 4 and set(units["unit"]) == {"root", f"layers.0-{layers['unit'].nunique() - 1}"}
    for _, row in units.iterrows():
        unit = "root" if row["unit"] == "root" else "layers.0"
        src = one(csv, unit=unit, collective=row["collective"])
        for col in ("count", "bytes_per_rank", "nccl_tests_bytes", "calls_per_step"):
            assert int(row[col]) == src[col]
        share = csv[(csv["collective"] == row["collective"]) & ((csv["unit"] == "root") == (unit == "root"))]
        assert int(row["bytes_per_step"]) == share["bytes_per_step"].sum()
    totals = tables["Per training step"][0]
    for _, row in totals.iterrows():
        rows = csv[csv["collective"] == row["collective"]]
        assert int(row["calls_per_step"]) == rows["calls_per_step"].sum()
        assert int(row["bytes_per_step"]) == rows["bytes_per_step"].sum()


def test_trace_summary_most_bytes_first(results, report):
    table = md_tables(section(report[1], "NCCL trace summary"))["NCCL trace summary"][0]
    csv = pd.read_csv(results / "trace" / "sizes.csv")
    assert list(table["op"]) == list(csv.sort_values("total_bytes", ascending=False, kind="stable")["op"])
    for _, row in table.iterrows():
        src = one(csv, op=row["op"])
        assert (int(row["calls"]), int(row["nccl_tests_bytes"])) == (src["calls"], src["nccl_tests_bytes"])


def test_checkpoint_slowest_save_first(results, report):
    table, ok = shown_and_csv(report[1], "Checkpoint", results / "ckpt" / "ckpt_benchmark.csv", 3)  # raw too
    shown = [float(v) for v in table["save_bandwidth_mib_per_s"]]
    assert shown == pytest.approx(sorted(ok["save_bandwidth_mib_per_s"]), rel=1e-3)  # table shows 4 digits
    for _, row in table.iterrows():
        src = one(ok, method=row["method"])
        for col in ("save_total_time", "load_time", "save_bandwidth_mib_per_s", "load_bandwidth_mib_per_s"):
            assert close(row[col], src[col])
        assert row["verified"] == "True"
        assert close(row["pct_of_raw_save"], src["pct_of_raw_save"])


def test_environment_and_skipped_files(results, report):
    built, text = report
    env = md_tables(section(text, "Environment"))["Environment"][0]
    meta_device = pd.read_json(results / "benchmark_gemm_Qwen3_0.6B.meta.json", typ="series")["device_name"]
    gemm_row = env[env["file"] == "benchmark_gemm_Qwen3_0.6B.csv"].iloc[0]
    assert gemm_row["device"] == meta_device and gemm_row["benchmark"] == "GEMM"
    assert set(env["file"]) == {
        "benchmark_gemm_Qwen3_0.6B.csv",
        "attn_tiny.csv",
        "nccl_tests.csv",
        "fsdp_qwen.csv",
        "trace/sizes.csv",
        "comm/all_reduce_benchmark.csv",
        "comm/all_gather_benchmark.csv",
        "ckpt/ckpt_benchmark.csv",
    }
    assert "-b 1K -e 16K -f 4" in section(text, "Environment")  # the comm run's command line, from its sidecar
    assert "- `notes.csv`: columns match no opbench benchmark" in section(text, "Skipped files")
    assert {f.kind.benchmark for f in built.found.files} == {
        "gemm",
        "attention",
        "comm",
        "nccl_tests",
        "fsdp",
        "trace",
        "ckpt",
    }


# ---- plots --------------------------------------------------------------------------------------------------


def test_plots_are_real_images_and_linked(report):
    import matplotlib.image

    built, text = report
    names = {p.filename for p in built.plots}
    assert names == {
        "busbw_all_reduce.png",
        "busbw_all_gather.png",
        "gemm_tflops_Qwen3_0.6B.png",
        "attention_tflops_tiny.png",
        "ckpt_bandwidth.png",
        "ckpt_phases.png",
    }
    assert not built.missing
    for name in names:
        path = built.path.parent / name
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
        image = matplotlib.image.imread(path)
        assert image.shape[0] >= 300 and image.shape[1] >= 500
        assert image[..., :3].std() > 0.05  # not a blank canvas
        assert f"]({name})" in text


def test_without_matplotlib_the_report_names_missing_plots(results, tmp_path, monkeypatch):
    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    built = build_report(results, tmp_path)
    text = built.path.read_text()
    assert not list(tmp_path.glob("*.png")) and not built.plots
    assert set(built.missing) == {
        "busbw_all_reduce.png",
        "busbw_all_gather.png",
        "gemm_tflops_Qwen3_0.6B.png",
        "attention_tflops_tiny.png",
        "ckpt_bandwidth.png",
        "ckpt_phases.png",
    }
    missing = section(text, "Plots not made")
    for name in built.missing:
        assert f"- `{name}`" in missing and "pip install 'opbench\\[plot\\]'" in missing  # escaped: inert.text
    assert "![" not in text
    assert md_tables(section(text, "GEMM"))["GEMM"][0].shape[0] == 6  # the tables are still there


# ---- --compare ----------------------------------------------------------------------------------------------


def test_compare_adds_ratio_this_over_other(results, tmp_path, capsys):
    before = tmp_path / "before"
    run_gemm(before)  # a second real run: the "other" side
    out = tmp_path / "cmp"
    assert run_cli(report_main, [str(results), "--out", str(out), "--compare", str(before), "--no-plots"]) == 0
    assert "report.md" in capsys.readouterr().out
    text = (out / "report.md").read_text()
    this = ok_rows(results / "benchmark_gemm_Qwen3_0.6B.csv")
    other = ok_rows(before / "benchmark_gemm_Qwen3_0.6B.csv")
    table = md_tables(section(text, "GEMM"))["GEMM"][0]
    assert len(table) == 6
    for _, row in table.iterrows():
        pick = {"layer": row["layer"], "pass": row["pass"]}
        t, o = one(this, **pick)["tflops"], one(other, **pick)["tflops"]
        assert close(row["tflops_other"], o)
        assert close(row["tflops_ratio"], t / o)
    assert "The other run has no results of this kind to compare with." in section(text, "Attention")
    assert "## Environment of the compared run" in text


def test_compare_with_itself_warns(results, tmp_path, capsys):
    alias = tmp_path / "same"
    alias.symlink_to(results)  # another spelling of the same folder
    assert (
        run_cli(report_main, [str(results), "--out", str(tmp_path / "o"), "--compare", str(alias), "--no-plots"]) == 0
    )
    err = capsys.readouterr().err
    assert f"warning: --compare {alias} is RESULTS_DIR itself: every ratio is 1" in err


# ---- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["missing", "empty", "foreign"])
def test_nothing_to_report_is_a_usage_error(tmp_path, capsys, case):
    res = tmp_path / "res"
    if case != "missing":
        res.mkdir()
    if case == "foreign":
        (res / "x.csv").write_text("a,b\n1,2\n")
    assert run_cli(report_main, [str(res), "--out", str(tmp_path / "out")], prog="opbench report") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"opbench report: error: {res}: ")
    assert {"missing": "does not exist", "empty": "no CSV files", "foreign": "none from opbench"}[case] in err


def test_cli_entry_point_runs(results, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "opbench", "report", str(results), "--out", str(tmp_path), "--top", "3", "--no-plots"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "report.md").read_text()
    assert "… 3 more row(s) in the CSV" in section(text, "GEMM")  # 6 ok rows, 3 shown
    assert importlib.util.find_spec("opbench.report.__main__") is not None


def test_interrupted_run_with_header_only_is_reported_not_dropped(tmp_path, capsys):
    from opbench.core.results import CsvReport
    from opbench.gemm.schema import SCHEMA

    CsvReport(tmp_path / "res" / "benchmark_gemm_X.csv", SCHEMA).close()  # what a run killed at once leaves
    built = build_report(tmp_path / "res", tmp_path / "out")
    gemm = section(built.path.read_text(), "GEMM")
    assert "`benchmark_gemm_X.csv`" in gemm and "No successful rows." in gemm
    assert not built.plots and not built.missing
    assert run_cli(report_main, [str(tmp_path / "res"), "--out", str(tmp_path / "out2"), "--no-plots"]) == 0
    assert "warning: benchmark_gemm_X.csv: no rows" in capsys.readouterr().err  # said, not just an empty section


# ---- opbench cluster ---------------------------------------------------------------------------------------


def test_cluster_folder_gets_its_sections_and_heatmaps(tmp_path):
    """A hand-written ``opbench cluster`` folder (2 nodes × 2 GPUs, node1's GPU 1 failed its GEMM): every CSV
    kind gets its section, and the GPU and pair heatmaps are drawn and linked under their tables."""
    from opbench.cluster import schema as cluster
    from opbench.core.results import CsvReport

    gpus = [
        {"host": f"h{n}", "node": f"node{n}", "rank": 2 * n + g, "local_rank": g, "device_name": "GPU X"}
        for n in (0, 1)
        for g in (0, 1)
    ]
    gemm = {"gemm": "square_4096", "m": 4096, "n": 4096, "k": 4096, "dtype": "bf16"}
    pair = {"size_bytes": 1 << 20, "gbs_per_gpu": 40.0, "status": "ok"}
    rows = {
        "compute": [{**g, **gemm, "time_s": 1e-4, "tflops": 600.0 + g["rank"], "status": "ok"} for g in gpus[:3]]
        + [{**gpus[3], **gemm, "status": "error", "error": "CUDA error: ECC"}],
        "memory": [{**g, "kernel": "copy", "size_bytes": 1 << 30, "gbs": 3000.0, "status": "ok"} for g in gpus],
        "telemetry": [{**g, "phase": "before", "source": "nvml", "sm_clock_mhz": 1980.0} for g in gpus],
        "comm": [
            {
                "scope": "intra",
                "group": f"node{n}",
                "collective": "all_reduce",
                "size_bytes": 1 << 20,
                "busbw_gbs": 200.0,
                "status": "ok",
            }
            for n in (0, 1)
        ],
        "pairs": [{"scope": "inter", "src": f"node{n}", "dst": f"node{1 - n}", **pair} for n in (0, 1)]
        + [{"scope": "gpu", "src": f"node{n}:{g}", "dst": f"node{n}:{1 - g}", **pair} for n in (0, 1) for g in (0, 1)],
    }
    for kind, schema in cluster.SCHEMAS.items():
        with CsvReport(tmp_path / "res" / cluster.file_name(kind), schema) as csv:
            csv.extend(rows[kind])

    built = build_report(tmp_path / "res", tmp_path / "out")
    text = built.path.read_text()
    assert [s.kind for s in built.sections] == list(cluster.SCHEMAS.values())
    compute = section(text, cluster.COMPUTE.title)
    assert list(md_tables(compute)["square_4096"][0]["tflops"]) == ["600", "601", "602"]  # slowest GPU first
    assert "### Rows not measured (1: error: 1)" in compute and "CUDA error: ECC" in compute
    heatmaps = {"cluster_tflops_square_4096.png", "cluster_pairs_inter_1MiB.png", "cluster_pairs_gpu_1MiB.png"}
    assert {p.filename for p in built.plots} == heatmaps and not built.missing
    for name in heatmaps:
        assert (built.path.parent / name).read_bytes().startswith(PNG_SIGNATURE)
    assert "](cluster_tflops_square_4096.png)" in compute
    assert "](cluster_pairs_inter_1MiB.png)" in section(text, cluster.PAIRS.title)


# ---- schemas: declared once, by the benchmarks; the report must agree with them -----------------------------


def test_report_tables_use_only_schema_or_derived_columns():
    """Every column a report table shows, orders by or compares exists in the benchmark's declared schema or
    is one the report derives itself; a renamed CSV column fails here, not silently in a blank table."""
    from opbench.report.discover import SCHEMAS
    from opbench.report.tables import ALWAYS_DERIVED, SPECS, keys_of, metrics_of

    assert set(SPECS) == set(SCHEMAS)
    for kind, schema in SCHEMAS.items():
        spec = SPECS[kind]
        known = set(schema.columns) | set(spec.derived) | set(ALWAYS_DERIVED)
        assert set(spec.columns) <= known, (kind, set(spec.columns) - known)
        assert set(spec.optional) | set(spec.sparse) <= set(spec.columns), kind
        assert not spec.split or spec.split in schema.columns, kind
        assert {a for a, _ in spec.key_map} <= set(schema.keys) and {b for _, b in spec.key_map} <= set(spec.derived)
        assert set(keys_of(kind)) <= known and set(metrics_of(kind)) <= set(schema.columns), kind
        ordered = pd.DataFrame(columns=list(schema.columns) + list(spec.derived))
        assert {c for c, _ in spec.order(ordered)} <= known, kind


def test_every_csv_is_identified_by_its_sidecar_and_matches_its_schema(results, report):
    """Each tool wrote its schema's header and a sidecar naming benchmark and schema version; the report read
    the sidecar, not the header. Without the sidecar the header alone still identifies the same kind."""
    from opbench.report.discover import SCHEMAS, identify

    built, _ = report
    for f in built.found.files:
        schema = SCHEMAS[f.kind.benchmark]
        assert f.identified_by == "sidecar", f.rel
        assert (f.meta["benchmark"], f.meta["schema_version"]) == (schema.benchmark, schema.version), f.rel
        assert tuple(f.frame.columns) == schema.columns, f.rel
        assert identify(set(f.frame.columns), f.path.name) is schema, f.rel


WRITE_UNTIL_FULL = """
import resource, signal, sys
from opbench.core.errors import UsageError
from opbench.core.results import CsvReport
from opbench.comm.schema import SCHEMA
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))  # a 'disk' that fills up after a few rows
report = CsvReport(sys.argv[1], SCHEMA, {"note": "x"})
try:
    for i in range(1000):
        report.append({"collective": "all_reduce", "size_bytes": 1 << i % 40, "busbw_gbs": 1.5, "status": "ok",
                       "error": "e" * 50})
except UsageError as exc:
    print(exc)
"""


def test_a_full_disk_leaves_no_half_row_and_the_report_skips_broken_rows(tmp_path, capsys):
    path = tmp_path / "all_reduce_benchmark.csv"
    proc = subprocess.run([sys.executable, "-c", WRITE_UNTIL_FULL, str(path)], capture_output=True, text=True)
    assert proc.returncode == 0 and "cannot write report" in proc.stdout and "Traceback" not in proc.stderr, proc
    text = path.read_text()
    assert text.endswith("\n") and 0 < len(text) <= 3000
    n_fields = {len(line.split(",")) for line in text.splitlines()}
    assert len(n_fields) == 1, n_fields  # every row complete: the cut-off row was truncated away

    # a row cut short by hand and a row with text where a number belongs: left out, named, no crash
    with path.open("a") as fh:
        fh.write("all_reduce,gloo,2,1,2,fp32\n")
        fh.write(text.splitlines()[1].replace(",1.5,", ",huge,") + "\n")
    good = len(text.splitlines()) - 1
    assert run_cli(report_main, [str(tmp_path), "--no-plots"]) == 0
    err = capsys.readouterr().err
    cut_line = len(text.splitlines()) + 1  # the line an editor shows (from 1)
    assert f"1 row(s) with the wrong number of fields left out (line {cut_line};" in err
    assert "1 row(s) with text where a number" in err
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Rows left out" in md and f"({good} ok rows)" not in err


def test_a_rerun_into_the_folder_reports_its_own_rows_and_lists_the_earlier_run(tmp_path, capsys):
    """A second run into one folder keeps the first under earlier/<time>/ (core.outputs); a dry run writes a
    .plan.csv. The report of the folder shows the latest run's rows only and names the others as skipped."""
    out = tmp_path / "res"
    run_gemm(out)
    args = ["--model", "Qwen3_0.6B", "--seqlen", "16", "--layers", "qkv", "--quick", "--device", "cpu"]
    for extra in ([], ["--dry-run"]):  # a later run, then a dry run (own processes, as a user runs them)
        subprocess.run(
            [sys.executable, "-m", "opbench", "gemm", *args, *extra, "--report-dir-path", str(out)],
            check=True,
            capture_output=True,
        )
    kept = list((out / "earlier").glob("*/benchmark_gemm_Qwen3_0.6B.csv"))
    assert len(kept) == 1 and (out / "benchmark_gemm_Qwen3_0.6B.plan.csv").exists()
    assert run_cli(report_main, [str(out), "--out", str(tmp_path / "rep"), "--no-plots"]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert len(md_tables(section(text, "GEMM"))["GEMM"][0]) == len(ok_rows(out / "benchmark_gemm_Qwen3_0.6B.csv"))
    skipped = section(text, "Skipped files")
    assert "earlier run" in skipped and "plan" in skipped


# ---- columns a kind needs, and bounded plots -------------------------------------------------------------------


def cli_report(res: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """The real ``opbench report`` CLI in its own process."""
    return subprocess.run(
        [sys.executable, "-m", "opbench", "report", str(res), "--report-dir-path", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def project_run(tmp_path_factory) -> Path:
    """A real opbench project CSV and its sidecar."""
    out = tmp_path_factory.mktemp("project")
    subprocess.run(
        [sys.executable, "-m", "opbench", "project", "--model", "Qwen3_0.6B", "--world-size", "8", "--device", "H100",
         "--report-dir-path", str(out)],
        check=True, capture_output=True, cwd=ROOT,
    )  # fmt: skip
    return out


@pytest.mark.parametrize("sidecar", [True, False])
def test_a_project_csv_without_a_time_column_draws_it_as_zero(project_run, tmp_path, sidecar):
    """A project.csv without pp_comm_s (hand-edited, or older) once raised AttributeError in the plot."""
    res = tmp_path / "res"
    res.mkdir()
    pd.read_csv(project_run / "project.csv").drop(columns="pp_comm_s").to_csv(res / "project.csv", index=False)
    if sidecar:
        (res / "project.meta.json").write_bytes((project_run / "project.meta.json").read_bytes())
    proc = cli_report(res, tmp_path / "out")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Plot not made" not in text and (tmp_path / "out" / "project_Qwen3_0.6B.png").exists()


@pytest.mark.parametrize("kind, lacking", [("gemm", "time_s"), ("attention", "seqlen_q")])
def test_a_csv_whose_sidecar_names_another_benchmark_is_skipped_with_the_reason(project_run, tmp_path, kind, lacking):
    """A project.csv whose sidecar says gemm (or attention) once raised KeyError: 'time_s' (or 'seqlen_q')."""
    res = tmp_path / "res"
    (res / "ok").mkdir(parents=True)
    for name in ("project.csv", "project.meta.json"):
        (res / "ok" / name).write_bytes((project_run / name).read_bytes())
    (res / "project.csv").write_bytes((project_run / "project.csv").read_bytes())
    meta = json.loads((project_run / "project.meta.json").read_text())
    (res / "project.meta.json").write_text(json.dumps({**meta, "benchmark": kind}))
    proc = cli_report(res, tmp_path / "out", "--no-plots")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    skipped = section((tmp_path / "out" / "report.md").read_text(), "Skipped files")
    line = next(s for s in skipped.splitlines() if "`project.csv`" in s)
    assert "columns do not match the sidecar's benchmark (missing" in line and lacking in line
    alone_res = tmp_path / "alone"  # nothing else to report: a usage error that says why
    alone_res.mkdir()
    for name in ("project.csv", "project.meta.json"):
        (alone_res / name).write_bytes((res / name).read_bytes())
    alone = cli_report(alone_res, tmp_path / "out2")
    assert alone.returncode == 2 and "Traceback" not in alone.stderr and lacking in alone.stderr


def test_a_csv_with_only_the_columns_its_kind_needs_reports_without_error(tmp_path):
    """Every kind, its CSV cut down to the columns the report needs (discover.NEEDS) and those that identify
    it: a report with every table and plot, no 'could not draw'."""
    from opbench.report.discover import NEEDS, SCHEMAS

    assert set(NEEDS) <= set(SCHEMAS)
    for kind, schema in SCHEMAS.items():
        assert set(NEEDS.get(kind, ())) <= set(schema.columns), kind
        columns = sorted(set(NEEDS.get(kind, ())) | schema.identifying | {"status"})
        cells = {c: "ok" if c == "status" else "2" for c in columns}
        pd.DataFrame([cells]).to_csv(tmp_path / f"{kind}.csv", index=False)
        (tmp_path / f"{kind}.meta.json").write_text(json.dumps(schema.sidecar()))
    report = build_report(tmp_path, tmp_path / "out")
    assert not report.found.skipped and len(report.found.files) == len(SCHEMAS)
    assert not report.missing, report.missing


def gemm_rows(models: int, layers: int) -> pd.DataFrame:
    from opbench.gemm.schema import SCHEMA as GEMM

    rows = [
        {c: "" for c in GEMM.columns}
        | dict(
            model=f"m{i}",
            layer=f"l{j}",
            mbs=1,
            m=64,
            n=64,
            k=64,
            dtype="bf16",
            backend="torch",
            time_s=(j + 1) * 1e-3,
            tflops=1.0,
            status="ok",
            **{"pass": "fwd"},
        )  # fmt: skip
        for i in range(models)
        for j in range(layers)
    ]
    return pd.DataFrame(rows, columns=list(GEMM.columns))


def test_a_gemm_plot_draws_at_most_the_slowest_rows(tmp_path):
    """20,000 GEMM rows of one model once made one bar each: minutes, GBs of memory and a 65 MB PNG."""
    from opbench.report.plots import MAX_BARS

    res = tmp_path / "res"
    res.mkdir()
    gemm_rows(1, MAX_BARS + 5).to_csv(res / "benchmark_gemm_m0.csv", index=False)
    report = build_report(res, tmp_path / "out")
    assert not report.missing
    (plot,) = report.plots
    assert f"the {MAX_BARS} slowest rows of {MAX_BARS + 5} drawn" in plot.title
    assert f"the {MAX_BARS} slowest rows of {MAX_BARS + 5} drawn" in report.path.read_text()
    assert (tmp_path / "out" / plot.filename).stat().st_size < 1 << 20


def test_at_most_so_many_plots_per_benchmark_and_the_report_says_how_many_more(tmp_path):
    """3,000 GEMM models once made 3,000 PNGs."""
    from opbench.report.plots import MAX_PLOTS

    res = tmp_path / "res"
    res.mkdir()
    gemm_rows(MAX_PLOTS + 3, 1).to_csv(res / "benchmark_gemm_many.csv", index=False)
    assert run_cli(report_main, [str(res), "--out", str(tmp_path / "out"), "--no-plots"]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert len(set(re.findall(r"gemm_tflops_m\d+\.png", text))) == MAX_PLOTS
    assert f"3 more plot(s) not drawn: at most {MAX_PLOTS} per benchmark" in text


# ---- rows that are different measurements stay apart (report/identity.py) ----------------------------------


@pytest.fixture(scope="module")
def gpt_oss_results(tmp_path_factory) -> Path:
    """The README's gpt-oss attention command on a tiny gpt-oss config: a full and a sliding-window row per
    backend, from the real tool."""
    transformers = pytest.importorskip("transformers")
    from opbench.attention.__main__ import main as attention_main

    base = tmp_path_factory.mktemp("gpt_oss")
    config = base / "gpt-oss-tiny"
    transformers.AutoConfig.for_model(
        "gpt_oss",
        num_hidden_layers=2,
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=16,
        intermediate_size=128,
        num_local_experts=2,
        num_experts_per_tok=1,
        layer_types=["sliding_attention", "full_attention"],
    ).save_pretrained(config)
    res = base / "res"
    argv = ["--model-config-path", str(config / "config.json"), "--seqlen", "64", "--backends", "sdpa,math"]
    argv += ["--passes", "fwd", "--device", "cpu", "--warmup", "1", "--min-iters", "3", "--max-iters", "5"]
    assert run_cli(attention_main, [*argv, "--budget", "0.02", "--report-dir-path", str(res)]) == 0
    return res


def test_full_and_sliding_attention_rows_stay_apart_in_table_and_plot(gpt_oss_results, tmp_path):
    """A full and a sliding-window row of one backend once showed as two identical-looking table rows and one
    bar at their median."""
    from opbench.report.plots import attention_bar_sets

    csv = pd.read_csv(gpt_oss_results / "attention_benchmark.csv")
    assert set(csv["attn_kind"]) == {"full", "sliding"} and (csv["status"] == "ok").all(), csv
    report = build_report(gpt_oss_results, tmp_path / "out", plots=False)
    table = md_tables(section(report.path.read_text(), "Attention"))["Attention"][0]
    assert {"attn_kind", "window"} <= set(table.columns)
    shown = table[["backend", "attn_kind", "window"]].astype(str).apply(tuple, axis=1)
    assert len(set(shown)) == len(table) == 4
    (attn,) = [s for s in report.sections if s.kind.benchmark == "attention"]
    cats, sets = attention_bar_sets([attn.ok], "fwd")
    assert cats == ["gpt-oss-tiny"]
    bars = {b.label: b.values[0] for b in sets}
    assert set(bars) == {"sdpa full", "sdpa sliding 16", "math full", "math sliding 16"}
    for _, row in csv.iterrows():
        label = f"{row['backend']} full" if row["attn_kind"] == "full" else f"{row['backend']} sliding 16"
        assert bars[label] == pytest.approx(row["fwd_tflops"], rel=1e-6), label


def test_gemm_rows_differing_in_pass_dtype_or_shape_are_separate_rows_and_bars(tmp_path):
    """Two dtypes of one layer and pass, and one layer at two shapes: separate table rows (dtype, m shown) and
    separate bars, each bar its own row's TFLOPS."""
    from opbench.report.plots import GEMM_TIMED, bars_of, gemm_categories, with_band

    rows = gemm_rows(1, 1)
    base = rows.iloc[0].to_dict()
    variants = [
        dict(dtype="bf16", m=64, tflops=1.0, **{"pass": "fwd"}),
        dict(dtype="fp8", m=64, tflops=3.0, **{"pass": "fwd"}),
        dict(dtype="bf16", m=128, tflops=2.0, **{"pass": "fwd"}),
        dict(dtype="bf16", m=64, tflops=5.0, **{"pass": "dgrad"}),
    ]
    frame = pd.DataFrame([base | v for v in variants])
    res = tmp_path / "res"
    res.mkdir()
    frame.to_csv(res / "benchmark_gemm_m0.csv", index=False)
    report = build_report(res, tmp_path / "out", plots=False)
    table = md_tables(section(report.path.read_text(), "GEMM"))["GEMM"][0]
    assert len(set(table[["pass", "m", "dtype"]].apply(tuple, axis=1))) == 4
    (gemm,) = [s for s in report.sections if s.kind.benchmark == "gemm"]
    (run,) = gemm_categories([gemm.ok])
    banded = with_band(run, GEMM_TIMED)
    fwd = banded[banded["pass"] == "fwd"]
    cats = list(dict.fromkeys(fwd["_x"]))
    assert len(cats) == 3
    values = sorted(bars_of(fwd, cats, "fwd", "C0").values)
    assert values == [1.0, 2.0, 3.0]  # never the median 2.0 of one bar


def test_moe_csv_is_read_and_its_routings_stay_apart(tmp_path):
    """benchmark_moe_*.csv is a kind of its own; rows of two routings are two table rows, routing shown."""
    from opbench.moe.schema import SCHEMA as MOE
    from opbench.report.identity import identity_of

    assert {"routing", "phase", "pass", "backend"} <= set(identity_of(MOE))
    rows = [
        {c: "" for c in MOE.columns}
        | dict(
            model="tiny",
            routing=r,
            backend="grouped_mm",
            phase="experts",
            mbs=1,
            seqlen=64,
            dtype="fp32",
            time_s=t,
            tflops=1e-3 / t,
            imbalance=1.0,
            status="ok",
            **{"pass": "fwd"},
        )  # fmt: skip
        for r, t in (("uniform", 1e-3), ("skewed", 2e-3))
    ]
    res = tmp_path / "res"
    res.mkdir()
    pd.DataFrame(rows, columns=list(MOE.columns)).to_csv(res / "benchmark_moe_tiny.csv", index=False)
    report = build_report(res, tmp_path / "out", plots=False)
    assert not report.found.skipped
    assert [f.kind.benchmark for f in report.found.files] == ["moe"]
    table = md_tables(section(report.path.read_text(), MOE.title))[MOE.title][0]
    assert sorted(table["routing"]) == ["skewed", "uniform"]
    assert sorted(float(v) for v in table["time_ms"]) == [1.0, 2.0]


def test_a_table_keeps_every_identity_column_that_differs(tmp_path):
    """A column the spec leaves out (transA here) is shown once two rows differ only in it; the fallback for a
    kind not declared takes every column that is not a measurement."""
    from opbench.report.discover import SCHEMAS
    from opbench.report.identity import IDENTITY, identity_of

    frame = pd.concat([gemm_rows(1, 1)] * 2, ignore_index=True)
    frame["transA"] = ["N", "T"]
    res = tmp_path / "res"
    res.mkdir()
    frame.to_csv(res / "benchmark_gemm_m0.csv", index=False)
    report = build_report(res, tmp_path / "out", plots=False)
    table = md_tables(section(report.path.read_text(), "GEMM"))["GEMM"][0]
    assert sorted(table["transA"]) == ["N", "T"]
    comm = identity_of(SCHEMAS["comm"])
    assert "comm" not in IDENTITY and {"collective", "size_bytes", "dtype", "inplace"} <= set(comm)
    assert not {"busbw_gbs", "time_us", "status", "note"} & set(comm)
