"""Numbers a report or a projection shows are plausible, and results CSVs are read one way (docs/conventions.md,
"Plausible numbers"; docs/report.md, "What the report trusts"; docs/project.md, "Rates"):

- a lone carriage return in a results CSV ends a line for ``opbench report`` and ``project --results`` alike,
  through one reader whose memory is linear in the file (pandas built a row index thousands of levels deep);
- a cell outside its kind's plausible range (a step of 1e300 s, -5 GiB) is set aside and named, never a result;
- ``--recompute-num-layers`` is bounded by a model chunk's layers;
- rates no real part has are named, and a projection built on them is marked implausible;
- rows of two devices are not mixed into one projection;
- plot labels from a CSV are inert and no plotting warning reaches the console.

The fixtures are written here, as the fuzzing round's reproducers wrote them.
"""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path

import pytest

from opbench.core.errors import run_cli
from opbench.core.plausible import KINDS, UNITS, part_range
from opbench.project.__main__ import main as project_main
from opbench.project.schema import SCHEMA as PROJECT
from opbench.report.__main__ import main as report_main
from opbench.report.discover import SCHEMAS, discover, read_rows

GEMM_HEADER = "model,layer,pass,m,n,k,dtype,backend,time_s,status"
QWEN = ["--model", "Qwen3_0.6B", "--device", "H100", "--world-size", "8"]


def gemm_folder(folder: Path, *rows: str, header: str = GEMM_HEADER, device: str | None = None) -> Path:
    """A results folder with one GEMM CSV of these rows and its sidecar (which names the benchmark: the short
    header alone matches none), naming ``device`` where given."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "benchmark_gemm_x.csv").write_text("\n".join([header, *rows]) + "\n")
    meta = {"benchmark": "gemm", **({"device_name": device} if device else {})}
    (folder / "benchmark_gemm_x.meta.json").write_text(json.dumps(meta))
    return folder


def lone_cr_folder(folder: Path, n: int) -> Path:
    """The fuzzer's file: each line holds a lone CR followed by ``n`` more fields (``,x`` in the header's line,
    ``,1`` in each row's), 15 good rows in all."""
    folder.mkdir(parents=True, exist_ok=True)
    header = GEMM_HEADER.encode()
    row = b"x,qkv,fwd,64,64,64,bf16,torch,1e-05,ok"
    lines = [header + b"\r" + b",x" * n] + [row + b"\r" + b",1" * n for _ in range(15)]
    (folder / "benchmark_gemm_x.csv").write_bytes(b"\n".join(lines) + b"\n")
    (folder / "benchmark_gemm_x.meta.json").write_text(json.dumps({"benchmark": "gemm", "device_name": "NVIDIA H100"}))
    return folder / "benchmark_gemm_x.csv"


# ---- item 7: one reader, a lone CR is a line break -----------------------------------------------------------


def test_a_lone_cr_ends_a_line_and_a_row_wider_than_its_header_is_left_out(tmp_path):
    """Each lone CR ends a line: the header and the 15 rows are read whole, the 16 lines of extra fields are rows of
    the wrong width, left out by the line they start on; the frame has the header's columns and a flat index."""
    path = lone_cr_folder(tmp_path / "res", 2000)
    frame, cut, lines = read_rows(path)
    assert list(frame.columns) == GEMM_HEADER.split(",") and frame.index.nlevels == 1
    assert len(frame) == 15 and (frame["m"] == 64).all() and (frame["status"] == "ok").all()
    assert lines == list(range(3, 33, 2)) and cut == list(range(2, 34, 2))
    found = discover(tmp_path / "res")
    (f,) = found.files
    assert len(f.frame) == 15 and [d.line for d in f.dropped] == cut
    assert found.damaged[0][1].startswith("16 row(s) with the wrong number of fields left out (line 2, 4, 6, 8, 10, …")


def test_the_reader_keeps_a_quoted_cr_and_counts_lines_as_the_file_has_them(tmp_path):
    path = tmp_path / "benchmark_gemm_x.csv"
    path.write_bytes(
        (
            GEMM_HEADER + '\r\n"a\rb",qkv,fwd,64,64,64,bf16,torch,1e-05,ok\rx,qkv,fwd,64,64,128,bf16,torch,2e-05,ok\n'
        ).encode()
    )
    frame, cut, lines = read_rows(path)
    assert frame["model"].tolist() == ["a\rb", "x"] and frame["k"].tolist() == [64, 128]
    assert cut == [] and lines == [2, 4]  # the quoted CR ends line 2 as well: the second row starts on line 4


def test_reading_memory_is_linear_in_the_file(tmp_path):
    """The fuzzer's 1.3 MB file took 2:44 min and 10.8 GB; the reader's peak (tracemalloc) stays within a small
    multiple of the file and grows with it, not with rows × widest row."""
    peaks = []
    for n in (20000, 40000):
        path = lone_cr_folder(tmp_path / str(n), n)
        tracemalloc.start()
        try:
            frame, _, _ = read_rows(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert frame.shape == (15, 10)
        assert peak < 8 * path.stat().st_size, (peak, path.stat().st_size)
        peaks.append(peak)
    assert peaks[1] < 3 * peaks[0], peaks  # twice the file: at most about twice the memory


def test_a_line_longer_than_any_row_of_the_header_is_one_cut_row(tmp_path):
    """3 MB of commas on one line (3 million empty fields: 24 MB of list were it split) is one row of the wrong
    width, never split: the reader's peak stays near the line's own size."""
    path = tmp_path / "benchmark_gemm_x.csv"
    row = "x,qkv,fwd,64,64,64,bf16,torch,1e-05,ok"
    path.write_text(f"{GEMM_HEADER}\n{row}\n{',' * 3_000_000}\n{row}\n")
    tracemalloc.start()
    try:
        frame, cut, lines = read_rows(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(frame) == 2 and cut == [3] and lines == [2, 4]
    assert peak < 5 * path.stat().st_size, peak


def test_report_and_project_read_the_same_rows(tmp_path, capsys):
    folder = lone_cr_folder(tmp_path / "res", 500).parent
    assert run_cli(report_main, [str(folder), "--no-plots"], prog="opbench report") == 0
    out, err = capsys.readouterr()
    assert "read 1 CSV(s) (15 ok rows)" in out
    assert "16 row(s) with the wrong number of fields left out (line 2, 4, 6" in err
    assert run_cli(project_main, [*QWEN, "--results", str(folder)], prog="opbench project") == 0
    err = capsys.readouterr().err
    assert f"note: 16 row(s) of --results left out for bad values ({folder}/benchmark_gemm_x.csv:2: the wrong" in err


# ---- item 8: one plausibility rule per kind, set aside and named ---------------------------------------------


def test_every_column_with_a_unit_has_a_kind_and_the_kinds_state_their_ranges():
    for schema in SCHEMAS.values():
        for column in schema.columns:
            unit = schema.unit(column)
            if unit:
                assert unit in UNITS and schema.plausible(column) is not None, (schema.benchmark, column, unit)
    time, memory = KINDS["time"], KINDS["memory"]
    assert time.rule == "a time: more than 0 s and at most 1 year"
    assert not time.plausible(0) and not time.plausible(1e300) and time.plausible(6.5)
    assert not memory.plausible(-5 * 2**30) and memory.plausible(0) and not memory.plausible(2.0**51)
    assert PROJECT.plausible("mem_total_gib") == (memory, 2.0**30)
    assert PROJECT.plausible("bubble_s")[0].plausible(0.0)  # a part of a step may be 0


PROJECT_CSV_ROW = {
    "model": "Qwen3_0.6B", "layout": "tp1 pp1 dp8 mbs4 zero1 rc-none", "world_size": 8, "tp": 1, "pp": 1, "dp": 8,
    "cp": 1, "ep": 1, "etp": 1, "vpp": 1, "mbs": 4, "microbatches": 32, "global_batch": 1024, "seqlen": 4096,
    "sharding": "zero1", "recompute": "none", "schedule": "1f1b", "dtype": "bf16", "fp8": "none", "device": "H100",
    "rank": 1, "step_time_s": 6.5278, "compute_s": 6.52697, "exposed_comm_s": 0, "tp_comm_s": 0, "ep_comm_s": 0,
    "cp_comm_s": 0, "pp_comm_s": 0, "dp_comm_s": 0, "offload_s": 0, "bubble_s": 0, "optimizer_s": 0.000834, "tokens_per_s": 642529,
    "mfu": 0.4239, "mem_params_gib": 1.11, "mem_grads_gib": 2.22, "mem_optimizer_gib": 0.83,
    "mem_activations_gib": 28.6, "mem_buffers_gib": 4.73, "mem_total_gib": 37.5, "memory_gib": 80, "fits": True,
    "estimated_share": 1, "rates": "gemm: estimated", "status": "ok", "error": "",
}  # fmt: skip


def write_project_csv(folder: Path, changes: list[dict[str, object]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [",".join(PROJECT.columns)]
    for i, change in enumerate(changes):
        row = {**PROJECT_CSV_ROW, "rank": i + 1, **change}
        rows.append(",".join(str(row[c]) for c in PROJECT.columns))
    (folder / "project.csv").write_text("\n".join(rows) + "\n")
    (folder / "project.meta.json").write_text(json.dumps({"benchmark": "project", "device": "H100"}))


def test_report_sets_aside_impossible_numbers_and_says_so(tmp_path, capsys):
    """step_time_s 1e300 and -5, mem_total_gib -5, tokens_per_s -1e308 (the fuzzer's project.csv) are no results:
    the good row alone is shown, the others are counted and named with file, line, column and the rule."""
    res = tmp_path / "res"
    write_project_csv(
        res, [{}, {"step_time_s": "1e+300"}, {"step_time_s": -5}, {"mem_total_gib": -5}, {"tokens_per_s": -1e308}]
    )
    assert run_cli(report_main, [str(res), "--no-plots"], prog="opbench report") == 0
    out, err = capsys.readouterr()
    assert "read 1 CSV(s) (1 ok rows, 4 set aside as implausible)" in out
    (warning,) = err.strip().splitlines()[:1]
    assert warning.startswith("warning: project.csv: 4 row(s) with a value outside its plausible range set aside (")
    assert "line 3 field 'step_time_s': '1e+300' (a time: more than 0 s and at most 1 year)" in warning
    assert "line 4 field 'step_time_s': '-5.0' (a time: more than 0 s and at most 1 year)" in warning
    md = (res / "report" / "report.md").read_text()
    assert "4 row(s) set aside: a value outside its plausible range" in md
    table = md.split("## Projected training step")[1].split("##")[0]
    rows = [line for line in table.splitlines() if line.startswith("|") and "tp1 pp1 dp8" in line]
    assert len(rows) == 1 and "1e+300" not in table and "-5" not in table and "-1e+308" not in table
    left_out = md.split("## Rows left out")[1]
    assert "line 5 field 'mem_total_gib': '-5.0' (a memory size: at least 0 B and at most 1 PiB)" in left_out


def test_project_results_set_an_implausible_rate_row_aside(tmp_path, capsys):
    res = gemm_folder(
        tmp_path / "res", "x,qkv,fwd,1024,1024,1024,bf16,torch,0.001,ok", "x,qkv,fwd,64,64,64,bf16,torch,-5,ok"
    )
    assert run_cli(project_main, [*QWEN, "--results", str(res)], prog="opbench project") == 0
    err = capsys.readouterr().err
    assert (
        f"note: 1 row(s) of --results left out for bad values ({res}/benchmark_gemm_x.csv:3: field 'time_s': a value "
        "outside its plausible range ('-5.0' (a time: more than 0 s and at most 1 year)))"
    ) in err


# ---- item 9: --recompute-num-layers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--recompute-method", "block", "--recompute-num-layers", "1000000000"],
            "field '--recompute-num-layers': 1,000,000,000 is more than the 28 decoder layers of a model chunk "
            "(Qwen3_0.6B: 28 layers / pp 1)",
        ),
        (
            ["--recompute-num-layers", "29"],
            "field '--recompute-num-layers': 29 is more than the 28 decoder layers of a model chunk",
        ),
        (
            ["--pp", "2", "--vpp", "2", "--recompute-num-layers", "8"],
            "field '--recompute-num-layers': 8 is more than the 7 decoder layers of a model chunk (Qwen3_0.6B: 28 "
            "layers / pp 2 / vpp 2)",
        ),
        (
            ["--search", "--recompute-num-layers", "1000000000"],
            "field '--recompute-num-layers': 1,000,000,000 is more than Qwen3_0.6B's 28 decoder layers",
        ),
    ],
)
def test_recompute_num_layers_above_a_chunk_is_one_line(capsys, extra, message):
    argv = [*QWEN, "--recompute", "full", *extra] if "--search" not in extra else [*QWEN, *extra]
    assert run_cli(project_main, argv, prog="opbench project") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_recompute_num_layers_up_to_a_chunk_projects(capsys):
    argv = [*QWEN, "--pp", "2", "--vpp", "2", "--recompute", "full", "--recompute-num-layers", "7"]
    assert run_cli(project_main, argv, prog="opbench project") == 0
    assert "rc-full[uniform7]" in capsys.readouterr().out


# ---- item 10: rates no real part has ------------------------------------------------------------------------


def test_part_range_is_the_slowest_part_and_the_targets_peak():
    low, high = part_range("compute", 2 * 1024**3 / 1e12, 989.0)
    assert high == pytest.approx(989.0 * 1.5) and 0 < low < 1e-4
    assert part_range("memory", math.inf, None) == (0.1, 1e5)


def test_a_projection_built_on_absurd_rates_is_named_and_marked(tmp_path, capsys):
    """A GEMM row of 10⁶ s: a note names the row and how far it is from any part; the step it gives (years) is
    marked implausible on the console, in project.csv's status and error, and the notes are in the sidecar."""
    res, out = gemm_folder(tmp_path / "res", "x,qkv,fwd,1024,1024,1024,bf16,torch,1000000,ok"), tmp_path / "out"
    assert run_cli(project_main, [*QWEN, "--results", str(res), "--report-dir-path", str(out)]) == 0
    stdout, err = capsys.readouterr()
    assert (
        f"note: 1 GEMM row of --results at a rate no real part has: {res}/benchmark_gemm_x.csv:2 (1024x1024x1024 in "
        "1e+06 s) at 2.15e-09 TFLOP/s is 4.64e+04 times below the plausible range for H100"
    ) in err
    assert "note: the projection is implausible, no result (step_time_s " in err
    assert "IMPLAUSIBLE, no result: step_time_s " in stdout and "[implausible] step " in stdout
    text = (out / "project.csv").read_text().splitlines()
    row = dict(zip(text[0].split(","), text[1].split(",", len(PROJECT.columns) - 1)))
    assert row["status"] == "implausible" and row["error"].startswith("step_time_s ")
    meta = json.loads((out / "project.meta.json").read_text())
    assert any(n.startswith("1 GEMM row of --results at a rate no real part has") for n in meta["notes"])
    # the report lists the marked row with why, not as a result
    assert run_cli(report_main, [str(out), "--no-plots"]) == 0
    md = (out / "report" / "report.md").read_text()
    assert "Rows not measured (1: implausible: 1)" in md and "outside the plausible range of a time" in md


def test_memory_rates_far_from_the_part_are_named(tmp_path, capsys):
    res = tmp_path / "res"
    res.mkdir()
    header = "host,node,rank,local_rank,device_name,kernel,size_bytes,time_s,gbs,status"
    (res / "cluster_memory.csv").write_text(f"{header}\nh,0,0,0,NVIDIA H100,copy,1073741824,2147483.648,1e-06,ok\n")
    assert run_cli(project_main, [*QWEN, "--results", str(res)]) == 0
    stdout, err = capsys.readouterr()
    assert f"note: 1 memory row of --results at a rate no real part has: {res}/cluster_memory.csv:2" in err
    assert "at 1e-06 GB/s is 9.91e+04 times below the plausible range for H100" in err
    assert "[implausible] step " in stdout
    assert run_cli(project_main, [*QWEN, "--memory-bandwidth-gbs", "1000000"]) == 0
    err = capsys.readouterr().err
    assert "note: 1 flag at a rate no real part has: --memory-bandwidth-gbs at 1e+06 GB/s is 199 times above" in err


def test_plausible_rates_give_no_note(tmp_path, capsys):
    res = gemm_folder(tmp_path / "res", "x,qkv,fwd,64,64,64,bf16,torch,1e-05,ok")
    assert run_cli(project_main, [*QWEN, "--results", str(res)]) == 0
    stdout, err = capsys.readouterr()
    assert err == "" and "implausible" not in stdout.lower()


# ---- item 11: one device per projection ---------------------------------------------------------------------


def test_rows_of_two_devices_are_refused_naming_both(tmp_path, capsys):
    """Neither device is in the peak table: rows of an Intel Xeon folder (named by its sidecar) and of an AMD EPYC
    folder are one line naming both and a file of each; a row's own device cell wins over its sidecar's."""
    header = f"{GEMM_HEADER},device"
    epyc, xeon, gpu = tmp_path / "epyc", tmp_path / "xeon", tmp_path / "gpu"
    for folder, device, sidecar in (
        (epyc, "AMD EPYC 7B13", None),
        (xeon, "", "Intel Xeon"),
        (gpu, "RTX 4090", "AMD EPYC 7B13"),
    ):
        gemm_folder(folder, f"x,qkv,fwd,1024,1024,1024,fp32,torch,0.01,ok,{device}", header=header, device=sidecar)
    base = ["--model", "Qwen3_0.6B", "--world-size", "1", "--seqlen", "128", "--dtype", "fp32", "--results"]
    for other, name in ((xeon, "Intel Xeon"), (gpu, "RTX 4090")):
        assert run_cli(project_main, [*base, str(epyc), str(other)]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert (
            f"field '--results': holds rows measured on two devices, 'AMD EPYC 7B13' ({epyc}/benchmark_gemm_x.csv:2) "
            f"and '{name}' ({other}/benchmark_gemm_x.csv:2)"
        ) in line


# ---- item 12: plot labels inert, no library warning ----------------------------------------------------------


def test_plot_text_is_escaped_and_capped():
    from opbench.report.plots import MAX_PLOT_TEXT, plot_text

    assert plot_text("a\x01b\x1b[31m\tc") == "a\\x01b\\x1b[31m\\tc"
    assert len(plot_text("L" * 5000)) == MAX_PLOT_TEXT and plot_text("L" * 5000).endswith("…")
    assert plot_text("qkv\nfwd") == "qkv\nfwd"  # a category's own lines stay


def test_report_plots_odd_names_without_a_library_warning(run, tmp_path):
    pytest.importorskip("matplotlib")
    res = tmp_path / "res"
    write_project_csv(res, [{"layout": "a\x01b\x1b[31m\x07c"}, {"layout": "L" * 5000}, {"layout": "tab\there\x00nul"}])
    r = run("opbench", "report", str(res))
    assert r.returncode == 0 and "Warning" not in r.stderr and "warnings.warn" not in r.stderr, r.stderr
    assert r.stderr == "" and "with 1 plot(s)" in r.stdout, r.stdout + r.stderr
    assert (res / "report" / "project_Qwen3_0.6B.png").stat().st_size > 0
