"""How does `opbench step`'s trace reading compare with HolisticTraceAnalysis' on the same file? Time and peak memory,
side by side, in one run.

Writes one synthetic Kineto trace of about --mb megabytes from the documented schema (opbench/steptrace/synth.py:
CPU operators, launches, kernels of CUDA's names, record_param_comms, ProfilerStep spans), then loads it in separate
fresh Python processes, interleaved over --rounds:

  opbench read     reader.read: the streaming parse, keeping what attribution needs
  opbench step     reader.read + attribution of every step (what `opbench step` does before printing)
  opbench step --memory-mib N   the same under a memory budget (summary.analyse(memory_mib=N)): a trace whose kept
                   events pass it is read again by step, as many per pass as fit (the row's note says how it was read)
  opbench markers  reader.step_windows: the text search for the ProfilerStep markers that splits the trace
  HTA load         hta.trace_analysis.TraceAnalysis(trace_dir=…): HTA's parse of the same file into DataFrames
  json.load        the whole file as Python objects (what a reader that is not streaming starts from)

Each child reports its own wall time and its peak resident memory (getrusage ru_maxrss, the process's high-water
mark, which includes the interpreter and imports: the `python -c pass` floor is printed too). Medians over rounds.
Figures depend on this machine's load: run it where nothing else runs for a number to quote.

HolisticTraceAnalysis 0.5.0 fails under pandas 3 on a trace with more events than int16 holds
(hta/common/trace.py, transform_correlation_to_index assigns row indices into a column it downcast to int16; pandas 2
upcast with a warning, pandas 3 raises): give --hta-python, an interpreter with HTA and pandas<3, e.g. a venv made
with --system-site-packages and `pip install "pandas<3"`.

Usage: python bench/step_vs_hta.py [--mb 300] [--rounds 3] [--keep DIR] [--hta-python PYTHON] [--memory-mib 128 …]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
kind, path = sys.argv[1], sys.argv[2]
t = time.perf_counter()
note = ""
if kind == "opbench read":
    from opbench.steptrace import reader
    n = reader.read(path).kept
elif kind == "opbench step":
    from opbench.steptrace import summary
    n = sum(len(s.kernels) for r in summary.analyse([path]) for s in r.steps)
elif kind.startswith("opbench step --memory-mib "):
    from opbench.steptrace import summary
    (r,) = summary.analyse([path], memory_mib=float(kind.split()[-1]))
    n = sum(len(s.kernels) for s in r.steps)
    note = f"read {r.reading['mode']}, {r.reading['passes']} pass(es)"
    if "steps_per_pass" in r.reading:
        note += ", steps per pass " + " ".join(map(str, r.reading["steps_per_pass"]))
elif kind == "opbench markers":
    from opbench.steptrace import reader
    n = len(reader.step_windows(path).steps)
elif kind == "HTA load":
    import os, logging
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis
    a = TraceAnalysis(trace_dir=os.path.dirname(path))
    n = len(a.t.get_trace(0))
elif kind == "json.load":
    n = len(json.load(open(path))["traceEvents"])
else:
    n = 0
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "n": n,
                  "note": note}))
"""

KINDS = ("floor", "opbench markers", "opbench read", "opbench step", "HTA load", "json.load")


def write_trace(folder: Path, mb: float) -> Path:
    from opbench.steptrace import synth

    path = folder / "rank-0.json"  # HTA reads every trace in the folder, the rank from distributedInfo
    probe = folder / "probe.json"
    synth.write(str(probe), "cuda", steps=1, layers=50)
    per_layer = probe.stat().st_size / 50
    probe.unlink()
    steps = 10
    layers = max(1, int(mb * 1e6 / per_layer / steps))
    synth.write(str(path), "cuda", steps=steps, layers=layers)
    return path


def run_child(kind: str, path: Path, python: str) -> dict:
    proc = subprocess.run([python, "-c", CHILD, kind, str(path)], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:160]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=300.0, help="trace size in MB (default 300)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--keep", default=None, help="write the trace into this folder and keep it")
    p.add_argument("--skip", nargs="*", default=[], choices=KINDS, help="kinds not to run")
    p.add_argument("--hta-python", default=sys.executable, help="the interpreter for HTA's load (default this one)")
    p.add_argument("--memory-mib", type=float, nargs="*", default=[128.0],
                   help="a row of opbench step under each of these budgets (default 128)")  # fmt: skip
    args = p.parse_args()
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="step_vs_hta."))
    folder.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    path = write_trace(folder, args.mb)
    size = path.stat().st_size
    print(f"trace: {path} ({size / 1e6:.0f} MB, written in {time.perf_counter() - t:.0f} s)", flush=True)
    kinds = [*KINDS[:4], *(f"opbench step --memory-mib {m:g}" for m in args.memory_mib), *KINDS[4:]]
    got: dict[str, list[dict]] = {k: [] for k in kinds if k not in args.skip}
    for r in range(args.rounds):
        for kind in got:
            res = run_child(kind, path, args.hta_python if kind == "HTA load" else sys.executable)
            got[kind].append(res)
            print(f"round {r + 1} {kind}: {res}", flush=True)
    print(f"\n| load of a {size / 1e6:.0f} MB Kineto trace | wall s (median of {args.rounds}) | peak RSS MiB | note |")
    print("|---|---|---|---|")
    for kind, runs in got.items():
        ok = [x for x in runs if "error" in x] == []
        if not ok:
            print(f"| {kind} | - | - | {runs[0].get('error', '')} |")
            continue
        secs = statistics.median(x["seconds"] for x in runs)
        mib = statistics.median(x["peak_mib"] for x in runs)
        spread = f"{min(x['seconds'] for x in runs):.2f}–{max(x['seconds'] for x in runs):.2f} s"
        print(f"| {kind} | {secs:.2f} | {mib:.0f} | {spread} {runs[0].get('note', '')} |")
    if not args.keep:
        path.unlink()
        os.rmdir(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
