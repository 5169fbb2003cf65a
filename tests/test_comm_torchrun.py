"""Real torchrun jobs with gloo: 2 and 3 ranks, corruption caught by --check, a rank that dies or hangs, and a
two-node launch on loopback. Sizes, counts and bus-bandwidth factors are checked against nccl-tests' rules
written out here by hand (not through conventions), so a wrong formula there fails here."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opbench.core.dist import _descendants

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
QUICK = ["-n", "2", "-w", "1", "--trials", "2"]
# busbw / algbw (nccl-tests src/*.cu getBw): all_reduce 2(n-1)/n; gathers, scatters, all-to-all (n-1)/n; else 1
FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1.0,
    "broadcast": lambda n: 1.0,
}
# nccl-tests 2.19 alltoallv.cu AlltoAllvGetBw: (n-1)/n of the busiest rank's bytes (kept apart: FACTOR's loop runs sweeps)
FACTOR_V = {"all_to_all_v": lambda n: (n - 1) / n}
# per-rank count for a -b size of fp32 on n ranks: size/elt, divided by n where the buffer holds n chunks
PER_RANK_CHUNKS = {"all_gather", "reduce_scatter", "all_to_all"}


def torchrun(nproc: int, *args: str, timeout: float = 240, extra: list[str] | None = None, faults: str = ""):
    """``torchrun … -m opbench.comm args``; ``faults`` is OPBENCH_FAULTS (core.faults) for every rank."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        *(extra or ["--standalone"]),
        "-m",
        "opbench.comm",
        *args,
    ]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**ENV, "OPBENCH_FAULTS": faults}, cwd=ROOT
    )


def rows(report: Path, collective: str) -> list[dict[str, str]]:
    with open(report / f"{collective}_benchmark.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def expected_count(collective: str, size: int, n: int) -> int:
    return size // 4 // (n if collective in PER_RANK_CHUNKS else 1)


def assert_nccl_tests_numbers(r: dict[str, str], n: int) -> None:
    coll, size = r["collective"], int(r["size_bytes"])
    assert r["status"] == "ok", r
    t = float(r["time_us"]) * 1e-6
    assert t > 0 and float(r["time_us_max"]) >= float(r["time_us"]) * 0.999
    assert float(r["time_us_trial_min"]) <= float(r["time_us"]) <= float(r["time_us_trial_max"])
    assert float(r["algbw_gbs"]) == pytest.approx(size / t / 1e9, rel=1e-3)
    assert float(r["busbw_gbs"]) == pytest.approx(
        float(r["algbw_gbs"]) * {**FACTOR, **FACTOR_V}[coll](n), rel=1e-3, abs=1e-9
    )


def test_two_ranks_self_launched(tmp_path):
    """`opbench comm --nproc-per-node 2` starts torchrun itself; sweep plus model-derived sizes, check on."""
    out = tmp_path / "r"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "opbench",
            "comm",
            "--nproc-per-node",
            "2",
            "-b",
            "1K",
            "-e",
            "4K",
            "-f",
            "4",
            "--check",
            "--model",
            "Mixtral_8x7B",
            "--seqlen",
            "4",
            "--report-dir-path",
            str(out),
            *QUICK,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=ENV,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch.distributed.run" in proc.stderr and "# Avg bus bandwidth" in proc.stdout
    for coll in FACTOR:
        got = rows(out, coll)
        sweep = [r for r in got if r["source"] == "sweep"]
        variants = 2 if coll in ("all_gather", "reduce_scatter") else 1
        assert [int(r["size_bytes"]) for r in sweep] == [1024] * variants + [4096] * variants
        for r in got:
            assert (r["world_size"], r["nnodes"], r["nranks"], r["backend"], r["wrong"]) == ("2", "1", "2", "gloo", "0")
            assert int(r["count"]) == expected_count(coll, int(r["size_bytes"]), 2)
            assert_nccl_tests_numbers(r, 2)
    # Mixtral: hidden 4096, top-2, mbs 1, seq 4, fp32, tp = ep = 2 -> TP/SP/PP activations 64 KiB; the EP
    # all-to-all carries a rank's own seq/tp tokens, top_k copies each: 2·2·4096·4 = 64 KiB
    (a2a,) = [r for r in rows(out, "all_to_all") if r["source"] != "sweep"]
    assert a2a["size_bytes"] == str(4 // 2 * 2 * 4096 * 4) and "EP all-to-all" in a2a["source"]
    model_ar = [r for r in rows(out, "all_reduce") if "TP all-reduce" in r["source"]]
    assert [r["size_bytes"] for r in model_ar] == [str(4 * 4096 * 4)]
    assert not list(out.glob("*.lock"))  # a job that ended gives its writer locks back, files and all


def test_three_ranks_check_catches_a_corrupted_buffer(tmp_path):
    """Rank 1 adds 1 to its first send element before each checked call: every collective that carries that
    element reports exactly the elements it spoils (a broadcast from rank 0 carries none of rank 1's).
    --per-rank fills the straggler columns from every rank's per-call times."""
    out = tmp_path / "r"
    proc = torchrun(
        3,
        "--sizes",
        "1000,3K",
        "--source-label",
        "fsdp",
        "--check",
        "--per-rank",
        "--report-dir-path",
        str(out),
        *QUICK,
        faults="corrupt:1",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    spoiled = {"all_reduce": 3, "all_gather": 3, "reduce_scatter": 1, "all_to_all": 1, "send_recv": 1, "broadcast": 0}
    for coll, wrong in spoiled.items():
        got = rows(out, coll)
        assert got and all(r["source"] == "fsdp" and r["world_size"] == "3" for r in got)
        assert {r["wrong"] for r in got} == {str(wrong)}, (coll, got)
        for r in got:
            size = expected_count(coll, 1000 if r["size_bytes"] in ("996", "1000") else 3072, 3)
            assert int(r["count"]) == size
            assert_nccl_tests_numbers(r, 3)
            assert r["slowest_rank"] in ("0", "1", "2") and 0 < float(r["slowest_share"]) <= 1
            assert float(r["slowest_p95_us"]) >= float(r["slowest_p50_us"]) > 0 and float(r["rank_spread_us"]) >= 0
    # 1000 B is not a multiple of 3 ranks x 4 B: nccl-tests rounds the count down and prints the real size
    assert rows(out, "all_gather")[0]["size_bytes"] == "996" and rows(out, "all_reduce")[0]["size_bytes"] == "1000"


def test_nccl_tests_flags_on_two_ranks_with_logged_sizes(tmp_path):
    """nccl-tests' flags in a real 2-rank job: -d bfloat16 runs bf16, -N 2 writes and prints every case twice
    (column cycle), -a 3 reports the slowest rank (time_us = time_us_max), -z 3 and -m 2 are stated in the header,
    -c 2 checks twice. --sizes-from-trace, repeated, replays a log named 'a,b.log' and another at their logged
    count and datatype."""
    logs = []
    for name, lines in (("a,b.log", [("AllGather", 96, 7)]), ("other.log", [("AllReduce", 500, 9)] * 2)):
        logs.append(tmp_path / name)
        logs[-1].write_text(
            "".join(
                f"gpu1:77:88 [0] NCCL INFO {op}: opCount {i} sendbuff 0x1 recvbuff 0x2 count {count} datatype {dt} "
                f"op 0 root 0 comm 0xa [nranks=2] stream 0xb\n"
                for i, (op, count, dt) in enumerate(lines)
            )
        )
    out = tmp_path / "r"
    proc = torchrun(
        2, "-b", "1K", "--collectives", "all_reduce,all_gather", "-d", "bfloat16", "-N", "2", "-a", "3", "-z", "3",
        "-m", "2", "-c", "2", "--sizes-from-trace", str(logs[0]), "--sizes-from-trace", str(logs[1]),
        "--report-dir-path", str(out), *QUICK,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    header = (
        "iters 2, trials 2, -m 2 calls per iteration, -z 3 (wait and barrier after each iteration, barrier not timed)"
    )
    assert proc.stdout.count(header) == 4  # two collectives, two cycles
    assert "cycle 2 of 2; time = median over trials of the slowest rank" in proc.stdout
    ar, ag = rows(out, "all_reduce"), rows(out, "all_gather")
    for got in (ar, ag):
        assert [r["cycle"] for r in got] == ["1"] * (len(got) // 2) + ["2"] * (len(got) // 2)
        for r in got:
            assert r["wrong"] == "0" and float(r["time_us"]) == float(r["time_us_max"])  # -a 3: the slowest rank
            assert_nccl_tests_numbers(r, 2)
    assert {(r["dtype"], r["count"], r["source"]) for r in ar} == {
        ("bf16", "512", "sweep"),  # 1 KiB of bf16 on each rank
        ("bf16", "500", "trace:a,b.log,other.log nranks=2 calls=2"),
    }
    assert {(r["dtype"], r["count"], r["source"]) for r in ag if r["source"] != "sweep"} == {
        ("fp32", "96", "trace:a,b.log,other.log nranks=2 calls=1")  # the logged datatype (7), not -d
    }
    meta = json.loads((out / "all_reduce_benchmark.meta.json").read_text())
    assert (meta["blocking"], meta["average"], meta["agg_iters"], meta["run_cycles"], meta["check"]) == (3, 3, 2, 2, 2)


@pytest.mark.parametrize("kind", ["exit", "hang"])
def test_dead_or_hung_rank_fails_survivors_cleanly(tmp_path, kind):
    """A rank that exits (as a lost node) or stalls: the survivor prints one clear error and the job exits
    non-zero within about --timeout, instead of hanging."""
    t0 = time.monotonic()
    proc = torchrun(
        2,
        "-b",
        "1K",
        "--collectives",
        "all_reduce",
        "--timeout",
        "4",
        "--report-dir-path",
        str(tmp_path / "r"),
        timeout=120,
        faults=f"{kind}:1",
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("opbench comm: error: rank 0/2")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "all_reduce at 1024 B failed" in errors[0] and "peer rank probably exited or hung" in errors[0]
    assert "Traceback" not in proc.stderr.split("opbench comm: error")[0][-2000:]
    assert elapsed < 90


def test_one_rank_failing_to_allocate_becomes_a_row(tmp_path):
    """Rank 1 alone runs out of memory on the first size: every rank skips that case (no rank is left inside a
    collective its peer never joins), the row says oom, and the next size is measured normally."""
    out = tmp_path / "r"
    proc = torchrun(
        2,
        "-b",
        "1K",
        "-e",
        "4K",
        "-f",
        "4",
        "--collectives",
        "all_reduce",
        "--timeout",
        "20",
        "--report-dir-path",
        str(out),
        *QUICK,
        timeout=120,
        faults="oom:1",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = rows(out, "all_reduce")
    assert first["status"] == "oom" and first["time_us"] == "" and first["busbw_gbs"] == ""
    assert first["error"].startswith("rank 1: out of memory (injected by OPBENCH_FAULTS oom:1)")
    assert second["status"] == "ok" and float(second["time_us"]) > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_loopback(tmp_path):
    """Two torchrun processes with --nnodes 2 on 127.0.0.1: one job of two nodes; only global rank 0 writes."""
    port = _free_port()
    procs = []
    for node in (0, 1):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=1",
            "--nnodes=2",
            f"--node-rank={node}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            "-m",
            "opbench.comm",
            "-b",
            "2K",
            "--collectives",
            "all_reduce,all_gather",
            "--check",
            "--report-dir-path",
            str(tmp_path / f"node{node}"),
            *QUICK,
        ]
        procs.append(
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
        )
    results = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results[0][1][-2000:] + results[1][1][-2000:]
    assert not (tmp_path / "node1").exists()
    for coll in ("all_reduce", "all_gather"):
        for r in rows(tmp_path / "node0", coll):
            assert (r["world_size"], r["nnodes"], r["wrong"]) == ("2", "2", "0")
            assert_nccl_tests_numbers(r, 2)


def test_slurm_environment_without_torchrun(tmp_path):
    """Two plain processes with only srun's variables (SLURM_PROCID/NTASKS/LOCALID/STEP_ID) and the job
    script's MASTER_ADDR/PORT form one job, as under `srun python -m opbench.comm`; also the 2-rank ping-pong
    and per-call blocking."""
    port = _free_port()
    base = {k: v for k, v in ENV.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    procs = []
    for rank in (0, 1):
        env = {
            **base,
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": str(rank),
            "SLURM_NNODES": "1",
            "SLURM_STEP_ID": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        cmd = [
            sys.executable,
            "-m",
            "opbench.comm",
            "-b",
            "1K",
            "--collectives",
            "all_to_all,send_recv",
            "--check",
            "--p2p-mode",
            "pingpong",
            "--blocking",
            "--per-rank",
            "--report-dir-path",
            str(tmp_path / f"rank{rank}"),
            *QUICK,
        ]
        procs.append(
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        )
    results = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results[0][1][-2000:] + results[1][1][-2000:]
    (row,) = rows(tmp_path / "rank0", "all_to_all")
    assert (row["world_size"], row["count"], row["wrong"]) == ("2", "128", "0")
    (p2p,) = rows(tmp_path / "rank0", "send_recv")
    assert (p2p["pattern"], p2p["count"], p2p["wrong"]) == ("pingpong", "256", "0")
    assert_nccl_tests_numbers(p2p, 2)
    # per-call times are one-way like time_us (a ping-pong iteration is a round trip, halved for both)
    assert 0 < float(p2p["slowest_p50_us"]) < 1.5 * float(p2p["time_us_max"]), p2p
    assert not (tmp_path / "rank1").exists()


def test_self_launched_job_with_a_dead_rank_ends_in_clear_lines(tmp_path):
    """`opbench comm --nproc-per-node 2` starting torchrun itself: rank 1 vanishes; the survivor's one error line
    and one closing line naming the failed rank are all the user sees — no torchrun traceback."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "opbench",
            "comm",
            "--nproc-per-node",
            "2",
            "-b",
            "1K",
            "--collectives",
            "all_reduce",
            "--timeout",
            "4",
            "--report-dir-path",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**ENV, "OPBENCH_FAULTS": "exit:1"},
        cwd=ROOT,
    )
    assert proc.returncode != 0
    lines = proc.stderr.splitlines()
    assert sum(ln.startswith("opbench comm: error: rank 0/2: all_reduce at 1024 B failed") for ln in lines) == 1
    assert lines[-1].startswith("opbench comm: error: rank 0 ended with exit code 1")
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr


def test_a_stopped_rank_does_not_keep_the_job_alive(tmp_path):
    """SIGSTOP on rank 1 mid-run: SIGTERM cannot end a stopped process, so torchrun alone would wait; the job ends
    about --timeout + STOP_GRACE_S after the stop, in clear lines."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "opbench",
            "comm",
            "--nproc-per-node",
            "2",
            "-b",
            "1K",
            "--collectives",
            "all_reduce",
            "-n",
            "1000000",
            "--timeout",
            "5",
            "--report-dir-path",
            str(tmp_path),
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=ROOT,
    )
    rank1 = None
    deadline = time.monotonic() + 120
    while rank1 is None and time.monotonic() < deadline:
        time.sleep(0.5)
        for pid in _descendants(proc.pid):
            try:
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if b"LOCAL_RANK=1" in env and b"opbench.comm" in open(f"/proc/{pid}/cmdline", "rb").read():
                rank1 = pid
    assert rank1 is not None, "rank 1 never started"
    time.sleep(3)  # inside the timed loop
    os.kill(rank1, signal.SIGSTOP)
    stopped_at = time.monotonic()
    _, err = proc.communicate(timeout=120)
    took = time.monotonic() - stopped_at
    assert proc.returncode != 0 and took < 5 + 10 + 10, (took, err[-2000:])
    assert "did not stop within 10 s after a rank failed" in err and "Traceback" not in err
    try:
        os.kill(rank1, signal.SIGKILL)  # should be gone already; never leave a stopped process behind
    except OSError:
        pass


def test_ranks_started_with_different_arguments_stop_with_one_line(tmp_path):
    """--dtype fp32 on one rank and int32 on the other (or -b 1K against 2K): no meaningless numbers, no abort
    inside gloo — every rank stops before timing with one line naming the flag."""
    port = _free_port()
    base = {k: v for k, v in ENV.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    procs = []
    for rank, dtype in ((0, "fp32"), (1, "int32")):
        env = {**base, "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank),
               "SLURM_NNODES": "1", "SLURM_STEP_ID": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        cmd = [sys.executable, "-m", "opbench.comm", "-b", "1K", "--dtype", dtype, "--report-dir-path",
               str(tmp_path / f"r{rank}"), *QUICK]  # fmt: skip
        procs.append(
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        )
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [2, 2], results
    for _, err in results:
        assert (
            "field '--dtype': the ranks were started with different arguments: rank 1 has 'int32', rank 0 has 'fp32'"
            in err
        )
        assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r0" / "all_reduce_benchmark.csv").exists()


def test_a_second_job_into_the_same_folder_stops_at_once_naming_the_first(tmp_path):
    """Rank 0 takes every CSV's writer lock before the first call (core.outputs): a second job into the same
    folder ends in one line naming the first while the first still runs, instead of mixing rows into its CSV."""
    cmd = [sys.executable, "-m", "opbench", "comm", "--nproc-per-node", "2", "-b", "1K", "--collectives", "all_reduce"]
    first = subprocess.Popen(
        [*cmd, "--timeout", "60", "--report-dir-path", str(tmp_path)],
        env={**ENV, "OPBENCH_FAULTS": "hang:1"},  # holds the folder: rank 1 sleeps before its first timed step
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        lock = tmp_path / "all_reduce_benchmark.csv.lock"
        deadline = time.monotonic() + 90
        while not lock.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert lock.exists(), "the first job never took its lock"
        started = time.monotonic()
        second = subprocess.run(
            [*cmd, "--report-dir-path", str(tmp_path)], capture_output=True, text=True, timeout=120, env=ENV, cwd=ROOT
        )
        took = time.monotonic() - started
        assert second.returncode != 0 and first.poll() is None  # the first job is still running
        errors = [ln for ln in second.stderr.splitlines() if "another opbench run is writing this file" in ln]
        assert len(errors) == 1 and "(pid " in errors[0], second.stderr
        assert took < 50, f"took {took:.0f} s: the second job waited instead of stopping at once"
    finally:
        first.send_signal(signal.SIGTERM)  # the launcher passes it on: torchrun and the ranks run in their own groups
        try:
            first.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()


def test_all_to_all_v_on_two_ranks_checks_values_and_follows_alltoallv_perf(tmp_path):
    """Uneven splits from a Zipf routing and a MoE model's dispatch/combine, 2 ranks, gloo. Rank 1 adds 1 to its first
    send element before each checked call: the check, built from the split matrix, finds exactly that element on
    rank 0 and every other element as the matrix says. Size, algbw and busbw are nccl-tests 2.19 alltoallv_perf's,
    written out here: the busiest rank's max(send, recv) bytes, busbw = algbw · (n−1)/n."""
    out = tmp_path / "r"
    proc = torchrun(2, "--collectives", "all_to_all_v", "--sizes", "16K", "--routing", "balanced,zipf:1.2",
                    "--hidden", "16", "--model", "Mixtral_8x7B", "--seqlen", "16", "--check", "--report-dir-path",
                    str(out), *QUICK, faults="corrupt:1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {r["source"]: r for r in rows(out, "all_to_all_v")}
    assert len(got) == 6 and {r["wrong"] for r in got.values()} == {"1"}, got  # 2 sizes + 2 routings × 2 directions
    for r in got.values():
        assert_nccl_tests_numbers(r, 2)  # algbw = size / time; busbw = algbw · (n−1)/n
    bal = got["sizes a2av dispatch balanced k=2 h=16"]
    zipf = got["sizes a2av dispatch zipf:1.2 k=2 h=16"]
    # 16 KiB fp32 = 128 tokens · top-2 · 16 elements per rank; 16 experts, 8 per rank
    assert (bal["size_bytes"], bal["count"], bal["imbalance"]) == ("16384", "2048", "1")
    meta = json.loads((out / "all_to_all_v_benchmark.meta.json").read_text())["all_to_all_v"]
    z = next(m for m in meta if m["routing"] == "zipf:1.2")
    assert z["send_bytes"] == [16384, 16384] and sum(z["recv_bytes"]) == 32768
    assert int(zipf["size_bytes"]) == max(z["recv_bytes"]) == z["split_elements"][0][0] * 2 * 4
    assert float(zipf["imbalance"]) == pytest.approx(max(z["recv_bytes"]) / 16384, rel=1e-4)
    mixtral = [r for s, r in got.items() if s.startswith("Mixtral") and "balanced" in s]
    assert [r["size_bytes"] for r in mixtral] == [
        str(16 // 2 * 2 * 4096 * 4)
    ] * 2  # seq/tp·k·hidden·elt: dispatch, combine
    assert "# sizes a2av dispatch zipf:1.2 k=2 h=16; busiest rank / mean" in proc.stdout
