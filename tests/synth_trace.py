"""Synthetic NCCL/RCCL COLL logs built from the documented line format (REFERENCE §5).

Used by the tests (one line per format variant) and by bench/trace_parse_speed.py (a realistic >= 100 MB job
log: FSDP-style AllGather/ReduceScatter per layer on 8 ranks, interleaved with training output, launcher
prefixes and the odd torn line).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class LineStyle:
    """How a line is dressed: which NCCL/RCCL era and which launcher/collector prefix."""

    prefix: str = ""  # "[0] ", " 0: ", "[1,0]<stdout>:", "(RayTrainWorker pid=1, ip=10.0.0.1) ", …
    nccl_ts: str | None = None  # NCCL >= 2.26 "[YYYY-mm-dd HH:MM:SS] " (NCCL_DEBUG_TIMESTAMP_LEVELS=INFO)
    rccl_us: str | None = None  # old RCCL: µs timestamp between "[dev]" and "NCCL INFO"
    rccl_acc: str | None = None  # RCCL 2.27: "acc 0x…" / "acc (nil)" before count
    rccl_task: tuple[int, int] | None = None  # RCCL >= 2.18: (task, globalrank) at the end


def call_line(
    op: str,
    opcount: int,
    count: int,
    datatype: int,
    redop: int = 0,
    root: int = 0,
    *,
    host: str = "node01",
    pid: int = 4242,
    tid: int = 4300,
    device: int = 0,
    comm: str = "0x55d0c0a1b2c0",
    nranks: int = 8,
    stream: str = "0x55d0c0d3e4f0",
    sendbuff: str = "0x7f3a40000000",
    recvbuff: str = "0x7f3a50000000",
    style: LineStyle | None = None,
) -> str:
    """One ``NCCL INFO <Op>: opCount …`` line (no newline)."""
    s = style or LineStyle()
    head = f"{s.prefix}{s.nccl_ts or ''}{host}:{pid}:{tid} [{device}] "
    if s.rccl_us:
        head += f"{s.rccl_us} "
    body = f"{op}: opCount {opcount:x} sendbuff {sendbuff} recvbuff {recvbuff} "
    if s.rccl_acc:
        body += f"acc {s.rccl_acc} "
    body += f"count {count} datatype {datatype} op {redop} root {root} comm {comm} [nranks={nranks}] stream {stream}"
    if s.rccl_task:
        body += f" task {s.rccl_task[0]} globalrank {s.rccl_task[1]}"
    return f"{head}NCCL INFO {body}"


def init_line(
    rank: int,
    nranks: int,
    *,
    host: str = "node01",
    pid: int = 4242,
    tid: int = 4300,
    device: int = 0,
    comm: str = "0x55d0c0a1b2c0",
    commid: str | None = "0x7c1f3e5a9b2d4c61",
    prefix: str = "",
) -> str:
    """``comm … rank … nranks … cudaDev … busId … [commId …] - Init COMPLETE`` (NCCL INIT subsystem)."""
    cid = f" commId {commid}" if commid else ""
    return (
        f"{prefix}{host}:{pid}:{tid} [{device}] NCCL INFO comm {comm} rank {rank} nranks {nranks} "
        f"cudaDev {device} nvmlDev {device} busId {0x18000 + device * 0x1000:x}{cid} - Init COMPLETE"
    )


@dataclass
class RankProc:
    host: str
    pid: int
    tid: int
    device: int
    comm: str
    stream: str
    rank: int


def job_ranks(nranks: int, gpus_per_node: int = 8) -> list[RankProc]:
    return [
        RankProc(
            f"node{r // gpus_per_node:02d}",
            10000 + r,
            10100 + r,
            r % gpus_per_node,
            f"0x55{r:02x}c0a1b2c0",
            f"0x55{r:02x}c0d3e4f0",
            r,
        )
        for r in range(nranks)
    ]


def fsdp_job_lines(
    nranks: int = 8,
    layers: int = 80,
    layer_count: int = 106956800,
    root_count: int = 262669312,
    seed: int = 0,
    rccl: bool = False,
    noise_every: int = 40,
    torn_every: int = 5000,
    prefix: bool = True,
) -> Iterator[str]:
    """An endless FSDP2-like job log (Llama-3-70B-ish sizes at 8 ranks), step after step.

    Per step and rank: root AllGather, 2 AllGathers + 1 ReduceScatter per layer, a small AllReduce; ranks
    interleave line by line; every ``noise_every`` lines a training-output line; every ``torn_every`` lines
    two ranks' lines are torn into one (the first call incomplete).
    """
    rng = random.Random(seed)
    procs = job_ranks(nranks)
    opcount = 0
    n = 0
    step = 0
    while True:
        plan = [("AllGather", root_count, 9, 0)]
        plan += [("AllGather", layer_count, 9, 0)] * layers
        plan += [("AllGather", layer_count, 9, 0), ("ReduceScatter", layer_count, 7, 0)] * layers
        plan += [("ReduceScatter", root_count, 7, 0), ("AllReduce", 1, 7, 0)]
        for op, count, dt, redop in plan:
            for p in procs:
                style = LineStyle(
                    prefix=f"[{p.rank}] " if prefix else "",
                    rccl_task=(opcount % 7, p.rank) if rccl else None,
                    rccl_acc="(nil)" if rccl else None,
                )
                line = call_line(
                    op,
                    opcount,
                    count,
                    dt,
                    redop,
                    0,
                    host=p.host,
                    pid=p.pid,
                    tid=p.tid,
                    device=p.device,
                    comm=p.comm,
                    nranks=nranks,
                    stream=p.stream,
                    style=style,
                )
                n += 1
                if torn_every and n % torn_every == 0:
                    cut = rng.randrange(20, len(line) - 20)
                    yield line[:cut] + line
                    continue
                yield line
                if noise_every and n % noise_every == 0:
                    yield (
                        f"[{p.rank}] step {step} loss {rng.random() * 3:.4f} lr 3.0e-04 "
                        f"tokens/s {rng.randint(2000, 4000)} mem {rng.random() * 80:.1f}GiB"
                    )
            opcount += 1
        step += 1


def write_log(path: str, target_bytes: int, **kwargs) -> int:
    """Write lines from ``fsdp_job_lines`` until ``target_bytes``; returns the bytes written."""
    written = 0
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        buf: list[str] = []
        for line in fsdp_job_lines(**kwargs):
            buf.append(line)
            written += len(line) + 1
            if len(buf) >= 4096:
                fh.write("\n".join(buf) + "\n")
                buf = []
            if written >= target_bytes:
                break
        if buf:
            fh.write("\n".join(buf) + "\n")
    return written
