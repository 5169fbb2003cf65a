"""Operand layouts and the reference check behind max_rel_err."""

import pytest
import torch

from opbench.core.device import device_info
from opbench.core.timing import TimingConfig
from opbench.gemm.runner import GemmCase, make_operands, max_rel_err, run_case
from opbench.gemm.shapes import GemmShape

CPU = torch.device("cpu")


def test_operands_use_the_pass_layout():
    g = torch.Generator().manual_seed(0)
    wgrad = GemmShape("t", "x", "wgrad", 1, m=24, n=8, k=40, groups=1, trans_a=True, trans_b=False)
    a, b = make_operands(wgrad, "fp32", CPU, g)
    assert a.shape == (24, 40) and b.shape == (40, 8)
    assert not a.is_contiguous() and a.t().is_contiguous()  # A is stored [k, m] and read transposed
    grouped = GemmShape("t", "x", "fwd", 1, m=6, n=5, k=7, groups=3, trans_a=False, trans_b=True)
    a, b = make_operands(grouped, "fp32", CPU, g)
    assert a.shape == (3, 6, 7) and b.shape == (3, 7, 5) and b.transpose(-1, -2).is_contiguous()


def test_reference_check_catches_a_wrong_result():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(100, 30, generator=g), torch.randn(30, 20000, generator=g)  # > one column chunk
    good = a @ b
    assert max_rel_err(good, a, b, g) < 1e-6
    bad = good.clone()
    bad[:, 15000] += 5.0  # corrupt one column in the second chunk, in every row
    assert max_rel_err(bad, a, b, g) > 0.05


def test_run_case_row_is_consistent():
    shape = GemmShape("t", "mlp_down", "dgrad", 1, m=64, n=96, k=128, groups=1, trans_a=False, trans_b=False)
    row = run_case(GemmCase(shape, "torch", "fp32"), device_info(CPU), TimingConfig.quick())
    assert row["status"] == "ok" and row["max_rel_err"] < 1e-6
    assert row["tflops"] * 1e12 * row["time_s"] == pytest.approx(2 * 64 * 96 * 128)
    assert row["bandwidth_gbs"] * 1e9 * row["time_s"] == pytest.approx((64 * 128 + 128 * 96 + 64 * 96) * 4)
    assert row["pct_of_peak"] is None  # no published peak for this CPU: empty, not zero
