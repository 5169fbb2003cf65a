"""OPBENCH_FAULTS is validated alike in every mode: a real run, ``--dry-run`` and ``cluster --plan`` refuse the same
bad value with one line and exit 2 (docs/faults.md). Rank numbers are ASCII digits within the command line's bound
on a world; a fault for a rank the planned world lacks is refused before anything runs."""

from __future__ import annotations

import pytest

from opbench.core.cli import MAX_WORLD
from opbench.core.errors import UsageError
from opbench.core.faults import ENV_VAR, Faults

HUGE_RANK = "exit:" + "9" * 23
ARABIC_ONE = "exit:\u0661"  # ١, which int() and str.isdigit() take as 1


def test_ranks_are_ascii_digits_within_the_world_bound():
    assert Faults.parse(f"exit:{MAX_WORLD - 1}").faults[0].rank == MAX_WORLD - 1
    for bad, needle in (
        (ARABIC_ONE, r"'exit:\\u0661': RANK must be ASCII digits"),
        ("slow:\u0661:4", "RANK must be ASCII digits"),
        ("slow:1:\u0664", "FACTOR must be a finite number in ASCII digits"),
        ("late_send:1:\uff10.5", "SECONDS must be a finite number in ASCII digits"),  # a full-width 0
        (HUGE_RANK, "rank 999999999999… is beyond any job"),
        (f"exit:{MAX_WORLD}", f"rank {MAX_WORLD} is beyond any job"),
        ("exit:1\nx", r"'exit:1\\nx'"),  # a newline cannot start a second line of the message
    ):
        with pytest.raises(UsageError, match=needle) as caught:
            Faults.parse(bad)
        assert f"field '{ENV_VAR}'" in str(caught.value) and "\n" not in str(caught.value)
    assert Faults.validate(4, {ENV_VAR: "slow:3:2"}).faults[0].rank == 3
    with pytest.raises(UsageError, match="names rank\\(s\\) 4, but the job has 4"):
        Faults.validate(4, {ENV_VAR: "hang:4"})


MODES = {  # tool: (a real run's arguments, the dry run's)
    "comm": (["-b", "1K", "-e", "1K", "--nproc-per-node", "2"], ["-b", "1K", "-e", "1K", "--nproc-per-node", "2", "--dry-run"]),
    "ckpt": (["--size-mb", "1", "--methods", "torch_save"], ["--size-mb", "1", "--methods", "torch_save", "--dry-run"]),
    "cluster": (["--quick", "--checks", "compute"], ["--plan", "2", "--nproc-per-node", "2"]),
}  # fmt: skip


@pytest.mark.parametrize("tool", list(MODES))
def test_a_bad_fault_is_one_line_exit_2_in_a_real_run_and_a_dry_run(run, tool, tmp_path):
    real, dry = MODES[tool]
    for value, needle in (
        (HUGE_RANK, "is beyond any job"),
        (ARABIC_ONE, "RANK must be ASCII digits"),
        ("exit:4", "names rank(s) 4, but the job has"),  # the dry run knows its world: 2 ranks (4 for the plan)
    ):
        for argv in (real, dry):
            if value == "exit:4" and argv is real:
                continue  # a real run finds this once its ranks have joined (tests/test_dist.py)
            proc = run("opbench", tool, *argv, "--report-dir-path", str(tmp_path), env={ENV_VAR: value}, timeout=120)
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 2 and len(lines) == 1, (tool, argv, value, proc.stderr[-2000:])
            assert lines[0].startswith(f"opbench {tool}: error: field '{ENV_VAR}': ") and needle in lines[0], lines
