"""Synthetic NCCL/RCCL COLL logs built from the documented line format (docs/conventions.md, "NCCL debug-log
lines").

Used by the tests (one line per format variant), by bench/trace_parse_speed.py (a realistic >= 100 MB job log)
and by docs/trace.md's examples:  python tests/synth_trace.py OUT[.gz] [--job mixed|fsdp] [--size-mb N]
"""

from __future__ import annotations

import argparse
import gzip
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
    reduce: tuple[int, int] = (9, 4),
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
        # FSDP2 with reduce_dtype unset: reduce-scatter in bf16 with NCCL avg (op 4), as a real Llama-3-70B trace shows
        # ``reduce`` = (NCCL datatype, op) of the reduce-scatters; (7, 4) is torchtitan's fp32 reduce_dtype
        plan += [("AllGather", layer_count, 9, 0), ("ReduceScatter", layer_count, *reduce)] * layers
        plan += [("ReduceScatter", root_count, *reduce), ("AllReduce", 1, 7, 0)]
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
                yield from _as_logged(line, f"[{p.rank}] ", n, step, rng, noise_every, torn_every)
            opcount += 1
        step += 1


def _as_logged(
    line: str, prefix: str, n: int, step: int, rng: random.Random, noise_every: int, torn_every: int
) -> Iterator[str]:
    """Line ``n`` of a job log as it lands in the file: every ``torn_every``-th is torn into the one before it
    (the first call cut short), every ``noise_every``-th is followed by a training-output line."""
    if torn_every and n % torn_every == 0:
        cut = rng.randrange(20, len(line) - 20)
        yield line[:cut] + line
        return
    yield line
    if noise_every and n % noise_every == 0:
        yield (
            f"{prefix}step {step} loss {rng.random() * 3:.4f} lr 3.0e-04 "
            f"tokens/s {rng.randint(2000, 4000)} mem {rng.random() * 80:.1f}GiB"
        )


def write_log(path: str, target_bytes: int, job: str = "mixed", **kwargs) -> int:
    """Write lines of a ``mixed`` (mixed_job_lines) or ``fsdp`` (fsdp_job_lines) job until ``target_bytes``;
    returns the bytes written."""
    lines = mixed_job_lines(**kwargs) if job == "mixed" else fsdp_job_lines(**kwargs)
    written = 0
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8", newline="\n") as fh:
        buf: list[str] = []
        for line in lines:
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


def _styles(nranks: int) -> list[tuple[str, str]]:
    """Per rank: (launcher prefix, format variant); four variants so every block mixes them."""
    kinds = ["nccl", "nccl_ts", "rccl", "rccl_us"]
    tags = ["[{r}] ", " {r}: ", "[1,{r}]<stdout>:", "(RayTrainWorker pid={r}, ip=10.0.0.{r}) "]
    return [(tags[r % 4].format(r=r), kinds[(r // 4) % 4]) for r in range(nranks)]


def mixed_job_lines(
    nranks: int = 16,
    pp: int = 2,
    ep: int = 8,
    layers: int = 4,
    microbatches: int = 4,
    seed: int = 0,
    noise_every: int = 40,
    torn_every: int = 5000,
) -> Iterator[str]:
    """An endless 3D-parallel MoE job log: what a pipeline-parallel job with expert parallelism on a
    pre-2.28 NCCL writes, with every format variant present in every block.

    Per step and microbatch, on every rank: Recv/Send of activations between pipeline stages (forward and
    backward), per layer a TP AllReduce and a MoE token dispatch as grouped Send/Recv to every rank of its EP
    group (uneven counts: an AlltoAllv); after the microbatches, per layer a data-parallel ReduceScatter and
    AllGather, and a loss AllReduce. Ranks interleave line by line. Rank r writes variant ``r // 4 % 4``:
    plain NCCL, NCCL >= 2.26 with its timestamp, RCCL with ``acc``/``task``/``globalrank``, or old RCCL with a
    µs timestamp (timestamps change on every line), behind one of four launcher prefixes.
    """
    rng = random.Random(seed)
    procs = job_ranks(nranks)
    styles = _styles(nranks)
    stage_size = nranks // pp
    # MoE token dispatch: tokens sent to each EP peer (hidden 2048 elements each); a few distinct patterns
    dispatch = [[rng.randrange(384, 640) for _ in range(ep)] for _ in range(4)]
    clock = 1712345678.0
    opcount = [0] * nranks
    n = 0
    step = 0

    def line(r: int, op: str, count: int, dt: int, redop: int, root: int, comm_id: int, nr: int) -> str:
        nonlocal clock
        p, (tag, kind) = procs[r], styles[r]
        clock += 0.000137
        ts = f"[2024-05-01 12:{int(clock) // 60 % 60:02d}:{int(clock) % 60:02d}] " if kind == "nccl_ts" else None
        style = LineStyle(
            prefix=tag,
            nccl_ts=ts,
            rccl_us=f"{clock:.6f}" if kind == "rccl_us" else None,
            rccl_acc="(nil)" if kind == "rccl" else None,
            rccl_task=(opcount[r] % 13, r) if kind == "rccl" else None,
        )
        comm = f"0x55{r:02x}c{comm_id}a1b2c0"
        return call_line(
            op,
            opcount[r],
            count,
            dt,
            redop,
            root,
            host=p.host,
            pid=p.pid,
            tid=p.tid,
            device=p.device,
            comm=comm,
            nranks=nr,
            stream=p.stream,
            style=style,
        )

    while True:
        per_rank: list[list[str]] = [[] for _ in range(nranks)]
        for r in range(nranks):
            out = per_rank[r]
            stage, local = divmod(r, stage_size)
            ep_me = local % ep
            for _mb in range(microbatches):
                for direction in ("fwd", "bwd"):
                    upstream = stage > 0 if direction == "fwd" else stage < pp - 1
                    downstream = stage < pp - 1 if direction == "fwd" else stage > 0
                    if upstream:
                        out.append(line(r, "Recv", 4194304, 9, 0, 0 if direction == "fwd" else 1, 1, 2))
                        opcount[r] += 1
                    for _layer in range(layers):
                        out.append(line(r, "AllReduce", 8388608, 9, 0, 0, 2, 2))
                        opcount[r] += 1
                        tokens = dispatch[rng.randrange(len(dispatch))]
                        for peer in range(ep):
                            out.append(line(r, "Send", tokens[peer] * 2048, 9, 0, peer, 3, ep))
                            out.append(line(r, "Recv", tokens[(peer + ep_me) % ep] * 2048, 9, 0, peer, 3, ep))
                        opcount[r] += 1
                    if downstream:
                        out.append(line(r, "Send", 4194304, 9, 0, 1 if direction == "fwd" else 0, 1, 2))
                        opcount[r] += 1
            for _layer in range(layers):
                out.append(line(r, "ReduceScatter", 54525952, 7, 0, 0, 4, stage_size))
                out.append(line(r, "AllGather", 54525952, 9, 0, 0, 4, stage_size))
                opcount[r] += 2
            out.append(line(r, "AllReduce", 1, 7, 0, 0, 5, nranks))
            opcount[r] += 1
        longest = max(len(x) for x in per_rank)
        for i in range(longest):
            for r in range(nranks):
                if i >= len(per_rank[r]):
                    continue
                n += 1
                yield from _as_logged(per_rank[r][i], styles[r][0], n, step, rng, noise_every, torn_every)
        step += 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Write a synthetic NCCL_DEBUG=INFO COLL job log.")
    ap.add_argument("out", help="output file; .gz is gzipped")
    ap.add_argument("--job", choices=("mixed", "fsdp"), default="mixed")
    ap.add_argument("--size-mb", type=float, default=2.0, help="uncompressed size (default 2)")
    args = ap.parse_args()
    print(f"wrote {args.out}: {write_log(args.out, int(args.size_mb * 1e6), job=args.job) / 1e6:.1f} MB of log lines")
