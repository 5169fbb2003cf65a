"""A failing rank's own error reaches the line opbench ends a self-launched job with, and torchrun's summary: a real
torchrun job of two ranks where rank 1 gives up through ``core.dist.fail_job`` (as a cluster, comm or ckpt rank
does when its job breaks) and rank 0 waits."""

from __future__ import annotations

import sys

from opbench.core import dist

WORKER = """\
import os, time
from opbench.core import dist
if os.environ["RANK"] == "1":
    dist.fail_job("opbench cluster", "rank 1/2: gathering intra times failed (--timeout 30 s): Connection closed by peer")
time.sleep(30)
"""


def test_the_failing_ranks_own_error_ends_the_launchers_message(tmp_path, capfd, monkeypatch):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", str(dist.__file__).rsplit("/opbench/", 1)[0])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone", str(worker)]
    assert dist.relaunch(cmd, "opbench cluster") == 1
    err = capfd.readouterr().err.strip().splitlines()
    own = "opbench cluster: error: rank 1/2: gathering intra times failed (--timeout 30 s): Connection closed by peer"
    assert own in err  # what the rank printed, passed through
    # the last line names the rank torchrun found first and quotes its own words (from its error file)
    assert err[-1] == f"opbench cluster: error: rank 1 ended with exit code 1: {own}; torchrun stopped the other ranks (the ranks' own messages are above)", err  # fmt: skip
    assert not any("To enable traceback" in line or "ChildFailedError" in line for line in err)
