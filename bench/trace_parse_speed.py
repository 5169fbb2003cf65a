"""How fast and how small is opbench's NCCL log parser? (issue 6 "done when")

Generates a realistic NCCL_DEBUG=INFO COLL log (FSDP2 Llama-3-70B-like sizes on 8 ranks, launcher prefixes,
training output every 40 lines, a torn line every 5000) of --size-mb, then times on the same file:

* ``opbench``  : trace.parse.LogParser + Send/Recv grouping + summary tallies (what ``opbench trace`` runs);
* ``parse``    : LogParser alone (records built, nothing kept);
* ``naive``    : the per-line loop people write first: text mode, one regex (prefix + body) ``search`` per line,
                 a dict of fields per match, a Counter of sizes.

Each method runs --repeats times in a fresh subprocess (so the OS page cache is warm for all and peak RSS is
that method's alone); reported: median MB/s, spread, peak RSS (ru_maxrss) above an idle interpreter that imported
the same modules, and tracemalloc's peak of Python allocations for one extra run. Throughput is given per CPU
second (process_time: steady on a shared machine) and per wall second. Memory is shown for two file
sizes to make "constant" visible. Run:  python bench/trace_parse_speed.py [--size-mb 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

NAIVE = re.compile(
    r"(\S+):(\d+):(\d+) \[(\d+)\] (?:\S+ )?NCCL INFO (\w+): opCount ([0-9a-fA-F]+) sendbuff (\S+) recvbuff (\S+) "
    r"(?:acc (\S+) )?count (\d+) datatype (\d+) op (\d+) root (-?\d+) comm (\S+) \[nranks=(\d+)\] stream (\S+)"
    r"(?: task (-?\d+) globalrank (-?\d+))?"
)
KEYS = (
    "host",
    "pid",
    "tid",
    "device",
    "op",
    "opcount",
    "sendbuff",
    "recvbuff",
    "acc",
    "count",
    "datatype",
    "redop",
    "root",
    "comm",
    "nranks",
    "stream",
    "task",
    "globalrank",
)


def run_naive(path: str) -> int:
    sizes: Counter = Counter()
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            m = NAIVE.search(line)
            if m:
                d = dict(zip(KEYS, m.groups()))
                sizes[(d["op"], int(d["count"]), int(d["datatype"]), int(d["redop"]), int(d["nranks"]))] += 1
    return sum(sizes.values())


def run_opbench(path: str) -> int:
    from opbench.trace.analyze import analyze

    summary, _ = analyze([path])
    return summary.total_calls


def run_parse(path: str) -> int:
    from opbench.trace.parse import LogParser

    p = LogParser()
    for _ in p.calls(path):
        pass
    return p.stats.calls


METHODS = {"opbench": run_opbench, "parse": run_parse, "naive": run_naive}


def child(method: str, path: str, trace: bool) -> None:
    """One timed run in this (fresh) process; prints a JSON line."""
    import resource

    import opbench.trace.analyze
    import opbench.trace.summary  # noqa: F401

    if trace:
        import tracemalloc

        tracemalloc.start()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    c0 = time.process_time()
    t0 = time.perf_counter()
    calls = METHODS[method](path)
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {
        "method": method,
        "seconds": dt,
        "cpu_seconds": cpu,
        "calls": calls,
        "rss_base_kib": base,
        "rss_peak_kib": peak,
    }
    if trace:
        out["tracemalloc_peak_bytes"] = tracemalloc.get_traced_memory()[1]
    print(json.dumps(out))


def spawn(method: str, path: str, trace: bool = False) -> dict:
    res = subprocess.run(
        [sys.executable, __file__, "--child", method, path] + (["--trace"] if trace else []),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=100.0, help="generated log size (default 100)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--log", help="use this log instead of generating one")
    ap.add_argument("--keep", action="store_true", help="keep the generated log")
    ap.add_argument("--child", nargs=2, metavar=("METHOD", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.trace)
        return 0

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from synth_trace import write_log  # the tests' log generator

    tmp = tempfile.mkdtemp(prefix="opbench-trace-bench-")
    logs = []
    if args.log:
        logs.append(args.log)
    else:
        for mb in (args.size_mb / 4, args.size_mb):
            path = os.path.join(tmp, f"job_{mb:g}MB.log")
            t0 = time.perf_counter()
            write_log(path, int(mb * 1e6))
            print(f"generated {path}: {os.path.getsize(path) / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s")
            logs.append(path)
    results = []
    for path in logs:
        mb = os.path.getsize(path) / 1e6
        with open(path, "rb") as fh:  # warm the page cache once for everyone
            while fh.read(1 << 24):
                pass
        runs_by: dict[str, list[dict]] = {m: [] for m in METHODS}
        for _ in range(args.repeats):  # interleaved, so machine load hits every method alike
            for method in METHODS:
                runs_by[method].append(spawn(method, path))
        for method, runs in runs_by.items():
            traced = spawn(method, path, trace=True)
            rates = [mb / r["seconds"] for r in runs]
            cpu_rates = [mb / r["cpu_seconds"] for r in runs]
            results.append(
                {
                    "file_mb": round(mb, 1),
                    "method": method,
                    "calls": runs[0]["calls"],
                    "cpu_mb_per_s_median": round(statistics.median(cpu_rates), 1),
                    "cpu_mb_per_s_min": round(min(cpu_rates), 1),
                    "cpu_mb_per_s_max": round(max(cpu_rates), 1),
                    "wall_mb_per_s_median": round(statistics.median(rates), 1),
                    "wall_seconds_median": round(statistics.median(r["seconds"] for r in runs), 3),
                    "rss_peak_mib": round(max(r["rss_peak_kib"] for r in runs) / 1024, 1),
                    "rss_growth_mib": round(max(r["rss_peak_kib"] - r["rss_base_kib"] for r in runs) / 1024, 1),
                    "tracemalloc_peak_mib": round(traced["tracemalloc_peak_bytes"] / 2**20, 2),
                }
            )
    from tabulate import tabulate

    print(tabulate(results, headers="keys"))
    by = {(r["file_mb"], r["method"]): r for r in results}
    for path in logs:
        mb = round(os.path.getsize(path) / 1e6, 1)
        ours, naive = by[(mb, "opbench")], by[(mb, "naive")]
        print(
            f"{mb} MB: opbench {ours['cpu_mb_per_s_median']} MB/s vs naive {naive['cpu_mb_per_s_median']} MB/s "
            f"(CPU time) = {ours['cpu_mb_per_s_median'] / naive['cpu_mb_per_s_median']:.2f}x; wall "
            f"{ours['wall_mb_per_s_median'] / naive['wall_mb_per_s_median']:.2f}x; calls agree: "
            f"{ours['calls'] == naive['calls']} ({ours['calls']} vs {naive['calls']})"
        )
    if not args.keep and not args.log:
        for path in logs:
            os.remove(path)
        os.rmdir(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
