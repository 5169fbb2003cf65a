"""opbench step on pipeline stages and its timeline picture: planted multi-stage traces (opbench/steptrace/synth.py:
2–4 stages, both vendors' p2p kernel names, a bubble known microsecond by microsecond) must be cut exactly, with
the bubble as its own line item beside the projection's when ``--project`` has ``--pp``; the timeline's pieces
must add up to the step's accounting, and ``opbench report`` must draw them from the CSV."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

from opbench.steptrace import attribute, reader, summary, synth

ROOT = Path(__file__).resolve().parent.parent
CASES = [(2, "cuda"), (3, "rocm"), (4, "cuda"), (2, "rocm")]


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    """Per (stages, vendor): each stage's trace path and planted truth."""
    d = tmp_path_factory.mktemp("pipeline")
    out = {}
    for p, vendor in CASES:
        out[p, vendor] = [
            (path, synth.write_pipeline(str(path), s, p, vendor))
            for s in range(p)
            for path in [d / f"{vendor}-pp{p}-stage{s}.json.gz"]
        ]
    return out


@pytest.mark.parametrize("p,vendor", CASES)
def test_planted_bubble_is_found_on_every_stage(stages, p, vendor):
    paths = [str(path) for path, _ in stages[p, vendor]]
    ranks = summary.analyse(paths)
    assert [r.rank for r in ranks] == list(range(p))
    for rs, (_, truth) in zip(ranks, stages[p, vendor]):
        assert len(rs.steps) == 2 and truth.partition["bubble"] > 0
        assert truth.partition["idle"] > 0  # launch gaps mid-step: idle, not bubble — the definition tells them apart
        for step in rs.steps:
            assert step.dur_us == pytest.approx(truth.step_us)
            assert step.partition.keys() == truth.partition.keys(), rs.rank
            for klass, us in truth.partition.items():
                assert step.partition[klass] == pytest.approx(us, abs=1e-6), (rs.rank, klass)
            assert step.comm_busy["send_recv"] == pytest.approx(truth.comm_busy)
            assert step.comm_exposed["send_recv"] == pytest.approx(truth.comm_exposed)
        items = summary.items(rs)
        assert items["bubble"]["measured_s"] == pytest.approx(truth.partition["bubble"] / 1e6)
        assert items["comm:send_recv"]["measured_s"] == 0.0  # its exposed time is the bubble, counted once
        assert items["comm:send_recv"]["exposed_s"] == pytest.approx(truth.comm_exposed / 1e6)
        (comm,) = [r for r in summary.kernel_rows(rs) if r["class"] == "comm"]
        assert comm["kind"] == "send_recv" and comm["group_ranks"] == str(list(range(p)))


def test_gpipe_bubble_is_megatrons_fraction():
    """The planted schedule's bubble is what Megatron-LM's formula says, (p − 1)/m of the ideal step, once the
    p2p waits and the step's edges (which the formula leaves out) are taken away: the truth is a pipeline's."""
    p, m = 4, 4
    plan, end = synth.pipeline_schedule(p, m, 0)
    for s in range(p):
        truth = synth.pipeline_truth(plan[s], 0, int(end))
        ideal = m * (synth.PP_FWD_US + synth.PP_BWD_US)
        assert truth.partition["gemm"] == ideal
        # the last stage waits only in p2p and at the edges: the rest of its bubble is compute it waits for
        assert truth.partition["bubble"] >= (p - 1) / m * ideal


def test_a_single_stage_has_no_bubble(tmp_path):
    path = tmp_path / "dp.json"
    truth = synth.write(str(path), "cuda", steps=1, layers=2)
    (rs,) = summary.analyse([str(path)])
    assert "bubble" not in rs.steps[0].partition and rs.steps[0].partition["idle"] == pytest.approx(
        truth.partition["idle"]
    )


def _sums(pieces):
    out: dict[str, float] = defaultdict(float)
    for label, t0, t1 in pieces:
        out[label] += t1 - t0
    return out


@pytest.mark.parametrize("which", ["planted", "pipeline"])
def test_timeline_adds_up_to_the_steps_accounting(stages, tmp_path, which):
    """The step lane is the partition piece by piece; each stream's pieces are its kernels' time by class, its
    collectives split into exposed and overlapped as the step counts them."""
    if which == "planted":
        path = tmp_path / "dp.json"
        synth.write(str(path), "rocm", steps=3, layers=3)
    else:
        path = stages[3, "rocm"][1][0]
    (rs,) = summary.analyse([str(path)])
    tl = rs.timeline
    assert tl is not None and tl.dropped == 0
    (step,) = [s for s in rs.steps if s.name == rs.timeline_step]
    lane = _sums(tl.pieces[attribute.STEP_LANE])
    assert lane.keys() == step.partition.keys()
    for label, us in step.partition.items():
        assert lane[label] == pytest.approx(us, abs=1e-6), label
    streams: dict[str, float] = defaultdict(float)
    for key, pieces in tl.pieces.items():
        if key != attribute.STEP_LANE:
            for label, us in _sums(pieces).items():
                streams[label] += us
    kernels: dict[str, float] = defaultdict(float)
    for key, (_, us) in step.kernels.items():
        kernels[key.klass] += us
    for klass in ("gemm", "attention", "memory", "optimizer"):
        assert streams.get(klass, 0.0) == pytest.approx(kernels.get(klass, 0.0)), klass
    comm = streams["comm exposed"] + streams["comm overlapped"] + streams.get("bubble", 0.0)
    assert comm == pytest.approx(kernels["comm"])
    # where some stream's collective is exposed, no stream computes: their union is the exposed time (one kind here)
    exposed = sorted(
        (t0, t1)
        for key, pieces in tl.pieces.items()
        if key != attribute.STEP_LANE
        for label, t0, t1 in pieces
        if label in ("comm exposed", "bubble")
    )
    union, reach = 0.0, -1.0
    for t0, t1 in exposed:
        union += max(0.0, t1 - max(t0, reach))
        reach = max(reach, t1)
    assert len(step.comm_exposed) == 1 and union == pytest.approx(sum(step.comm_exposed.values()))


def test_timeline_is_capped_and_says_so(tmp_path):
    path = tmp_path / "dp.json"
    synth.write(str(path), "cuda", steps=1, layers=2)
    (rs,) = summary.analyse([str(path)])
    (step,) = rs.steps
    items = attribute.intervals(reader.read(str(path)))
    tl = attribute.timeline(items, step, limit=5)
    assert tl.dropped > 0 and 5 <= tl.kept <= 5 + 3  # the piece that reached the cap: the step lane and 2 streams
    # every lane stops at the cut, and the step lane covers the step up to it without a hole
    assert all(t1 <= tl.cut_us for pieces in tl.pieces.values() for _, _, t1 in pieces)
    assert sum(t1 - t0 for _, t0, t1 in tl.pieces[attribute.STEP_LANE]) == pytest.approx(tl.cut_us - step.start_us)
    whole = attribute.timeline(items, step)
    assert whole.dropped == 0 and whole.cut_us == float("inf")


def test_cli_bubble_beside_projection_and_report_timeline(stages, tmp_path, run):
    """Two stages with --project … --pp 2: the bubble row has both figures; the timeline CSV (with its sidecar)
    is drawn by opbench report, and the bars it draws are the CSV's pieces, which add up to the line items."""
    paths = [str(path) for path, _ in stages[2, "cuda"]]
    out = tmp_path / "out"
    flags = f"--model-config-path {ROOT / 'examples/configs/tiny-llama'} --world-size 2 --pp 2 --mbs 1 --seqlen 64 "
    flags += "--global-batch 4 --device H100 --dtype bf16"
    p = run("opbench", "step", *paths, "--report-dir-path", str(out), "--project", flags)
    assert p.returncode == 0, p.stderr
    with open(out / "step_items.csv") as fh:
        rows = list(csv.DictReader(fh))
    bubble = [r for r in rows if r["item"] == "bubble"]
    assert len(bubble) == 2
    for row, (_, truth) in zip(sorted(bubble, key=lambda r: r["rank"]), stages[2, "cuda"]):
        assert float(row["measured_s"]) == pytest.approx(truth.partition["bubble"] / 1e6)
        assert float(row["projected_s"]) > 0 and float(row["measured_over_projected"]) > 0 and not row["note"]
    sidecar = json.loads((out / "step_timeline.meta.json").read_text())
    assert sidecar["benchmark"] == "step_timeline" and sidecar["timeline_dropped"] == {}

    import pandas as pd

    from opbench.report.plots import timeline_bars

    frame = pd.read_csv(out / "step_timeline.csv")
    bars = timeline_bars(frame)
    assert [name for name, _ in bars] == [f"rank {r} ({Path(paths[r]).name})" for r in (0, 1)]
    for (_, pieces), (_, truth) in zip(bars, stages[2, "cuda"]):
        drawn: dict[str, float] = defaultdict(float)
        for label, _, width in pieces:
            drawn[label] += width * 1e6
        assert drawn.keys() == truth.partition.keys()
        for label, us in truth.partition.items():
            assert drawn[label] == pytest.approx(us, abs=1e-3), label
    one = timeline_bars(frame[frame["rank"] == 0])
    assert one[0][0] == "step" and len(one) == 4  # the step's cut, then the compute and two p2p streams

    r = run("opbench", "report", str(out))
    assert r.returncode == 0, r.stderr
    pytest.importorskip("matplotlib")
    assert (out / "report" / "step_timeline.png").stat().st_size > 0
    assert "step_timeline.png" in (out / "report" / "report.md").read_text()


GLOO_PIPELINE = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    H, M, B = 256, 4, 64  # hidden, micro-batches, rows per micro-batch
    stage = torch.nn.Sequential(*[torch.nn.Linear(H, H) for _ in range(4)])
    opt = torch.optim.SGD(stage.parameters(), lr=1e-3)
    def step():  # GPipe over two stages: all forwards, then all backwards; activations and gradients by send/recv
        outs, ins = [], []
        for i in range(M):
            if rank == 0:
                x = torch.randn(B, H)
            else:
                x = torch.empty(B, H); dist.recv(x, 0); x.requires_grad_()
            y = stage(x)
            if rank == 0:
                dist.send(y.detach(), 1)
            ins.append(x); outs.append(y)
        for i in range(M):
            if rank == 1:
                outs[i].square().mean().backward()
                dist.send(ins[i].grad, 0)
            else:
                g = torch.empty(B, H); dist.recv(g, 1); outs[i].backward(g)
        opt.step(); opt.zero_grad()
    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(f"{sys.argv[1]}/rank{rank}.json")) as prof:
        for _ in range(3):
            step(); prof.step()
    dist.destroy_process_group()
""")


def test_gloo_two_stage_pipeline_has_its_bubble(tmp_path):
    """A real two-stage GPipe step over gloo (torchrun, CPU): gloo's c10d::send / c10d::recv_ block their thread
    while the peer computes, so each stage's step holds a bubble (its p2p waits and its fill/drain idle), the
    classes still add up to the span, and the timeline's step lane is that partition."""
    pytest.importorskip("torch.distributed")
    script = tmp_path / "pp.py"
    script.write_text(GLOO_PIPELINE)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    proc = subprocess.run([*cmd, str(tmp_path)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = summary.analyse([str(tmp_path / "rank0.json"), str(tmp_path / "rank1.json")])
    for rs in ranks:
        assert len(rs.steps) == 2
        for step in rs.steps:
            assert sum(step.partition.values()) == pytest.approx(step.dur_us, abs=0.01)
            assert step.comm_exposed["send_recv"] > 0 and step.partition["bubble"] >= step.comm_exposed["send_recv"]
            assert not any(k.startswith("comm:") for k in step.partition), step.partition  # p2p only: all bubble
        kinds = {r["name"]: r["kind"] for r in summary.kernel_rows(rs) if r["class"] == "comm"}
        assert kinds.get("c10d::recv_") == "send_recv" and kinds.get("c10d::send") == "send_recv", kinds
        (step,) = [s for s in rs.steps if s.name == rs.timeline_step]
        assert rs.timeline is not None
        assert _sums(rs.timeline.pieces[attribute.STEP_LANE])["bubble"] == pytest.approx(step.partition["bubble"])
