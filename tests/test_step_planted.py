"""opbench step on traces written from the documented Kineto schema with planted kernels of both vendors
(opbench/steptrace/synth.py): the attribution must find the planted partition exactly, the GEMMs with their
passes, the collective's bytes and group; several ranks name the straggler; the reader streams and refuses bad
files in one line."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from opbench.core.errors import UsageError
from opbench.steptrace import attribute, reader, summary, synth


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    d = tmp_path_factory.mktemp("planted")
    out = {}
    for vendor in ("cuda", "rocm"):
        path = d / f"{vendor}.json.gz"
        out[vendor] = (path, synth.write(str(path), vendor, steps=2, layers=3))
    return out


@pytest.mark.parametrize("vendor", ["cuda", "rocm"])
def test_planted_partition_is_found(planted, vendor):
    path, truth = planted[vendor]
    (rs,) = summary.analyse([str(path)])
    assert rs.on_gpu and len(rs.steps) == 2
    for step in rs.steps:
        assert step.dur_us == pytest.approx(truth.step_us)
        assert step.partition.keys() == truth.partition.keys()
        for klass, us in truth.partition.items():
            assert step.partition[klass] == pytest.approx(us, abs=1e-6), klass
        assert step.comm_busy["all_reduce"] == pytest.approx(truth.comm_busy)
        assert step.comm_exposed["all_reduce"] == pytest.approx(truth.comm_exposed)
    rows = summary.kernel_rows(rs)
    assert {(r["kind"], r["m"], r["n"], r["k"]) for r in rows if r["class"] == "gemm"} == truth.gemms
    (comm,) = [r for r in rows if r["class"] == "comm"]
    assert comm["kind"] == "all_reduce" and comm["bytes"] == synth.H * synth.F * 2 and comm["group_ranks"] == "[0, 1]"
    attention = {r["kind"] for r in rows if r["class"] == "attention"}
    assert attention == ({"flash fwd", "flash bwd"} if vendor == "cuda" else {"ck fwd", "ck bwd"})
    items = summary.items(rs)
    assert items["comm:all_reduce"]["overlapped_s"] == pytest.approx((truth.comm_busy - truth.comm_exposed) / 1e6)


def test_straggler_named(tmp_path, run):
    slow, fast = tmp_path / "rank0.json", tmp_path / "rank1.json"
    synth.write(str(slow), "cuda", steps=2, layers=2, rank=0, world=2, slow_us=40.0)
    synth.write(str(fast), "cuda", steps=2, layers=2, rank=1, world=2, wait_us=500.0)
    ranks = summary.analyse([str(fast), str(slow)])
    assert [r.rank for r in ranks] == [1, 0]
    lag = summary.straggler(ranks)
    assert lag is not None and lag.rank == 0
    assert lag.kernels and lag.kernels[0][0].startswith("gemm")
    assert lag.waits[0][:2] == (1, "all_reduce") and lag.waits[0][2] == pytest.approx(500e-6)
    p = run("opbench", "step", str(slow), str(fast), "--report-dir-path", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    assert "slowest rank: 0" in p.stdout and "rank 1 waited" in p.stdout
    csv = (tmp_path / "out" / "step_items.csv").read_text()
    assert "rank0.json,0," in csv and "rank1.json,1," in csv


def test_reader_streams_in_small_pieces(tmp_path, monkeypatch):
    """Pieces of 997 characters cut every event, number and string somewhere: the result is the same, and the
    reader's memory stays a few pieces, not the file."""
    path = tmp_path / "big.json"
    synth.write(str(path), "rocm", steps=3, layers=40)
    whole = json.loads(path.read_text())["traceEvents"]
    monkeypatch.setattr(reader, "CHUNK_CHARS", 997)
    tracemalloc.start()
    try:
        count = sum(1 for _ in reader.events(str(path)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == len(whole)
    assert path.stat().st_size > 1_000_000 and peak < 200_000, peak
    assert reader.read(str(path)).events == len(whole)


def _step_view(r: attribute.StepResult) -> tuple:
    return r.name, r.start_us, r.dur_us, r.partition, r.busy, r.comm_busy, r.comm_exposed, list(r.kernels.items())


def test_memory_is_columns_plus_one_step(tmp_path, monkeypatch):
    """Three times the steps: the reader keeps the same few bytes per event (typed columns: under 100, where an
    object per event took ~375), attribution's working memory (one step's intervals) does not grow, and every step
    comes out the same as from the whole trace's intervals at once (the attribution before it went step by step)."""
    monkeypatch.setattr(attribute, "CONTEXT_CACHE", 1024)  # a cache: capped lower here so a small trace shows it
    warm = tmp_path / "warm.json"
    synth.write(str(warm), "cuda", steps=1, layers=2)
    # first-call allocations (regular expressions, interned names) are not a step's
    attribute.Attribution(reader.read(str(warm))).steps()
    per_event, working = {}, {}
    for steps in (4, 12):
        path = tmp_path / f"s{steps}.json"
        truth = synth.write(str(path), "cuda", steps=steps, layers=20)
        tracemalloc.start()
        try:
            trace = reader.read(str(path))
            per_event[steps] = tracemalloc.get_traced_memory()[0] / trace.kept
            work = attribute.Attribution(trace)
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            got = work.steps()
            working[steps] = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert len(got) == steps and all(r.partition == pytest.approx(truth.partition) for r in got)
        whole = attribute.steps(trace, attribute.intervals(trace))
        assert [_step_view(r) for r in got] == [_step_view(r) for r in whole]
    assert per_event[4] < 100 and per_event[12] < 100, per_event
    assert working[12] < 1.3 * working[4], working


@pytest.mark.parametrize(
    "text,why",
    [
        ('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph":', "not valid JSON"),
        ("[1, 2]", "not a Kineto trace"),
        ('{"schemaVersion": 1}', "no traceEvents"),
        ("", "not a Kineto trace"),
    ],
)
def test_bad_files_are_one_usage_error(tmp_path, text, why):
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(UsageError, match=why) as info:
        reader.read(str(path))
    assert str(path) in str(info.value)


def test_rocm_kernel_with_only_its_own_external_id(tmp_path):
    """A ROCm trace whose launch events carry no correlation (HTA #219: other launch names, stream 0): the
    kernel's own External id still finds its operator."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10,
         "args": {"External id": 5, "Input Dims": [[64, 32], [32, 16]], "Input type": ["c10::BFloat16"] * 2}},
        {"ph": "X", "cat": "kernel", "name": "some_vendor_kernel", "pid": 0, "tid": 0, "ts": 20, "dur": 30,
         "args": {"External id": 5, "device": 0, "stream": 0}},
    ]  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    (rs,) = summary.analyse([str(path)])
    (row,) = summary.kernel_rows(rs)
    assert (row["class"], row["m"], row["n"], row["k"], row["dtype"]) == ("gemm", 64, 16, 32, "bf16")


def test_step_never_imports_torch(planted, tmp_path):
    """A login node without PyTorch reads traces: neither the run nor its help nor a usage error imports torch."""
    import subprocess
    import sys

    path, _ = planted["cuda"]
    script = (
        "import contextlib, io, sys\n"
        "from opbench.core.cli import main\n"
        "for argv in ([sys.argv[1], '--report-dir-path', sys.argv[2]], ['--help'], [sys.argv[1], '--calibrate', 'x']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        try:\n"
        "            main(['step', *argv])\n"
        "        except SystemExit:\n"
        "            pass\n"
        "    assert 'torch' not in sys.modules, argv\n"
        "print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(path), str(tmp_path / "out")], capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.strip() == "ok", proc.stderr[-2000:]
    assert (tmp_path / "out" / "step_items.csv").is_file()


def test_report_reads_the_step_csvs(planted, tmp_path, run):
    """opbench report finds both CSVs by their sidecars, tables them and draws the stacked bar per rank."""
    path, _ = planted["rocm"]
    out = tmp_path / "res"
    p = run("opbench", "step", str(path), "--report-dir-path", str(out))
    assert p.returncode == 0, p.stderr
    r = run("opbench", "report", str(out))
    assert r.returncode == 0, r.stderr
    text = (out / "report" / "report.md").read_text()
    assert "## Training step from a profiler trace" in text and "## Training step kernels" in text
    assert (out / "report" / "step_items.png").stat().st_size > 0
