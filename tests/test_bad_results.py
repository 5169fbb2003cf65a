"""Results folders written by hand with bad numbers and odd files, read by the real CLIs (``opbench project
--results``, ``opbench report``): every bad row is left out and named (file:line, field), nothing hangs or reads a
device, nothing becomes a traceback, an ``inf`` rate or a 5000-digit cell (docs/project.md "Rates", docs/report.md
"What the report trusts")."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from opbench.core.units import human_bytes
from opbench.report.tables import cell

PROJECT = ("opbench", "project", "--model", "Qwen3_0.6B", "--world-size", "8", "--tp", "2", "--device", "H100")
GEMM_HEADER = "model,layer,pass,mbs,m,n,k,groups,dtype,backend,time_s,tflops,pct_of_peak,status,device\n"
GEMM_GOOD = "x,qkv,fwd,1,1024,1024,1024,1,bf16,torch,0.001,,,ok,H100\n"
COMM_HEADER = (
    "collective,backend,world_size,nnodes,nranks,dtype,size_bytes,count,inplace,time_us,algbw_gbs,busbw_gbs,status\n"
)
COMM_GOOD = "all_reduce,nccl,8,1,8,bf16,1048576,32768,False,20,52.4,45.9,ok\n"


def gemm_row(**cells: str) -> str:
    values = dict(zip(GEMM_HEADER.strip().split(","), GEMM_GOOD.strip().split(",")))
    return ",".join({**values, **cells}.values()) + "\n"


def comm_row(**cells: str) -> str:
    values = dict(zip(COMM_HEADER.strip().split(","), COMM_GOOD.strip().split(",")))
    return ",".join({**values, **cells}.values()) + "\n"


BAD_GEMM = [
    {"m": "0"},
    {"m": "-5"},
    {"groups": "0"},
    {"m": "inf"},
    {"m": "nan"},
    {"m": "١٢"},  # Arabic-Indic digits: float() takes them, a flag would not
    {"m": "9" * 400},  # a Python int beyond any float
    {"time_s": "inf"},
    {"time_s": "0"},
]
BAD_COMM = [{"size_bytes": "0"}, {"world_size": "inf"}, {"busbw_gbs": "inf"}]


def step_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("step "))


def test_project_leaves_out_bad_rate_rows_and_says_so(run, tmp_path):
    """Each bad row is skipped and counted in one note naming the first rows' file:line and field; the projection
    is the one the good rows alone give (no inf, no NaN rate, no traceback)."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    for folder, gemm_rows, comm_rows in ((good, [], []), (bad, BAD_GEMM, BAD_COMM)):
        folder.mkdir()
        (folder / "benchmark_gemm_x.csv").write_text(
            GEMM_HEADER + GEMM_GOOD + "".join(gemm_row(**r) for r in gemm_rows)
        )
        (folder / "all_reduce_benchmark.csv").write_text(
            COMM_HEADER + COMM_GOOD + "".join(comm_row(**r) for r in comm_rows)
        )
    ref, got = run(*PROJECT, "--results", str(good)), run(*PROJECT, "--results", str(bad))
    assert ref.returncode == 0 and ref.stderr == "", ref.stderr
    assert got.returncode == 0 and "Traceback" not in got.stderr, got.stderr
    assert step_line(got.stdout) == step_line(ref.stdout) and "inf" not in step_line(got.stdout)
    (note,) = got.stderr.strip().splitlines()
    n = len(BAD_GEMM) + len(BAD_COMM)
    assert note.startswith(f"note: {n} row(s) of --results left out for bad values (")
    assert f"{bad}/all_reduce_benchmark.csv:3: field 'size_bytes': out of range (0;" in note
    assert f"{bad}/all_reduce_benchmark.csv:4: field 'world_size': a number that is not finite ('inf')" in note


@pytest.mark.parametrize(
    "name, text, where",
    [
        # the only row has text where m belongs: left out, then no device name from an empty frame (was IndexError)
        ("benchmark_gemm_x.csv", GEMM_HEADER + gemm_row(m="١٢"), "benchmark_gemm_x.csv:2: field 'm': text"),
        ("benchmark_gemm_x.csv", GEMM_HEADER + gemm_row(m="0"), "benchmark_gemm_x.csv:2: field 'm': out of range"),
        ("all_reduce_benchmark.csv", COMM_HEADER + comm_row(world_size="inf"), "csv:2: field 'world_size': a number"),
    ],
)
def test_project_with_no_usable_row_left_is_one_line(run, tmp_path, name, text, where):
    (tmp_path / name).write_text(text)
    r = run(*PROJECT, "--results", str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert where in line and "no usable row is left in --results (1 row(s) left out)" in line


def test_project_results_of_another_dtype_name_the_gemm_and_the_dtype_they_hold(run, tmp_path):
    """fp32 rows (what a CPU measures) with the default --dtype bf16 on a device without a peak: the one line names
    the GEMM no row covers and the dtype the rows are in; every --results given, repeated or not, is read."""
    fp32, comm = tmp_path / "fp32", tmp_path / "comm"
    fp32.mkdir()
    comm.mkdir()
    (fp32 / "benchmark_gemm_x.csv").write_text(GEMM_HEADER + gemm_row(dtype="fp32", device="AMD EPYC"))
    (comm / "all_reduce_benchmark.csv").write_text(COMM_HEADER + COMM_GOOD)
    base = ("opbench", "project", "--model", "Qwen3_0.6B", "--world-size", "1", "--seqlen", "128")
    r = run(*base, "--results", str(fp32))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert re.search(r"no measured row covers the \d+x\d+x\d+ bf16 GEMM", line), line
    assert "gemm rows in fp32 only, not bf16: pass --dtype fp32" in line
    # repeated --results: every folder is read (it kept only the last): gemm rates from the first, comm from the second
    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    (bf16 / "benchmark_gemm_x.csv").write_text(GEMM_HEADER + GEMM_GOOD)
    r = run(*base, "--world-size", "8", "--tp", "8", "--device", "H100", "--results", str(bf16), "--results", str(comm))
    assert r.returncode == 0, r.stderr
    rates = next(line for line in r.stdout.splitlines() if line.startswith("rates:"))
    assert "gemm interpolated" in rates and "tp_comm interpolated" in rates, rates


@pytest.mark.parametrize(
    "schema_module, row, drop",
    [
        ("opbench.attention.schema", {"seqlen_q": 128, "backend": "sdpa", "causal": True, "fwd_time": 1e-3}, "causal"),
        ("opbench.attention.schema", {"seqlen_q": 128, "backend": "sdpa", "causal": True, "fwd_time": 1e-3}, "backend"),
        ("opbench.comm.schema", {"collective": "all_gather", "size_bytes": 1 << 20, "busbw_gbs": 40.0}, "collective"),
    ],
)
def test_project_results_without_a_column_a_rate_reads_leave_their_rows_out(run, tmp_path, schema_module, row, drop):
    """A results CSV (with its sidecar) that lost a column a rate reads as text: its rows are left out and named
    (file:line, field), the projection goes on from the peak table; it was a KeyError traceback."""
    import importlib

    import pandas as pd

    from opbench.core.results import CsvReport

    schema = importlib.import_module(schema_module).SCHEMA
    full = {"model": "x", "batch_size": 1, "seqlen_kv": 128, "num_head_q": 16, "num_head_kv": 8, "head_dim_qk": 128,
            "head_dim_v": 128, "attn_kind": "full", "window": 0, "dtype": "bf16", "bwd_time": 3e-3, "backend": "nccl",
            "world_size": 8, "nnodes": 1, "nranks": 8, "status": "ok", **row}  # fmt: skip
    path = tmp_path / ("attention_benchmark.csv" if "attention" in schema_module else "all_gather_benchmark.csv")
    with CsvReport(path, schema, {}) as out:
        out.append({k: v for k, v in full.items() if k in schema.columns})
    pd.read_csv(path).drop(columns=[drop]).to_csv(path, index=False)
    r = run("opbench", "project", "--model", "Qwen3_0.6B", "--world-size", "8", "--tp", "2", "--device", "H100",
            "--seqlen", "128", "--results", str(tmp_path))  # fmt: skip
    assert r.returncode in (0, 2) and "Traceback" not in r.stderr, r.stderr
    # the row is left out for the column, or (backend, collective: columns that mark the kind) the file is not read
    left_out, not_read = f"{path.name}:2: field '{drop}': no such column", f"{path.name}: columns do not match"
    assert left_out in r.stderr or (drop != "causal" and not_read in r.stderr), r.stderr


def test_report_leaves_out_infinite_sizes_and_formats_extremes_short(run, tmp_path):
    """An infinite size is left out; a finite one beyond any data size (1e300 B) is set aside as implausible, both
    named with their line; a large plausible one (1e18 B) prints short."""
    res = tmp_path / "res"
    res.mkdir()
    (res / "all_reduce_benchmark.csv").write_text(
        COMM_HEADER
        + comm_row(size_bytes="inf")
        + COMM_GOOD
        + comm_row(size_bytes="1e300", busbw_gbs="50")
        + comm_row(size_bytes="1e18", busbw_gbs="50")
    )
    r = run("opbench", "report", str(res), "--no-plots")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "line 2 field 'size_bytes': 'inf'" in r.stderr
    assert "line 4 field 'size_bytes': '1e+300' (a data size: at least 0 B and at most 1 EiB)" in r.stderr
    assert "read 1 CSV(s) (2 ok rows, 1 set aside as implausible)" in r.stdout
    md = (res / "report" / "report.md").read_text()
    assert "left out (line 2 field 'size_bytes': 'inf'; line 4 field 'size_bytes': '1e+300'" in md
    assert "1 row(s) set aside: a value outside its plausible range" in md
    assert "888 PiB" in md and "1 MiB" in md and "e+284" not in md and not re.search(r"\d{25}", md)
    # the formatters themselves: short text, never an exception
    assert [human_bytes(v) for v in (float("inf"), float("-inf"), 1e300, 10**400, "huge")] == [
        "inf",
        "-inf",
        "8.88e+284 PiB",
        "1e308+ B",
        "huge",
    ]
    assert [cell(v) for v in (float("inf"), 1e300, 10**400, 12345)] == ["inf", "1e+300", "1e308+", "12345"]


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not Path("/dev/zero").exists(), reason="needs mkfifo and /dev/zero")
def test_report_reads_regular_files_only_and_caps_sidecars(run, tmp_path):
    """A named pipe, a link to /dev/zero (as a CSV and as a sidecar) and a folder named .csv are skipped with what
    they are; a sidecar over 16 MiB is skipped with its size; the CSVs beside those sidecars still count."""
    res = tmp_path / "res"
    res.mkdir()
    os.mkfifo(res / "pipe.csv")
    (res / "zero.csv").symlink_to("/dev/zero")
    (res / "dir.csv").mkdir()
    (res / "all_reduce_benchmark.csv").write_text(COMM_HEADER + COMM_GOOD)
    (res / "all_reduce_benchmark.meta.json").symlink_to("/dev/zero")
    (res / "all_gather_benchmark.csv").write_text(COMM_HEADER + comm_row(collective="all_gather"))
    with open(res / "all_gather_benchmark.meta.json", "wb") as fh:
        fh.truncate(17 << 20)  # sparse: 17 MiB of size, no disk
    r = run("opbench", "report", str(res), "--no-plots", timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "read 2 CSV(s) (2 ok rows)" in r.stdout
    skipped = (res / "report" / "report.md").read_text().split("## Skipped files")[1]
    for expected in (
        "`pipe.csv`: not a regular file (a named pipe)",
        "`zero.csv`: not a regular file (a character device)",
        "`dir.csv`: not a regular file (a folder)",
        "`all_reduce_benchmark.meta.json`: sidecar not a regular file (a character device)",
        "`all_gather_benchmark.meta.json`: sidecar larger than 16 MiB (17 MiB)",
    ):
        assert expected in skipped, skipped


def test_sidecar_numbers_in_the_environment_table_are_bounded(run, tmp_path):
    res = tmp_path / "res"
    res.mkdir()
    (res / "all_reduce_benchmark.csv").write_text(COMM_HEADER + COMM_GOOD)
    meta = {"benchmark": "comm", "world_size": "9" * 5000, "host": "h" * 500, "device_name": "H100"}
    text = json.dumps(meta)[:-1] + ', "utc_time": 1e999}'  # JSON's 1e999 reads as inf
    (res / "all_reduce_benchmark.meta.json").write_text(text)
    r = run("opbench", "report", str(res), "--no-plots")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    md = (res / "report" / "report.md").read_text()
    env = md.split("## Environment")[1].split("\n## ")[0]
    row = next(line for line in env.splitlines() if "all_reduce_benchmark.csv" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    header = [c.strip() for c in env.strip().splitlines()[0].strip("|").split("|")]
    shown = dict(zip(header, cells))
    assert shown["ranks"] == "?" and shown["utc_time"] == "?" and shown["device"] == "H100", shown
    assert len(shown["host"]) <= 80 and "inf" not in row and "99999" not in md
