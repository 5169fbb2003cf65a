"""The timing harness and the report writer."""

import csv
import json
import random
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from opbench.core.results import CsvReport, environment, sidecar_path
from opbench.core.schema import Schema
from opbench.core.timing import ISSUE_CALLS, Stats, TimingConfig, issue_time, measure, noisy_note, rotation_count

CPU = torch.device("cpu")


def test_stats_match_numpy():
    samples = [0.5, 0.1, 0.3, 0.2, 0.9, 0.4]
    s = Stats.from_samples(samples)
    assert s.median == pytest.approx(np.median(samples))
    assert (s.min, s.max, s.iters) == (0.1, 0.9, 6)
    assert s.mean == pytest.approx(np.mean(samples))
    assert s.std == pytest.approx(np.std(samples, ddof=1))
    assert s.p10 == pytest.approx(np.percentile(samples, 10))
    assert s.p90 == pytest.approx(np.percentile(samples, 90))


def test_measure_reports_the_call_time():
    stats = measure(lambda: time.sleep(0.004), CPU, TimingConfig(min_iters=5, budget_s=0.2, rel_tol=0.5))
    assert 0.004 <= stats.median < 0.02
    assert stats.min <= stats.p10 <= stats.median <= stats.p90 <= stats.max
    assert stats.iters >= 5


def test_issue_time_starts_each_call_from_an_idle_device_and_does_not_wait_for_it(monkeypatch):
    """The host's issue time (docs/conventions.md, "Host issue time"): the device is synchronised before every call
    and once at the end, never between a call and its clock reading; the figure is the median call."""
    import opbench.core.device as device_mod

    events: list[str] = []
    monkeypatch.setattr(device_mod, "synchronize", lambda dev: events.append("sync"))
    sleeps = iter([0.004] * (ISSUE_CALLS - 1) + [0.05])  # one slow call: the median does not take it

    def call() -> None:
        events.append("call")
        time.sleep(next(sleeps))

    host = issue_time(call, CPU)
    assert events == ["sync", "call"] * ISSUE_CALLS + ["sync"]
    assert 0.004 <= host < 0.05  # below the slow call: the median is one of the 4 ms calls


def test_before_hook_is_not_timed():
    stats = measure(
        lambda: time.sleep(0.002), CPU, TimingConfig(min_iters=4, budget_s=0.05), before=lambda: time.sleep(0.02)
    )
    assert stats.median < 0.015


def test_iteration_cap_and_budget():
    calls = []
    stats = measure(
        lambda: calls.append(1), CPU, TimingConfig(warmup_iters=3, min_iters=5, max_iters=17, rel_tol=0.0, budget_s=100)
    )
    assert stats.iters == 17 and len(calls) >= 17 + 3
    t0 = time.perf_counter()
    stats = measure(
        lambda: time.sleep(0.01), CPU, TimingConfig(min_iters=3, max_iters=10_000, rel_tol=0.0, budget_s=0.3)
    )
    assert time.perf_counter() - t0 < 3 and stats.iters < 200


def test_spread_rule_keeps_timing_a_bimodal_call_and_flags_it_noisy():
    """Median-stable but bimodal (2 ms / 8 ms alternately): the spread rule keeps going to the budget and the
    result is marked noisy; a steady call stops early and is not."""
    flip = [0]

    def bimodal() -> None:
        flip[0] ^= 1
        time.sleep(0.008 if flip[0] else 0.002)

    cfg = TimingConfig(warmup_iters=1, min_iters=8, max_iters=10_000, rel_tol=0.5, max_spread=0.1, budget_s=0.4)
    t0 = time.perf_counter()
    noisy = measure(bimodal, CPU, cfg)
    assert noisy.noisy and noisy.iqr_rel > 0.5 and time.perf_counter() - t0 >= 0.35  # ran to the budget
    steady = measure(lambda: time.sleep(0.004), CPU, replace(cfg, max_spread=10.0))
    assert not steady.noisy and steady.iters < noisy.iters
    assert Stats.from_samples([1.0, 1.0, 2.0, 4.0, 4.0]).iqr_rel == pytest.approx((4 - 1) / 2)
    assert noisy_note(noisy, "fwd").startswith("noisy fwd: IQR ")


def test_rotation_count_covers_cache():
    assert rotation_count(10 << 30, CPU) == 1
    n = rotation_count(1 << 20, CPU)
    assert n > 1


def test_csv_rows_are_on_disk_as_they_finish(tmp_path):
    path = tmp_path / "r.csv"
    schema = Schema("toy", "Toy", 3, ("a", "b", "status"), keys=("a",), metrics={"b": "s"})
    rep = CsvReport(path, schema, meta=environment(CPU, {"x": 1, "benchmark": "overridden"}))
    with open(path) as fh:
        assert fh.read().strip() == "a,b,status"
    rep.append({"a": 1, "b": 0.123456789, "status": "ok"})
    rows = list(csv.DictReader(open(path)))  # readable before close
    assert rows == [{"a": "1", "b": "0.123457", "status": "ok"}]
    rep.append({"a": 2, "b": None, "status": "error"})
    assert list(csv.DictReader(open(path)))[1]["b"] == ""  # no silent zero
    with pytest.raises(KeyError):
        rep.append({"a": 3, "typo": 1})
    rep.close()
    meta = json.loads(sidecar_path(path).read_text())
    for key in ("opbench", "torch", "device", "host", "command", "utc_time", "x"):
        assert key in meta
    assert (meta["benchmark"], meta["schema_version"]) == ("toy", 3)  # the schema's, whatever meta said


def test_schema_rejects_keys_that_are_not_columns():
    with pytest.raises(ValueError, match="not columns"):
        Schema("toy", "Toy", 1, ("a", "b"), keys=("a", "c"), metrics={})


def test_peaks_match_the_part_torch_names():
    from opbench.core.device import lookup_peak

    names = {  # torch.cuda.get_device_name(), as the parts report it
        "NVIDIA H100 80GB HBM3": 3.35,
        "NVIDIA H100 PCIe": 2.0,
        "NVIDIA H100 NVL": 3.9,
        "NVIDIA H200": 4.8,
        "NVIDIA H200 NVL": 4.8,
        "AMD Instinct MI300X": 5.3,
        "AMD Instinct MI300A": 5.3,
        "AMD Instinct MI325X": 6.0,
        "AMD Instinct MI350X": 8.0,
        "AMD Instinct MI355X": 8.0,
        "NVIDIA B200": 8.0,
        "NVIDIA GB200": 8.0,
        "NVIDIA A100-SXM4-80GB": 2.039,
        "NVIDIA A100-SXM4-40GB": 1.555,
        "NVIDIA A100 80GB PCIe": 1.935,
    }
    for name, hbm in names.items():
        peak = lookup_peak(name)
        assert peak is not None and peak.hbm_tbs == hbm, name
    assert lookup_peak("NVIDIA H200 NVL").bf16_tflops == 835.0 and lookup_peak("NVIDIA H200").bf16_tflops == 989.0
    assert lookup_peak("AMD Instinct MI300A").bf16_tflops == 980.6
    assert lookup_peak("NVIDIA GH200 480GB") is None and lookup_peak("AMD EPYC 9654") is None
    assert lookup_peak("NVIDIA GB200").bf16_tflops == 2500.0 and lookup_peak("NVIDIA B200").bf16_tflops == 2250.0
    assert lookup_peak("NVIDIA A100-SXM4-80GB").tflops("fp8") is None  # no FP8 tensor cores: no FP8 peak
    from opbench.cluster.links import intra_link
    from opbench.project.__main__ import _device_memory_gib

    assert intra_link("AMD Instinct MI355X").pair_gbs == 76.8 and intra_link("NVIDIA GB200").intra_gbs == 900.0
    assert [_device_memory_gib(n) for n in ("NVIDIA B200", "NVIDIA GB200", "AMD Instinct MI355X")] == [178, 185, 288]


class _FakeGpu:
    """The GPU side of ``measure`` on a fake clock: every call
    takes ``per_call`` seconds of GPU time, a graph replay ``calls`` of them; what ``measure`` schedules and how it
    divides the times is the real code."""

    def __init__(self, monkeypatch, per_call: float, capture_fails: bool):
        import opbench.core.device as device_mod
        import opbench.core.timing as timing

        self.per_call, self.gpu_s, self.batches, self.jitter = per_call, 0.0, 0, random.Random(0)
        monkeypatch.setattr(timing, "_run_batch", self.run_batch)
        monkeypatch.setattr(timing, "capture_graph", self.capture)
        monkeypatch.setattr(device_mod, "synchronize", self.synchronize)
        self.capture_fails = capture_fails
        self.warm_calls = self.warm_syncs = 0  # before the first timed batch

    def synchronize(self, device):
        self.warm_syncs += self.gpu_s == 0

    def call(self):  # the warm-up's wall time per call sizes the batches: 7 µs, as a synchronised GPU call takes
        self.warm_calls += self.gpu_s == 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < self.per_call:
            pass

    def capture(self, fn, before, calls, device):
        if self.capture_fails:
            return None, "RuntimeError: operation not permitted when stream is capturing"
        graph = type("Graph", (), {"calls": calls, "replay": lambda self: None})()
        return graph, ""

    def run_batch(self, fn, n, device, before, hold_s=0.0, calls_per_sample=1):
        graph = getattr(fn, "__self__", None)
        sample = self.per_call * calls_per_sample * getattr(graph, "calls", 1)
        self.batches += 1  # each batch a little slower than all before: the median never repeats, so only the
        drift = 1 + 1e-3 * self.batches  # budget (or the cap) can stop the measurement
        out = [sample / calls_per_sample * drift * self.jitter.uniform(0.9996, 1.0004) for _ in range(n)]
        # the GPU time the harness is told of (the drift included: a loaded machine's smaller batches drift more)
        self.gpu_s += sum(out) * calls_per_sample
        return out, 1e-6


@pytest.mark.parametrize("capture_fails", [False, True])
def test_a_small_gpu_call_is_timed_per_call_and_its_budget_counts_every_call(monkeypatch, capture_fails):
    """A 7 µs call: timed as replays of a graph (or, where capture fails, in groups between one event pair, with
    the reason), per call, and the budget binds on the GPU time of every call timed, not of one call per sample
    (which let a --budget 0.3 run go on to the iteration cap); the warm-up waits for each call, where a GPU would
    queue up to its cap of 1000 before its clock moved."""
    gpu = _FakeGpu(monkeypatch, per_call=7e-6, capture_fails=capture_fails)
    config = TimingConfig(min_iters=5, max_iters=100_000, rel_tol=0.0, budget_s=0.3)
    stats = measure(gpu.call, torch.device("cuda"), config)
    assert 0.3 <= gpu.gpu_s < 0.3 + 0.1  # the budget, and at most one batch past it
    assert stats.median == pytest.approx(7e-6, rel=0.1)
    if capture_fails:
        assert stats.timed_as.startswith("events around groups of 8 calls (CUDA graph capture failed: RuntimeError")
    else:
        assert stats.timed_as == "CUDA graph of 143 calls"  # ~1 ms of calls per replay
    assert stats.iters == pytest.approx(0.3 / 7e-6, rel=0.3)
    assert gpu.warm_syncs > gpu.warm_calls >= 2  # every warm-up call waited for (a GPU queues them otherwise)


def test_only_a_cpu_measurement_says_it_was_timed_in_cpu_time(monkeypatch):
    """OPBENCH_CLOCK=cpu changes CPU timings only: a row's note names the clock when the harness timed on a CPU, and
    a GPU's per-call event timing (no ``timed_as``) is never labelled so (docs/conventions.md, "The CPU clock")."""
    import torch

    from opbench.core.timing import Stats, TimingConfig, measure, timing_note

    monkeypatch.setenv("OPBENCH_CLOCK", "cpu")
    cpu = measure(lambda: torch.ones(64).sum(), torch.device("cpu"), TimingConfig.quick())
    assert cpu.cpu_clock and "timed in process CPU time (OPBENCH_CLOCK=cpu)" in (timing_note(cpu) or "")
    events = Stats.from_samples([0.01] * 3)  # what a GPU's event pairs give: no timed_as, not on the CPU clock
    assert timing_note(events) is None
    monkeypatch.setenv("OPBENCH_CLOCK", "wall")
    assert not measure(lambda: torch.ones(64).sum(), torch.device("cpu"), TimingConfig.quick()).cpu_clock


@pytest.mark.parametrize("variable,value", [("OPBENCH_CLOCK", "gpu"), ("OPBENCH_FIRST_CPU_WARMUP_S", "61")])
def test_a_bad_timing_variable_is_one_line_before_anything_runs(run, tmp_path, variable, value):
    """The clock and the first warm-up come from the environment (core/clock.py); a bad value is one line naming
    the variable, exit 2, whichever way the tool is started, and no CSV is written."""
    for module in (("opbench", "gemm"), ("opbench.gemm",)):
        r = run(*module, "--mnk", "64x64x64", env={variable: value}, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and variable in r.stderr, r.stderr
        assert not (tmp_path / "out").exists()
