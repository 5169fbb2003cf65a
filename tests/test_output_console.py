"""What the console shows (issue 26 items 1, 3, 6): one line per finished row where output is not a terminal
(a batch log), flushed as each row lands; units in every header; a bare `opbench gemm` that is quick and says
what it chose."""

import csv
import io
import json
import subprocess
import sys
import time

from conftest import ROOT

from opbench.attention.__main__ import main as attention_main
from opbench.core.progress import BAR, LINES, OFF, RowProgress, column, progress_mode, time_text
from opbench.core.results import summary_table
from opbench.gemm.schema import SCHEMA as GEMM


def test_a_piped_gemm_prints_each_row_as_it_finishes(tmp_path):
    """stdout is a pipe (as under sbatch or `| tee`): the header comes at once and each row's line while the run
    is still going, with the figures the CSV holds."""
    shapes = "16x16x16,24x24x24,32x32x32"
    proc = subprocess.Popen(
        [sys.executable, "-m", "opbench.gemm", "--mnk", shapes, "--rel-tol", "0", "--max-spread", "0"]
        + ["--max-iters", "100000000", "--budget", "1", "--report-dir-path", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[tuple[str, bool]] = []  # (line, was the run still going when it arrived)
    assert proc.stdout is not None
    for line in proc.stdout:  # every line through one reader: communicate() after a partial read would lose
        seen.append((line.rstrip("\n"), proc.poll() is None))  # what this file object had buffered already
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    out = "\n".join(text for text, _ in seen)
    lines = [text for text, _ in seen]
    assert lines[0].startswith("# gemm raw on ") and "3 rows" in lines[0]
    assert lines[1].split()[:5] == ["#", "row", "elapsed", "layer", "pass"] and "TFLOP/s" in lines[1]
    first = next(i for i, text in enumerate(lines) if text.startswith("  1/3"))
    assert seen[first][1], "the first row's line came only when the run had ended"
    with open(tmp_path / "benchmark_gemm_raw.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    for n, row in enumerate(rows, 1):
        cells = next(text for text in lines if text.startswith(f"  {n}/3")).split()
        m_n_k = f"{row['m']}x{row['n']}x{row['k']}"
        assert m_n_k in cells and "torch" in cells
        shown, unit = cells[cells.index("torch") + 1 :][:2]
        expected, expected_unit = time_text(float(row["time_s"])).split()
        # the line prints the measured float, the CSV keeps it to a few digits: equal up to that rounding
        assert unit == expected_unit and abs(float(shown) - float(expected)) <= 0.01 * float(expected), (cells, row)
        assert float(cells[cells.index("torch") + 3]) == float(f"{float(row['tflops']):.4g}")
    assert "\nraw on " in out and "wrote " in out  # the closing table follows the lines


def test_progress_mode_and_lines():
    assert progress_mode(environ={"OPBENCH_PROGRESS": "lines"}) == LINES
    assert progress_mode(environ={"OPBENCH_PROGRESS": "1"}) == BAR
    assert progress_mode(environ={"OPBENCH_PROGRESS": "off"}) == OFF
    assert progress_mode(enabled=False, environ={"OPBENCH_PROGRESS": "lines"}) == OFF
    assert progress_mode(environ={}) == LINES  # pytest captures stdout: not a terminal
    out = io.StringIO()
    with RowProgress(12, "demo", [column("name", 6, left=True), column("x", 5)], stream=out) as shown:
        shown.done({"name": "a", "x": 1.5})
        shown.done({"name": "bb", "x": None})
    head, titles, one, two = out.getvalue().splitlines()
    assert head == "# demo: 12 rows, one line per finished row (the CSV has every column)"
    assert titles.split() == ["#", "row", "elapsed", "name", "x"]
    assert one.split()[0] == "1/12" and one.split()[2:] == ["a", "1.5"]
    assert two.split()[0] == "2/12" and two.split()[2:] == ["bb"]
    silent = io.StringIO()
    with RowProgress(1, "demo", stream=silent, mode=OFF) as shown:
        shown.done({})
    assert silent.getvalue() == ""
    assert [time_text(s) for s in (2.514, 0.0919, 8.31e-6, 1e-9)] == ["2.51 s", "91.9 ms", "8.31 us", "1 ns"]


def test_attention_lines_and_headers_state_their_units(tmp_path, capsys):
    shapes = tmp_path / "mine.json"
    shape = {"model": "mine", "seqlen_q": 64, "seqlen_kv": 64, "num_head_q": 2, "num_head_kv": 2}
    shapes.write_text(json.dumps([{**shape, "head_dim_qk": 32, "head_dim_v": 32, "causal": True}]))
    out = tmp_path / "a.csv"
    argv = ["--shapes-json-path", str(shapes), "--backends", "math", "--passes", "fwd,bwd", "--quick"]
    assert attention_main([*argv, "--report-csv-path", str(out)]) == 0
    text = capsys.readouterr().out
    titles = next(line for line in text.splitlines() if line.startswith("# row"))
    assert "fwd time" in titles and "bwd TFLOP/s" in titles and "fwdbwd" not in titles  # fwdbwd was not run
    line = next(line for line in text.splitlines() if line.startswith("  1/1"))
    assert "1 x 64/64 x 2/2 x 32" in line and " math " in line and line.rstrip().endswith(("ok", "ok, noisy"))
    assert "fwd_time [s]" in text and "bwd_time [s]" in text  # the closing table's headers say seconds


def test_summary_headers_carry_the_schema_units():
    text = summary_table([{"time_s": 0.5, "tflops": 1.0, "pct_of_peak": 3.0}], ["time_s", "tflops", "pct_of_peak"])
    assert text.split()[:3] == ["time_s", "tflops", "pct_of_peak"]  # no schema: the names as they are
    text = summary_table([{"time_s": 0.5, "tflops": 1.0, "pct_of_peak": 3.0}], ["time_s", "pct_of_peak"], schema=GEMM)
    assert text.splitlines()[0].split() == ["time_s", "pct_of_peak", "[%]"]  # time_s names its unit already


def test_a_bare_gemm_is_a_quick_look_and_says_so(run, tmp_path):
    t0 = time.monotonic()
    r = run("opbench", "gemm", "--dry-run", "--device", "cpu", "--report-dir-path", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 60
    assert "note: no --model: a quick look at Qwen3_0.6B at seqlen 128 (CPU)" in r.stderr
    assert "Llama3.1_405B" in r.stderr  # the choices, for --model
    (plan,) = tmp_path.glob("*.csv")
    with open(plan, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert plan.name == "benchmark_gemm_Qwen3_0.6B.plan.csv" and len(rows) == 15
    assert {r["seqlen"] for r in rows} == {"128"} and {r["model"] for r in rows} == {"Qwen3_0.6B"}


def test_a_reader_that_goes_away_ends_the_help_quietly():
    """`opbench --help | head -1`: the pipe closes before opbench writes; exit 0 and no traceback."""
    for argv in (["--help"], ["project", "--help"]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "opbench", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
        )
        assert proc.stdout is not None
        proc.stdout.close()  # the reader is gone before the first write
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and b"Traceback" not in err, err.decode()
