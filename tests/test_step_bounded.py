"""opbench step under a memory budget (docs/step.md, "Reading large traces"): a trace over it is read by step, as
many consecutive steps per pass as fit, and every step, row and the timeline must come out exactly as from the
whole read; the step markers are found by a text search that must find exactly what the parse finds, wherever the
file's pieces are cut; a step's windowed read keeps about one step's events, not the trace's. Planted traces of
opbench/steptrace/synth.py."""

from __future__ import annotations

import json
import random

import pytest

from opbench.core.errors import UsageError
from opbench.steptrace import __main__ as step_cli
from opbench.steptrace import attribute, reader, summary, synth

TINY_MIB = 1e-3  # ~1 KB: every trace here is over it


def _rewrite(src, dst, change) -> None:
    """``src``'s trace with its events changed by ``change`` (a list in, a list out), written to ``dst``."""
    doc = json.loads(src.read_text())
    doc["traceEvents"] = change(doc["traceEvents"])
    dst.write_text(json.dumps(doc))


def _shuffled_with_gpu_markers(events: list) -> list:
    """Kineto writes events in no promised order; and a GPU trace has each step on the GPU timeline too."""
    out = list(events)
    for ev in events:
        if ev.get("name", "").startswith("ProfilerStep#"):
            out.append({**ev, "cat": "gpu_user_annotation", "pid": 0, "tid": 7, "ts": ev["ts"] + 5.0})
    random.Random(46).shuffle(out)
    return out


def _gpu_lagging(events: list) -> list:
    """The GPU half a step behind the CPU, no GPU step markers: a step's CPU span holds kernels the previous step
    launched (the window must reach back to the previous step's start)."""
    lag = next(ev["dur"] for ev in events if ev.get("name") == "ProfilerStep#0") / 2
    return [{**ev, "ts": ev["ts"] + lag} if ev.get("cat") == "kernel" else ev for ev in events]


def _gpu_lagging_more(events: list) -> list:
    """The GPU a step and a half behind, no GPU step markers: kernels in a step's span were launched two steps
    earlier (the window reaches further back for them: ``reader.unlaunched``)."""
    lag = next(ev["dur"] for ev in events if ev.get("name") == "ProfilerStep#0") * 1.5
    return [{**ev, "ts": ev["ts"] + lag} if ev.get("cat") == "kernel" else ev for ev in events]


def _cpu_only(events: list) -> list:
    return [ev for ev in events if ev.get("cat") not in ("kernel", "cuda_runtime")]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """name -> path: both vendors, a pipeline stage, a shuffled trace with GPU step markers, a GPU lagging the CPU,
    a CPU-only trace."""
    d = tmp_path_factory.mktemp("bounded")
    out = {"cuda": d / "cuda.json.gz", "rocm": d / "rocm.json", "pipeline": d / "pp3-stage1.json.gz"}
    synth.write(str(out["cuda"]), "cuda", steps=4, layers=2)
    synth.write(str(out["rocm"]), "rocm", steps=3, layers=2)
    synth.write_pipeline(str(out["pipeline"]), 1, 3, "rocm", steps=3)
    plain = d / "plain.json"
    synth.write(str(plain), "cuda", steps=3, layers=2)
    out["shuffled"], out["cpu"], out["lagging"] = d / "shuffled.json", d / "cpu.json", d / "lagging.json"
    _rewrite(plain, out["shuffled"], _shuffled_with_gpu_markers)
    _rewrite(plain, out["lagging"], _gpu_lagging)
    four = d / "four.json"
    synth.write(str(four), "cuda", steps=4, layers=2)
    out["lagging_more"] = d / "lagging_more.json"
    _rewrite(four, out["lagging_more"], _gpu_lagging_more)
    _rewrite(plain, out["cpu"], _cpu_only)
    return out


@pytest.fixture
def small_budget_checks(monkeypatch):
    monkeypatch.setattr(reader, "BUDGET_EVERY", 32)  # a look at the columns every 32 events: a small trace is over


def _view(r: attribute.StepResult) -> tuple:
    return r.name, r.start_us, r.dur_us, r.partition, r.busy, r.comm_busy, r.comm_exposed, list(r.kernels.items())


def _same(whole: summary.RankSteps, by: summary.RankSteps) -> None:
    assert (by.rank, by.on_gpu, by.events) == (whole.rank, whole.on_gpu, whole.events)
    assert [_view(r) for r in by.steps] == [_view(r) for r in whole.steps]
    assert summary.item_rows(by) == summary.item_rows(whole)
    assert summary.kernel_rows(by) == summary.kernel_rows(whole)
    assert by.timeline_step == whole.timeline_step and summary.timeline_rows(by) == summary.timeline_rows(whole)


@pytest.mark.parametrize("which", ["cuda", "rocm", "pipeline", "shuffled", "lagging", "lagging_more", "cpu"])
def test_by_step_equals_whole(traces, which, small_budget_checks):
    path = str(traces[which])
    (whole,) = summary.analyse([path])
    said: list[str] = []
    (by,) = summary.analyse([path], memory_mib=TINY_MIB, say=said.append)
    n = len(whole.steps)
    assert n >= 3 and whole.reading["mode"] == "whole"
    assert by.reading["mode"] == "by step" and by.reading["passes"] == 1 + n, by.reading
    if which == "lagging_more":  # the later steps' windows reached two steps back for their kernels' launches
        assert summary.kernel_rows(by) == summary.kernel_rows(whole)
    assert by.reading["steps_per_pass"] == [1] * n and by.reading["passes_over_budget"] == 0, by.reading
    assert len(said) == 1 and path in said[0] and f"1 step per pass after the first, {n} passes" in said[0], said
    assert f"step {whole.steps[0].name} alone needs" in " ".join(by.warnings)
    assert whole.on_gpu == (which != "cpu")
    _same(whole, by)


def test_under_the_budget_is_read_whole(traces, small_budget_checks):
    (rs,) = summary.analyse([str(traces["cuda"])], memory_mib=64)
    assert rs.reading == {"mode": "whole", "passes": 1}


def _trap_trace(path) -> None:
    """Markers where a text search can go wrong: ``args`` before the name (a nested ``{`` first), a ``{`` and the
    marker's text inside other events' strings, an instant event and a negative duration (not markers for ``read``),
    a marker on ``cpu_op`` with its name in its arguments too (one marker), GPU markers of one name twice (the last
    wins), the text outside ``traceEvents``."""
    events = [
        {"ph": "X", "cat": "python_function", "name": "profiler.py(700): step {ProfilerStep#9}", "ts": 0, "dur": 1},
        {"ph": "X", "cat": "user_annotation", "args": {"External id": 1}, "name": "ProfilerStep#0", "ts": 10,
         "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 20, "dur": 5, "args": {"note": "{ProfilerStep#0"}},
        {"ph": "i", "cat": "user_annotation", "name": "ProfilerStep#5", "ts": 30, "s": "t"},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#6", "ts": 30, "dur": -1},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#0", "ts": 12, "dur": 90},
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "ts": 110, "dur": 100.5,
         "args": {"again": "ProfilerStep#1"}},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#0", "ts": 13, "dur": 91},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#1", "ts": 115, "dur": 1e2},
    ]  # fmt: skip
    path.write_text(json.dumps({"traceEvents": events, "traceName": "ProfilerStep#7 {"}, indent=1))


def test_marker_scan_finds_what_read_finds(traces, tmp_path, monkeypatch):
    """In pieces of every size from 40 to 140 characters, so a marker straddles a piece's end at many offsets."""
    trap = tmp_path / "trap.json"
    _trap_trace(trap)
    whole = reader.read(str(trap))
    assert [s[0] for s in whole.steps] == ["ProfilerStep#0", "ProfilerStep#1"]
    assert whole.gpu_steps == {"ProfilerStep#0": (13.0, 91.0), "ProfilerStep#1": (115.0, 100.0)}
    text = trap.read_text()
    at = [i for i in range(len(text)) if text.startswith("ProfilerStep#", i)]
    monkeypatch.setattr(reader, "STEP_TAIL_CHARS", 512)
    straddled = 0
    for piece in range(40, 141):
        monkeypatch.setattr(reader, "CHUNK_CHARS", piece)
        marks = reader.step_windows(str(trap))
        assert (marks.steps, marks.gpu_steps) == (whole.steps, whole.gpu_steps), piece
        assert marks.chars == len(text)
        straddled += sum(p // piece != (p + 12) // piece for p in at)
    assert straddled > 50
    monkeypatch.setattr(reader, "CHUNK_CHARS", 997)
    for path in traces.values():
        marks, got = reader.step_windows(str(path)), reader.read(str(path))
        assert marks.steps and (marks.steps, marks.gpu_steps) == (got.steps, got.gpu_steps), path


@pytest.mark.parametrize("which", ["cuda", "shuffled"])
def test_a_window_keeps_about_one_step(traces, which):
    """A step's windowed read keeps at most two steps' events (the previous step's launches and operators may have
    launched this one's kernels) and learns from the whole file whether it is a GPU trace."""
    path = str(traces[which])
    whole = reader.read(path)
    wins = reader.windows(reader.step_windows(path))
    per_step = whole.kept / len(wins)
    for win in wins:
        part = reader.read(path, keep=win)
        assert part.kept <= 2 * per_step, (win.name, part.kept, per_step)
        assert part.on_gpu and part.events == whole.events
        assert [s[0] for s in part.steps] == [win.name] and list(part.gpu_steps) in ([], [win.name])


def _heavier_from_step(first: int, extra: int):
    """A change for ``_rewrite``: from step ``first`` on, each step holds ``extra`` more CPU operators (one after the
    other on a thread of their own): its events cost more than the first steps' told."""

    def change(events: list) -> list:
        marks = sorted((ev for ev in events if ev["name"].startswith("ProfilerStep#")), key=lambda ev: ev["ts"])
        out = list(events)
        for mark in marks[first:]:
            step = mark["dur"] / (extra + 1)
            out += [{"ph": "X", "cat": "cpu_op", "name": f"aten::empty_{j % 50}", "pid": mark.get("pid", 0),
                     "tid": 999, "ts": mark["ts"] + j * step, "dur": step / 2} for j in range(extra)]  # fmt: skip
        return out

    return change


@pytest.fixture(scope="module")
def ten_steps(tmp_path_factory):
    """A 10-step planted trace, the same with steps 5 on holding many more events, and one step's estimate (MiB:
    what the first by-step pass learns)."""
    d = tmp_path_factory.mktemp("packed")
    plain, heavy = d / "ten.json", d / "heavy.json"
    synth.write(str(plain), "cuda", steps=10, layers=20)  # a step's events well above the names' fixed cost
    _rewrite(plain, heavy, _heavier_from_step(5, 3000))
    first = reader.windows(reader.step_windows(str(plain)))[0]
    step_mib = reader.read(str(plain), keep=first).nbytes() * reader.WORK_FACTOR / (1 << 20)
    return plain, heavy, step_mib


def test_several_steps_per_pass_equal_whole(ten_steps, small_budget_checks):
    """A budget that fits 3 steps and the step before them (4.5 steps: ``summary._Plan``): the first pass reads one
    step, the other nine go three at a time, 5 passes for 10 steps, every result as from the whole read."""
    path, _, step_mib = ten_steps
    (whole,) = summary.analyse([str(path)])
    said: list[str] = []
    (by,) = summary.analyse([str(path)], memory_mib=4.5 * step_mib, say=said.append)
    assert len(whole.steps) == 10
    assert by.reading["steps_per_pass"] == [1, 3, 3, 3] and by.reading["passes"] == 5 < 10, by.reading
    assert by.reading["passes_over_budget"] == by.reading["renamed_steps"] == 0, by.reading
    assert len(said) == 1 and "3 steps per pass after the first, 4 passes of the file for 10 steps" in said[0], said
    assert not [w for w in by.warnings if "budget" in w], by.warnings
    _same(whole, by)


def test_a_budget_of_one_step_reads_one_per_pass(ten_steps, small_budget_checks):
    path, _, step_mib = ten_steps
    (whole,) = summary.analyse([str(path)])
    (by,) = summary.analyse([str(path)], memory_mib=1.5 * step_mib)
    assert by.reading["steps_per_pass"] == [1] * 10 and by.reading["passes"] == 11, by.reading
    _same(whole, by)


def test_a_pass_over_the_budget_falls_back_to_fewer_steps(ten_steps, small_budget_checks):
    """Steps 5 on cost far more than the first told: the pass of 4 to 6 passes the budget, is given up, and the
    rest go one step per pass; nothing fails and every result is as from the whole read."""
    _, path, step_mib = ten_steps
    (whole,) = summary.analyse([str(path)])
    (by,) = summary.analyse([str(path)], memory_mib=4.5 * step_mib)
    sizes = by.reading["steps_per_pass"]
    assert sizes[:2] == [1, 3] and set(sizes[2:]) == {1} and sum(sizes) == 10, by.reading
    assert by.reading["passes_over_budget"] == 1 and by.reading["passes"] == 1 + len(sizes) + 1, by.reading
    assert any("a pass of 3 steps from ProfilerStep#4 passed the budget" in w for w in by.warnings), by.warnings
    _same(whole, by)


def test_a_group_window_keeps_its_steps(ten_steps):
    """``reader.group`` of steps 3 to 5 keeps their three markers and at most four steps' events."""
    path = str(ten_steps[0])
    whole = reader.read(path)
    wins = reader.windows(reader.step_windows(path))
    part = reader.read(path, keep=reader.group(wins[3:6]))
    assert [s[0] for s in part.steps] == [w.name for w in wins[3:6]]
    assert reader.group(wins[3:6]).markers == tuple(m for w in wins[3:6] for m in w.markers)
    assert 3 * whole.kept / 10 < part.kept <= 4 * whole.kept / 10, (part.kept, whole.kept)


def _later_backward_trace(path) -> None:
    """Step 1's backward GEMM is named by step 0's forward shape, outside step 1's window: the step must be
    attributed again with every step's forward shapes (dgrad), as the whole read names it."""

    def mm(ext, ts, dims, corr, gpu_ts, tid=1):
        return [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": tid, "ts": ts, "dur": 5,
             "args": {"External id": ext, "Input Dims": dims, "Input type": ["c10::BFloat16"] * 2}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": tid, "ts": ts + 1, "dur": 1,
             "args": {"External id": ext, "correlation": corr}},
            {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "tid": 7, "ts": gpu_ts, "dur": 50,
             "args": {"External id": ext, "correlation": corr, "device": 0, "stream": 7}},
        ]  # fmt: skip

    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "tid": 1, "ts": 0, "dur": 1000},
        *mm(1, 10, [[64, 32], [32, 16]], 1, 100),  # forward (64, 16, 32)
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "tid": 1, "ts": 1000, "dur": 1000},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "tid": 1, "ts": 2000, "dur": 1000},
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MmBackward0", "tid": 2,
         "ts": 2005, "dur": 20},
        *mm(2, 2010, [[64, 16], [16, 32]], 2, 2100, tid=2),  # dgrad (64, 32, 16) of it
    ]  # fmt: skip
    path.write_text(json.dumps({"traceEvents": events}))


def test_backward_named_by_another_steps_forward(tmp_path, small_budget_checks, monkeypatch):
    monkeypatch.setattr(reader, "BUDGET_EVERY", 2)
    path = tmp_path / "later.json"
    _later_backward_trace(path)
    (whole,) = summary.analyse([str(path)])
    assert {r["kind"] for r in summary.kernel_rows(whole)} == {"fwd", "dgrad"}
    (by,) = summary.analyse([str(path)], memory_mib=TINY_MIB)
    assert by.reading["passes"] == 1 + 3 + 1  # the given-up whole read, one per step, step 2 once more
    _same(whole, by)


def test_no_markers_is_read_whole_with_a_warning(traces, tmp_path, small_budget_checks):
    path = tmp_path / "nomarks.json"
    _rewrite(traces["cpu"], path, lambda evs: [e for e in evs if not e["name"].startswith("ProfilerStep#")])
    (whole,) = summary.analyse([str(path)])
    (by,) = summary.analyse([str(path)], memory_mib=TINY_MIB)
    assert [s.name for s in by.steps] == ["trace"] and by.reading["mode"] == "whole" and by.reading["passes"] == 2
    assert any("without ProfilerStep markers" in w for w in by.warnings)
    _same(whole, by)


def test_cli_says_so_and_records_it(traces, tmp_path, small_budget_checks, capsys):
    out = tmp_path / "out"
    path = str(traces["rocm"])
    assert step_cli.main([path, "--memory-mib", "0.001", "--report-dir-path", str(out)]) == 0
    err = capsys.readouterr().err
    switched = [line for line in err.splitlines() if line.startswith("opbench step:")]
    assert len(switched) == 1 and "1 step per pass after the first, 3 passes of the file for 3 steps" in switched[0]
    meta = json.loads((out / "step_items.meta.json").read_text())
    assert meta["memory_mib"] == 0.001
    assert meta["reading"]["rocm.json"]["mode"] == "by step" and meta["reading"]["rocm.json"]["passes"] == 4
    assert meta["reading"]["rocm.json"]["steps_per_pass"] == [1, 1, 1]


@pytest.mark.parametrize("value", ["0", "-5", "lots", "nan", "1e30"])
def test_bad_memory_mib_is_one_usage_error(value):
    with pytest.raises(UsageError) as info:
        step_cli.build_parser().parse_args(["t.json", "--memory-mib", value])
    assert "--memory-mib" in str(info.value) and "\n" not in str(info.value)


def test_bad_memory_mib_exits_2_in_one_line(traces, run):
    p = run("opbench", "step", str(traces["rocm"]), "--memory-mib", "0")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "--memory-mib" in p.stderr, p.stderr


def test_markers_behind_nested_arguments_are_found_and_a_missed_one_reads_whole(tmp_path, monkeypatch):
    """A marker whose own event has nested objects (and braces in strings) before its name is still found; if the
    search misses one all the same, the windowed read's count of every marker says so and the trace is read whole,
    with a warning, rather than losing the step."""
    doc = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "args": {"Call stack": "f{g{h{i{"}, "name": "ProfilerStep#0", "ts": 10,
         "dur": 100},
        {"ph": "X", "cat": "user_annotation", "args": {"a": {"b": {"c": {"d": {"e": 1}}}}}, "name": "ProfilerStep#1",
         "ts": 110, "dur": 100},
    ]}  # fmt: skip
    path = tmp_path / "nested.json"
    path.write_text(json.dumps(doc))
    assert [m[0] for m in reader.step_windows(str(path)).steps] == ["ProfilerStep#0", "ProfilerStep#1"]
    plain = tmp_path / "plain.json"
    synth.write(str(plain), "cuda", steps=3, layers=2)
    monkeypatch.setattr(reader, "BUDGET_EVERY", 32)
    (whole,) = summary.analyse([str(plain)])
    found = reader.step_windows(str(plain))
    monkeypatch.setattr(reader, "step_windows", lambda p: reader.StepMarkers(found.steps[1:], found.gpu_steps))
    (by,) = summary.analyse([str(plain)], memory_mib=TINY_MIB)
    assert by.reading["mode"] == "whole" and "marker search found 2 of 3" in " ".join(by.warnings), by.warnings
    _same(whole, by)


def test_the_timeline_step_is_the_whole_reads_when_gpu_steps_tie(tmp_path, monkeypatch):
    """Steps of equal GPU durations: the median step (by duration, then start) is picked from the GPU markers' own
    figures, as the whole read picks it, not from a difference of window bounds (float rounding flips a tie)."""
    spans = [(513.672, 4650.8), (5164.757, 4650.8), (9816.125, 4650.8), (14467.455, 4650.8)]
    events = []
    for i, (t, d) in enumerate(spans):
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "tid": 1, "ts": t - 10, "dur": d},
            {"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{i}", "tid": 7, "ts": t, "dur": d},
            {"ph": "X", "cat": "kernel", "name": "k", "tid": 7, "ts": t, "dur": d / 2,
             "args": {"stream": 7, "correlation": i + 1}},
        ]  # fmt: skip
    path = tmp_path / "ties.json"
    path.write_text(json.dumps({"traceEvents": events}))
    monkeypatch.setattr(reader, "BUDGET_EVERY", 2)
    (whole,) = summary.analyse([str(path)])
    (by,) = summary.analyse([str(path)], memory_mib=1e-6)
    assert by.reading["mode"] == "by step" and by.timeline_step == whole.timeline_step
