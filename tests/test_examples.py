"""The sample inputs in examples/ are what examples/make_examples.py writes, and the README's commands on them
give what the README says (every FSDP unit matches its model; both perf tables parse completely)."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

EXAMPLES = ROOT / "examples"
FILES = ("nccl_fsdp_qwen3_0.6b_4ranks.log.gz", "all_gather_perf.out", "rccl_all_reduce_perf.out")


def test_examples_are_current_and_parse(tmp_path):
    gen = subprocess.run([sys.executable, str(EXAMPLES / "make_examples.py"), str(tmp_path)], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (EXAMPLES / name).read_bytes(), f"{name}: run make_examples.py"
    trace = subprocess.run(
        [sys.executable, "-m", "opbench", "trace", str(EXAMPLES / FILES[0]), "--compare-fsdp", "Qwen3_0.6B"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert trace.returncode == 0, trace.stderr
    assert "the log covers 2 step(s); 58 of 58 predicted AllGather/ReduceScatter units matched" in trace.stdout
    perf = subprocess.run(
        [sys.executable, "-m", "opbench", "nccl-tests", *(str(EXAMPLES / f) for f in FILES[1:]), "--csv",
         str(tmp_path / "n.csv")], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert perf.returncode == 0, perf.stderr
    assert "wrote" in perf.stdout and "(22 rows)" in perf.stdout
    assert "NOT A MEASUREMENT" in (EXAMPLES / FILES[1]).read_text()
