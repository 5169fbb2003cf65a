"""Where this process sits in a distributed job, and how to start one.

Three ways in: torchrun (RANK/WORLD_SIZE/LOCAL_RANK, env:// rendezvous), Slurm ``srun`` (SLURM_PROCID /
SLURM_NTASKS / SLURM_LOCALID plus MASTER_ADDR/MASTER_PORT that the job script exports), or nothing — then
``opbench comm --nproc-per-node N`` starts torchrun itself (``python -m torch.distributed.run``), and a plain
``opbench comm`` runs as a one-rank world.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence

from opbench.core.errors import UsageError


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    nnodes: int
    launcher: str            # "torchrun" | "slurm" | "single"


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise UsageError(f"environment variable {key}={env[key]!r} is not an integer", field=key) from None


def detect(env: Mapping[str, str] | None = None) -> DistEnv | None:
    """The launcher's view of this process, or None when no launcher started it."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _int(env, "WORLD_SIZE")
        local_world = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else None
        if "GROUP_WORLD_SIZE" in env:            # torchrun: one agent (worker group) per node
            nnodes = _int(env, "GROUP_WORLD_SIZE")
        elif local_world:
            nnodes = max(1, world // local_world)
        else:
            nnodes = _int(env, "SLURM_NNODES") if "SLURM_NNODES" in env else 1
        return DistEnv(_int(env, "RANK"), world, _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
                       nnodes, "torchrun")
    # Inside `srun` (a job step); a batch script's own shell has SLURM_PROCID too but no SLURM_STEP_ID.
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "SLURM_STEP_ID" in env:
        nnodes = _int(env, "SLURM_NNODES") if "SLURM_NNODES" in env else 1
        return DistEnv(_int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS"),
                       _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0, nnodes, "slurm")
    return None


def export_slurm_rendezvous(dist_env: DistEnv, env: dict[str, str] | None = None) -> None:
    """Make env:// work under srun: RANK/WORLD_SIZE/LOCAL_RANK from Slurm, MASTER_ADDR from the job script."""
    env = os.environ if env is None else env
    if "MASTER_ADDR" not in env:
        raise UsageError("running under srun needs MASTER_ADDR (e.g. export MASTER_ADDR=$(scontrol show "
                         "hostnames $SLURM_JOB_NODELIST | head -n1))", field="MASTER_ADDR")
    env.setdefault("MASTER_PORT", "29500")
    env.update(RANK=str(dist_env.rank), WORLD_SIZE=str(dist_env.world_size), LOCAL_RANK=str(dist_env.local_rank))


def torchrun_command(argv: Sequence[str], nproc_per_node: int, nnodes: int = 1, node_rank: int = 0,
                     master_addr: str | None = None, master_port: int | None = None,
                     timeout_s: float | None = None, module: str = "opbench.comm") -> list[str]:
    """``python -m torch.distributed.run … -m <module> <argv>`` for this machine's share of the job.

    One node: ``--standalone`` (torchrun picks a free port) unless a port is given. Several nodes: the static
    rendezvous at MASTER_ADDR:MASTER_PORT, with its join timeout bounded by ``timeout_s`` so a node that never
    arrives ends the job instead of hanging it.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}",
           f"--nnodes={nnodes}", f"--node-rank={node_rank}"]
    if nnodes == 1 and master_port is None:
        cmd.append("--standalone")
    else:
        cmd += [f"--master-addr={master_addr or '127.0.0.1'}", f"--master-port={master_port or 29500}"]
        if timeout_s:
            cmd.append(f"--rdzv-conf=timeout={int(timeout_s)}")
    return [*cmd, "-m", module, *argv]


def relaunch(cmd: Sequence[str]) -> int:
    """Run torchrun in the foreground and hand back its exit status (Ctrl-C reaches the whole job)."""
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.call(list(cmd))


def pick_backend(device_type: str, override: str | None) -> str:
    """NCCL on GPUs (torch names RCCL 'nccl' too), gloo on the CPU, unless told otherwise."""
    if override:
        return override
    return "nccl" if device_type == "cuda" else "gloo"


def init_process_group(dist_env: DistEnv, backend: str, device, timeout_s: float) -> None:
    """Join the job. ``timeout_s`` bounds the rendezvous and every collective (gloo raises after it; NCCL's
    watchdog aborts the communicator), so a dead or missing rank ends the run instead of hanging it."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    # Binding the GPU makes NCCL create its communicator now (a bad rank fails here, not mid-sweep).
    kwargs = {"device_id": device} if backend == "nccl" and getattr(device, "type", "cpu") == "cuda" else {}
    if dist_env.launcher == "single":
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, **kwargs)
        return
    if dist_env.launcher == "slurm" and "RANK" not in os.environ:
        export_slurm_rendezvous(dist_env)
    dist.init_process_group(backend, init_method="env://", rank=dist_env.rank, world_size=dist_env.world_size,
                            timeout=timeout, **kwargs)
