"""How fast and how small is ``opbench trace`` against the per-line regex loop people write first? (issue 11)

Generates an NCCL_DEBUG=INFO COLL log of --size-mb (tests/synth_trace.py):

* ``--job mixed`` (default): a pipeline-parallel MoE job on 16 ranks and a pre-2.28 NCCL: pipeline Send/Recv,
  a TP AllReduce and an all-to-all token dispatch logged as grouped Send/Recv per layer (about 90 % of the call
  lines are Send/Recv, in every block), data-parallel ReduceScatter/AllGather; four format variants (NCCL,
  NCCL >= 2.26 timestamps, RCCL with acc/task/globalrank, old RCCL with µs timestamps) behind four launcher
  prefixes, ranks interleaved line by line, training output every 40 lines, a torn line every 5000;
* ``--job fsdp``: FSDP2 Llama-3-70B-like AllGather/ReduceScatter on 8 ranks (no Send/Recv).

Then runs, each as a whole process on the same file (warm page cache), interleaved --repeats times so machine
load hits every method alike:

* ``opbench``: ``python -m opbench.trace LOG --csv OUT`` (parse, all-to-all grouping, tables, CSV + sidecar), with
  the native reader where it was built (docs/trace.md, "Native reader");
* ``opbench-python``: the same with OPBENCH_TRACE_READER=python (the Python reader);
* ``naive``:   ``python -c`` with a text-mode ``for line in file`` loop, one regex ``search`` per line (prefix +
  body), a dict of the fields per match and a Counter of sizes: what a user writes first;
* ``minimal``: the least a loop can do: one ``search`` per line for ``opCount … count … datatype`` (a pattern
  that starts with a literal, which the regex engine finds with a fast scan), counting matches; it names no
  host, rank, size or reduction. It is the baseline of issue 25 item 4, whose target is opbench at most half
  its CPU time;
* ``floor``: the cheapest block parser (``FLOOR`` below): 128 KiB binary blocks, the line and 'opCount '
  counts, one literal-anchored ``findall`` per block and a C-level Counter, keeping no process and grouping no
  Send/Recv: what a fast path of that shape cannot go below, measured rather than guessed;
* ``read``: a Python process that only reads the file in 128 KiB blocks and counts 'opCount ' in each: the start
  and the reading every parser in a Python process pays before it parses a field (how much of the target it takes);
* ``opbench-j2`` (with --jobs): ``opbench trace --jobs 2``;
* ``records`` (with --records): ``LogParser.calls`` + Send/Recv grouping, a CallRecord per call (the Python API);
* ``polars``, ``pyarrow`` (with --engines, each where installed): the floor's extraction done by a native regex
  engine (Rust regex, C++ RE2) on one thread: would another engine meet the target where ``re`` cannot?

opbench's modules are byte-compiled first, as ``pip install`` leaves them: under PYTHONDONTWRITEBYTECODE=1 (set
on the VM these figures come from) an editable install would compile its modules from source on every run, about
25 ms of CPU that no installed copy pays.

CPU time (user + sys) and peak RSS come from ``os.wait4`` of each child (started from a small spawner process,
so the bench's own memory is not counted). The verdict is the median of the ratios of
CPU times of each back-to-back pair of runs (naive / opbench: neighbours in time share the machine's load;
CPU time is the steadier figure on a shared machine), with their range, the ratio of the fastest runs and
whether both counted the same calls; then opbench / minimal and floor / minimal (and the engines') against the
target (<= 0.5).
Run it with OMP_NUM_THREADS=1 (one thread on every side):

    python bench/trace_parse_speed.py [--size-mb 150] [--repeats 5] [--job mixed|fsdp] [--records] [--engines]
                                      [--log LOG]
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# The naive loop, as a self-contained program (so its process pays no import of opbench).
NAIVE = r"""
import re, sys
from collections import Counter
CALL = re.compile(
    r"(\S+):(\d+):(\d+) \[(\d+)\] (?:\S+ )?NCCL INFO (\w+): opCount ([0-9a-fA-F]+) sendbuff (\S+) recvbuff (\S+) "
    r"(?:acc (\S+) )?count (\d+) datatype (\d+) op (\d+) root (-?\d+) comm (\S+) \[nranks=(\d+)\] stream (\S+)"
    r"(?: task (-?\d+) globalrank (-?\d+))?"
)
KEYS = ("host", "pid", "tid", "device", "op", "opcount", "sendbuff", "recvbuff", "acc", "count", "datatype",
        "redop", "root", "comm", "nranks", "stream", "task", "globalrank")
sizes = Counter()
with open(sys.argv[1], encoding="utf-8", errors="replace") as fh:
    for line in fh:
        m = CALL.search(line)
        if m:
            d = dict(zip(KEYS, m.groups()))
            sizes[(d["op"], int(d["count"]), int(d["datatype"]), int(d["redop"]), int(d["nranks"]))] += 1
print(sum(sizes.values()))
"""

# The floor: a loop that only finds the call lines (no fields kept, nothing tallied).
MINIMAL = r"""
import re, sys
CALL = re.compile(r"opCount [0-9a-f]+ .*?count \d+ datatype \d+")
n = 0
with open(sys.argv[1], encoding="utf-8", errors="replace") as fh:
    for line in fh:
        if CALL.search(line):
            n += 1
print(n)
"""

# The floor of a block parser (issue 25 item 4's suggested fast path, cut to its bone): 128 KiB binary blocks cut
# at the last newline, the two counts the summary's line statistics need ('\n' and 'opCount ': torn lines), ONE
# literal-anchored compiled regex with findall per block capturing op and count..nranks, and a C-level Counter of
# the tuples. It keeps no process (host/pid/device), groups no Send/Recv and writes nothing, so no parser that
# prints opbench's tables can cost less; 128 KiB measured faster than 8 MiB blocks (the matches stay in cache).
FLOOR = r"""
import re, sys
from collections import Counter
CALL = re.compile(
    rb"\] (?:[0-9.]++ )?NCCL INFO ([A-Za-z][A-Za-z0-9]*+): opCount [0-9a-fA-F]++ sendbuff [^ ]++ recvbuff [^ ]++ "
    rb"(?:acc [^ ]++ )?(count \d++ datatype \d++ op \d++ root -?\d++ comm [^ ]++ \[nranks=\d++\])"
)
tally, lines, occurrences, tail = Counter(), 0, 0, b""
with open(sys.argv[1], "rb") as fh:
    while chunk := fh.read(1 << 17):
        cut = chunk.rfind(b"\n") + 1
        block, tail = tail + chunk[:cut], chunk[cut:]
        lines += block.count(b"\n")
        occurrences += block.count(b"opCount ")
        tally.update(CALL.findall(block))
print(sum(tally.values()))
"""

# What any parser in a Python process pays before it parses anything: the interpreter's start, reading the file in
# 128 KiB blocks and one C-level pass over each (counting 'opCount ', which also approximates the call count).
READ = r"""
import sys
n = 0
with open(sys.argv[1], "rb") as fh:
    while chunk := fh.read(1 << 17):
        n += chunk.count(b"opCount ")
print(n)
"""

# The floors of two native engines a user might reach for, where they are installed (--engines): polars (Rust
# regex) and pyarrow (C++ RE2) extract the same fields FLOOR's findall does (the op, and count..nranks) from the
# call lines of 16 MiB blocks, on one thread, and count the distinct tuples; nothing else. They answer "would a
# native regex engine meet the target where Python's re cannot?" with a measurement.
POLARS = r"""
import os, sys
os.environ["POLARS_MAX_THREADS"] = "1"
import polars as pl
CALL = (r"\] (?:[0-9.]+ )?NCCL INFO ([A-Za-z][A-Za-z0-9]*): opCount [0-9a-fA-F]+ sendbuff [^ ]+ recvbuff [^ ]+ "
        r"(?:acc [^ ]+ )?(count \d+ datatype \d+ op \d+ root -?\d+ comm [^ ]+ \[nranks=\d+\])")
tally, tail = {}, b""
with open(sys.argv[1], "rb") as fh:
    while chunk := fh.read(16 << 20):
        cut = chunk.rfind(b"\n") + 1
        block, tail = tail + chunk[:cut], chunk[cut:]
        lines = pl.Series([block.decode("utf-8", "replace")]).str.split("\n").explode()
        calls = lines.filter(lines.str.contains("opCount ", literal=True)).str.extract_groups(CALL).struct.unnest()
        for op, rest, n in calls.drop_nulls().group_by(["1", "2"]).len().iter_rows():
            tally[(op, rest)] = tally.get((op, rest), 0) + n
print(sum(tally.values()))
"""

PYARROW = r"""
import sys
import pyarrow as pa, pyarrow.compute as pc
pa.set_cpu_count(1)
pa.set_io_thread_count(1)
CALL = (r"\] (?:[0-9.]+ )?NCCL INFO (?P<op>[A-Za-z][A-Za-z0-9]*): opCount [0-9a-fA-F]+ sendbuff [^ ]+ recvbuff [^ ]+ "
        r"(?:acc [^ ]+ )?(?P<rest>count \d+ datatype \d+ op \d+ root -?\d+ comm [^ ]+ \[nranks=\d+\])")
tally, tail = {}, b""
with open(sys.argv[1], "rb") as fh:
    while chunk := fh.read(16 << 20):
        cut = chunk.rfind(b"\n") + 1
        block, tail = tail + chunk[:cut], chunk[cut:]
        lines = pc.split_pattern(pa.array([block], pa.binary()), b"\n").flatten()
        lines = lines.filter(pc.match_substring(lines, b"opCount "))
        calls = pc.extract_regex(lines.cast(pa.string()), CALL)
        table = pa.table({"op": calls.field("op"), "rest": calls.field("rest")}).drop_null()
        for row in table.group_by(["op", "rest"]).aggregate([([], "count_all")]).to_pylist():
            key = (row["op"], row["rest"])
            tally[key] = tally.get(key, 0) + row["count_all"]
print(sum(tally.values()))
"""

RECORDS = r"""
import sys
from opbench.trace.analyze import iter_records
from opbench.trace.parse import LogParser
parser = LogParser()
for _ in iter_records(parser, [sys.argv[1]]):
    pass
print(parser.stats.calls)
"""


# Runs one command and prints its rusage as JSON. The bench's children are started through this small process:
# a child forked straight from the bench would report the bench's own memory as its peak RSS.
SPAWN = r"""
import json, os, sys, time
out, argv = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
pid = os.posix_spawn(argv[0], argv, os.environ,
                     file_actions=[(os.POSIX_SPAWN_OPEN, 1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)])
_, status, ru = os.wait4(pid, 0)
print(json.dumps({"cpu": ru.ru_utime + ru.ru_stime, "wall": time.perf_counter() - t0,
                  "rss_mib": ru.ru_maxrss / 1024, "rc": os.waitstatus_to_exitcode(status)}))
"""


def timed(argv: list[str], tmp: str) -> dict:
    """One run of ``argv``: CPU seconds (user + sys), wall seconds, peak RSS (MiB) and its stdout."""
    out = os.path.join(tmp, "stdout.txt")
    res = subprocess.run([sys.executable, "-c", SPAWN, out, *argv], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"spawning {argv[:4]} failed:\n{res.stderr[-2000:]}")
    run = json.loads(res.stdout)
    with open(out, encoding="utf-8") as fh:
        run["stdout"] = fh.read()
    if run["rc"] != 0:
        raise SystemExit(f"{' '.join(argv[:4])}… failed (rc {run['rc']}); run it by hand to see why")
    return run


def commands(log: str, out_csv: str) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "opbench": [py, "-m", "opbench.trace", log, "--csv", out_csv],
        "opbench-j2": [py, "-m", "opbench.trace", log, "--jobs", "2", "--csv", out_csv],
        # the Python reader, where the native one is built (analyze.READER_ENV; env execs python: its rusage)
        "opbench-python": [
            shutil.which("env") or "/usr/bin/env",
            "OPBENCH_TRACE_READER=python",
            py,
            "-m",
            "opbench.trace",
            log,
            "--csv",
            out_csv,
        ],
        "naive": [py, "-c", NAIVE, log],
        "minimal": [py, "-c", MINIMAL, log],
        "floor": [py, "-c", FLOOR, log],
        "read": [py, "-c", READ, log],
        "records": [py, "-c", RECORDS, log],
        "polars": [py, "-c", POLARS, log],
        "pyarrow": [py, "-c", PYARROW, log],
    }


def calls_of(method: str, run: dict, out_csv: str) -> int:
    if method.startswith("opbench"):
        with open(os.path.splitext(out_csv)[0] + ".meta.json", encoding="utf-8") as fh:
            return int(json.load(fh)["calls"])
    return int(run["stdout"].strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, nargs="+", default=[150.0], help="generated log size(s) (default 150)")
    ap.add_argument("--job", choices=("mixed", "fsdp"), default="mixed", help="what the generated log holds")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved runs per method (default 5)")
    ap.add_argument("--records", action="store_true", help="also time the per-call CallRecord road")
    ap.add_argument("--jobs", action="store_true", help="also time opbench trace --jobs 2")
    ap.add_argument(
        "--engines",
        action="store_true",
        help="also time the floors of polars and pyarrow (each where installed): native regex engines on one thread",
    )
    ap.add_argument("--log", help="use this log instead of generating one")
    ap.add_argument("--keep", action="store_true", help="keep the generated log(s)")
    args = ap.parse_args()

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "tests"))
    from synth_trace import write_log  # the tests' log generator
    from tabulate import tabulate

    package = importlib.util.find_spec("opbench")
    if package is None or not package.submodule_search_locations:
        raise SystemExit("opbench is not installed: pip install -e . first")
    compileall.compile_dir(list(package.submodule_search_locations)[0], quiet=1)  # as pip install leaves it
    tmp = tempfile.mkdtemp(prefix="opbench-trace-bench-")
    out_csv = os.path.join(tmp, "sizes.csv")  # opbench keeps an earlier CSV under earlier/: removed after each run
    logs = [args.log] if args.log else []
    for mb in [] if args.log else args.size_mb:
        path = os.path.join(tmp, f"{args.job}_{mb:g}MB.log")
        t0 = time.perf_counter()
        write_log(path, int(mb * 1e6), job=args.job)
        print(f"generated {path}: {os.path.getsize(path) / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s")
        logs.append(path)
    methods = (
        ["opbench", "opbench-python", "naive", "minimal", "floor", "read"]
        + (["opbench-j2"] if args.jobs else [])
        + (["records"] if args.records else [])
        + [engine for engine in ("polars", "pyarrow") if args.engines and importlib.util.find_spec(engine)]
    )

    rows, verdicts = [], []
    for log in logs:
        mb = os.path.getsize(log) / 1e6
        with open(log, "rb") as fh:  # warm the page cache once for everyone
            while fh.read(1 << 24):
                pass
        cmds = commands(log, out_csv)
        runs: dict[str, list[dict]] = {m: [] for m in methods}
        calls: dict[str, int] = {}
        for _ in range(args.repeats):
            for method in methods:
                run = timed(cmds[method], tmp)
                calls[method] = calls_of(method, run, out_csv)
                shutil.rmtree(os.path.join(tmp, "earlier"), ignore_errors=True)
                runs[method].append(run)
        for method in methods:
            cpu = [r["cpu"] for r in runs[method]]
            rows.append(
                {
                    "file_mb": round(mb, 1),
                    "method": method,
                    "calls": calls[method],
                    "cpu_s_median": round(statistics.median(cpu), 2),
                    "cpu_s_min": round(min(cpu), 2),
                    "cpu_s_max": round(max(cpu), 2),
                    "cpu_mb_per_s": round(mb / statistics.median(cpu), 1),
                    "wall_s_median": round(statistics.median(r["wall"] for r in runs[method]), 2),
                    "peak_rss_mib": round(max(r["rss_mib"] for r in runs[method]), 1),
                }
            )
        ours = runs["opbench"]
        for base in ("naive", "minimal"):
            other = runs[base]
            pairs = sorted(n["cpu"] / o["cpu"] for n, o in zip(other, ours))  # runs next to each other in time
            best = min(r["cpu"] for r in other) / min(r["cpu"] for r in ours)
            wall = statistics.median(r["wall"] for r in other) / statistics.median(r["wall"] for r in ours)
            verdicts.append(
                f"{mb:.1f} MB: the {base} loop takes {statistics.median(pairs):.2f}x opbench's CPU time (median of "
                f"{len(pairs)} back-to-back ratios, range {pairs[0]:.2f}-{pairs[-1]:.2f}; fastest runs {best:.2f}x; "
                f"median wall {wall:.2f}x); calls agree: {calls['opbench'] == calls[base]} "
                f"({calls['opbench']} vs {calls[base]})"
            )
        # Issue 25 item 4's target, as it is stated: opbench's CPU time at most half the minimal loop's.
        for method in ("opbench", "opbench-python", "floor", "read", *(e for e in ("polars", "pyarrow") if e in runs)):
            pairs = sorted(o["cpu"] / m["cpu"] for o, m in zip(runs[method], runs["minimal"]))
            median = statistics.median(pairs)
            verdicts.append(
                f"{mb:.1f} MB: {method} / minimal CPU time = {median:.2f} (median of {len(pairs)} back-to-back "
                f"ratios, range {pairs[0]:.2f}-{pairs[-1]:.2f}; {mb / statistics.median(r['cpu'] for r in runs[method]):.0f} "
                f"MB per CPU second); target <= 0.50: {'met' if median <= 0.5 else 'not met'}"
            )
    print(tabulate(rows, headers="keys"))
    print("\n".join(verdicts))
    if not args.keep:
        for log in logs if not args.log else []:
            os.remove(log)
    for name in os.listdir(tmp):
        if name.startswith(("sizes", "stdout")):
            os.remove(os.path.join(tmp, name))
    if not os.listdir(tmp):
        os.rmdir(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
