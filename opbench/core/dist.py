"""The one distributed layer: where this process sits in a job, how to start one, and how ranks agree.

Three ways in, detected from the environment:
- torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, node rank in ``GROUP_RANK``), env:// rendezvous;
- Slurm ``srun`` (``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``/``SLURM_NODEID``; the job script exports
  ``MASTER_ADDR``/``MASTER_PORT``): every task joins ONE world;
- nothing: a one-rank world in this process, or, when the user asks for ``--nproc-per-node N`` (or several
  nodes), a self-launch through ``python -m torch.distributed.run`` that re-runs the same command per rank.

The rest is shared by every multi-rank tool: the one LOCAL_RANK → GPU rule, joining the process group with a
timeout that bounds every collective, ``Ranks.agree`` ("did every rank manage this step?"), and one rank-0
writer. Importing this module does not import torch; the functions that need it import it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, TypeVar

from .errors import EXIT_INTERRUPTED, EXIT_TERMINATED, UsageError, raise_if_terminated
from .launch import LAUNCH_COMMAND_ENV, DistEnv, _env_int, _optional_int, detect, single  # noqa: F401 - their home was here
from .redact import redact_text

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


def export_slurm_rendezvous(dist_env: DistEnv, env: dict[str, str] | None = None) -> None:
    """Make env:// work under srun: RANK/WORLD_SIZE/LOCAL_RANK from Slurm, MASTER_ADDR from the job script."""
    env = os.environ if env is None else env  # type: ignore[assignment]
    assert env is not None
    if "MASTER_ADDR" not in env:
        raise UsageError(
            "running under srun needs MASTER_ADDR (e.g. export MASTER_ADDR=$(scontrol show "
            "hostnames $SLURM_JOB_NODELIST | head -n1))",
            field="MASTER_ADDR",
        )
    env.setdefault("MASTER_PORT", "29500")
    env.update(RANK=str(dist_env.rank), WORLD_SIZE=str(dist_env.world_size), LOCAL_RANK=str(dist_env.local_rank))


# -- self-launch ---------------------------------------------------------------------------------------------
def torchrun_command(
    argv: Sequence[str],
    nproc_per_node: int,
    module: str,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    timeout_s: float | None = None,
) -> list[str]:
    """``python -m torch.distributed.run … -m <module> <argv>`` for this machine's share of the job.

    One node: ``--standalone`` (torchrun picks a free port) unless a port is given. Several nodes: the static
    rendezvous at MASTER_ADDR:MASTER_PORT, with its join timeout bounded by ``timeout_s`` so a node that never
    arrives ends the job instead of hanging it.
    """
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc_per_node}",
        f"--nnodes={nnodes}",
        f"--node-rank={node_rank}",
    ]
    if nnodes == 1 and master_port is None:
        cmd.append("--standalone")
    else:
        cmd += [f"--master-addr={master_addr or '127.0.0.1'}", f"--master-port={master_port or 29500}"]
        if timeout_s:
            cmd.append(f"--rdzv-conf=timeout={int(timeout_s)}")
    return [*cmd, "-m", module, *argv]


# torchrun's own log lines (glog style, from torch.distributed.elastic) and the traceback + summary it prints when
# a rank fails: the ranks already said what went wrong, so these are replaced by one line.
_AGENT_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ .*torch/distributed/")
# The agent of another node losing the rendezvous store when node 0's agent has finished first (the job is over):
# a C++ warning plus its stack, not news to the user.
_STORE_GONE = re.compile(r"^\[W\d{4} [\d:.]+ (?:\d+ )?TCPStore\.cpp:\d+\] \[c10d\] recv\w* failed")
# A rank giving up: fail_job's "opbench comm: error: …" or run_cli's "python -m opbench.comm: error: …".
_RANK_ERROR = re.compile(r"^(?:python -m opbench\.[\w.]+|opbench(?: [\w-]+)?): error: ")
# A rank saying it stopped on Ctrl-C or SIGTERM (core.errors.run_cli): every rank says it, the user reads it once.
_RANK_STOPPED = re.compile(
    r"^(?:python -m opbench\.[\w.]+|opbench(?: [\w-]+)?): (?:interrupted|terminated \(SIGTERM\));"
)
_CPP_STACK = ("Exception raised from", "frame #", "<omitting python frames>")
# The agent's c10d client retrying a rendezvous store it cannot reach (C++ log lines, each with a stack).
_STORE_RETRY = re.compile(r"^\[[WE]\d{4} [\d:.]+ (?:\d+ )?(?:socket|TCPStore)\.cpp:\d+\] \[c10d\] ")
# How the agent's own traceback ends when the rendezvous failed: the job never started.
_RDZV_FAILED = re.compile(
    r"^torch\.distributed\.(?:DistNetworkError|DistStoreError|elastic\.rendezvous\.api\.Rendezvous\w*Error): (.*)"
)
_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
# The root cause's own words, from the error file a rank leaves through ``record_error`` (torchrun prints it as
# "traceback : …"; without a file it prints a pointer to its docs or the signal instead).
_ROOT_TEXT = re.compile(r"^\s*traceback\s*:\s*(?!To enable traceback|Signal \d)(\S.*)")


def _relay_stderr(
    src: IO[str],
    prog: str,
    verdict_exit: int | None = None,
    failing: Callable[[], None] | None = None,
) -> int | None:
    """Copy the job's stderr through, minus torchrun's agent logs and failure traceback; end with one line naming
    the rank that failed first (torchrun's "Root Cause") — unless it ended with ``verdict_exit``, the code a tool
    returns on purpose (``opbench cluster``: a check failed; ``fail_job``'s words in the rank's error file tell a
    broken job from it), or with a usage error, whose ranks have said everything already (an error line several
    ranks print alike is passed on once). The line quotes the rank's own error where it left one (``record_error``).

    Returns 2 when the job ended in a usage error (the ranks' exit code 2, or a rendezvous this node could not
    join), for the launcher to exit with; else None."""
    held: list[str] = []  # a traceback being read: torchrun's own is dropped, a rank's is passed on
    summary = False  # inside torchrun's "==== … FAILED ====" block
    retrying = False  # inside the c10d client's retry lines and their C++ stacks
    root: dict[str, str] = {}
    in_root = False
    usage_error = False
    said: set[str] = set()  # rank error lines already passed on
    store_gone = False
    for line in src:
        if store_gone and line.startswith(_CPP_STACK):
            continue
        store_gone = bool(_STORE_GONE.match(line))
        if store_gone:
            continue
        if _STORE_RETRY.match(line) or (retrying and (line.startswith(_CPP_STACK) or not line.strip())):
            retrying = True  # said once, in one line, if the rendezvous fails in the end
            continue
        retrying = False
        if failing is not None and (_RANK_ERROR.match(line) or "ChildFailedError" in line):
            failing()  # a rank gave up (or torchrun says one failed): the job has a grace period to stop
        if summary:
            if line.startswith("Root Cause"):
                in_root = True
            elif in_root:
                for key, pat in (("rank", _ROOT_RANK), ("exitcode", _ROOT_EXIT), ("text", _ROOT_TEXT)):
                    m = pat.match(line)
                    if m and key not in root:
                        root[key] = m.group(1)
            continue
        if held:
            held.append(line)
            if line.startswith("torch.distributed.elastic.multiprocessing.errors.ChildFailedError"):
                held, summary = [], True
            elif line.startswith("torch.distributed.elastic.multiprocessing.api.SignalException"):
                held = []  # torchrun told to stop (SIGTERM passed on): the ranks have said so themselves
            elif m := _RDZV_FAILED.match(line):
                held, usage_error = [], True
                print(
                    f"{prog}: error: this node could not join the job's rendezvous: {m.group(1).strip()} (is node 0 "
                    "running, and do --master-addr / --master-port name it?)",
                    file=sys.stderr,
                    flush=True,
                )
            elif line and not line[0].isspace() and not line.startswith(("Traceback", "During handling", "The above")):
                sys.stderr.writelines(held)
                held = []
            continue
        if line.startswith(("Traceback (most recent call last):", "During handling of the above", "The above exc")):
            held = [line]  # a traceback, or the chained part of one whose first part was torchrun's
        elif (_RANK_ERROR.match(line) or _RANK_STOPPED.match(line)) and line in said:
            continue  # the same usage error, or the same "interrupted", from another rank
        elif not _AGENT_LOG.match(line):
            if _RANK_ERROR.match(line) or _RANK_STOPPED.match(line):
                said.add(line)
            sys.stderr.write(line)
        elif failing is not None and "failed (exitcode:" in line:
            failing()  # torchrun saw a worker fail: it now waits 30 s on the others, we wait STOP_GRACE_S
        sys.stderr.flush()
    sys.stderr.writelines(held)
    broke = root.get("text", "").startswith(f"{prog}: error: ")  # fail_job's words: the job broke, no verdict
    if summary and verdict_exit is not None and root.get("exitcode") == str(verdict_exit) and not broke:
        if root.get("text"):  # the verdict in one line on every node (the report itself is node 0's)
            print(root["text"].strip(), file=sys.stderr, flush=True)
        return None
    if summary and root.get("exitcode") == "2":
        return 2  # a usage error every rank found and said (mismatched arguments, a fault for a missing rank)
    if summary:
        code = root.get("exitcode", "?")
        own = f": {root['text'].strip()};" if root.get("text") else ";"  # the rank's own error (record_error)
        print(
            f"{prog}: error: rank {root.get('rank', '?')} ended with exit code {code}"
            f"{' (killed by a signal)' if code.startswith('-') else ''}{own} torchrun stopped the other ranks "
            "(the ranks' own messages are above)",
            file=sys.stderr,
            flush=True,
        )
    return 2 if usage_error else None


STOP_GRACE_S = 10.0  # after a rank has failed, how long the rest of the job may take to stop before it is killed


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc); torchrun starts each worker in its own session, so a process
    group signal would miss them."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _signal_all(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass  # already gone


def _kill_job(proc: subprocess.Popen[str]) -> None:
    # SIGKILL also ends a stopped (SIGSTOP) process; SIGTERM waits for SIGCONT
    _signal_all([*_descendants(proc.pid), proc.pid], signal.SIGKILL)


def _launch_env(nproc_per_node: int) -> dict[str, str]:
    """The environment for torchrun: the user's command for the ranks' sidecars (core.results.launch_command), and
    OMP_NUM_THREADS set (this machine's cores shared among its ranks) unless the user set it, so torchrun does not
    print its banner about setting it to 1."""
    env = dict(os.environ)
    env[LAUNCH_COMMAND_ENV] = shlex.join(getattr(sys, "orig_argv", sys.argv))
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, nproc_per_node)))
    return env


def _nproc_of(cmd: Sequence[str]) -> int:
    for arg in cmd:
        if arg.startswith("--nproc-per-node="):
            return int(arg.split("=", 1)[1])
    return 1


def relaunch(cmd: Sequence[str], prog: str = "opbench", verdict_exit: int | None = None) -> int:
    """Run torchrun in the foreground and hand back its exit status (Ctrl-C reaches the whole job). Its stderr
    goes through ``_relay_stderr``, so a failed rank ends in one clear line instead of torchrun's traceback.

    torchrun gives the other ranks 30 s to stop after one fails, and a stopped or hung rank then keeps the job
    alive; here the job gets ``STOP_GRACE_S`` from the first failure a rank reports, then it is killed."""
    print("+ " + redact_text(shlex.join(cmd)), file=sys.stderr, flush=True)  # core.redact: no credential printed
    # torchrun runs in a process group of its own, so a signal meant for the job (Ctrl-C at the terminal,
    # `timeout -s INT`, `kill -INT` of this process) reaches it exactly once, from here: it passes SIGINT on to
    # the ranks, which stop as on Ctrl-C. In our group it got a terminal's Ctrl-C but not a `kill` of this pid.
    own_group: dict[str, Any] = (
        {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}  # 3.10: no process_group
    )
    proc = subprocess.Popen(
        list(cmd), stderr=subprocess.PIPE, text=True, errors="replace", env=_launch_env(_nproc_of(cmd)), **own_group
    )
    assert proc.stderr is not None
    timer: threading.Timer | None = None
    terminated = interrupted = False

    def overdue(seconds: float = STOP_GRACE_S, after: str = "a rank failed") -> None:
        if proc.poll() is None:
            print(
                f"{prog}: error: the job did not stop within {seconds:g} s after {after} (a rank is stopped or hung); "
                "killed it",
                file=sys.stderr,
                flush=True,
            )
            _kill_job(proc)

    def failing() -> None:
        nonlocal timer
        if timer is None:
            timer = threading.Timer(STOP_GRACE_S, overdue)
            timer.daemon = True
            timer.start()

    def pass_on_sigterm(signum: int, frame: object) -> None:
        # SIGTERM (kill PID, scancel): torchrun passes it on to the ranks, which clean up as on Ctrl-C; we keep
        # relaying their last words, and kill the job if it is still there after 3 grace periods.
        nonlocal timer, terminated
        terminated = True
        proc.send_signal(signal.SIGTERM)
        if timer is None:
            timer = threading.Timer(3 * STOP_GRACE_S, overdue, (3 * STOP_GRACE_S, signal.Signals(signum).name))
            timer.daemon = True
            timer.start()

    def pass_on_sigint(signum: int, frame: object) -> None:
        # Ctrl-C: the ranks stop as they do on their own Ctrl-C (rows kept, data removed) and say so; we keep
        # relaying them. A second Ctrl-C means now: the job is killed.
        nonlocal timer, interrupted
        if interrupted:
            print(f"{prog}: interrupted again: killing the job", file=sys.stderr, flush=True)
            _kill_job(proc)
            return
        interrupted = True
        proc.send_signal(signal.SIGINT)
        if timer is None:
            timer = threading.Timer(3 * STOP_GRACE_S, overdue, (3 * STOP_GRACE_S, "Ctrl-C"))
            timer.daemon = True
            timer.start()

    def suspend_job(signum: int, frame: object) -> None:
        # Ctrl-Z (SIGTSTP) reaches this process alone (the job has its own group, each rank its own session):
        # stop every process of the job, then this one; `fg`/`bg` (SIGCONT) wakes this one, which wakes the job.
        job = [*_descendants(proc.pid), proc.pid]
        _signal_all(job, signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGSTOP)
        _signal_all(job, signal.SIGCONT)

    handlers = {
        signal.SIGTERM: pass_on_sigterm,
        signal.SIGHUP: pass_on_sigterm,
        signal.SIGINT: pass_on_sigint,
        signal.SIGTSTP: suspend_job,
    }
    previous: dict[int, Any] = {}
    try:
        for signum, handler in handlers.items():
            previous[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main thread
        pass
    try:
        usage = _relay_stderr(proc.stderr, prog, verdict_exit, failing)
        code = proc.wait()
        if usage is not None:
            return usage  # bad input the ranks (or the rendezvous) reported in one line: exit 2, as a local run
        if terminated:
            return EXIT_TERMINATED  # as if the job had been this process: 143, what a shell reports for SIGTERM
        if interrupted:
            return EXIT_INTERRUPTED  # 130, as a local run's Ctrl-C; the ranks have said where their rows are
        return 1 if code < 0 else code  # killed (by us, or torchrun by a signal): a failed job, not a signal number
    finally:
        if timer is not None:
            timer.cancel()
        for restored, handler in previous.items():
            signal.signal(restored, handler)


def local_gpu_count(device: str | None) -> int:
    """GPUs this node has for ``--device`` (0 for 'cpu'); imports torch."""
    if device == "cpu":
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def self_launch(args: Any, argv: Sequence[str], module: str, prog: str, verdict_exit: int | None = None) -> int | None:
    """Started plainly with ``--nproc-per-node N`` > 1 (default: one rank per GPU) or ``--nnodes`` > 1: run this
    machine's share of the job under torchrun and return its exit status. None: run in this process."""
    if args.node_rank >= args.nnodes:
        raise UsageError(f"node {args.node_rank} does not exist in a job of {args.nnodes} node(s)", field="--node-rank")
    nproc = args.nproc_per_node or local_gpu_count(args.device) or 1
    if nproc == 1 and args.nnodes == 1:
        return None
    port = args.master_port or (int(os.environ["MASTER_PORT"]) if "MASTER_PORT" in os.environ else None)
    cmd = torchrun_command(argv, nproc, module, args.nnodes, args.node_rank, args.master_addr, port, args.timeout)
    return relaunch(cmd, prog, verdict_exit)


def without_flag(argv: Sequence[str], flag: str) -> list[str]:
    """argv with ``flag VALUE`` / ``flag=VALUE`` removed (what the self-launched ranks must not see again)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out


# -- devices and the process group ----------------------------------------------------------------------------
def local_device(spec: str | None, local_rank: int) -> torch.device:
    """This rank's device by the one LOCAL_RANK rule (``core.device.resolve_device``), made current."""
    from .device import use_device

    return use_device(spec, local_rank)


def check_one_gpu_per_rank(local_world_size: str | None, gpus: int) -> None:
    """NCCL/RCCL refuse two ranks of one communicator on the same GPU ("Duplicate GPU detected"), which the
    LOCAL_RANK modulo rule would give when a node runs more ranks than it has GPUs: say so before NCCL does.
    Every rank of the node sees torchrun's LOCAL_WORLD_SIZE, so all stop with the same line. Only under
    torchrun: other launchers (MPI, Kubernetes wrappers) may give each rank one GPU through
    CUDA_VISIBLE_DEVICES, a valid setup in which each rank sees one GPU."""
    if not (local_world_size and local_world_size.isdigit()):
        return  # srun may bind one GPU per task (each sees "GPU 0"): nothing to conclude; NCCL's own error is mapped
    ranks_here = int(local_world_size)
    if ranks_here > gpus:
        raise UsageError(
            f"{ranks_here} ranks on this node but torch sees {gpus} GPU(s); NCCL needs one GPU per rank: run at most "
            f"{gpus} rank(s) per node, or --backend gloo",
            field="--nproc-per-node",
        )


def pick_backend(device_type: str, override: str | None = None) -> str:
    """NCCL on GPUs (torch names RCCL 'nccl' too), gloo on the CPU, unless told otherwise."""
    if override:
        return override
    return "nccl" if device_type == "cuda" else "gloo"


def init_process_group(dist_env: DistEnv, backend: str, device: Any, timeout_s: float) -> None:
    """Join the job. ``timeout_s`` bounds the rendezvous and every collective (gloo raises after it; NCCL's
    watchdog aborts the communicator), so a dead or missing rank ends the run instead of hanging it."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    timeout = datetime.timedelta(seconds=timeout_s)
    # Binding the GPU makes NCCL create its communicator now (a bad rank fails here, not mid-sweep).
    kwargs: dict[str, Any] = {}
    if "nccl" in backend and getattr(device, "type", "cpu") == "cuda":
        kwargs["device_id"] = device
    if dist_env.launcher == "single":
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout, **kwargs)
        return
    if dist_env.launcher == "slurm" and "RANK" not in os.environ:
        export_slurm_rendezvous(dist_env)
    dist.init_process_group(
        backend, init_method="env://", rank=dist_env.rank, world_size=dist_env.world_size, timeout=timeout, **kwargs
    )


@contextlib.contextmanager
def _stderr_held() -> Iterator[None]:
    """c10d's C++ layer writes its errors, with a C++ stack, straight to file descriptor 2 before Python sees the
    exception. Hold fd 2 in a temporary file while joining: replayed when the join works (nothing is lost), dropped
    when it fails (the one line from ``rendezvous_error`` says what happened)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        joined = False
        try:
            yield
            joined = True
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if joined:
                held.seek(0)
                for chunk in iter(lambda: held.read(1 << 16), b""):
                    os.write(2, chunk)


def rendezvous_error(exc: BaseException, timeout_s: float) -> str:
    """One line for a failed rendezvous: what went wrong and where, without torch's C++ trace."""
    text = " ".join(str(exc).split())
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    if "Duplicate GPU" in text:  # NCCL/RCCL: two ranks of one communicator on one GPU
        return (
            "two ranks were given the same GPU, which NCCL refuses: run one rank per GPU (fewer ranks per node, "
            f"or check CUDA_VISIBLE_DEVICES / srun's GPU binding), or --backend gloo "
            f"(NCCL: {text[text.index('Duplicate GPU') :][:160]})"
        )
    if "EADDRINUSE" in text or "address already in use" in text.lower():
        return f"cannot open the rendezvous port {where}: it is in use (another job?); pick another --master-port"
    if "timed out" in text.lower() or "timeout" in text.lower():
        return (
            f"the rendezvous at {where} did not complete within --timeout {timeout_s:g} s (master unreachable, or "
            "not every rank started)"
        )
    if "Connection refused" in text or "ECONNREFUSED" in text:
        return f"the rendezvous at {where} refused the connection (is rank 0 running there?)"
    return f"joining the job at {where} failed: {type(exc).__name__}: {text[:300]}"


# Flags that may differ between ranks (set per node, or used by rank 0 alone).
LAUNCH_ONLY = (
    "nproc_per_node",
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
    "report_dir_path",
    "append",
    "overwrite",
)


class RankFailure(Exception):
    """Raised on every rank when any rank failed a step; carries the first failing rank's status and message."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Ranks:
    """The joined job as the benchmarks use it: who am I, where is my device, and the few object collectives
    that keep every rank in step."""

    env: DistEnv
    device: torch.device
    backend: str

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    @classmethod
    def join(
        cls,
        dist_env: DistEnv,
        device_spec: str | None,
        timeout_s: float,
        backend: str | None = None,
        cpu_group: bool = False,
    ) -> Ranks:
        """Pick this rank's device, join the process group. ``cpu_group`` adds a gloo backend beside NCCL
        (``cpu:gloo,cuda:nccl``) for tools that also move CPU tensors (DCP's async save)."""
        device = local_device(device_spec, dist_env.local_rank)
        chosen = pick_backend(device.type, backend)
        if "nccl" in chosen and "cpu:" not in chosen and device.type != "cuda":
            raise UsageError(f"NCCL runs on GPUs and this rank's device is {device}; use gloo", field="--backend")
        if "nccl" in chosen and device.type == "cuda":
            import torch

            if os.environ.get("TORCHELASTIC_RUN_ID"):  # torchrun: every rank sees the node's GPUs
                check_one_gpu_per_rank(os.environ.get("LOCAL_WORLD_SIZE"), torch.cuda.device_count())
        if cpu_group and chosen == "nccl":
            chosen = "cpu:gloo,cuda:nccl"
        try:
            with _stderr_held():
                init_process_group(dist_env, chosen, device, timeout_s)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - every way a rendezvous fails becomes one line
            raise UsageError(rendezvous_error(exc, timeout_s)) from None
        return cls(dist_env, device, chosen)

    def stop(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def gather(self, value: Any) -> list[Any]:
        """Every rank's (picklable) value, on every rank, in rank order."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def broadcast(self, value: Any) -> Any:
        """Rank 0's value on every rank."""
        import torch.distributed as dist

        box = [value if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def open_report(
        self,
        path: str,
        schema: Any,
        meta: Mapping[str, Any] | None = None,
        append: bool = False,
        *,
        earlier: str | None = None,
    ) -> Any:
        """The one rank-0 writer: a CsvReport on rank 0, a NullReport (writes nothing) on every other rank.
        ``earlier``: what happens to an earlier CSV at the path (core.outputs; default keep it aside)."""
        from .results import CsvReport, NullReport

        return CsvReport(path, schema, meta, append, earlier=earlier) if self.is_main else NullReport()

    def same_arguments(self, args: Any, ignore: Sequence[str] = ()) -> None:
        """Stop every rank with one line when the ranks were started with different arguments (``--dtype fp32`` on
        one, ``int32`` on another would time meaningless calls, ``-b 1K`` against ``-b 2K`` would abort inside the
        backend). Launch-only flags (which node, where to write) may differ and are left out."""
        skip = {*LAUNCH_ONLY, *ignore}
        mine = {k: v for k, v in sorted(vars(args).items()) if k not in skip}
        everyone = self.gather(mine)
        for rank, theirs in enumerate(everyone):
            for key, value in everyone[0].items():
                if theirs.get(key) != value:
                    flag = "--" + key.replace("_", "-")
                    raise UsageError(
                        f"the ranks were started with different arguments: rank {rank} has {theirs.get(key)!r}, "
                        f"rank 0 has {value!r}",
                        field=flag,
                    )

    def agree(self, fn: Callable[[], T], describe: Callable[[BaseException], tuple[str, str]] | None = None) -> T:
        """Run ``fn`` on every rank; if it raised anywhere, raise the first failure on every rank, so no rank
        goes on into a collective its peer will never join. ``describe`` turns an exception into
        (status, message); the default is the sweep's classification (ok / unsupported / oom / error).
        Unsupported anywhere is re-raised as Unsupported, anything else as RankFailure."""
        from .sweep import STATUS_UNSUPPORTED, Unsupported, classify_failure

        failure: tuple[str, str] | None = None
        result: Any = None
        try:
            result = fn()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - shared with the peers below, then re-raised
            # BaseException: torch's DCP CheckpointException derives from it, and must become a row too
            raise_if_terminated()
            status, message = (describe or classify_failure)(exc)
            failure = (status, message if self.world_size == 1 else f"rank {self.rank}: {message}")
        failures = [f for f in self.gather(failure) if f is not None]
        if failures:
            status, message = failures[0]
            if status == STATUS_UNSUPPORTED:
                raise Unsupported(message)
            raise RankFailure(status, message)
        return result


# Errors that mean the job itself is broken (a peer died or hung past the timeout): no row, stop every survivor.
_BROKEN = re.compile(
    r"timed out|timeout|connection (closed|reset|refused)|broken pipe|watchdog|abort|remote worker|peer",
    re.IGNORECASE,
)


def job_broken(exc: BaseException) -> bool:
    """Whether a failure is the job's (a peer exited or hung, the network failed) rather than the case's."""
    import torch.distributed as dist

    network = tuple(getattr(dist, n) for n in ("DistNetworkError", "DistStoreError") if hasattr(dist, n))
    return isinstance(exc, network) or bool(_BROKEN.search(str(exc)))


def record_error(line: str) -> None:
    """Under torchrun, leave this rank's one-line error in the file torchrun reads when a rank fails
    (TORCHELASTIC_ERROR_FILE, the format of torch's own ``@record``): torchrun's failure summary and opbench's
    launcher then quote the rank's own words rather than a pointer to torchrun's docs."""
    import json
    import time

    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    stamp = str(int(time.time()))
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump({"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": stamp}}}, fh)
    except OSError:
        pass  # the line is on stderr anyway


def fail_job(prog: str, message: str) -> None:
    """The group is broken (a peer died or hung past the timeout): one line, exit 1 at once. Tearing the group
    down properly could block on the dead peer."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    record_error(f"{prog}: error: {message}")
    sys.stdout.flush()
    os._exit(1)
