"""opbench project, issue 44: host-bound steps. The host's time to issue the step's operators (by the part's host
CPU, TransformerEngine #2053's measurement, or --host-us-per-op) against the GPU's work: a small model's step is its
host's, a large one's its GPU's; on a CPU the host is the device. Torch-free; each projection takes well under a
second."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opbench.core.peaks import host_cpu
from opbench.models import load_model_configs, select_models
from opbench.project.plan import Plan
from opbench.project.rates import HOST_US, TE_MODULE_HOST, Assumptions, Rates
from opbench.project.step import Projector, _optimizer_ops

SMALL = Plan(world=8, seqlen=512, global_batch=8)  # one micro-batch of 512 tokens a GPU
LARGE = Plan(world=64, seqlen=8192, global_batch=64, tp=8)


@pytest.fixture(scope="module")
def models():
    configs = load_model_configs()
    (small,) = select_models(configs, "Qwen3_0.6B")
    (large,) = select_models(configs, "Llama3.1_70B")
    return small, large


def _project(cfg, plan: Plan, device: str = "H100", **assumed):
    return Projector(cfg, Rates([], device, "bf16", Assumptions(**assumed), 8)).project(plan)


def test_the_host_cost_comes_from_the_parts_host_cpu_the_flag_or_is_none_on_a_cpu():
    assert host_cpu("NVIDIA GB200") == host_cpu("GB300") == host_cpu("GH200 480GB") == "grace"
    assert host_cpu("H100") == host_cpu("B200") == host_cpu("MI300X") == host_cpu(None) == "x86"
    assert HOST_US["grace"] / HOST_US["x86"] == pytest.approx(37.08 / 13.48)
    assert TE_MODULE_HOST == pytest.approx(2.69, abs=0.01)
    a = Assumptions()
    assert Rates([], "H100", "bf16", a, 8).host_cost().seconds == pytest.approx(13.48e-6)
    assert Rates([], "GB200", "bf16", a, 4).host_cost().seconds == pytest.approx(37.08e-6)
    assert Rates([], "cpu", "bf16", a, 1).host_cost().seconds == 0.0
    given = Rates([], "GB200", "bf16", Assumptions(host_us_per_op=5.0), 4).host_cost()
    assert given.seconds == pytest.approx(5e-6) and "--host-us-per-op" in given.note


def test_a_small_model_is_host_bound_a_large_one_is_not(models):
    """Qwen3-0.6B, one micro-batch of 512 tokens a GPU: its kernels take less than the host takes to issue
    them, so the step is the host's (longer on Grace than on x86, by their per-operator ratio); Llama-3.1-70B's
    layers take milliseconds: the host hides behind them and the step is as without it."""
    small, large = models
    free = _project(small, SMALL, host_us_per_op=0.0)
    h100, gb200 = _project(small, SMALL), _project(small, replace(SMALL, gpus_per_node=4), "GB200")
    assert free.host_s == free.host_wait_s == 0.0
    assert h100.host_wait_s > 0 and h100.step_s == pytest.approx(h100.host_s)
    assert h100.step_s == pytest.approx(free.step_s + h100.host_wait_s)
    assert gb200.host_s / h100.host_s == pytest.approx(37.08 / 13.48)
    assert gb200.step_s > h100.step_s  # the faster GPU, the slower step: Megatron CI's 82 vs 58 ms
    # the breakdown still adds up: the wait is its own part, not a bubble
    parts = h100.compute_s + h100.exposed_comm_total + h100.bubble_s + h100.optimizer_s + h100.host_wait_s
    assert parts == pytest.approx(h100.step_s)
    big, big_free = _project(large, LARGE), _project(large, LARGE, host_us_per_op=0.0)
    assert big.host_wait_s == 0.0 and big.step_s == big_free.step_s and 0 < big.host_s < big.step_s / 10


def test_the_host_issues_every_micro_batchs_operators_and_the_optimizers(models):
    """The host's time is linear in the micro-batches (each issues the same operators) and in the cost per
    operator; the optimizer's multi-tensor-apply launches grow with the local parameters."""
    small, _ = models
    cost = 10.0
    one, two = (
        _project(small, replace(SMALL, global_batch=b), host_us_per_op=cost) for b in (8, 16)
    )  # 1 and 2 micro-batches
    per_microbatch = two.host_s - one.host_s
    assert per_microbatch > 0 and one.host_s > per_microbatch  # the optimizer's operators on top
    projector = Projector(small, Rates([], "H100", "bf16", Assumptions(host_us_per_op=cost), 8))
    (ops,) = projector.stage_host_ops(SMALL)
    assert per_microbatch == pytest.approx(ops * cost * 1e-6)
    # 28 layers: at least a GEMM a projection (7, × the TE module's weight) and the norms' kernels each, per pass
    assert ops > 28 * 2 * 7 * TE_MODULE_HOST
    doubled = _project(small, SMALL, host_us_per_op=2 * cost)
    assert doubled.host_s == pytest.approx(2 * one.host_s)
    assert _optimizer_ops(1) < _optimizer_ops(10**9)


def test_on_a_cpu_the_host_is_the_device_so_issue_adds_to_the_work(models, monkeypatch):
    """A CPU target has no host cost by default (its operators' times already hold their issue); one given with
    --host-us-per-op adds to the step instead of overlapping it (no launch queue to run ahead in). The H100's
    peak line stands in for a CPU's measured rows; only ``on_gpu`` is the CPU's."""
    small, _ = models
    monkeypatch.setattr(Rates, "on_gpu", property(lambda self: False))
    plan = Plan(world=1, seqlen=256, global_batch=1)
    none = _project(small, plan)
    given = _project(small, plan, host_us_per_op=10.0)
    assert none.host_s == 0.0
    assert given.step_s == pytest.approx(none.step_s + given.host_s) and given.host_wait_s == pytest.approx(
        given.host_s
    )


def test_the_flag_is_in_the_cli_and_a_bad_value_is_one_line(capsys):
    from opbench.core.errors import run_cli
    from opbench.project.__main__ import main

    flags = ["--model", "Qwen3_0.6B", "--world-size", "8", "--seqlen", "512", "--global-batch", "8"]
    assert run_cli(main, [*flags, "--device", "H100"], prog="opbench project") == 0
    assert "waiting on the host (host-bound)" in capsys.readouterr().out
    assert run_cli(main, [*flags, "--device", "H100", "--host-us-per-op", "-1"], prog="opbench project") == 2
    err = capsys.readouterr().err
    assert "--host-us-per-op" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
