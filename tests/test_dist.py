"""The distributed layer (launcher detection, node identity, self-launch command) and fault injection parsing.
The multi-process behaviour is in test_comm_torchrun.py and test_ckpt_run.py (real torchrun and srun-style jobs)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from opbench.core import dist
from opbench.core.errors import UsageError
from opbench.core.faults import Fault, Faults


def test_detect_torchrun_with_node_rank():
    env = {
        "RANK": "3",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "3",
        "LOCAL_WORLD_SIZE": "8",
        "GROUP_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
    }
    got = dist.detect(env)
    assert (got.rank, got.world_size, got.local_rank, got.nnodes, got.launcher, got.node_rank) == (
        3,
        16,
        3,
        2,
        "torchrun",
        1,
    )
    assert got.node == "node1" and not got.is_main


def test_detect_slurm_one_world_and_batch_shell():
    slurm = {
        "SLURM_PROCID": "9",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "1",
        "SLURM_NNODES": "2",
        "SLURM_STEP_ID": "0",
        "SLURM_NODEID": "1",
    }
    got = dist.detect(slurm)
    assert (got.rank, got.world_size, got.local_rank, got.nnodes, got.launcher, got.node) == (
        9,
        16,
        1,
        2,
        "slurm",
        "node1",
    )
    assert dist.detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None  # a batch script's own shell
    assert dist.detect({}) is None


def test_node_falls_back_to_host_name():
    got = dist.detect({"RANK": "0", "WORLD_SIZE": "2"})
    assert got.node_rank is None and got.node == got.host and got.host


def test_bad_launcher_variable_is_a_usage_error():
    with pytest.raises(UsageError, match="WORLD_SIZE"):
        dist.detect({"RANK": "0", "WORLD_SIZE": "two"})


def test_export_slurm_rendezvous():
    exported = {"MASTER_ADDR": "node0"}
    dist.export_slurm_rendezvous(dist.DistEnv(9, 16, 1, 2, "slurm"), exported)
    assert exported == {
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29500",
        "RANK": "9",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "1",
    }
    with pytest.raises(UsageError, match="MASTER_ADDR"):
        dist.export_slurm_rendezvous(dist.DistEnv(0, 2, 0, 1, "slurm"), {})


def test_torchrun_command_and_flag_removal():
    one = dist.torchrun_command(["-b", "1K"], 4, "opbench.comm")
    assert one[1:4] == ["-m", "torch.distributed.run", "--nproc-per-node=4"] and "--standalone" in one
    assert one[-4:] == ["-m", "opbench.comm", "-b", "1K"]
    two = dist.torchrun_command(
        [], 8, "opbench.ckpt", nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29400, timeout_s=60
    )
    assert "--master-addr=10.0.0.1" in two and "--master-port=29400" in two and "--node-rank=1" in two
    assert "--rdzv-conf=timeout=60" in two and "--standalone" not in two and two[-1] == "opbench.ckpt"
    argv = ["--size-mb", "1", "--nproc-per-node", "2", "--nproc-per-node=3", "--keep"]
    assert dist.without_flag(argv, "--nproc-per-node") == ["--size-mb", "1", "--keep"]


def test_faults_parse():
    faults = Faults.parse("exit:1, hang:2,slow:3:4,corrupt:1,oom:0,late_send:2:0.25")
    assert faults.faults == (
        Fault("exit", 1),
        Fault("hang", 2),
        Fault("slow", 3, 4.0),
        Fault("corrupt", 1),
        Fault("oom", 0),
        Fault("late_send", 2, seconds=0.25),
    )
    assert faults.corrupts(1) and not faults.corrupts(0)
    assert faults.send_delay(2) == 0.25 and faults.send_delay(1) == 0.0
    assert not Faults.from_env({}) and Faults.from_env({}).timed(len, 0) is len
    bad_values = ("slow:1:inf", "slow:1:nan", "late_send:1", "late_send:1:0", "late_send:1:61", "late_send:1:x",
                  "late_send:1:0.1,late_send:2:0.1")  # fmt: skip
    for bad in ("exit", "exit:x", "slow:1", "slow:1:0.5", "boom:1", "oom:1:2", *bad_values):
        with pytest.raises(UsageError, match="OPBENCH_FAULTS"):
            Faults.parse(bad)


def test_faults_fire_at_their_points():
    faults = Faults.parse("oom:0,slow:1:3")
    with pytest.raises(MemoryError, match="out of memory"):
        faults.prepare(0)
    faults.prepare(0)  # once: the next case allocates normally
    faults.prepare(1)
    import time

    def work():
        time.sleep(0.02)
        return 7

    slowed = faults.timed(work, 1)
    start = time.perf_counter()
    assert slowed() == 7
    assert time.perf_counter() - start >= 0.055  # 3 × 20 ms, minus timer slack
    assert faults.timed(work, 0) is work


TORCHRUN_FAILURE = """\
W1123 00:34:01.357000 18022 site-packages/torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 18027 closing signal SIGTERM
opbench ckpt: 1 of 1 cases failed or did not verify (see status/error)
Traceback (most recent call last):
  File "/x/rank.py", line 3, in <module>
    boom()
ValueError: a rank's own traceback stays
E1123 00:34:01.422000 18022 site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 18026) of binary: python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/site-packages/torch/distributed/run.py", line 1028, in main
    run(args)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
opbench.ckpt FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-23_00:34:01
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 18027)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_00:34:01
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 18026)
  error_file: <N/A>
============================================================
"""


def test_relayed_stderr_keeps_the_ranks_words_and_ends_in_one_line(capsys):
    """torchrun's agent log lines and its own ChildFailedError traceback and summary are replaced by one line
    naming the root-cause rank; everything the ranks printed (their tracebacks too) passes through."""
    import io

    dist._relay_stderr(io.StringIO(TORCHRUN_FAILURE), "opbench ckpt")
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "opbench ckpt: 1 of 1 cases failed or did not verify (see status/error)",
        "Traceback (most recent call last):",
        '  File "/x/rank.py", line 3, in <module>',
        "    boom()",
        "ValueError: a rank's own traceback stays",
        "opbench ckpt: error: rank 0 ended with exit code 1; torchrun stopped the other ranks (the ranks' "
        "own messages are above)",
    ]


# -- reliability: launch problems are one line, exit 2; failures that are not Exceptions still become rows ---------
def _port_in_use():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_launch_and_rendezvous_problems_are_one_line(run, capsys):
    import socket

    from opbench.comm.__main__ import main as comm_main
    from opbench.core.errors import run_cli

    bad_flags = (  # refused before any rank starts: in this process (run_cli is console_main's error handling)
        (["--master-port", "99999"], "field '--master-port': a TCP port is 1-65535, got 99999"),
        (["--master-port", "-1"], "field '--master-port': a TCP port is 1-65535, got -1"),
        (["--node-rank", "-3"], "field '--node-rank': must not be negative, got -3"),
        (["--nnodes", "2", "--node-rank", "2"], "field '--node-rank': node 2 does not exist in a job of 2 node(s)"),
        (["--backend", "bogus"], "field '--backend': unknown backend 'bogus'"),
        (["--timeout", "inf"], "field '--timeout': must be a positive, finite number of seconds, got inf"),
    )
    for argv, needle in bad_flags:
        rc = run_cli(comm_main, argv, prog="opbench comm")
        err = capsys.readouterr().err
        assert rc == 2 and needle in err, (argv, err)
        assert len(err.strip().splitlines()) == 1, err
    proc = run("opbench", "comm", "--backend", "nccl", "-b", "1K")  # refused by the rank, in a process of its own
    needle = "field '--backend': NCCL runs on GPUs and this rank's device is cpu"
    assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    env = {"RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    proc = run("opbench", "cluster", "--quick", env=env)
    assert proc.returncode == 2 and "field 'RANK': RANK=3 is outside a world of 2" in proc.stderr, proc.stderr

    with _port_in_use() as held:  # rank 0 must serve the store on a port another process holds
        port = str(held.getsockname()[1])
        env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        proc = run("opbench", "comm", "-b", "1K", "--timeout", "5", env=env)
    assert proc.returncode == 2 and f"rendezvous port 127.0.0.1:{port}: it is in use" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1

    with socket.socket() as s:  # a port nobody serves: rank 1 waits for rank 0 until --timeout
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    proc = run("opbench", "comm", "-b", "1K", "--timeout", "1", env=env, timeout=120)
    assert proc.returncode == 2 and f"rendezvous at 127.0.0.1:{port}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_checkpoint_exception_and_a_cpu_allocation_failure_become_rows():
    import torch
    from torch.distributed.checkpoint.api import CheckpointException

    from opbench.core.sweep import classify_failure

    try:
        torch.empty(1 << 60, dtype=torch.uint8)
    except RuntimeError as exc:
        assert classify_failure(exc)[0] == "oom", exc
    ranks = dist.Ranks.join(dist.single(), "cpu", 30)
    try:

        def truncated_load():
            raise CheckpointException("load", {0: (EOFError("truncated .distcp"), None)})

        with pytest.raises(dist.RankFailure, match="truncated .distcp"):  # BaseException, not Exception
            ranks.agree(truncated_load)
    finally:
        ranks.stop()


def test_printed_commands_are_paste_safe(run, tmp_path):
    """A folder name with shell syntax stays one quoted argument in every printed command; a name with a newline
    cannot start a line of its own; run_script.sh checks its numbers and stages before using them."""
    import shlex

    hostile = str(tmp_path / "out dir;$(touch X)")  # under tmp_path: the run writes its CSV there
    proc = run(
        "opbench", "fsdp", "--model", "Llama3.1_8B", "--world-size", "8", "--commands", "--report-dir-path", hostile
    )
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("opbench comm ")]
    argv = shlex.split(line)
    assert argv[argv.index("--report-dir-path") + 1] == hostile

    from opbench.core.units import one_line

    assert one_line("all_gather layers.0\n./evil --run") == "all_gather layers.0?./evil --run"

    for env, needle in (
        ({"NPROC_PER_NODE": "a[$(touch X)]"}, "NPROC_PER_NODE must be a non-negative integer"),
        ({"STAGES": "gemm bogus"}, "unknown stage 'bogus'"),
        ({"STAGES": ""}, "STAGES is empty"),  # set but empty is not "every stage"
        ({"NNODES": "0"}, "NNODES must be at least 1"),
        ({"NNODES": "2", "NODE_RANK": "3"}, "NODE_RANK=3 does not exist in a job of NNODES=2"),  # would wait forever
        ({"NNODES": "2", "MASTER_PORT": "99999"}, "MASTER_PORT must be 1-65535"),
        ({"PYTHON": "/nonexistent"}, "PYTHON='/nonexistent' is not a command"),
    ):
        proc = subprocess.run(
            ["bash", "run_script.sh"],
            capture_output=True,
            text=True,
            env={**os.environ, "REPORT_DIR": str(tmp_path / "r"), **env},
            timeout=60,
            cwd=Path(__file__).resolve().parent.parent,
        )
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists() and not (Path(__file__).resolve().parent.parent / "X").exists()


EXAMPLE_LOG = str(Path(__file__).resolve().parent.parent / "examples" / "nccl_fsdp_qwen3_0.6b_4ranks.log.gz")


def test_impossible_sizes_and_empty_selections_are_one_line(run, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    data = Path(EXAMPLE_LOG).read_bytes()
    truncated = tmp_path / "cut.log.gz"
    truncated.write_bytes(data[: len(data) // 2])
    corrupt = tmp_path / "bad.log.gz"
    corrupt.write_bytes(data[:1000] + bytes(255 - b for b in data[1000:1400]) + data[1400:])
    damaged = run("opbench", "trace", str(corrupt), timeout=60)  # keeps what it read, warns, exit 1: no traceback
    assert damaged.returncode == 1 and "Traceback" not in damaged.stderr and "stopped reading" in damaged.stderr
    cases = (
        (["gemm", "--model", "", "--dry-run"], "field '--model': '' names no model"),
        (["attention", "--model", ",,"], "field '--model': ',,' names no model"),
        (["fsdp", "--model", "", "--world-size", "8"], "field '--model': '' names no model"),
        (["ckpt", "--size-mb", "nan", "--dry-run"], "field '--size-mb': must be a positive, finite number of MiB"),
        (["ckpt", "--size-mb", "1e12", "--dry-run"], "field '--size-mb': 1e12 MiB is more than 1 PiB"),
        (["fsdp", "--model", "Llama3.1_8B", "--world-size", "99999999999"], "field '--world-size': 99999999999 ranks"),
        (["trace", "--csv", "", "x.log"], "field '--report-csv-path': is empty"),
        (["gemm", "--model-config-path", str(deep), "--dry-run"], "JSON nested too deeply"),
        # from the second hostile-input audit (issue 16's note): each was a traceback, a hang or silently accepted
        (["trace", EXAMPLE_LOG, "--gpus-per-node", "0", "--commands"], "field '--gpus-per-node': must be positive"),
        (["trace", EXAMPLE_LOG, "--compare-fsdp", "Qwen3_0.6B", "--world-size", "99999999999"], "'--world-size'"),
        (["comm", "-b", "8", "-e", "1T", "-i", "1", "--dry-run"], "sizes, more than 10,000"),
        (["comm", "--sizes-from-trace", str(truncated), "--dry-run"], "could not be read to its end"),
        (["ckpt", "--size-mb", "1", "--thread-count", "99999999999", "--dry-run"], "writer threads per rank"),
        (["gemm", "--mnk", "8x8x8", "--budget", "nan"], "field '--budget': must be a finite number"),
        (["ckpt", "--save-interval", "nan", "--dry-run"], "field '--save-interval': must be a finite number"),
        (["cluster", "--plan", "2", "--sizes", "0"], "'0' is less than one byte"),
        (["cluster", "--plan", "2", "--model", "Nope"], "unknown model 'Nope'"),
        (["report", ""], "field 'RESULTS_DIR': is empty"),
        (["gemm", "--mnk", "8x8x8", "--report-dir-path", "/dev/full"], "/dev/full is not a folder"),
        (["gemm", "--model", "Qwen3_0.6B", "--mbs", "1,,2", "--dry-run"], "'1,,2' has an empty item"),
        (
            ["comm", "-r", "5", "--nproc-per-node", "2", "--collectives", "broadcast", "-b", "1K", "--dry-run"],
            "rank 5 is outside a broadcast group of 2",
        ),  # fmt: skip
    )
    for argv, needle in cases:
        proc = run("opbench", *argv, timeout=60)
        assert proc.returncode == 2 and needle in proc.stderr, (argv, proc.stderr[-500:])
        assert len(proc.stderr.strip().splitlines()) == 1, (argv, proc.stderr[-500:])
    # a fault for a rank the job does not have would never fire: a test relying on it would pass for nothing
    argv = ["ckpt", "--size-mb", "1", "--methods", "torch_save", "--report-dir-path", str(tmp_path / "f")]
    proc = run("opbench", *argv, env={"OPBENCH_FAULTS": "slow:5:2"}, timeout=120)
    assert proc.returncode == 2 and "field 'OPBENCH_FAULTS': names rank(s) 5, but the job has 1" in proc.stderr


RENDEZVOUS_FAILURE = """\
[W1123 14:03:14.973175299 socket.cpp:764] [c10d] The IPv6 network addresses of (no.such.host, 29500) cannot be retrieved (gai error: -2 - Name or service not known).
[W1123 14:03:17.202587532 TCPStore.cpp:340] [c10d] TCP client failed to connect/validate to host no.such.host:29500 - retrying (try=0, timeout=5000ms, delay=5180ms): timed out
Exception raised from throwTimeoutError at /pytorch/torch/csrc/distributed/c10d/socket.cpp:1030 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation) + 0x9d (0x7f36a0579b8d in libc10.so)
<omitting python frames>

Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/site-packages/torch/distributed/run.py", line 1028, in main
torch.distributed.DistNetworkError: The client socket has timed out after 5000ms while trying to connect to (no.such.host, 29500).
"""


def test_a_failed_rendezvous_is_one_line(capsys):
    """A node that cannot reach the job's rendezvous store: the c10d client's retry lines, their C++ stacks and
    torchrun's traceback become one line that says what to check; relaunch then exits 2."""
    import io

    assert dist._relay_stderr(io.StringIO(RENDEZVOUS_FAILURE), "opbench comm") == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "opbench comm: error: this node could not join the job's rendezvous: The client socket has timed out after "
        "5000ms while trying to connect to (no.such.host, 29500). (is node 0 running, and do --master-addr / "
        "--master-port name it?)"
    ]


def test_a_usage_error_on_every_rank_is_said_once_with_exit_2(capsys):
    """Ranks that all find the same bad input (here a fault for a rank the job lacks) each print it; the launcher
    passes it on once, blames no rank, and exits 2 as a local run would."""
    import io

    line = "python -m opbench.comm: error: field 'OPBENCH_FAULTS': names rank(s) 99, but the job has 2 rank(s)\n"
    summary = TORCHRUN_FAILURE[TORCHRUN_FAILURE.index('Traceback (most recent call last):\n  File "<frozen') :]
    stderr = line + line + summary.replace("exitcode  : 1 (pid: 18026)", "exitcode  : 2 (pid: 18026)")
    assert dist._relay_stderr(io.StringIO(stderr), "opbench comm") == 2
    assert capsys.readouterr().err == line


def test_more_ranks_than_gpus_under_nccl_is_one_clear_line():
    """torchrun's LOCAL_WORLD_SIZE above the GPU count would put two ranks on one GPU (LOCAL_RANK modulo rule),
    which NCCL refuses mid-rendezvous; srun without it may bind a GPU per task, so nothing is concluded there, and
    NCCL's own "Duplicate GPU" error is turned into the same advice."""
    with pytest.raises(UsageError, match="2 ranks on this node but torch sees 1 GPU"):
        dist.check_one_gpu_per_rank("2", 1)
    dist.check_one_gpu_per_rank("8", 8)
    dist.check_one_gpu_per_rank(None, 1)  # srun: each task may see its own "GPU 0"
    nccl = RuntimeError(
        "NCCL error in: ProcessGroupNCCL.cpp:1970, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL "
        "version 2.27.5\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\n"
        "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000"
    )
    line = dist.rendezvous_error(nccl, 30)
    assert line.startswith("two ranks were given the same GPU") and "\n" not in line and "rank 1 and rank 0" in line
