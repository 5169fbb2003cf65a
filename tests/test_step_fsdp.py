"""opbench step on a real 2-rank FSDP2 step over gloo (torchrun), traced on each rank with torch.profiler: every
step's classes add up to its span, the collectives FSDP2 issued are found by kind with their bytes (from the c10d
operators' inputs: gloo records no record_param_comms), and the two ranks' tables and the straggler section are
printed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opbench.steptrace import summary

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist, transformers
    from torch.distributed.fsdp import fully_shard
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.from_pretrained(sys.argv[1])
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, cfg.vocab_size, (1, 32), generator=torch.Generator().manual_seed(rank))
    def step():
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1),
                                on_trace_ready=lambda p: p.export_chrome_trace(f"{sys.argv[2]}/rank{rank}.json")) as prof:
        for _ in range(3):
            step()
            prof.step()
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def fsdp_traces(tmp_path_factory):
    pytest.importorskip("torch.distributed.fsdp")
    d = tmp_path_factory.mktemp("fsdp")
    script = d / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*cmd, str(script), str(ROOT / "examples/configs/tiny-llama"), str(d)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [d / "rank0.json", d / "rank1.json"]


def test_fsdp2_gloo_step(fsdp_traces, run, tmp_path):
    ranks = summary.analyse([str(p) for p in fsdp_traces])
    assert [r.rank for r in ranks] == [0, 1]
    for r in ranks:
        assert len(r.steps) == 2
        for s in r.steps:
            assert sum(s.partition.values()) == pytest.approx(s.dur_us, abs=0.01)  # µs at 5e12 µs clocks
        comm = [row for row in summary.kernel_rows(r) if row["class"] == "comm"]
        kinds = {row["kind"] for row in comm}
        assert {"all_gather", "reduce_scatter"} <= kinds, kinds
        # torch 2.13's gloo records no record_param_comms: the bytes come from the c10d operator's input tensor
        assert any(row["bytes"] and row["dtype"] == "fp32" for row in comm), comm[:5]
    p = run("opbench", "step", *map(str, fsdp_traces), "--report-dir-path", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "slowest rank:" in p.stdout and "comm:all_gather" in p.stdout
