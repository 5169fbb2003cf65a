"""opbench project --calibration (opbench/project/calibration.py): a profiled step's per-class factors scale every
time of their class exactly — dense and grouped expert GEMMs, measured MoE rows, attention, memory-bound operators —
and nothing else; a bad file or a flag it cannot go with is one line, exit 2. CPU, no torch, seconds."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from opbench.models import load_model_configs
from opbench.models.architectures import decoder_layers
from opbench.project.plan import Plan
from opbench.project.rates import Assumptions, Rates
from opbench.project.workload import ATTENTION, GEMM, MEMORY, layer_work

ROOT = Path(__file__).resolve().parent.parent
TINY_MOE = "examples/configs/tiny-qwen3-moe"
TINY_LLAMA = str(ROOT / "examples/configs/tiny-llama")


def _by_item(cfg, lay, plan, a: Assumptions) -> dict[str, tuple[str, float]]:
    work = layer_work(cfg, lay, plan, Rates([], "H100", "bf16", a, 8))
    return {f"{i.name} ({p})": (i.category, i.timed.seconds) for p, items in (("f", work.fwd), ("b", work.bwd))
            for i in items}  # fmt: skip


@pytest.mark.parametrize("factors", [{"gemm": 2.0}, {"attention": 3.0}, {"memory": 0.5}])
def test_each_factor_scales_exactly_its_class(factors):
    (cfg,) = load_model_configs(TINY_MOE)
    lay = decoder_layers(cfg)[0]  # attention, router, routed experts (grouped, narrow: k_share), permutation
    plan = Plan(world=2, seqlen=512, global_batch=2, ep=2)
    base = _by_item(cfg, lay, plan, Assumptions())
    got = _by_item(cfg, lay, plan, replace(Assumptions(), calibration=tuple(factors.items())))
    assert got.keys() == base.keys()
    classes = {"gemm": GEMM, "attention": ATTENTION, "memory": MEMORY}
    scaled = {classes[k]: v for k, v in factors.items()}
    hit = 0
    for name, (category, seconds) in base.items():
        factor = scaled.get(category, 1.0) if category in (GEMM, ATTENTION, MEMORY) else 1.0
        hit += factor != 1.0
        assert got[name][1] == pytest.approx(seconds * factor, rel=1e-12), name
    assert hit >= 2  # forward and backward at least


@pytest.mark.parametrize(
    "content,extra,says",
    [
        ("[1, 2]", [], "no per-class factors"),
        ('{"factors": {"gemm": "fast"}}', [], "is no factor of"),
        ('{"factors": {"comm": 2}}', [], "is no factor of"),
        ('{"factors": {"gemm": 1e9}}', [], "is no factor of"),
        ("{", [], "cannot read calibration"),
        ('{"factors": {"gemm": 1.2}}', ["--compute-scale", "1.1"], "not both"),
        ('{"factors": {"gemm": 1.2}}', ["--validate"], "does not apply"),
    ],
)
def test_a_bad_calibration_is_one_line(run, tmp_path, content, extra, says):
    path = tmp_path / "calibration.json"
    path.write_text(content)
    r = run(
        "opbench.project", "--model-config-path", TINY_LLAMA, "--world-size", "1",
        "--device", "H100", "--seqlen", "256", "--calibration", str(path), *extra, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr


def test_a_good_calibration_is_said_and_moves_the_step(run, tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"factors": {"gemm": 2.0, "memory": 1.5}}))
    base = ["opbench.project", "--model-config-path", TINY_LLAMA, "--world-size", "1",
            "--device", "H100", "--seqlen", "256"]  # fmt: skip
    plain, calibrated = run(*base, cwd=tmp_path), run(*base, "--calibration", str(path), cwd=tmp_path)
    assert plain.returncode == calibrated.returncode == 0, calibrated.stderr
    assert "calibrated: gemm × 2, memory × 1.5 (--calibration" in calibrated.stdout
    assert plain.stdout != calibrated.stdout
