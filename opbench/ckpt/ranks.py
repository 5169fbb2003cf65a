"""The process group the benchmark runs in, and the few collectives it needs.

Under torchrun every rank joins a gloo group (``cpu:gloo,cuda:nccl`` on GPUs, since dcp.async_save needs a CPU
backend); a plain ``python -m opbench.ckpt`` is a group of one. ``agree`` makes a failure on any rank a failure
on every rank, so no rank waits forever in a collective its peer never reaches.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

import torch
import torch.distributed as dist

from opbench.core.sweep import Unsupported, classify_failure

T = TypeVar("T")
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    return all(v in os.environ for v in TORCHRUN_VARS)


class RankFailure(Exception):
    """Raised on every rank when any rank failed; carries the first failing rank's status and message."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Ranks:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def start(cls, device: torch.device, timeout_s: float = 1800.0) -> "Ranks":
        """Join (or create) the process group; sets the GPU of this local rank."""
        if under_torchrun():
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            store = None
        else:
            rank, world = 0, 1
            store = dist.HashStore()
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device.type == "cuda":
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
            backend = "cpu:gloo,cuda:nccl"
        else:
            backend = "gloo"
        if not dist.is_initialized():
            # Bounds every collective (and DCP's), so a dead rank fails its peers instead of holding them.
            timeout = datetime.timedelta(seconds=timeout_s)
            if store is None:
                dist.init_process_group(backend, timeout=timeout)
            else:
                dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
        return cls(rank, world, local_rank, device)

    def stop(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def barrier(self) -> None:
        dist.barrier()

    def gather(self, value: Any) -> list[Any]:
        """Every rank's value, on every rank, in rank order."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def broadcast(self, value: Any) -> Any:
        box = [value if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def agree(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on every rank; if it raised anywhere, raise the first failure on every rank."""
        failure: tuple[str, str] | None = None
        result: Any = None
        try:
            result = fn()
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - shared with the peers below, then re-raised
            status, message = classify_failure(exc)
            if isinstance(exc, OSError):
                from .storage import describe_os_error

                message = describe_os_error(exc)
            failure = (status, message if self.world_size == 1 else f"rank {self.rank}: {message}")
        failures = [f for f in self.gather(failure) if f is not None]
        if failures:
            status, message = failures[0]
            if status == "unsupported":
                raise Unsupported(message)
            raise RankFailure(status, message)
        return result

    def timed(self, fn: Callable[[], T]) -> tuple[T, float]:
        """(result, seconds) of ``fn`` on this rank, all ranks starting together after a barrier."""
        self.barrier()
        start = time.perf_counter()
        result = fn()
        return result, time.perf_counter() - start


def launch_local(nproc: int, argv: Sequence[str], module: str = "opbench.ckpt") -> int:
    """Start ``nproc`` ranks of ``python -m module argv`` on this machine with torchrun's environment variables,
    and return the worst exit code. If one rank dies, the others are stopped after a grace period instead of
    hanging in a collective."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, "-m", module, *argv], env=env))
    failed_at: float | None = None
    try:
        while any(p.poll() is None for p in procs):
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > 30:
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
            time.sleep(0.2)
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait()
        raise
    worst = max((p.returncode for p in procs), key=lambda rc: (rc != 0, abs(rc)))
    return worst if worst >= 0 else 128 - worst  # killed by signal N -> 128+N, as a shell reports it
