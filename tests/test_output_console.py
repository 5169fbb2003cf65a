"""What the console shows (issue 26 items 1, 3, 6): one line per finished row where output is not a terminal
(a batch log), flushed as each row lands; units in every header; a bare `opbench gemm` that is quick and says
what it chose."""

import csv
import io
import json
import subprocess
import sys
import time

import pytest
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


def test_notes_are_wrapped_at_120_with_a_continuation_indent():
    from opbench.core.units import CONSOLE_WIDTH, note, wrapped

    text = "the earlier benchmark_gemm_raw.csv is kept as " + "/tmp/" + "x" * 130 + "/b.csv (--overwrite replaces it)"
    lines = note(text).splitlines()
    assert lines[0] == "note: the earlier benchmark_gemm_raw.csv is kept as"
    assert lines[1] == "  /tmp/" + "x" * 130 + "/b.csv"  # a path longer than a line stands whole, on its own
    assert lines[2] == "  (--overwrite replaces it)" and " ".join(" ".join(lines).split()) == f"note: {text}"
    hashed = note("a " * 100, lead="# note: ", indent="#   ").splitlines()
    assert len(hashed) == 2 and hashed[1].startswith("#   a") and all(len(x) <= CONSOLE_WIDTH for x in hashed)
    assert wrapped("\nshort\n\nkept") == "\nshort\n\nkept"  # the text's own lines stay


def test_the_bare_gemm_note_is_wrapped(run, tmp_path):
    r = run("opbench", "gemm", "--dry-run", "--device", "cpu", "--report-dir-path", str(tmp_path))
    assert r.returncode == 0 and all(len(line) <= 120 for line in r.stderr.splitlines()), r.stderr
    assert "Qwen3_235B_A22B" in r.stderr and r.stderr.count("\n  ") >= 1


def test_the_time_left_weighs_rows_by_their_work():
    """A Qwen3-0.6B-like sweep: 12 GEMMs of 2-6 GFLOP, then 3 of 159 GFLOP. After the 12, counting rows promised
    the 3 in a quarter of the 12's time; the work-weighted estimate charges each big row what the harness spends on
    its predicted calls, plus the fixed cost the small rows showed. No clock is read: wall times are given."""
    from opbench.core.progress import Remaining, Workload
    from opbench.core.timing import TimingConfig, expected_seconds

    timing = TimingConfig()
    assert expected_seconds(0.02, timing, extra_calls=1) == pytest.approx(44 * 0.02)  # 3 warm-up, 2×20, 1 check
    assert expected_seconds(0.75, timing, extra_calls=1) == pytest.approx(8 * 0.75)  # 2 warm-up, 5, 1 check
    small = [4.3e9, 2.1e9, 6.4e9, 3.2e9] * 3
    flops = [*small, 159e9, 159e9, 159e9]
    rate = 0.21e12  # FLOP/s of every call
    wall = [expected_seconds(f / rate, timing, 1) + 0.1 for f in small]  # 0.1 s fixed per row
    work = Workload([[f] for f in flops], lambda row: [row["time_s"]], lambda t: expected_seconds(t, timing, 1))
    left = Remaining(work)
    assert left.seconds_left(0) is None  # nothing measured yet
    for i, (f, w) in enumerate(zip(small, wall, strict=True)):
        left.finished(i, {"time_s": f / rate}, w)
    by_rows = sum(wall) / 12 * 3
    expected = 3 * (0.1 + expected_seconds(159e9 / rate, timing, 1))
    assert left.seconds_left(12) == pytest.approx(expected, rel=1e-6)
    assert left.seconds_left(12) > 6 * by_rows  # 18.5 s against 2.9 s
    left.finished(12, {"time_s": None}, 50.0)  # a failed row says nothing about the rate or the fixed cost
    assert left.seconds_left(13) == pytest.approx(expected * 2 / 3, rel=1e-6)


def test_the_bar_shows_the_work_weighted_time_left(monkeypatch, capsys):
    """On a terminal (OPBENCH_PROGRESS=bar) the bar counts rows and ends with the estimate, not tqdm's own."""
    from opbench.core.progress import RowProgress, Workload

    work = Workload([[1.0], [1.0], [100.0]], lambda row: [row["t"]], lambda t: 10 * t)
    with RowProgress(3, "demo", mode=BAR, workload=work) as shown:
        shown.done({"t": 0.01})
        assert shown.time_left() != "?" and shown._bar.left == shown.time_left()
        assert "1/3 [" in str(shown._bar) and str(shown._bar).endswith(f"<{shown.time_left()}]")
    assert RowProgress(2, "x", mode=OFF).time_left() == "?"  # no workload: tqdm's row count only


def test_an_interrupt_names_the_csv_and_its_rows(tmp_path, capsys):
    """run_cli's Ctrl-C line names every CSV open at that moment and the rows in it; none open: says so."""
    from opbench.core.errors import run_cli
    from opbench.core.results import CsvReport

    path = tmp_path / "g.csv"

    def stopped(argv):
        with CsvReport(path, GEMM) as report:
            report.append({"model": "m", "status": "ok"})
            report.append({"model": "m", "status": "ok"})
            raise KeyboardInterrupt

    assert run_cli(stopped, [], prog="opbench gemm") == 130
    assert capsys.readouterr().err == f"opbench gemm: interrupted; the 2 rows finished so far are in {path}\n"

    def two(argv):
        with CsvReport(tmp_path / "a.csv", GEMM), CsvReport(tmp_path / "b.csv", GEMM) as second:
            second.append({"model": "m"})
            raise KeyboardInterrupt

    assert run_cli(two, [], prog="p") == 130
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    assert capsys.readouterr().err == f"p: interrupted; the rows finished so far are in {a} (0 rows), {b} (1 row)\n"

    def done_first(argv):
        with CsvReport(tmp_path / "c.csv", GEMM):
            pass  # closed before the interrupt: not named
        raise KeyboardInterrupt

    assert run_cli(done_first, [], prog="p") == 130
    assert capsys.readouterr().err == "p: interrupted; no CSV was being written\n"
