import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A process's first CPU measurement warms up 1 s (core/timing.py, FIRST_CPU_WARMUP_S, says why); the suite's
# hundreds of short-lived processes check behaviour, not rates, and warm up 0.2 s (docs/development.md, "Tests").
os.environ.setdefault("OPBENCH_FIRST_CPU_WARMUP_S", "0.2")


def run_module(
    *args: str, env: dict | None = None, timeout: float = 600, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run ``python -m <args>`` as a user would, capturing output."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd or ROOT
    )


@pytest.fixture
def run():
    return run_module


# Figures a test measured that a reader of the CI log should see even when it passes (the projection's
# projected/measured ratios): tests append lines, the terminal summary prints them.
RECORDED: list[str] = []


@pytest.fixture
def record():
    return RECORDED.append


def pytest_terminal_summary(terminalreporter):
    if RECORDED:
        terminalreporter.section("recorded figures")
        for line in RECORDED:
            terminalreporter.write_line(line)
