"""Does ``opbench project --validate`` hold on a busy machine? Its projected/measured step-time ratio, in wall
time and in CPU time (``OPBENCH_CLOCK=cpu``), with the rates measured on a quiet machine and the step trained at
several loads — what the test suite meets on a shared CI machine (tests/test_project.py, "matches_a_real").

    python bench/validate_under_load.py [--loads 0,2,3+mem] [--repeat 1]

For each clock, tiny-llama's rates are measured once with no load (``--validate`` measures them the way the tests'
fixture does, one thread), then for each load the same model is validated with ``--results`` of those rates: one
rank, and two ranks under FSDP. A load is a number of busy loops (pure CPU) beside the run, ``+mem`` adds one
process that copies 400 MB arrays without end (memory bandwidth). The machine's own load average is printed too:
other tenants share it. Prints one line per (load, clock, layout) and a table of ratios.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "examples" / "configs" / "tiny-llama"
COMMON = ["--seqlen", "512", "--mbs", "2", "--microbatches", "2", "--steps", "3"]


def _spin() -> None:
    while True:
        pass


def _stream() -> None:
    import numpy as np

    a = np.ones(50_000_000)
    b = np.empty_like(a)
    while True:
        np.copyto(b, a)


def start_load(spec: str) -> list[mp.Process]:
    busy, _, mem = spec.partition("+")
    procs = [mp.Process(target=_spin, daemon=True) for _ in range(int(busy or 0))]
    if mem:
        procs.append(mp.Process(target=_stream, daemon=True))
    for p in procs:
        p.start()
    time.sleep(1.0)
    return procs


def opbench(args: list[str], clock: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPBENCH_CLOCK": clock}
    return subprocess.run([sys.executable, "-m", "opbench", *args], capture_output=True, text=True, env=env)


def step_ratio(out: Path) -> float:
    with open(out / "project_validate.csv", newline="") as fh:
        return next(float(r["ratio"]) for r in csv.DictReader(fh) if r["quantity"] == "step_time_s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", default="0,2,3+mem", help="comma list of loads: busy loops, '+mem' for a copier")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    table: dict[tuple[str, str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for clock in ("wall", "cpu"):
            # the rates, quiet: a 1-rank validate measures them (and its own ratio at load 0)
            rates = Path(tmp) / f"rates-{clock}"
            r = opbench(["project", "--model-config-path", str(TINY), *COMMON, "--world-size", "2",
                         "--nproc-per-node", "2", "--fsdp", "--validate", "--report-dir-path", str(rates)], clock)  # fmt: skip
            if r.returncode != 0:
                print(r.stderr[-2000:], file=sys.stderr)
                return 1
            for load in args.loads.split(","):
                procs = start_load(load)
                try:
                    for _ in range(args.repeat):
                        for layout, extra in (("1 rank", ["--world-size", "1"]),
                                              ("2 ranks fsdp", ["--world-size", "2", "--nproc-per-node", "2", "--fsdp"])):  # fmt: skip
                            out = Path(tmp) / f"v-{clock}-{load}-{layout.replace(' ', '')}"
                            r = opbench(["project", "--model-config-path", str(TINY), *COMMON, *extra, "--validate",
                                         "--results", str(rates), "--report-dir-path", str(out)], clock)  # fmt: skip
                            if r.returncode != 0:
                                print(r.stderr[-2000:], file=sys.stderr)
                                return 1
                            ratio = step_ratio(out)
                            table.setdefault((load, clock, layout), []).append(ratio)
                            print(f"load {load:>6} (loadavg {os.getloadavg()[0]:.1f})  clock {clock:4}  "
                                  f"{layout:13}  step projected/measured {ratio:.3f}", flush=True)  # fmt: skip
                finally:
                    for p in procs:
                        p.kill()
    print("\n| load | layout | wall clock | CPU clock |\n|---|---|---|---|")
    for load in args.loads.split(","):
        for layout in ("1 rank", "2 ranks fsdp"):
            cells = [", ".join(f"{x:.3f}" for x in table[(load, c, layout)]) for c in ("wall", "cpu")]
            print(f"| {load} | {layout} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
