"""Peak memory and speed of both log parsers on big generated inputs (issue 25 item 3).

Generates, in a temporary folder that is deleted afterwards (unless --keep):

* ``nccl-tests``: --size-mb of nccl-tests result rows, one endless table (the header, then the rows of
  examples/all_gather_perf.out over and over, no ``Avg bus bandwidth`` line: the case that made the old parser
  hold every row);
* ``trace``: an NCCL_DEBUG=INFO COLL log of the same size (tests/synth_trace.py, ``--job mixed``).

Then runs ``opbench nccl-tests FILE --csv OUT`` and ``opbench trace FILE --csv OUT`` (and ``--jobs 2`` with
--jobs) as whole processes, --repeats times interleaved, and prints per parser: CPU seconds (user + sys), wall
seconds, MB/s (file MB / wall and / CPU seconds) and peak RSS (ru_maxrss of the child; the bench's own memory is
not counted, bench/trace_parse_speed.py's spawner). The CSV goes to the same temporary folder. Run:

    python bench/parser_memory.py [--size-mb 1024] [--repeats 1] [--jobs] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def write_nccl_tests_rows(path: str, target_bytes: int) -> int:
    """The header of examples/all_gather_perf.out, then its result rows repeated to ``target_bytes``."""
    with open(os.path.join(ROOT, "examples", "all_gather_perf.out"), encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    head = [ln for ln in lines if ln.startswith("#") and "Avg bus" not in ln and "Out of bounds" not in ln]
    block = "\n".join(ln for ln in lines if ln.strip() and not ln.startswith("#")) + "\n"
    block *= max(1, (1 << 20) // len(block))  # write about 1 MiB at a time
    written = 0
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(head) + "\n")
        while written < target_bytes:
            fh.write(block)
            written += len(block)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=1024.0, help="size of each generated input in MiB (default 1024)")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved runs per parser (default 1)")
    ap.add_argument("--jobs", action="store_true", help="also time opbench trace --jobs 2")
    ap.add_argument("--only", choices=("trace", "nccl-tests"), help="run one parser only")
    ap.add_argument("--keep", action="store_true", help="keep the generated inputs (printed)")
    args = ap.parse_args()

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from synth_trace import write_log  # the tests' log generator
    from tabulate import tabulate
    from trace_parse_speed import timed  # the same spawner: rusage of the child only

    tmp = tempfile.mkdtemp(prefix="opbench-parser-memory-")
    target = int(args.size_mb * (1 << 20))
    py = sys.executable
    inputs: dict[str, str] = {}
    try:
        if args.only != "trace":
            inputs["nccl-tests"] = os.path.join(tmp, "rows.out")
        if args.only != "nccl-tests":
            inputs["trace"] = os.path.join(tmp, "mixed.log")
        for kind, path in inputs.items():
            t0 = time.perf_counter()
            if kind == "nccl-tests":
                write_nccl_tests_rows(path, target)
            else:
                write_log(path, target, job="mixed")
            print(f"generated {path}: {os.path.getsize(path) / 1e6:.0f} MB in {time.perf_counter() - t0:.0f} s")
        methods: dict[str, list[str]] = {}
        if "nccl-tests" in inputs:
            methods["nccl-tests"] = [py, "-m", "opbench.trace.nccl_tests", inputs["nccl-tests"], "--csv"]
        if "trace" in inputs:
            methods["trace"] = [py, "-m", "opbench.trace", inputs["trace"], "--csv"]
            if args.jobs:
                methods["trace --jobs 2"] = [py, "-m", "opbench.trace", inputs["trace"], "--jobs", "2", "--csv"]
        runs: dict[str, list[dict]] = {m: [] for m in methods}
        for _ in range(args.repeats):
            for method, argv in methods.items():
                run_dir = tempfile.mkdtemp(dir=tmp)  # a fresh folder: no earlier CSV to keep or rotate
                out = os.path.join(run_dir, "out.csv")
                runs[method].append(timed([*argv, out], run_dir))
                with open(out, encoding="utf-8") as fh:
                    runs[method][-1]["rows"] = sum(1 for _ in fh) - 1
                shutil.rmtree(run_dir)
        table = []
        for method, done in runs.items():
            path = inputs["nccl-tests" if method == "nccl-tests" else "trace"]
            mb = os.path.getsize(path) / 1e6
            cpu = statistics.median(r["cpu"] for r in done)
            wall = statistics.median(r["wall"] for r in done)
            table.append(
                {
                    "parser": method,
                    "input_mb": round(mb),
                    "csv_rows": done[-1]["rows"],
                    "cpu_s": round(cpu, 1),
                    "wall_s": round(wall, 1),
                    "mb_per_s_wall": round(mb / wall, 1),
                    "mb_per_s_cpu": round(mb / cpu, 1),
                    "peak_rss_mib": round(max(r["rss_mib"] for r in done), 1),
                    "runs": len(done),
                }
            )
        print(tabulate(table, headers="keys"))
    finally:
        if args.keep:
            print(f"kept {', '.join(inputs.values())}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
