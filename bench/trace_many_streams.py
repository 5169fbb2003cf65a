"""Both NCCL-log readers on a log with one communicator per Send line (issue 47 item 4): time and peak memory must
grow linearly with the number of streams, memory bounded by the open groups (docs/trace.md, "Speed and memory").

A job with thousands of process groups (EP × PP × DP subgroups on a big cluster) writes such logs. Each line here
is a Send on its own communicator of 8 ranks, so every line opens a group that stays open to the end: the worst
case for the grouping state. For each size (default 20k, 80k, 300k lines) the log is generated in a temporary
folder, then ``opbench trace LOG`` runs as a whole process with each reader (OPBENCH_TRACE_READER=native|python),
interleaved; the table gives wall and CPU seconds, peak RSS of the child (bench/trace_parse_speed.py's spawner),
and per-line figures (µs and KiB per line above the smallest size's). Run:

    python bench/trace_many_streams.py [--lines 20000,80000,300000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def write_log(path: str, n: int) -> None:
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(
                f"node01:4242:4300 [0] NCCL INFO Send: opCount {i:x} sendbuff 0x7f3a40000000 recvbuff 0x7f3a50000000 "
                f"count 1024 datatype 7 op 0 root 1 comm 0x{i:012x} [nranks=8] stream 0x55d0c0d3e4f0\n"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", default="20000,80000,300000", help="comma list of log sizes in lines")
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    from tabulate import tabulate
    from trace_parse_speed import timed

    sizes = [int(x) for x in args.lines.split(",")]
    rows = []
    env = shutil.which("env") or "/usr/bin/env"
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            log = os.path.join(tmp, f"streams{n}.log")
            write_log(log, n)
            for reader in ("native", "python"):
                argv = [env, f"OPBENCH_TRACE_READER={reader}", sys.executable, "-m", "opbench.trace", log]
                run = timed([*argv, "--csv", os.path.join(tmp, "out.csv")], tmp)
                rows.append({"lines": n, "reader": reader, "MB": os.path.getsize(log) / 1e6, **run})
                print(f"{n} lines, {reader}: {run['wall']:.2f} s, {run['rss_mib']:.0f} MiB", flush=True)
    table = []
    for r in rows:
        base = next(b for b in rows if b["reader"] == r["reader"] and b["lines"] == sizes[0])
        extra = r["lines"] - base["lines"]
        table.append(
            [
                r["lines"],
                r["reader"],
                f"{r['MB']:.1f}",
                f"{r['wall']:.2f}",
                f"{r['cpu']:.2f}",
                f"{1e6 * r['cpu'] / r['lines']:.1f}",
                f"{r['rss_mib']:.0f}",
                f"{(r['rss_mib'] - base['rss_mib']) * 1024 / extra:.2f}" if extra else "-",
            ]
        )
    heads = ["lines", "reader", "MB", "wall s", "CPU s", "CPU µs/line", "peak RSS MiB", "KiB/line above the first"]
    print(tabulate(table, heads, tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
