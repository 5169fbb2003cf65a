"""opbench step on real traces of real training steps on this CPU: transformers' tiny Llama and Qwen3-MoE
(examples/configs) trained under torch.profiler, CPU operators standing in for kernels.

The truth: each step's classes add up to its ProfilerStep span exactly, that span is the step's wall time (timed
around the same step with perf_counter) within 10 % + 2 ms, attributed work (every class but idle) is at least half
of it, and the GEMM rows carry the model's own shapes with the right pass. One capture per model, shared."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from opbench.steptrace import attribute, reader, summary

ROOT = Path(__file__).resolve().parent.parent
MBS, SEQ = 2, 64
TOKENS = MBS * SEQ


def capture(config_dir: Path, out: Path, steps: int = 2) -> list[float]:
    """Train ``steps`` profiled steps (after one warm-up) of the model in ``config_dir``; the wall time of each."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the shared 2-core machine: two threads against other jobs' load take 10 times longer
    try:
        return _capture(torch, transformers, config_dir, out, steps)
    finally:
        torch.set_num_threads(threads)


def _capture(torch, transformers, config_dir: Path, out: Path, steps: int) -> list[float]:
    cfg = transformers.AutoConfig.from_pretrained(config_dir)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, cfg.vocab_size, (MBS, SEQ))
    walls: list[float] = []

    def step() -> None:
        t = time.perf_counter()
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
        walls.append(time.perf_counter() - t)

    step()
    walls.clear()
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        record_shapes=True,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(out)),
    ) as prof:
        for _ in range(steps + 1):
            step()
            prof.step()
    return walls[1:]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("step") / "llama.json"
    walls = capture(ROOT / "examples" / "configs" / "tiny-llama", path)
    return path, walls


@pytest.fixture(scope="module")
def qwen_moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("step") / "qwen3moe.json"
    walls = capture(ROOT / "examples" / "configs" / "tiny-qwen3-moe", path)
    return path, walls


def _check_accounts(path: Path, walls: list[float]) -> list[attribute.StepResult]:
    trace = reader.read(str(path))
    assert not trace.on_gpu
    results = attribute.steps(trace)
    assert [r.name for r in results] == ["ProfilerStep#1", "ProfilerStep#2"]
    for r, wall in zip(results, walls):
        assert sum(r.partition.values()) == pytest.approx(r.dur_us, abs=0.01)  # µs at 5e12 µs clocks
        assert abs(r.dur_us / 1e6 - wall) <= 0.10 * wall + 2e-3, (r.dur_us, wall)
        work = r.dur_us - r.partition.get(attribute.IDLE, 0.0)
        assert work >= 0.5 * r.dur_us, r.partition
        for klass in ("gemm", "attention", "memory", "optimizer"):
            assert r.partition.get(klass, 0.0) > 0, (klass, r.partition)
    return results


def test_llama_step_accounted(llama, record):
    path, walls = llama
    results = _check_accounts(path, walls)
    rs = summary.RankSteps(str(path), 0, False, results)
    rows = summary.kernel_rows(rs)
    gemms = {(r["kind"], r["m"], r["n"], r["k"]) for r in rows if r["class"] == "gemm"}
    # tiny-llama: hidden 384, intermediate 1024; gate/up (T, 1024, 384) forward, its dgrad and wgrad in backward
    assert ("fwd", TOKENS, 1024, 384) in gemms
    assert ("dgrad", TOKENS, 384, 1024) in gemms
    assert ("wgrad", 1024, 384, TOKENS) in gemms
    assert all(r["dtype"] == "fp32" for r in rows if r["class"] == "gemm" and r["m"])
    attn = {r["kind"] for r in rows if r["class"] == "attention"}
    assert any(k.endswith("fwd") for k in attn) and any(k.endswith("bwd") for k in attn)
    items = summary.items(rs)
    shares = ", ".join(
        f"{k} {v['measured_s'] / items['step']['measured_s']:.0%}" for k, v in items.items() if k != "step"
    )
    record(f"opbench step, tiny Llama CPU step {items['step']['measured_s'] * 1e3:.1f} ms: {shares}")


def test_llama_timeline_is_the_steps_accounting(llama):
    """On a real CPU trace (nested operators on threads), the timeline's step lane adds up to the median step's
    partition, and each thread's pieces to its operators' own time by class."""
    path, _ = llama
    (rs,) = summary.analyse([str(path)])
    tl = rs.timeline
    assert tl is not None and tl.dropped == 0
    (step,) = [s for s in rs.steps if s.name == rs.timeline_step]
    lanes: dict[tuple[int, int], dict[str, float]] = {}
    for lane, pieces in tl.pieces.items():
        for label, t0, t1 in pieces:
            assert t1 > t0
            lanes.setdefault(lane, {})[label] = lanes.get(lane, {}).get(label, 0.0) + t1 - t0
    own = lanes.pop(attribute.STEP_LANE)
    assert own.keys() == step.partition.keys()
    for label, us in step.partition.items():
        assert own[label] == pytest.approx(us, abs=0.01), label
    kernels: dict[str, float] = {}
    for key, (_, us) in step.kernels.items():
        kernels[key.klass] = kernels.get(key.klass, 0.0) + us
    threads: dict[str, float] = {}
    for per in lanes.values():
        for label, us in per.items():
            threads[label] = threads.get(label, 0.0) + us
    assert threads.keys() == kernels.keys()
    for klass, us in kernels.items():
        assert threads[klass] == pytest.approx(us, abs=0.01), klass


def test_qwen3_moe_step_accounted(qwen_moe, record):
    path, walls = qwen_moe
    results = _check_accounts(path, walls)
    rs = summary.RankSteps(str(path), 0, False, results)
    rows = summary.kernel_rows(rs)
    # the router (T, 8 experts, 384) is a GEMM of the model's own shape
    assert any(r["class"] == "gemm" and r["kind"] == "fwd" and (r["n"], r["k"]) == (8, 384) for r in rows), rows[:20]
    items = summary.items(rs)
    shares = ", ".join(
        f"{k} {v['measured_s'] / items['step']['measured_s']:.0%}" for k, v in items.items() if k != "step"
    )
    record(f"opbench step, tiny Qwen3-MoE CPU step {items['step']['measured_s'] * 1e3:.1f} ms: {shares}")


def test_cli_tables_csvs_projection_and_calibration(llama, tmp_path, run):
    path, _ = llama
    out, cal = tmp_path / "out", tmp_path / "cal.json"
    flags = f"--model-config-path {ROOT / 'examples/configs/tiny-llama'} --world-size 1 --mbs {MBS} --seqlen {SEQ} "
    flags += "--global-batch 2 --device H100 --dtype fp32 --activation-profile eager --memory-ops eager"
    p = run("opbench", "step", str(path), "--report-dir-path", str(out), "--project", flags, "--calibrate", str(cal))
    assert p.returncode == 0, p.stderr
    assert "measured/projected" in p.stdout and "wrote" in p.stdout
    items = (out / "step_items.csv").read_text().splitlines()
    assert items[0].startswith("trace,rank,steps,item,measured_s")
    assert any(",gemm," in line for line in items) and any(",bubble," in line for line in items)
    sidecar = json.loads((out / "step_items.meta.json").read_text())
    assert sidecar["benchmark"] == "step" and sidecar["projection"]["model"]
    assert (out / "step_kernels.csv").is_file() and (out / "step_kernels.meta.json").is_file()
    factors = json.loads(cal.read_text())["factors"]
    assert set(factors) == {"gemm", "attention", "memory"} and all(v > 0 for v in factors.values())
    # project reads it back: with the factors, the projected GEMM time is the measured one
    proj = run("opbench", "project", *flags.split(), "--calibration", str(cal))
    assert proj.returncode == 0, proj.stderr
    assert "calibrated: " in proj.stdout and "gemm × " in proj.stdout
    both = run("opbench", "project", *flags.split(), "--calibration", str(cal), "--compute-scale", "2")
    assert both.returncode == 2 and "not both" in both.stderr


def test_calibration_round_trip(llama, tmp_path):
    """After --calibrate, the projection's compute classes equal the measured ones."""
    from opbench.steptrace import compare

    path, _ = llama
    flags = f"--model-config-path {ROOT / 'examples/configs/tiny-llama'} --world-size 1 --mbs {MBS} --seqlen {SEQ} "
    flags += "--global-batch 2 --device H100 --dtype fp32"
    projected, meta, _ = compare.projected_items(flags)
    rs = summary.analyse([str(path)])
    measured = compare.measured_totals([summary.items(r) for r in rs])
    fac = compare.factors(measured, projected)
    cal = tmp_path / "cal.json"
    compare.write_calibration(str(cal), fac, meta)
    again, _, _ = compare.projected_items(flags + f" --calibration {cal}")
    for klass in fac:
        assert again[klass] == pytest.approx(measured[klass], rel=1e-3)


def test_bad_input_is_one_line(tmp_path, run):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph":')
    p = run("opbench", "step", str(bad), "--report-dir-path", str(tmp_path / "o"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "bad.json" in p.stderr, p.stderr
    missing = run("opbench", "step", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "nope.json" in missing.stderr
    nocal = run("opbench", "step", str(bad), "--calibrate", str(tmp_path / "c.json"))
    assert nocal.returncode == 2 and "--calibrate" in nocal.stderr
