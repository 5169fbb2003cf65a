"""Where this process sits in a job, from its launcher's environment, and the command line that started the job.
Torch-free and at the bottom of core: the device rule (core.device), the result files' sidecars (core.results,
core.outputs) and the distributed layer (core.dist) all read it.

Three ways in: torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, node rank in ``GROUP_RANK``); Slurm ``srun``
(``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``/``SLURM_NODEID``); nothing (one rank in this process).
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import UsageError

LAUNCH_COMMAND_ENV = "OPBENCH_LAUNCH_COMMAND"  # the user's command line, passed to the ranks opbench starts


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job, as its launcher described it."""

    rank: int
    world_size: int
    local_rank: int
    nnodes: int
    launcher: str  # "torchrun" | "slurm" | "single"
    node_rank: int | None = None  # torchrun GROUP_RANK or SLURM_NODEID; None when the launcher gives none
    host: str = ""

    @property
    def node(self) -> str:
        """Which node this rank is on: the launcher's node rank, else the host name. Two torchrun agents on one
        machine (``--nnodes 2`` on loopback) are two nodes, as they are to NCCL's topology."""
        return f"node{self.node_rank}" if self.node_rank is not None else (self.host or socket.gethostname())

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise UsageError(f"environment variable {key}={env[key]!r} is not an integer", field=key) from None


def _optional_int(env: Mapping[str, str], key: str) -> int | None:
    return _env_int(env, key) if key in env else None


def detect(env: Mapping[str, str] | None = None) -> DistEnv | None:
    """The launcher's view of this process, or None when no launcher started it."""
    env = os.environ if env is None else env
    host = socket.gethostname()
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _env_int(env, "WORLD_SIZE")
        local_world = _optional_int(env, "LOCAL_WORLD_SIZE")
        if "GROUP_WORLD_SIZE" in env:  # torchrun: one agent (worker group) per node
            nnodes = _env_int(env, "GROUP_WORLD_SIZE")
        elif local_world:
            nnodes = max(1, world // local_world)
        else:
            nnodes = _optional_int(env, "SLURM_NNODES") or 1
        node_rank = _optional_int(env, "GROUP_RANK")
        if node_rank is None:
            node_rank = _optional_int(env, "SLURM_NODEID")
        return _checked(
            DistEnv(
                _env_int(env, "RANK"), world, _optional_int(env, "LOCAL_RANK") or 0, nnodes, "torchrun", node_rank, host
            ),
            "RANK",
            "WORLD_SIZE",
        )
    # Inside `srun` (a job step); a batch script's own shell has SLURM_PROCID too but no SLURM_STEP_ID.
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "SLURM_STEP_ID" in env:
        return _checked(
            DistEnv(
                _env_int(env, "SLURM_PROCID"),
                _env_int(env, "SLURM_NTASKS"),
                _optional_int(env, "SLURM_LOCALID") or 0,
                _optional_int(env, "SLURM_NNODES") or 1,
                "slurm",
                _optional_int(env, "SLURM_NODEID"),
                host,
            ),
            "SLURM_PROCID",
            "SLURM_NTASKS",
        )
    return None


def _checked(d: DistEnv, rank_var: str, world_var: str) -> DistEnv:
    """A launcher environment that cannot describe a real job is a usage error, not a hang in the rendezvous."""
    if d.world_size < 1:
        raise UsageError(f"must be at least 1, got {d.world_size}", field=world_var)
    if not 0 <= d.rank < d.world_size:
        raise UsageError(f"{rank_var}={d.rank} is outside a world of {d.world_size} ({world_var})", field=rank_var)
    if d.local_rank < 0:
        raise UsageError(f"must not be negative, got {d.local_rank}", field="LOCAL_RANK")
    return d


def single() -> DistEnv:
    """A one-rank world in this process."""
    return DistEnv(0, 1, 0, 1, "single", 0, socket.gethostname())


def launch_command() -> str:
    """The command the user typed, to be re-run as it is: the launcher's line when opbench started torchrun itself
    (core.dist.relaunch passes it on) or when the user ran torchrun (its agent is this rank's parent), else this
    process's own line. A rank's child command alone would be a 1-rank run if copied."""
    if os.environ.get(LAUNCH_COMMAND_ENV):
        return os.environ[LAUNCH_COMMAND_ENV]
    own = list(getattr(sys, "orig_argv", sys.argv))
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by a torchrun agent: its command line is the job's
        try:
            with open(f"/proc/{os.getppid()}/cmdline", "rb") as fh:
                parent = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
        except OSError:
            parent = []
        if any("torchrun" in a or "torch.distributed.run" in a for a in parent[:3]):
            return shlex.join(parent)
    return shlex.join(own)
