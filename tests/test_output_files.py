"""No measured row is lost unless the user asks (issue 26 item 2, issue 25 item 8): a rerun keeps the earlier CSV,
a dry run writes a plan of its own, --overwrite / --append do what they say, and two runs writing one CSV at once
never lose each other's rows (the second stops at once, naming the first). Real processes, real files."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from opbench.core import outputs
from opbench.core.errors import UsageError
from opbench.core.results import CsvReport
from opbench.gemm.schema import SCHEMA as GEMM

TINY = ["--mnk", "32x32x32,48x48x48", "--quick"]


def rows_of(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_rerun_keeps_the_earlier_csv_and_a_dry_run_never_touches_it(run, tmp_path):
    first = run("opbench.gemm", *TINY, "--report-dir-path", str(tmp_path))
    assert first.returncode == 0, first.stderr
    measured = tmp_path / "benchmark_gemm_raw.csv"
    before = measured.read_bytes()
    assert len(rows_of(measured)) == 2

    plan = run("opbench.gemm", *TINY, "--dry-run", "--report-dir-path", str(tmp_path))
    assert plan.returncode == 0, plan.stderr
    assert measured.read_bytes() == before  # the measured rows are where they were
    planned = rows_of(tmp_path / "benchmark_gemm_raw.plan.csv")
    assert [r["status"] for r in planned] == ["planned", "planned"]
    assert "benchmark_gemm_raw.plan.csv (2 planned rows)" in plan.stdout

    again = run("opbench.gemm", *TINY, "--report-dir-path", str(tmp_path))
    assert again.returncode == 0, again.stderr
    (kept,) = (tmp_path / "earlier").glob("*/benchmark_gemm_raw.csv")
    assert kept.read_bytes() == before and (kept.parent / "benchmark_gemm_raw.meta.json").is_file()
    # wrapped at 120 characters (docs/conventions.md, "Console lines"): the path whole, on a line of its own if long
    assert f"note: the earlier benchmark_gemm_raw.csv is kept as {kept}" in " ".join(again.stderr.split())
    assert all(len(line) <= 120 or line.strip().startswith(str(kept)) for line in again.stderr.splitlines())
    assert len(rows_of(measured)) == 2 and measured.read_bytes() != before


def test_a_real_run_into_a_plan_name_is_refused_and_a_dry_run_writes_it(tmp_path, capsys):
    """A real run's CSV named <x>.plan.csv would be skipped by opbench report as a plan: one line, exit 2, nothing
    written; a dry run writes its plan there."""
    from opbench.attention.__main__ import main as attention_main
    from opbench.core.errors import run_cli
    from opbench.trace.__main__ import main as trace_main

    log = tmp_path / "job.log"
    log.write_text("no calls here\n")
    plan = tmp_path / "sizes.plan.csv"
    assert run_cli(trace_main, [str(log), "--csv", str(plan)], prog="opbench trace") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field '--report-csv-path': a name ending in .plan.csv is a dry run's plan" in err
    assert not plan.exists()
    attention = ["--model", "Qwen3_0.6B", "--seqlen", "64", "--report-csv-path", str(plan)]
    assert run_cli(attention_main, [*attention, "--dry-run"], prog="opbench attention") == 0
    assert {r["status"] for r in rows_of(plan)} == {"planned"}


def test_overwrite_replaces_append_adds_and_both_at_once_is_refused(run, tmp_path):
    assert run("opbench.gemm", *TINY, "--report-dir-path", str(tmp_path)).returncode == 0
    measured = tmp_path / "benchmark_gemm_raw.csv"
    r = run("opbench.gemm", *TINY, "--append", "--report-dir-path", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert len(rows_of(measured)) == 4 and not (tmp_path / "earlier").exists()
    r = run("opbench.gemm", *TINY, "--overwrite", "--report-dir-path", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert len(rows_of(measured)) == 2 and not (tmp_path / "earlier").exists()
    r = run("opbench.gemm", *TINY, "--overwrite", "--append", "--report-dir-path", str(tmp_path))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not allowed with argument --overwrite" in r.stderr


def test_append_refuses_a_csv_with_other_columns(tmp_path):
    path = tmp_path / "benchmark_gemm_raw.csv"
    path.write_text("model,layer,time\nx,qkv,1.0\n")
    with pytest.raises(UsageError, match="--append: the CSV there has other columns"):
        CsvReport(path, GEMM, append=True)
    assert path.read_text() == "model,layer,time\nx,qkv,1.0\n"
    assert not outputs.lock_path(path).exists()  # a refused open leaves no lock behind


def test_a_plan_only_csv_is_replaced_without_keeping_it(tmp_path):
    path = tmp_path / "benchmark_gemm_x.csv"  # written by an opbench before plans had their own file
    with CsvReport(path, GEMM) as report:
        report.append({"model": "x", "status": "planned"})
    outputs._WRITTEN.discard(outputs._key(path))  # as a new run would see it
    with CsvReport(path, GEMM) as report:
        report.append({"model": "x", "status": "ok"})
    assert report.moved_to is None and not (tmp_path / "earlier").exists()
    assert [r["status"] for r in rows_of(path)] == ["ok"]
    assert outputs.plan_path(path).name == "benchmark_gemm_x.plan.csv"
    assert outputs.kept_aside("earlier/20261124T000000Z/benchmark_gemm_x.csv").startswith("an earlier run")
    assert outputs.kept_aside("benchmark_gemm_x.plan.csv").startswith("a dry run")
    assert outputs.kept_aside("gemm/benchmark_gemm_x.csv") is None


def test_a_csv_path_without_csv_keeps_a_sidecar_of_its_own(tmp_path):
    """``llama3.1`` and ``llama3.2`` once shared ``llama3.meta.json`` (each run's environment replaced the other's);
    ``run`` beside ``run.csv`` would share ``run.meta.json``, so it is refused in one line."""
    for name in ("run.csv", "llama3.1", "llama3.2"):
        with CsvReport(tmp_path / name, GEMM, {"command": name}) as report:
            report.append({"model": name, "status": "ok"})
    sidecars = {p.name: json.loads(p.read_text())["command"] for p in tmp_path.glob("*.meta.json")}
    assert sidecars == {"run.meta.json": "run.csv", "llama3.1.meta.json": "llama3.1", "llama3.2.meta.json": "llama3.2"}
    with pytest.raises(UsageError, match=r"run\.csv beside it has the same sidecar \(run\.meta\.json\)"):
        CsvReport(tmp_path / "run", GEMM)
    assert not (tmp_path / "run").exists()


HOLDER = """
import sys, time
from opbench.core.results import CsvReport
from opbench.gemm.schema import SCHEMA
with CsvReport(sys.argv[1], SCHEMA) as report:
    report.append({"model": "first", "status": "ok"})
    print("holding", flush=True)
    time.sleep(120)
"""


SHAPES = ["16x16x16", "24x24x24", "40x40x40", "48x48x48", "56x56x56", "72x72x72"]


def test_a_second_run_into_the_same_csv_stops_at_once_naming_the_first(run, tmp_path):
    """Two real gemm runs into one folder: the second fails at once with one line naming the first (pid, host,
    command with its secret masked); the first's rows are all there."""
    folder = tmp_path / "run_password=hunter22"  # a credential-like path: masked wherever a command is printed
    csv_path = folder / "benchmark_gemm_raw.csv"
    first = subprocess.Popen(
        [sys.executable, "-m", "opbench.gemm", "--mnk", ",".join(SHAPES), "--rel-tol", "0", "--max-spread", "0"]
        + ["--max-iters", "100000000", "--budget", "2", "--report-dir-path", str(folder)],  # 2 s a shape
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (csv_path.exists() and rows_of(csv_path)):
            time.sleep(0.1)
        t0 = time.monotonic()
        second = run("opbench.gemm", "--mnk", "64x64x64", "--quick", "--report-dir-path", str(folder))
        took = time.monotonic() - t0
        assert first.poll() is None, "the first run ended before the second started: nothing was tested"
    finally:
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=120)
    assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
    assert "another opbench run is writing this file" in second.stderr
    assert f"pid {first.pid} on " in second.stderr and "opbench.gemm --mnk 16x16x16,24x24x24" in second.stderr
    assert "hunter22" not in second.stderr and "wrote" not in second.stdout
    assert took < 30  # at once: torch's import, not the first run's seconds per shape
    assert first.returncode == 130, err
    assert not (folder / "benchmark_gemm_raw.csv.lock").exists()  # the first run took its lock file away
    rows = rows_of(csv_path)
    assert rows and {f"{r['m']}x{r['n']}x{r['k']}" for r in rows} <= set(SHAPES)  # none of the second's
    assert not (folder / "earlier").exists()


def test_a_symlink_to_a_csv_being_written_is_that_csv(tmp_path):
    """The lock is the file's, not the path's: a second writer through a symlink (here with --append, which
    would have interleaved its rows into the first's) stops at once, naming the first."""
    path = tmp_path / "d" / "out.csv"
    link = tmp_path / "link.csv"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        link.symlink_to(path)
        with pytest.raises(UsageError, match=f"another opbench run is writing this file \\(pid {holder.pid} on "):
            CsvReport(link, GEMM, append=True)
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert [r["model"] for r in rows_of(path)] == ["first"]


def test_a_killed_writer_leaves_no_lock_that_holds(tmp_path):
    """SIGKILL leaves the lock file behind, but the kernel dropped the lock: the next writer goes on."""
    path = tmp_path / "out.csv"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(UsageError, match=f"another opbench run is writing this file \\(pid {holder.pid} on "):
            CsvReport(path, GEMM)
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert outputs.lock_path(path).exists()
    with CsvReport(path, GEMM, append=True) as report:
        report.append({"model": "second", "status": "ok"})
    assert [r["model"] for r in rows_of(path)] == ["first", "second"]
    assert not outputs.lock_path(path).exists()


def test_project_takes_the_same_flags(run, tmp_path):
    """The rule is CsvReport's, the flags core.cli's: a tool wired to them (here `opbench project`, no torch) keeps,
    replaces or refuses as gemm does."""
    path = tmp_path / "p.csv"
    args = ["opbench", "project", "--model", "Qwen3_0.6B", "--world-size", "8", "--device", "H100"]
    assert run(*args, "--report-csv-path", str(path)).returncode == 0
    assert run(*args, "--report-csv-path", str(path)).returncode == 0
    assert len(list((tmp_path / "earlier").glob("*/p.csv"))) == 1
    assert run(*args, "--report-csv-path", str(path), "--overwrite").returncode == 0
    assert len(list((tmp_path / "earlier").glob("*/p.csv"))) == 1
    r = run(*args, "--report-csv-path", str(path), "--append")
    assert r.returncode == 0 and len(rows_of(path)) == 2


def test_a_csv_sent_to_dev_stdout_is_appended_to_the_users_file_and_nothing_in_dev_moves(tmp_path):
    """`--report-csv-path /dev/stdout > out.txt`: the rows go after what is there; /dev/stdout (a link to
    /proc/self/fd/1) is not moved aside, locked or given a sidecar; a pipe gets the rows too."""
    args = [sys.executable, "-m", "opbench", "project", "--model", "Qwen3_0.6B", "--world-size", "8", "--device",
            "H100", "--report-csv-path", "/dev/stdout"]  # fmt: skip
    out = tmp_path / "out.txt"
    out.write_text("kept line\n")
    for _ in range(2):  # the second run finds the first one's rows: an earlier CSV it must not move
        with open(out, "a") as fh:
            assert subprocess.run(args, stdout=fh, stderr=subprocess.PIPE, timeout=120).returncode == 0
    text = out.read_text()
    assert text.startswith("kept line\n") and text.count("\nmodel,layout,") == 2 and "earlier" not in text
    assert os.path.islink("/dev/stdout") and not os.path.exists("/dev/stdout.meta.json")
    assert not os.path.exists("/dev/" + outputs.EARLIER_DIR) and not os.path.exists("/dev/stdout.lock")
    piped = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and "\nmodel,layout," in piped.stdout, piped.stderr
    fifo, link = tmp_path / "fifo", tmp_path / "link.csv"
    os.mkfifo(fifo)
    link.symlink_to("/dev/null")
    assert outputs.is_stream(fifo) and outputs.is_stream(link) and outputs.is_stream("/proc/self/fd/1")
    assert not outputs.is_stream(out) and not outputs.is_stream(tmp_path / "new.csv")


@pytest.mark.parametrize("tool", ["trace", "nccl-tests"])
def test_a_csv_over_the_file_being_read_is_refused_and_the_input_is_intact(run, tmp_path, tool):
    source = ROOT / "examples" / ("nccl_fsdp_qwen3_0.6b_4ranks.log.gz" if tool == "trace" else "all_gather_perf.out")
    given = tmp_path / source.name
    given.write_bytes(source.read_bytes())
    link = tmp_path / "link.csv"  # the same file by another name
    link.symlink_to(given)
    for out in (given, link):
        r = run("opbench", tool, str(given), "--report-csv-path", str(out), "--overwrite")
        assert r.returncode == 2 and "is a file this run reads" in r.stderr and not r.stdout, r.stderr
        assert given.read_bytes() == source.read_bytes()


TOOLS_WITH_CSV = [
    "opbench.gemm.__main__",
    "opbench.attention.__main__",
    "opbench.comm.__main__",
    "opbench.selftest.__main__",
    "opbench.project.__main__",
    "opbench.trace.__main__",
    "opbench.trace.nccl_tests",
    "opbench.fsdp_model.__main__",
    "opbench.ckpt.__main__",
    "opbench.cluster.__main__",
]


@pytest.mark.parametrize("module", TOOLS_WITH_CSV)
def test_every_tool_that_writes_a_csv_takes_the_flags_the_keep_note_names(module):
    """CsvReport's note ('--overwrite replaces earlier results, --append adds to them') is printed by every tool:
    each of them takes both flags, and refuses them together."""
    import importlib

    parser = importlib.import_module(module).build_parser()
    flags = parser._option_string_actions
    assert "--overwrite" in flags and "--append" in flags
    with pytest.raises(UsageError, match="not allowed with argument --overwrite"):
        parser.parse_known_args(["--overwrite", "--append"])


def test_trace_keeps_replaces_or_appends_every_csv_it_writes(run, tmp_path):
    """trace writes a summary and its breakdowns: a rerun keeps all of them aside together, --overwrite replaces
    them, --append adds to them."""
    log = os.path.join(ROOT, "examples", "nccl_fsdp_qwen3_0.6b_4ranks.log.gz")
    csv_path = tmp_path / "sizes.csv"
    args = ["opbench.trace", log, "--per-rank", "--csv", str(csv_path)]
    names = ["sizes.csv", "sizes_per_rank.csv"]
    first = run(*args)
    assert first.returncode == 0, first.stderr
    rows = {n: len(rows_of(tmp_path / n)) for n in names}
    assert all(rows.values())
    again = run(*args)
    assert again.returncode == 0, again.stderr
    (stamp,) = (tmp_path / "earlier").iterdir()
    assert sorted(p.name for p in stamp.glob("*.csv")) == sorted(names)
    assert run(*args, "--overwrite").returncode == 0
    assert len(list((tmp_path / "earlier").iterdir())) == 1
    assert run(*args, "--append").returncode == 0
    assert {n: len(rows_of(tmp_path / n)) for n in names} == {n: 2 * k for n, k in rows.items()}


def test_the_errors_log_goes_aside_with_its_csv_and_overwrite_drops_it(tmp_path):
    """ckpt's tracebacks (<stem>.errors.log) describe the rows of the CSV beside them: kept aside with it, and
    removed when --overwrite replaces those rows."""
    path = tmp_path / "ckpt_benchmark.csv"
    errors = tmp_path / "ckpt_benchmark.errors.log"
    for policy in (outputs.KEEP, outputs.OVERWRITE):
        path.write_text("method,status\ndcp,error\n")
        errors.write_text("=== a run\nTraceback ...\n")
        outputs._WRITTEN.discard(outputs._key(path))  # as a new run would see it
        fresh, moved = outputs.prepare(path, policy)
        assert fresh and not errors.exists()
        if policy == outputs.KEEP:
            assert moved is not None and (moved.parent / "ckpt_benchmark.errors.log").read_text().startswith("===")
        else:
            assert moved is None


def test_a_link_at_the_lock_name_is_refused_and_never_written_through(tmp_path):
    """A link (or a FIFO) left at ``<csv>.lock``: the holder's label would be written over what it points at (here
    the measured CSV itself, emptied before it could be kept aside). One line naming the lock; the CSV intact."""
    path = tmp_path / "out.csv"
    path.write_text("model,status\nmine,ok\n")
    outputs.lock_path(path).symlink_to(path.name)
    with pytest.raises(UsageError, match="out.csv.lock: cannot lock the report: is a link"):
        CsvReport(path, GEMM)
    assert path.read_text() == "model,status\nmine,ok\n"
    outputs.lock_path(path).unlink()
    os.mkfifo(outputs.lock_path(path))
    with pytest.raises(UsageError, match="out.csv.lock: cannot lock the report: is not a plain file"):
        CsvReport(path, GEMM)


@pytest.mark.parametrize("name", ["out.meta.json", "out.errors.log", "out.csv.lock"])
def test_a_csv_named_like_a_file_kept_beside_another_is_refused(tmp_path, name):
    """`--report-csv-path out.meta.json` moved out.csv's sidecar aside and put rows in its place; `out.csv.lock`
    wrote rows into another run's lock, which that run deletes when it ends."""
    beside = tmp_path / name
    beside.write_text("kept\n")
    with pytest.raises(UsageError, match=f"{name}: a name ending in .* give a --report-csv-path ending in .csv"):
        CsvReport(beside, GEMM, earlier=outputs.OVERWRITE)
    assert beside.read_text() == "kept\n" and sorted(os.listdir(tmp_path)) == [name]


def test_two_outputs_of_one_run_that_are_one_file_are_refused(tmp_path):
    """gemm's models 'a/b' and 'a_b' both give benchmark_gemm_a_b.csv: the second model's rows replaced the
    first's. Any two outputs of one run that are one file (by name or through a link) stop the run first."""
    from opbench.gemm.__main__ import main as gemm

    config = {"seqlen": 128, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 4, "head_dim": 16, "vocab_size": 256, "model_type": "llama"}  # fmt: skip
    (tmp_path / "two.json").write_text(json.dumps([{**config, "model": "a/b"}, {**config, "model": "a_b"}]))
    with pytest.raises(UsageError, match="benchmark_gemm_a_b.plan.csv: two of this run's outputs are this one file"):
        gemm(["--model-config-path", str(tmp_path / "two.json"), "--dry-run", "--report-dir-path", str(tmp_path)])
    assert sorted(os.listdir(tmp_path)) == ["two.json"]
    (tmp_path / "link.csv").symlink_to("real.csv")
    with pytest.raises(UsageError, match="two of this run's outputs are this one file"):
        with outputs.claimed(tmp_path / "real.csv", tmp_path / "link.csv"):
            pass
    assert not outputs._HELD


def test_trace_claims_every_csv_it_writes_before_it_reads(tmp_path):
    """A breakdown CSV over the log (`log_per_rank.csv` with --csv log.csv --per-rank), or one another run holds,
    stopped trace only after the whole log was parsed and the summary CSV written."""
    from opbench.trace.__main__ import main as trace

    log = tmp_path / "s_per_rank.csv"
    log.write_bytes((ROOT / "examples" / "nccl_fsdp_qwen3_0.6b_4ranks.log.gz").read_bytes())
    with pytest.raises(UsageError, match="s_per_rank.csv: is a file this run reads"):
        trace([str(log), "--csv", str(tmp_path / "s.csv"), "--per-rank"])
    assert sorted(os.listdir(tmp_path)) == ["s_per_rank.csv"] and not outputs._HELD


def test_whole_files_are_put_in_place_never_written_through_a_link_fifo_or_folder(tmp_path):
    """report.md, the plots and every CSV's sidecar: a folder at the name was a traceback, a FIFO a hang (here it
    has a reader, so the old code wrote into it), a link wrote over the file it points at."""
    from opbench.report.build import build_report

    results, notes = tmp_path / "results", tmp_path / "notes.md"
    results.mkdir()
    notes.write_text("mine\n")
    os.mkfifo(results / "x.meta.json")
    reader = os.open(results / "x.meta.json", os.O_RDONLY | os.O_NONBLOCK)
    try:
        with CsvReport(results / "x.csv", GEMM) as report:
            report.append({"model": "m", "layer": "qkv", "pass": "fwd", "m": 8, "n": 8, "k": 8, "status": "ok"})
    finally:
        os.close(reader)
    assert (results / "x.meta.json").is_file()  # not a FIFO (reading one with no writer would block)
    assert json.loads((results / "x.meta.json").read_text())["benchmark"] == "gemm"
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").symlink_to(notes)
    build_report(results, out, plots=False)
    assert notes.read_text() == "mine\n" and (out / "report.md").is_file() and not (out / "report.md").is_symlink()
    (out / "report.md").unlink()
    (out / "report.md").mkdir()
    with pytest.raises(UsageError, match="report.md: cannot write: is a folder"):
        build_report(results, out, plots=False)
    assert sorted(os.listdir(out)) == ["report.md"]  # no temporary file left

    # cluster_summary.md too: it was opened with "w", so a FIFO there hung the check until something read it
    from types import SimpleNamespace

    from opbench.cluster.summary import write_summary

    os.mkfifo(out / "cluster_summary.md")
    reader = os.open(out / "cluster_summary.md", os.O_RDONLY | os.O_NONBLOCK)  # the old code writes into it
    got = SimpleNamespace(compute=[], memory=[], telemetry=[], comm=[], pairs={}, pair_labels=[], pair_rows=[])
    try:
        head = write_summary(str(out / "cluster_summary.md"), True, ["2 ranks"], [], got)
    finally:
        os.close(reader)
    assert head.startswith("# Cluster check: PASS")
    assert (out / "cluster_summary.md").is_file() and "- 2 ranks" in (out / "cluster_summary.md").read_text()


PROJECT = ["project", "--model", "Qwen3_0.6B", "--world-size", "8", "--device", "H100"]


@pytest.mark.parametrize("tool", ["project", "nccl-tests", "report"])
def test_an_output_path_with_a_control_character_is_printed_as_one_plain_line(capsys, tmp_path, tool):
    """A folder named with a newline or a terminal escape is written to (tests/test_fsdp_model.py quotes one in
    printed commands), but the 'wrote' and 'kept' lines printed it raw: a new line, or a recoloured terminal."""
    from opbench.core.cli import main

    folder, results = str(tmp_path / "x\x1b[31m\ny"), str(tmp_path / "results")
    nccl_tests = ["nccl-tests", str(ROOT / "examples" / "all_gather_perf.out"), "--report-dir-path"]
    if tool == "report":
        assert main([*nccl_tests, results]) == 0
    args = {
        "project": [*PROJECT, "--report-dir-path", folder],
        "nccl-tests": [*nccl_tests, folder],
        "report": ["report", results, "--no-plots", "--out", folder],
    }[tool]
    capsys.readouterr()
    for _ in range(2):  # the second run keeps the first one's CSV aside, and says so
        assert main(args) == 0
        printed = "".join(capsys.readouterr())
        assert "wrote " in printed and "\x1b" not in printed
        assert not [line for line in printed.splitlines() if line.startswith("y")]


def test_a_name_too_long_is_one_short_line(capsys, tmp_path):
    """A 300-byte name printed the whole path twice inside Python's error text."""
    from opbench.core.cli import main

    assert main([*PROJECT, "--report-csv-path", str(tmp_path / ("a" * 300 + ".csv"))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.count("a" * 300) == 1 and "name too long" in err
    assert os.listdir(tmp_path) == []


SMALL_GEMM = ["--layers", "qkv", "--passes", "fwd", "--quick"]


def test_each_job_has_its_own_default_folder_and_the_report_reads_the_latest_of_each(run, tmp_path):
    """No --report-dir-path: each tool writes out/<tool>/, and a bare `opbench gemm` (the quick look) out/gemm-quick/,
    so it never moves the CSV of `--model Qwen3_0.6B` aside (one file name); rerunning that job keeps its earlier
    CSV in out/gemm/earlier/, which `opbench report out/` skips: the report has each job's latest rows only."""
    job = ["opbench", "gemm", "--model", "Qwen3_0.6B", "--seqlen", "64", *SMALL_GEMM]
    assert run(*job, cwd=tmp_path).returncode == 0
    look = run("opbench", "gemm", *SMALL_GEMM, cwd=tmp_path)
    assert look.returncode == 0, look.stderr
    out = tmp_path / "out"
    assert {r["seqlen"] for r in rows_of(out / "gemm" / "benchmark_gemm_Qwen3_0.6B.csv")} == {"64"}
    assert {r["seqlen"] for r in rows_of(out / "gemm-quick" / "benchmark_gemm_Qwen3_0.6B.csv")} == {"128"}
    assert "into out/gemm-quick/" in " ".join(look.stderr.split()) and not list(out.rglob("earlier"))
    again = run(*job, cwd=tmp_path)  # the same job again: its earlier CSV goes aside, in its own folder
    assert again.returncode == 0, again.stderr
    (kept,) = (out / "gemm" / "earlier").glob("*/benchmark_gemm_Qwen3_0.6B.csv")
    plan = run("opbench", "attention", "--model", "Qwen3_0.6B", "--seqlen", "64", "--dry-run", cwd=tmp_path)
    assert plan.returncode == 0 and (out / "attention" / "attention_benchmark.plan.csv").is_file(), plan.stderr
    rep = run("opbench", "report", "out", "--report-dir-path", str(tmp_path / "rep"), cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    from opbench.report.discover import discover

    found = discover(out)
    assert sorted(f.rel for f in found.files) == [
        "gemm-quick/benchmark_gemm_Qwen3_0.6B.csv",
        "gemm/benchmark_gemm_Qwen3_0.6B.csv",
    ]
    skipped = dict(found.skipped)
    assert kept.relative_to(out).as_posix() in skipped and "attention/attention_benchmark.plan.csv" in skipped


def test_the_default_folders_of_the_other_tools(run, tmp_path):
    """ckpt's data and CSV go to out/ckpt/, comm's CSVs to out/comm/ (their --help says so); explicit paths win."""
    r = run("opbench", "ckpt", "--size-mb", "1", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0 and " out/ckpt/ckpt_data" in r.stdout, r.stderr
    r = run("opbench", "ckpt", "--size-mb", "1", "--dry-run", "--report-dir-path", "mine", cwd=tmp_path)
    assert r.returncode == 0 and " mine/ckpt_data" in r.stdout and " out/" not in r.stdout
    r = run("opbench", "comm", "--help")
    assert "(default: out/comm)" in " ".join(r.stdout.split())
