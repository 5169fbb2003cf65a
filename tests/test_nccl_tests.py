"""nccl-tests / rccl-tests output parser: every table era (built with the printf formats of each release's
src/common.cu / util.cu, docs/conventions.md, "Collectives: sizes, counts and bus bandwidth"), launcher prefixes, interleaved NCCL lines, N/A, gz, CLI."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opbench.core.errors import run_cli
from opbench.trace import nccl_tests
from opbench.trace.nccl_tests import parse_lines
from opbench.trace.schema import NCCL_TESTS

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CONTRACT = [
    "size_bytes",
    "count",
    "type",
    "redop",
    "root",
    "oop_time_us",
    "oop_algbw_gbs",
    "oop_busbw_gbs",
    "oop_wrong",
    "ip_time_us",
    "ip_algbw_gbs",
    "ip_busbw_gbs",
    "ip_wrong",
]


def time_str(us: float) -> str:
    """v2.x BenchTime: %7.0f from 10 ms, %7.1f from 100 µs, else %7.2f."""
    return "%7.0f" % us if us >= 10000 else ("%7.1f" % us if us >= 100 else "%7.2f" % us)


def _samples_module():
    """examples/make_nccl_tests_samples.py, which writes nccl-tests' 2025+ formats (getFloatStr among them)."""
    spec = importlib.util.spec_from_file_location("make_nccl_tests_samples", EXAMPLES / "make_nccl_tests_samples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


float_str = _samples_module()._float  # 2025+ getFloatStr: widest of %.2f/%.1f/%.0f that fits, else exponent


# -- table builders, one per era ------------------------------------------------------------------------------
def v1_table(rows):
    """nccl-tests v1 (NCCL 1): bytes N type op, time in ms, 'res' column."""
    out = [
        "# %10s  %12s  %6s  %6s        out-of-place                    in-place" % ("", "", "", ""),
        "# %10s  %12s  %6s  %6s  %7s  %5s  %5s  %7s  %7s  %5s  %5s  %7s"
        % ("bytes", "N", "type", "op", "time", "algbw", "busbw", "res", "time", "algbw", "busbw", "res"),
    ]
    for size, count, typ, op, blocks in rows:
        line = "%12li  %12li  %6s  %6s" % (size, count, typ, op)
        for ms, alg, bus, res in blocks:
            line += "  %7.3f  %5.2f  %5.2f  %7.0e" % (ms, alg, bus, res)
        out.append(line)
    return out


def legacy_table(lead_names, rows, avg=None):
    """v2.0-v2.12: per-collective lead columns, 'error' (max deviation) printed with %5.0le."""
    widths = {"size": "%10s", "count": "%12s", "type": "%8s", "redop": "%6s", "root": "%6s"}
    lead_fmt = "  ".join(widths[n] for n in lead_names)
    out = [
        ("# " + lead_fmt + "            out-of-place                       in-place          ")
        % tuple("" for _ in lead_names),
        ("# " + lead_fmt + "  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s")
        % (*lead_names, "time", "algbw", "busbw", "error", "time", "algbw", "busbw", "error"),
        ("# " + lead_fmt + "  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s")
        % (
            "(B)",
            "(elements)",
            *["" for _ in lead_names[2:]],
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
        ),
    ]
    row_widths = {"size": "%12li", "count": "%12li", "type": "%8s", "redop": "%6s", "root": "%6i"}
    for lead, blocks in rows:
        line = "  ".join(row_widths[n] for n in lead_names) % lead
        for us, alg, bus, err in blocks:
            line += (
                ("  %7s  %6.2f  %6.2f  %5.0e" % (time_str(us), alg, bus, err))
                if err is not None
                else ("  %7s  %6.2f  %6.2f  %5s" % (time_str(us), alg, bus, "N/A"))
            )
        out.append(line)
    out += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : %g " % avg] if avg is not None else []
    return out


def v213_header(timestr="time", labels=("out-of-place", "in-place")):
    if len(labels) == 2:
        return [
            "#",
            "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
            % ("", "", "", "", ""),
            "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s"
            % (
                "size",
                "count",
                "type",
                "redop",
                "root",
                timestr,
                "algbw",
                "busbw",
                "#wrong",
                timestr,
                "algbw",
                "busbw",
                "#wrong",
            ),
            "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s"
            % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""),
        ]
    return [
        "#",
        "# %10s  %12s  %8s  %6s  %6s           in-place          " % ("", "", "", "", ""),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s"
        % ("size", "count", "type", "redop", "root", timestr, "algbw", "busbw", "#wrong"),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s"
        % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""),
    ]


def v213_preamble(size, count, typ, op, root):
    return "%12li  %12li  %8s  %6s  %6s" % (size, count, typ, op, "%6i" % root)


def v213_body(us, alg, bus, wrong):
    if wrong is None:
        return "  %7s  %6.2f  %6.2f  %5s" % (time_str(us), alg, bus, "N/A")
    return "  %7s  %6.2f  %6.2f  %5g" % (time_str(us), alg, bus, wrong)


def devices(n, newest=True):
    fmt = (
        "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s"
        if newest
        else "#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s"
    )
    return ["# Using devices"] + [
        (fmt % (r, 0, 4000 + r, "node01", r, 0, 0x18 + r, 0, "NVIDIA H100 80GB HBM3"))
        if newest
        else (fmt % (r, 0, 4000 + r, "node01", r, 0x18 + r, "NVIDIA H100 80GB HBM3"))
        for r in range(n)
    ]


def rows_by_size(rows):
    return {r["size_bytes"]: r for r in rows}


# -- eras -------------------------------------------------------------------------------------------------------
def test_v1_ms_times_and_res_column():
    lines = ["nThread 1 nGpus 4 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20 validation: 1 "]
    lines += v1_table([(1024, 256, "float", "sum", [(0.052, 0.02, 0.03, 0.0), (0.051, 0.02, 0.03, 0.0)])])
    [r] = parse_lines(lines, "all_reduce_perf.log")
    assert r["collective"] == "all_reduce" and (r["size_bytes"], r["count"], r["type"], r["redop"]) == (
        1024,
        256,
        "float",
        "sum",
    )
    assert r["oop_time_us"] == pytest.approx(52.0) and r["ip_time_us"] == pytest.approx(51.0)
    assert r["oop_wrong"] == 0.0 and r["wrong_kind"] == "error"


@pytest.mark.parametrize(
    "binary,lead,lead_row,redop,root",
    [
        ("all_reduce_perf", ["size", "count", "type", "redop"], (4096, 1024, "float", "sum"), "sum", None),
        ("all_gather_perf", ["size", "count", "type"], (4096, 128, "half"), None, None),
        ("reduce_scatter_perf", ["size", "count", "type", "redop"], (4096, 128, "bfloat16", "max"), "max", None),
        ("broadcast_perf", ["size", "count", "type", "root"], (4096, 1024, "float", 3), None, 3),
        ("reduce_perf", ["size", "count", "type", "redop", "root"], (4096, 1024, "float", "prod", 2), "prod", 2),
        ("sendrecv_perf", ["size", "count", "type"], (4096, 1024, "float"), None, None),
        ("alltoall_perf", ["size", "count", "type", "redop"], (4096, 128, "float", "sum"), "sum", None),
    ],
)
def test_legacy_per_collective_tables(binary, lead, lead_row, redop, root):
    lines = [f"# Command: mpirun -np 8 ./build/{binary} -b 4K -e 4K", "#"]
    lines += legacy_table(lead, [(lead_row, [(23.4, 0.18, 0.31, 0.0), (12345.6, 0.0, 0.0, 2e-2)])], avg=0.155)
    [r] = parse_lines(lines)
    assert r["collective"] == nccl_tests.collective_from_binary(binary[:-5])
    assert (r["size_bytes"], r["count"], r["type"], r["redop"], r["root"]) == (
        4096,
        lead_row[1],
        lead_row[2],
        redop,
        root,
    )
    assert (r["oop_time_us"], r["oop_algbw_gbs"], r["oop_busbw_gbs"], r["oop_wrong"]) == (23.4, 0.18, 0.31, 0.0)
    assert (r["ip_time_us"], r["ip_wrong"], r["wrong_kind"], r["avg_busbw"]) == (12346.0, 0.02, "error", 0.155)


def test_v213_uniform_table_blank_and_none_redop_na_values():
    lines = (
        [
            "# nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 "
            "agg iters: 1 validation: 0 graph: 0",
            "#",
        ]
        + devices(8, newest=False)
        + v213_header()
    )
    lines += [
        v213_preamble(8, 2, "float", "", -1) + v213_body(30.5, 0.0, 0.0, None) + v213_body(29.9, 0.0, 0.0, None),
        v213_preamble(134217728, 4194304, "bfloat16", "none", -1)
        + v213_body(657.2, 204.23, 178.7, 0)
        + v213_body(656.1, 204.57, 179.0, 0),
    ]
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 89.425 ", "#"]
    rows = rows_by_size(parse_lines(lines, "runs/all_gather_perf.8gpu.out"))
    small, big = rows[8], rows[134217728]
    assert small["collective"] == "all_gather" and small["redop"] is None and small["root"] == -1
    assert small["oop_wrong"] is None and small["ip_wrong"] is None  # N/A: empty, never 0
    assert big["redop"] is None and (big["oop_busbw_gbs"], big["ip_busbw_gbs"], big["oop_wrong"]) == (178.7, 179.0, 0)
    assert big["nranks"] == 8 and big["wrong_kind"] == "#wrong" and big["avg_busbw"] == 89.425


def test_newest_version_unalign_per_iteration_columns_timestamp_and_cputime():
    ts_hdr = "timestamp"
    lines = [
        "# nccl-tests version 2.19.6 nccl-headers=22807 nccl-library=22807",
        "# Collective test starting: ./build/reduce_scatter_perf",
        "# nThread 1 nGpus 2 minBytes 1048576 maxBytes 1048576 step: 2(factor) warmup iters: 1 iters: 5 "
        "agg iters: 1 validation: 1 graph: 0 unalign: 3",
        "# Per-Iteration Report: CUDA event timing; i_* uses max over process rows ",
        "#",
    ] + devices(2)
    lines += [
        "#",
        "# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)                                "
        "in-place (+ per-iteration)" % ("", "", "", "", ""),
        (
            "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  "
            "%7s  %7s %*s"
        )
        % (
            "size",
            "count",
            "type",
            "redop",
            "root",
            "cputime",
            "algbw",
            "busbw",
            "#wrong",
            "i_min",
            "i_max",
            "i_p99",
            "i_cv%",
            "cputime",
            "algbw",
            "busbw",
            "#wrong",
            "i_min",
            "i_max",
            "i_p99",
            "i_cv%",
            19,
            ts_hdr,
        ),
    ]
    body = "  %7s  %6s  %6s  %6g" % (
        float_str(45.3, 7),
        float_str(23.15, 6),
        float_str(11.57, 6),
        0,
    ) + "  %7s  %7s  %7s  %7s" % (float_str(44.0, 7), float_str(51.2, 7), float_str(50.9, 7), float_str(3.4, 7))
    lines.append(v213_preamble(1048576, 131072, "float", "sum", -1) + body + body + "%21s" % "2026-07-01 10:11:12")
    [r] = parse_lines(lines)
    assert r["collective"] == "reduce_scatter" and r["nranks"] == 2
    assert (r["oop_time_us"], r["oop_algbw_gbs"], r["oop_busbw_gbs"], r["oop_wrong"]) == (45.3, 23.15, 11.57, 0)
    assert (r["ip_time_us"], r["ip_busbw_gbs"], r["ip_wrong"]) == (45.3, 11.57, 0)


def test_rccl_in_place_only_and_trace_replay_null_body():
    lines = ["rccl-tests: Version develop:7a8b9c0", "# Using devices"] + v213_header(labels=("in-place",))
    lines.append(v213_preamble(2048, 512, "fp8_e4m3", "sum", -1) + v213_body(11.0, 0.19, 0.33, 0))
    lines += ["# Avg bus bandwidth    : 0.33 "] + v213_header()
    lines.append(v213_preamble(4096, 1024, "float", "sum", 0) + " " * 32 + v213_body(12.0, 0.34, 0.6, 0))
    a, b = parse_lines(lines, "rccl/all_reduce_perf.log")
    assert (a["type"], a["oop_time_us"], a["ip_time_us"], a["ip_busbw_gbs"], a["avg_busbw"]) == (
        "fp8_e4m3",
        None,
        11.0,
        0.33,
        0.33,
    )
    assert (b["oop_time_us"], b["ip_time_us"], b["root"], b["avg_busbw"]) == (None, 12.0, 0, None)


@pytest.mark.parametrize("prefix", ["[0] ", " 0: ", "[1,0]<stdout>:", "rank0: "])
def test_launcher_prefixes(prefix):
    lines = [prefix + ln for ln in v213_header()]
    lines.append(
        prefix
        + v213_preamble(1 << 30, 1 << 28, "float", "sum", -1)
        + v213_body(9000.5, 119.3, 208.8, 0)
        + v213_body(8999.0, 119.3, 208.8, 0)
    )
    lines.append(prefix + "# Avg bus bandwidth    : 208.8 ")
    [r] = parse_lines(lines)
    assert (r["size_bytes"], r["oop_time_us"], r["ip_busbw_gbs"], r["avg_busbw"]) == (1 << 30, 9000.5, 208.8, 208.8)


def test_interleaved_nccl_lines_split_a_row():
    """NCCL_DEBUG=INFO output shares stdout: NCCL lines land between the preamble, the out-of-place and the
    in-place block of one row. mpirun adds tags to other ranks' lines."""
    nccl = (
        "node01:4001:4101 [1] NCCL INFO AllReduce: opCount 3f sendbuff 0x7f01 recvbuff 0x7f02 count 262144 "
        "datatype 7 op 0 root 0 comm 0x5501 [nranks=8] stream 0x5601"
    )
    lines = ["[1,0]<stdout>:" + ln for ln in v213_header()]
    lines += [
        "[1,0]<stdout>:" + v213_preamble(1048576, 262144, "float", "sum", -1) + nccl,
        "[1,1]<stdout>:" + nccl,
        "[1,2]<stdout>:" + nccl,
        "[1,0]<stdout>:" + v213_body(41.2, 25.45, 44.54, 0) + "[1,3]<stdout>:" + nccl,
        "[2025-01-01 00:00:00] " + nccl,
        "[1,0]<stdout>:" + v213_body(40.9, 25.64, 44.87, 0),
        "[1,0]<stdout>:"
        + v213_preamble(2097152, 524288, "float", "sum", -1)
        + v213_body(60.0, 34.95, 61.16, 0)
        + v213_body(59.5, 35.25, 61.68, 0),
        "[1,0]<stdout>:# Avg bus bandwidth    : 52.9 ",
    ]
    rows = rows_by_size(parse_lines(lines, "all_reduce_perf.log"))
    r = rows[1048576]
    assert (r["count"], r["redop"], r["root"]) == (262144, "sum", -1)
    assert (r["oop_time_us"], r["oop_busbw_gbs"], r["ip_time_us"], r["ip_busbw_gbs"]) == (41.2, 44.54, 40.9, 44.87)
    assert rows[2097152]["ip_busbw_gbs"] == 61.68 and r["avg_busbw"] == 52.9


def test_multiple_tables_take_collective_from_title_lines():
    lines = ["# Collective test starting: all_reduce_perf"] + v213_header()
    lines += [
        v213_preamble(8, 2, "float", "sum", -1) + v213_body(10, 0, 0, 0) + v213_body(10, 0, 0, 0),
        "# Avg bus bandwidth    : 0 ",
        "# Collective test concluded: all_reduce_perf",
        "+ mpirun -np 8 ./build/alltoall_perf -b 8 -e 8",
    ] + v213_header()
    lines += [v213_preamble(64, 2, "float", "none", -1) + v213_body(10, 0, 0, 0) + v213_body(10, 0, 0, 0)]
    a, b = parse_lines(lines)
    assert (a["collective"], a["avg_busbw"], b["collective"], b["avg_busbw"]) == ("all_reduce", 0.0, "all_to_all", None)


def test_cli_csv_gz_and_contract(tmp_path):
    lines = ["# Collective test starting: all_gather_perf"] + v213_header()
    lines += [
        v213_preamble(1 << 20, 1 << 15, "bfloat16", "none", -1)
        + v213_body(20, 52.4, 45.9, 0)
        + v213_body(19, 55.2, 48.3, 0),
        "# Avg bus bandwidth    : 47.1 ",
    ]
    gz = tmp_path / "ag.out.gz"
    gz.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    out = tmp_path / "nt.csv"
    assert run_cli(nccl_tests.main, [str(gz), "--csv", str(out)]) == 0
    [row] = list(csv.DictReader(out.open()))
    assert list(row)[:1] == ["collective"] and set(CONTRACT) <= set(row) and "avg_busbw" in row
    assert tuple(row) == NCCL_TESTS.columns
    assert (row["collective"], row["size_bytes"], row["count"], row["type"], row["redop"], row["root"]) == (
        "all_gather",
        str(1 << 20),
        str(1 << 15),
        "bfloat16",
        "",
        "-1",
    )
    assert (row["oop_busbw_gbs"], row["ip_busbw_gbs"], row["oop_wrong"], row["avg_busbw"]) == (
        "45.9",
        "48.3",
        "0",
        "47.1",
    )


def test_cli_missing_file_exit_2_and_no_rows_exit_1(tmp_path, run):
    res = run("opbench.trace.nccl_tests", str(tmp_path / "missing.out"))
    assert res.returncode == 2 and "missing.out" in res.stderr and "Traceback" not in res.stderr
    empty = tmp_path / "empty.out"
    empty.write_text("# nThread 1 nGpus 1\nsomething else\n")
    none = run("opbench.trace.nccl_tests", str(empty))
    assert none.returncode == 1 and f"opbench nccl-tests: {empty}: no nccl-tests/rccl-tests result rows" in none.stderr


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.text(max_size=120),
            st.sampled_from(
                v213_header()
                + [
                    v213_preamble(8, 2, "float", "sum", -1),
                    v213_body(1, 2, 3, None),
                    "# Avg bus bandwidth : x",
                    "#  Rank  0",
                    "1 2 float",
                    "8 2 float sum -1 1 2 3 N/A",
                    "size count time",
                ]
            ),
        ),
        max_size=40,
    )
)
def test_parser_never_raises(lines):
    rows = parse_lines(lines)
    assert all(set(r) <= set(NCCL_TESTS.columns) for r in rows)


def test_stdin(tmp_path):
    text = (
        "\n".join(
            v213_header() + [v213_preamble(8, 2, "float", "sum", -1) + v213_body(5, 0, 0, 0) + v213_body(5, 0, 0, 0)]
        )
        + "\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "opbench.comm.nccl_tests", "-"], input=text, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0 and "float" in res.stdout, res.stderr


def test_row_with_trailing_comment():
    lines = v213_header() + [
        v213_preamble(8, 2, "float", "sum", -1)
        + v213_body(5, 0.1, 0.2, 0)
        + v213_body(6, 0.1, 0.2, 0)
        + "   # trace:job.log nranks=2"
    ]
    [r] = parse_lines(lines)
    assert (r["oop_time_us"], r["ip_time_us"]) == (5.0, 6.0)


def test_over_long_lines_are_skipped_and_a_damaged_gz_keeps_the_rows_before_it(tmp_path, capsys):
    """A 1 MB line without a newline is read past in bounded pieces (the rows around it survive); a .gz cut off
    after ~3000 rows keeps every row read before the damage, warns, and exits 1."""
    head = ["# Collective test starting: all_reduce_perf", *v213_header()]
    row = (
        v213_preamble(1 << 20, 1 << 18, "float", "sum", -1)
        + v213_body(20, 52.4, 45.9, 0)
        + v213_body(19, 55.2, 48.3, 0)
    )
    noisy = tmp_path / "noisy.out"
    noisy.write_text("\n".join([*head, row, "x" * 1_000_000, row]) + "\n")
    out = tmp_path / "n.csv"
    assert run_cli(nccl_tests.main, [str(noisy), "--csv", str(out)]) == 0
    assert len(list(csv.DictReader(out.open()))) == 2
    assert "skipped 1 line(s) longer than 64 KiB" in capsys.readouterr().err

    body = "\n".join([*head, *[row] * 3000, "# Avg bus bandwidth    : 47.1 "]) + "\n"
    whole = gzip.compress(body.encode())
    cut = tmp_path / "cut.out.gz"
    cut.write_bytes(whole[: len(whole) * 2 // 3])
    assert run_cli(nccl_tests.main, [str(cut), "--csv", str(out)]) == 1
    kept = list(csv.DictReader(out.open()))
    assert 1000 < len(kept) < 3000 and all(r["oop_busbw_gbs"] == "45.9" for r in kept)
    err = capsys.readouterr().err
    assert "stopped reading after" in err and "the rows before the damage are kept" in err and "Traceback" not in err


# -- issue 25 (streaming, bounds, inf) and issue 26 (-J JSON, -I per-iteration) ---------------------------------
ROW = v213_preamble(1 << 20, 1 << 18, "float", "sum", -1) + v213_body(20, 52.4, 45.9, 0) + v213_body(19, 55.2, 48.3, 0)


def test_json_and_per_iteration_samples_are_current_and_read_to_the_same_rows(tmp_path):
    """examples/all_reduce_perf.json (-J) and all_reduce_perf_iter.out (-I 1), written in nccl-tests' formats by
    examples/make_nccl_tests_samples.py, give the same rows: sizes, times, bandwidths, the -I summary, nranks
    (2 processes × 4 GPUs in the JSON's config), the Avg bus bandwidth."""
    gen = subprocess.run(
        [sys.executable, str(EXAMPLES / "make_nccl_tests_samples.py"), str(tmp_path)], capture_output=True, text=True
    )
    assert gen.returncode == 0, gen.stderr
    for name in ("all_reduce_perf.json", "all_reduce_perf_iter.out"):
        assert (tmp_path / name).read_bytes() == (EXAMPLES / name).read_bytes(), f"{name}: rerun the generator"
    from_json = list(nccl_tests.iter_file_rows(str(EXAMPLES / "all_reduce_perf.json")))
    from_text = list(nccl_tests.iter_file_rows(str(EXAMPLES / "all_reduce_perf_iter.out")))
    assert len(from_json) == len(from_text) == 6
    for j, t in zip(from_json, from_text):
        assert (j["collective"], j["size_bytes"], j["count"], j["type"], j["redop"], j["root"], j["nranks"]) == (
            t["collective"],
            t["size_bytes"],
            t["count"],
            t["type"],
            t["redop"],
            t["root"],
            t["nranks"],
        ) and j["nranks"] == 8
        for col in ("oop_time_us", "ip_busbw_gbs", "oop_iter_min_us", "ip_iter_p99_us", "oop_iter_cv_pct", "avg_busbw"):
            assert t[col] is not None and j[col] == pytest.approx(t[col], rel=0.01, abs=0.01), col
        assert j["oop_wrong"] == t["oop_wrong"] == 0 and j["note"] is None
    assert from_json[-1]["oop_iter_max_us"] > from_json[-1]["oop_iter_min_us"]


def test_json_is_read_in_bounded_pieces_whatever_the_chunk_boundaries(monkeypatch):
    """The same rows when the JSON arrives 7 bytes at a time (strings, keys and colons cut by chunk ends)."""
    whole = list(nccl_tests.iter_file_rows(str(EXAMPLES / "all_reduce_perf.json")))
    monkeypatch.setattr(nccl_tests, "JSON_CHUNK", 7)
    assert list(nccl_tests.iter_file_rows(str(EXAMPLES / "all_reduce_perf.json"))) == whole


def test_inf_overflow_and_out_of_range_numbers(tmp_path, capsys):
    """Text and JSON: inf, 1e999 and nan become empty cells named in ``note``; a row with a 400-digit count (or a
    size beyond 1 PiB, an Arabic-Indic digit) is skipped and counted; a file with only such rows is one line
    naming file:line and field, exit 2."""
    head = ["# Collective test starting: all_reduce_perf", *v213_header()]
    inf_row = v213_preamble(8, 2, "float", "sum", -1) + "      inf    1e999  nan      0" + v213_body(5, 0.1, 0.2, 0)
    huge = v213_preamble(8, 2, "float", "sum", -1).replace("           2", "9" * 400) + v213_body(5, 0, 0, 0) * 2
    text = tmp_path / "t.out"
    text.write_text(
        "\n".join([*head, ROW, inf_row, huge, ROW.replace("1048576", "١٠٢٤"), "# Avg bus bandwidth : inf"]) + "\n"
    )
    out = tmp_path / "t.csv"
    assert run_cli(nccl_tests.main, [str(text), "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2 and rows[0]["avg_busbw"] == "" and "avg_busbw=inf" in rows[0]["note"]
    r = rows[1]
    assert (r["oop_time_us"], r["oop_algbw_gbs"], r["oop_busbw_gbs"], r["ip_time_us"]) == ("", "", "", "5")
    assert "oop_time_us=inf" in r["note"] and "oop_algbw_gbs=inf" in r["note"] and "nan" in r["note"]
    err = capsys.readouterr().err
    assert f"skipped 1 row(s) with numbers out of range (first: {text}:8: count " in err and "Traceback" not in err

    js = tmp_path / "r.json"
    js.write_text(
        '{"version":3,"args":["./build/all_gather_perf"],"config":{"nthreads":1,"ngpus":2,"devices":[{},{}]},'
        '"results":[{"size":1024,"count":128,"type":"float","redop":"none","root":"    -1",'
        '"out_of_place":{"time":inf,"alg_bw":1e999,"bus_bw":"nan","nwrong":0.000000},"in_place":null},'
        '{"size":1' + "0" * 30 + ',"count":1,"type":"float","redop":"none","root":"-1"}],'
        '"average_bus_bandwidth":{"bandwidth":-inf,"okay":"unchecked"}}'
    )
    assert run_cli(nccl_tests.main, [str(js), "--csv", str(out)]) == 0
    [row] = list(csv.DictReader(out.open()))
    assert (row["collective"], row["nranks"], row["size_bytes"], row["redop"]) == ("all_gather", "4", "1024", "")
    assert row["oop_time_us"] == row["oop_algbw_gbs"] == row["oop_busbw_gbs"] == row["ip_time_us"] == ""
    assert "oop_time_us=inf" in row["note"] and "avg_busbw=-inf" in row["note"] and row["oop_wrong"] == "0"
    assert "result 2: size 1000000000000000000000000000000 is out of range" in capsys.readouterr().err

    bad = tmp_path / "bad.out"
    bad.write_text("\n".join([*head, huge]) + "\n")
    res = subprocess.run(
        [sys.executable, "-m", "opbench.trace.nccl_tests", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and f"{bad}:" in res.stderr and "count" in res.stderr


def test_rows_reach_the_csv_while_the_input_is_still_open(tmp_path):
    """Streaming: 5000 rows of one table with no end line go in on a pipe that stays open; the CSV holds rows
    before the input ends (the old parser held a table's rows until its end, and kept every row in memory)."""
    import time

    out = tmp_path / "live.csv"
    proc = subprocess.Popen(
        [sys.executable, "-m", "opbench.trace.nccl_tests", "-", "--csv", str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write(
            "\n".join(["# Collective test starting: all_reduce_perf", *v213_header(), *[ROW] * 5000]) + "\n"
        )
        proc.stdin.flush()
        seen = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and seen < 2000:
            time.sleep(0.2)
            seen = len(out.read_text().splitlines()) - 1 if out.exists() else 0
        assert seen >= 2000, f"{seen} rows in the CSV before the input ended"
        assert proc.poll() is None  # still reading: the input is open
    finally:
        proc.stdin.close()
    err = proc.stderr.read() if proc.stderr else ""
    proc.wait(timeout=60)
    assert proc.returncode == 0, err
    assert len(out.read_text().splitlines()) == 5001


# -- bounds of measured values; rows held for the Avg line on Ctrl-C / SIGTERM ------------------------------------
def _example_text_lines():
    return (EXAMPLES / "all_reduce_perf_iter.out").read_text().splitlines()


def test_out_of_range_measurements_become_empty_cells_named_in_note_text(tmp_path, capsys):
    """A negative time, a busbw of -1e30, #wrong -7 or 2.5, a time beyond one day, an algbw beyond 1e6 GB/s, a
    negative i_min, a cv% of 1e7 and an Avg bus bandwidth of -1e300 become empty cells named in ``note``; the
    row's other cells are kept and no row is skipped."""
    lines = _example_text_lines()
    first = next(k for k, line in enumerate(lines) if line.split()[:1] == ["1024"])
    lines[first] = lines[first].replace("    25.81    0.04    0.07", "   -25.81    0.04   -1e30", 1)
    tok = lines[first + 1].split()
    assert tok[:2] == ["4096", "1024"] and len(tok) == 21
    tok[8], tok[12], tok[13], tok[14], tok[16], tok[17] = "-7", "1e7", "1e11", "2e6", "2.5", "-1"
    lines[first + 1] = "  ".join(tok)
    lines = [line.replace("13.3524", "-1e300") if "Avg bus bandwidth" in line else line for line in lines]
    src = tmp_path / "neg.out"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "neg.csv"
    assert run_cli(nccl_tests.main, [str(src), "--csv", str(out)]) == 0
    assert "skipped" not in capsys.readouterr().err
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 6 and all(r["avg_busbw"] == "" and "avg_busbw=-1e+300" in r["note"] for r in rows)
    a, b = rows[0], rows[1]
    assert (a["oop_time_us"], a["oop_algbw_gbs"], a["oop_busbw_gbs"], a["ip_time_us"]) == ("", "0.04", "", "25.81")
    assert "out of range, left empty: oop_time_us=-25.81, oop_busbw_gbs=-1e+30" in a["note"]
    empty = ("oop_wrong", "oop_iter_cv_pct", "ip_time_us", "ip_algbw_gbs", "ip_wrong", "ip_iter_min_us")
    assert all(b[c] == "" for c in empty), b
    assert (b["oop_time_us"], b["oop_iter_p99_us"], b["ip_busbw_gbs"], b["ip_iter_max_us"]) == (
        "25.82",
        "26.62",
        "0.28",
        "26.62",
    )
    for cell in ("oop_wrong=-7", "oop_iter_cv_pct=10000000", "ip_time_us=100000000000", "ip_algbw_gbs=2000000"):
        assert cell in b["note"], b["note"]
    assert "ip_wrong=2.5" in b["note"] and "ip_iter_min_us=-1" in b["note"]
    assert rows[2]["note"] == "out of range, left empty: avg_busbw=-1e+300"


def test_bounds_in_every_table_era():
    """v1 times are bounded in µs after the ms conversion; the v2.0–2.12 ``error`` (a max deviation) must be
    >= 0 but has no cap; a #wrong count must be whole; the bounds themselves are in range."""
    [v1] = parse_lines(v1_table([(1024, 256, "float", "sum", [(1e8, 0.02, 0.03, 0.0), (86400e3, 0.02, 0.03, 0.0)])]))
    assert v1["oop_time_us"] is None and v1["ip_time_us"] == 86400e6 and "oop_time_us=100000000000" in v1["note"]
    lead = ["size", "count", "type", "redop"]
    [old] = parse_lines(legacy_table(lead, [((4096, 1024, "float", "sum"), [(5, 0, 0, -1), (5, 0, 0, 1e20)])], 1e6))
    assert (old["oop_wrong"], old["ip_wrong"], old["avg_busbw"], old["wrong_kind"]) == (None, 1e20, 1e6, "error")
    assert old["note"] == "out of range, left empty: oop_wrong=-1"
    [new] = parse_lines(
        [*v213_header(), v213_preamble(8, 2, "float", "sum", -1) + v213_body(0, 0, 1e6, 0) + v213_body(5, 0, 0, 1)]
    )
    assert (new["oop_time_us"], new["oop_busbw_gbs"], new["oop_wrong"], new["ip_wrong"], new["note"]) == (
        0.0,
        1e6,
        0,
        1,
        None,
    )
    assert isinstance(new["oop_wrong"], int)


def test_out_of_range_measurements_become_empty_cells_named_in_note_json(tmp_path, capsys):
    """The -J JSON form: time -3, bus_bw 1e300, nwrong -7 (and 0.5), a negative p99_us and an average bus
    bandwidth of -1e300 are empty cells named in ``note``, the rest of the row is kept."""
    doc = json.loads((EXAMPLES / "all_reduce_perf.json").read_text())
    doc["results"][0]["out_of_place"].update(time=-3, bus_bw=1e300, nwrong=-7)
    doc["results"][1]["in_place"]["nwrong"] = 0.5
    doc["results"][1]["in_place_per_iter"]["p99_us"] = -1.5
    doc["average_bus_bandwidth"]["bandwidth"] = -1e300
    src = tmp_path / "neg.json"
    src.write_text(json.dumps(doc))
    out = tmp_path / "neg.csv"
    assert run_cli(nccl_tests.main, [str(src), "--csv", str(out)]) == 0
    assert "skipped" not in capsys.readouterr().err
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 6 and all(r["avg_busbw"] == "" and "avg_busbw=-1e+300" in r["note"] for r in rows)
    a, b = rows[0], rows[1]
    assert a["oop_time_us"] == a["oop_busbw_gbs"] == a["oop_wrong"] == "" and a["oop_algbw_gbs"] == "0.039681"
    assert "out of range, left empty: oop_time_us=-3, oop_busbw_gbs=1e+300, oop_wrong=-7" in a["note"]
    assert (a["ip_time_us"], a["ip_wrong"]) == ("25.806", "0")
    assert b["ip_wrong"] == b["ip_iter_p99_us"] == "" and "ip_wrong=0.5, ip_iter_p99_us=-1.5" in b["note"]


class _InterruptedAfter(io.RawIOBase):
    """A stream that gives ``data``, then Ctrl-C (where a live pipe would block)."""

    def __init__(self, data):
        self.data = data

    def readable(self):
        return True

    def readinto(self, buf):
        if not self.data:
            raise KeyboardInterrupt
        n = min(len(buf), len(self.data))
        buf[:n], self.data = self.data[:n], self.data[n:]
        return n


def test_held_rows_are_handed_over_once():
    """take_held gives the rows still waiting for their Avg line, once; rows already yielded (an interrupt in
    the middle of a table's release) are not given twice, and the rest keep the table's average."""
    lines = _example_text_lines()
    cut = next(k for k, line in enumerate(lines) if line.split()[:1] == ["65536"])
    parser = nccl_tests.OutputParser("s.out")
    with pytest.raises(KeyboardInterrupt):
        list(parser.rows(_then_interrupt(lines[:cut])))
    held = parser.take_held()
    assert [r["size_bytes"] for r in held] == [1024, 4096, 16384] and all(r["avg_busbw"] is None for r in held)
    assert parser.take_held() == []

    parser = nccl_tests.OutputParser("s.out")
    rows = parser.rows(lines)
    first = next(rows)  # the Avg line has been read: the table is being released
    held = parser.take_held()
    assert first["size_bytes"] == 1024 and [r["size_bytes"] for r in held] == [4096, 16384, 65536, 262144, 1048576]
    assert all(r["avg_busbw"] == pytest.approx(13.3524) for r in [first, *held]) and list(rows) == []

    doc = (EXAMPLES / "all_reduce_perf.json").read_bytes()
    partial = doc[: doc.index(b',"out_of_bounds"')]  # every result, no average_bus_bandwidth yet
    reader = nccl_tests.JsonResults("r.json")
    with pytest.raises(KeyboardInterrupt):
        list(reader.rows(io.BufferedReader(_InterruptedAfter(partial)), nccl_tests.LineStats()))
    assert [r["size_bytes"] for r in reader.take_held()] == [1024 << (2 * k) for k in range(6)]


def _then_interrupt(lines):
    yield from lines
    raise KeyboardInterrupt  # Ctrl-C while the next line is awaited


def _stream_prefix(kind):
    """The start of a live output with 3 finished rows and no Avg line yet: 22 lines of the text sample, or the
    JSON sample cut after its third result (the results list still open)."""
    if kind == "text":
        return "".join(line + "\n" for line in _example_text_lines()[:22])
    doc = (EXAMPLES / "all_reduce_perf.json").read_text()
    head = doc[: doc.index('"results":[') + len('"results":[')]
    results = json.loads(doc[len(head) - 1 : doc.index(',"out_of_bounds"')])
    return head + ",".join(json.dumps(r) for r in results[:3])


def _wait_until_blocked_reading(proc, pipe_fd, deadline):
    """Until the child has drained the pipe and sleeps (blocked on its next read): it has parsed what it got."""
    import fcntl
    import struct
    import termios
    import time

    stat = Path(f"/proc/{proc.pid}/stat")
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
        unread = struct.unpack("i", fcntl.ioctl(pipe_fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        if unread == 0 and (not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "S"):
            time.sleep(0.3)  # and it still is: not a sleep on the way (a page read, a lock)
            if stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "S":
                return
            if not stat.exists():
                time.sleep(1.5)
                return
    raise AssertionError("the child did not read its input in time")


@pytest.mark.parametrize(
    "kind,sig,code",
    [("text", signal.SIGINT, 130), ("text", signal.SIGTERM, 143), ("json", signal.SIGINT, 130)],
)
def test_ctrl_c_on_a_live_stream_writes_the_rows_held_for_the_avg_line(tmp_path, kind, sig, code):
    """A live ``nccl-tests … | opbench nccl-tests -``: 3 rows are in, the Avg line is not; Ctrl-C (or SIGTERM)
    writes those 3 rows (avg_busbw empty) before the process stops, as its message says."""
    import time

    out = tmp_path / "E" / "a.csv"
    proc = subprocess.Popen(
        [sys.executable, "-m", "opbench", "nccl-tests", "-", "--csv", str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # pytest's parent may ignore Ctrl-C
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write(_stream_prefix(kind))
        proc.stdin.flush()
        _wait_until_blocked_reading(proc, proc.stdin.fileno(), time.monotonic() + 60)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code and f"; the 3 rows finished so far are in {out}\n" in err, err
    rows = list(csv.DictReader(out.open()))
    assert [r["size_bytes"] for r in rows] == ["1024", "4096", "16384"]
    assert all(r["avg_busbw"] == "" and r["oop_time_us"] and r["nranks"] == "8" for r in rows)
