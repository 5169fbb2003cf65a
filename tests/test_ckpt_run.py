"""Real runs: two gloo ranks under torchrun save and load a model-shaped state with every method, on local disk
and on a real S3 server (moto, started here) with multipart uploads; failures on one rank become error rows."""

from __future__ import annotations

import csv
import json
import os
import shlex
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

from opbench.ckpt.state import deterministic_tensor, model_state_spec, shard_range, tensor_seed
from opbench.models import load_model_configs

pytestmark = pytest.mark.slow
BUCKET = "opbench-ckpt"
PART = 5 * 2**20  # S3's smallest multipart part; s3fs uploads in blocks of this size
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 352,
    "vocab_size": 2048,
    "num_hidden_layers": 2,
    "tie_word_embeddings": False,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_env():
    """A moto S3 server in this process, one bucket, and the environment that points boto/s3fs at it."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = dict(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
    )
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=env["AWS_ENDPOINT_URL"], skip_instance_cache=True)
    fs.mkdir(BUCKET)
    yield env, fs
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


def _run(cmd: list[str], env: dict[str, str], timeout: float = 420) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        cmd, env={**os.environ, **env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=timeout
    )
    return proc


def test_every_method_on_local_disk_and_s3_with_two_ranks(tmp_path, s3_env):
    env, fs = s3_env
    cfg_path = tmp_path / "tiny_llama.json"
    cfg_path.write_text(json.dumps(TINY_LLAMA))
    local = tmp_path / "local"
    out = tmp_path / "out"
    s3_url = f"s3://{BUCKET}/run1"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "opbench.ckpt",
        "--model-config-path",
        str(cfg_path),
        "--param-dtype",
        "bf16",
        "--methods",
        "torch_save,dcp,dcp_async,dcp_async_process",
        "--thread-count",
        "1,2",
        "--storage",
        f"{local},{s3_url}",
        "--storage-options",
        json.dumps({"default_block_size": PART}),
        "--iterations",
        "2",
        "--drop-cache",
        "--keep",
        "--report-dir-path",
        str(out),
    ]
    proc = _run(cmd, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "async save_block_time = copying the state into host memory (pageable) (staging); planning" in proc.stdout

    rows = pd.read_csv(out / "ckpt_benchmark.csv")
    # a batch log (stdout is a pipe) has one progress line per case, from rank 0 only, with its method and figures
    lines = [
        ln.split() for ln in proc.stdout.splitlines() if ln.lstrip().startswith(tuple(f"{i}/16" for i in range(1, 17)))
    ]
    assert [ln[2] for ln in lines] == list(rows["method"]) and all(ln[-1] == "ok" for ln in lines)
    meta = json.loads((out / "ckpt_benchmark.meta.json").read_text())
    spec = model_state_spec(load_model_configs(str(cfg_path))[0], "adam", "bf16")
    assert len(rows) == 16 and set(rows["status"]) == {"ok"} and rows["verified"].all() and rows["accurate"].all()
    assert set(rows["world_size"]) == {2} and set(rows["num_saved"]) == {2} and set(rows["num_loaded"]) == {2}
    assert set(rows["method"]) == {"raw", "torch_save", "dcp", "dcp_async", "dcp_async_process"}
    # raw, first on each storage: exactly the state's bytes; every other row's bandwidth as a % of raw's there
    raw = rows[rows["method"] == "raw"].set_index("storage")
    assert list(rows.drop_duplicates("storage")["method"]) == ["raw", "raw"]
    assert (raw["iter_folder_size"] == spec.total_bytes).all() and (raw["pct_of_raw_save"] == 100).all()
    # DCP saves by phase: the median save's phases add up to its total (within 5 %; with 2 iterations the lower
    # middle save, in the sidecar); async (thread) adds staging; process-mode async writes in a daemon, and
    # torch_save/raw have no phases
    phases = ["save_staging_time", "save_planning_time", "save_writing_time", "save_finishing_time"]
    saves = {(c["method"], c["storage"], c["thread_count"]): sorted(c["total"]) for c in meta["cases"]}
    for _, r in rows.iterrows():
        if r.method in ("dcp", "dcp_async"):
            lower_middle = saves[(r.method, r.storage, int(r.thread_count))][0]
            assert r[phases].fillna(0).sum() == pytest.approx(lower_middle, rel=0.05), r.to_dict()
            assert all(r[p] >= 0 for p in phases[1:]) and pd.isna(r.save_staging_time) == (r.method == "dcp")
        else:
            assert r[phases].isna().all()
        if r.async_save:
            assert r.save_overlap_time >= 0
    for _, r in rows[rows["method"] != "raw"].iterrows():
        ref = raw.loc[r.storage]
        assert r.pct_of_raw_save == pytest.approx(
            100 * r.save_bandwidth_mib_per_s / ref.save_bandwidth_mib_per_s, rel=1e-4
        )
        assert r.pct_of_raw_load == pytest.approx(
            100 * r.load_bandwidth_mib_per_s / ref.load_bandwidth_mib_per_s, rel=1e-4
        )
    assert (rows["state_bytes"] == spec.total_bytes).all() and (rows["iter_folder_size"] >= spec.total_bytes).all()
    for _, r in rows.iterrows():
        # bandwidth = iter_folder_size / 2^20 / median time (CSV keeps 6 significant digits)
        assert r.save_bandwidth_mib_per_s == pytest.approx(r.iter_folder_size / 2**20 / r.save_total_time, rel=2e-5)
        assert r.load_bandwidth_mib_per_s == pytest.approx(r.iter_folder_size / 2**20 / r.load_time, rel=2e-5)
        assert 0 < r.save_block_time <= r.save_total_time
        if not r.async_save:
            assert r.save_block_time == r.save_total_time and pd.isna(r.async_staging)
        else:  # a CPU device: DCP's default staging copy into pageable memory (pinned memory needs a GPU)
            assert r.async_staging == "host memory (pageable)"
        assert r.drop_cache == (not r.storage.startswith("s3://"))  # evicted where the files are local

    cases = {(c["method"], c["storage"], c["thread_count"]): c for c in meta["cases"]}
    assert len(cases) == 16
    # the recorded command is the torchrun line the user typed (re-runnable), the rank's own is beside it
    assert meta["command"].startswith(f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node 2")
    assert "torch.distributed.run" not in meta["rank_command"] and "opbench.ckpt" in meta["rank_command"]
    for case in cases.values():
        assert len(case["total"]) == 2 and all(len(per) == 2 for per in case["per_rank"]["total"])
        assert all(b <= t for b, t in zip(case["block"], case["total"]))
        assert case["total"] == [max(per) for per in case["per_rank"]["total"]]
        assert case["warmup_s"] > 0

    # Sizes in the CSV are the files really written (--keep left them in place).
    run_dir = Path(meta["run_dirs"][0])
    torch_iter = run_dir / "s0_torch_save" / "iter_0000001"
    assert sorted(p.name for p in torch_iter.iterdir()) == ["rank_00000.pt", "rank_00001.pt"]
    on_disk = sum(p.stat().st_size for p in torch_iter.iterdir())
    assert cases[("torch_save", str(local), None)]["sizes"][0] == on_disk
    dcp_iter = run_dir / "s0_dcp_t2" / "iter_0000002"
    # thread_count=2: each rank's single-file-per-rank data is split over one file per writer thread
    assert {p.name for p in dcp_iter.iterdir()} == {
        ".metadata",
        "__0_0.distcp",
        "__0_1.distcp",
        "__1_0.distcp",
        "__1_1.distcp",
    }

    # The DCP checkpoint is a real sharded one: consolidated offline, each tensor's dim-0 chunk r is rank r's.
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(dcp_iter, tmp_path / "full.pt")
    full = torch.load(tmp_path / "full.pt", weights_only=True)
    assert set(full) == {t.key for t in spec.tensors}
    for t in spec.tensors:
        assert tuple(full[t.key].shape) == t.shape
        for rank in range(2):
            start, length = shard_range(t.shape[0], rank, 2)
            want = deterministic_tensor(t.local_shape(rank, 2), t.dtype, tensor_seed(t.key, rank), torch.device("cpu"))
            assert torch.equal(full[t.key][start : start + length], want), t.key

    # On S3 the ~6 MiB per-rank files (torch_save, DCP with one thread) went up in 5 MiB parts (multipart ETags end in -<parts>).
    s3_run = meta["run_dirs"][1].split("://", 1)[1]
    fs.invalidate_cache()
    objects = fs.find(s3_run, detail=True)
    big = {k: v for k, v in objects.items() if v["size"] > PART}
    assert big and all(v["ETag"].strip('"').endswith("-2") for v in big.values()), big
    assert any(k.endswith("rank_00001.pt") for k in big) and any(k.endswith("__1_0.distcp") for k in big)
    s3_dcp = f"{s3_run}/s0_dcp_async_process_t2/iter_0000001"
    assert cases[("dcp_async_process", s3_url, 2)]["sizes"][0] == sum(
        v["size"] for k, v in objects.items() if k.startswith(s3_dcp + "/")
    )


INJECT = textwrap.dedent('''
    """Test-only: rank 1 finds the disk full when torch.save writes its file; DCP loads come back corrupted."""
    import builtins, errno, os
    if os.environ.get("OPBENCH_CKPT_INJECT") == "1":
        _open = builtins.open
        def _full_disk_open(file, mode="r", *args, **kwargs):
            if os.environ.get("RANK") == "1" and "w" in mode and str(file).endswith("rank_00001.pt") \\
                    and "warmup" not in str(file):
                raise OSError(errno.ENOSPC, "No space left on device", str(file))
            return _open(file, mode, *args, **kwargs)
        builtins.open = _full_disk_open
        import torch.distributed.checkpoint as dcp
        _load = dcp.load
        def _corrupt_load(state_dict, *args, **kwargs):
            result = _load(state_dict, *args, **kwargs)
            victim = [v for k, v in state_dict.items() if not k.startswith("warmup")]
            if victim and os.environ.get("RANK") == "0":
                victim[0].to_local().view(-1)[0] += 1
            return result
        dcp.load = _corrupt_load
''')


def test_failures_on_one_rank_become_rows_and_a_nonzero_exit(tmp_path):
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(INJECT)
    env = {
        "OPBENCH_CKPT_INJECT": "1",
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "inject"), os.environ.get("PYTHONPATH", "")]),
    }
    out = tmp_path / "out"
    proc = _run(
        [
            sys.executable,
            "-m",
            "opbench.ckpt",
            "--nproc-per-node",
            "2",
            "--size-mb",
            "2",
            "--param-dtype",
            "fp32",
            "--methods",
            "torch_save,dcp",
            "--no-raw",
            "--iterations",
            "1",
            "--storage",
            str(tmp_path / "data"),
            "--report-dir-path",
            str(out),
        ],
        env,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 of 2 cases failed or did not verify" in proc.stderr
    rows = pd.read_csv(out / "ckpt_benchmark.csv").set_index("method")
    full = rows.loc["torch_save"]
    assert full.status == "error" and "rank 1: disk full" in full.error
    assert pd.isna(full.save_total_time) and pd.isna(full.iter_folder_size) and pd.isna(full.verified)
    bad = rows.loc["dcp"]  # the sweep went on after the failed case
    assert bad.status == "error" and not bad.verified and "contents differ" in bad.error
    assert bad.save_total_time > 0 and bad.iter_folder_size > 2 * 2**20
    assert not list((tmp_path / "data").iterdir())  # checkpoints cleaned up after the run
    # the state was written and removed once, untimed, before its first case (ckpt.__main__.prime_storages)
    assert json.loads((out / "ckpt_benchmark.meta.json").read_text())["states"][0]["prime_s"] > 0


def test_srun_environment_is_one_world_and_a_corrupt_rank_is_caught(tmp_path):
    """Two plain processes with only srun's variables form ONE 2-rank world (not two 1-rank worlds): rank 0
    alone writes the CSV with world_size 2. OPBENCH_FAULTS=corrupt:1 damages what rank 1 saved, and every
    method's verified load catches it on rank 1."""
    port = _free_port()
    out = tmp_path / "out"
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    procs = []
    for rank in (0, 1):
        env = {
            **base,
            "OMP_NUM_THREADS": "1",
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": str(rank),
            "SLURM_NNODES": "1",
            "SLURM_NODEID": "0",
            "SLURM_STEP_ID": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OPBENCH_FAULTS": "corrupt:1",
        }
        cmd = [
            sys.executable,
            "-m",
            "opbench.ckpt",
            "--size-mb",
            "1",
            "--methods",
            "torch_save,dcp",
            "--no-raw",
            "--iterations",
            "1",
            "--storage",
            str(tmp_path / "data"),
            "--report-dir-path",
            str(out),
            "--timeout",
            "120",
        ]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [1, 1], results[0][1][-3000:] + results[1][1][-3000:]
    rows = pd.read_csv(out / "ckpt_benchmark.csv")
    assert list(rows["method"]) == ["torch_save", "dcp"] and set(rows["world_size"]) == {2}
    assert set(rows["status"]) == {"error"}
    assert all("rank 1" in e and "rank 0" not in e for e in rows["error"]), list(rows["error"])
    assert json.loads((out / "ckpt_benchmark.meta.json").read_text())["launcher"] == "slurm"


def _written(root, suffix: str) -> bool:
    """Whether a file ending in ``suffix`` is under ``root``, outside the untimed priming writes (ckpt's ``prime``
    folder), read while the job writes and removes folders (os.walk passes over one that vanished)."""
    return any(name.endswith(suffix) for folder, _, names in os.walk(root) if "/prime" not in folder for name in names)


def test_sigterm_to_every_task_cleans_up_like_ctrl_c(tmp_path):
    """scancel and Slurm's time limit send SIGTERM to every task: the ranks stop as on Ctrl-C, rank 0 removes
    the checkpoint data, rows already written stay, and the exit code is 143. (A rank caught inside a collective
    its peer left waits at most --timeout, then reports the broken job: exit 1.)"""
    import signal
    import time

    port = _free_port()
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    procs = []
    for rank in (0, 1):
        env = {**base, "OMP_NUM_THREADS": "1", "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2",
               "SLURM_LOCALID": str(rank), "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_STEP_ID": "0",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        cmd = [sys.executable, "-m", "opbench.ckpt", "--size-mb", "16", "--methods", "torch_save", "--no-raw", "--iterations",
               "200", "--storage", str(tmp_path / "data"), "--report-dir-path", str(tmp_path / "out"),
               "--timeout", "15"]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + 180
    while (
        time.monotonic() < deadline and all(p.poll() is None for p in procs) and not _written(tmp_path / "data", ".pt")
    ):
        time.sleep(0.2)
    if not _written(tmp_path / "data", ".pt"):  # say why: a rank that died (rendezvous, import) or a slow one
        for p in procs:
            p.kill()
        ends = [(p.returncode, *p.communicate(timeout=60)) for p in procs]
        pytest.fail(
            "no checkpoint written; (exit, stdout, stderr) per rank:\n"
            + "\n".join(f"exit {code}:\n{out[-1500:]}\n{err[-3000:]}" for code, out, err in ends)
        )
    time.sleep(1.0)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    results = [p.communicate(timeout=120) for p in procs]
    # both stop; a rank whose peer left first may report the broken job instead (exit 1), never a traceback
    codes = [p.returncode for p in procs]
    csv_text = (
        (tmp_path / "out" / "ckpt_benchmark.csv").read_text()
        if (tmp_path / "out" / "ckpt_benchmark.csv").exists()
        else ""
    )
    assert set(codes) <= {143, 1} and 143 in codes, (codes, results, csv_text[-1500:])
    assert any("terminated (SIGTERM)" in err for _, err in results)
    assert all("Traceback" not in err for _, err in results), results
    assert not [f for f in (tmp_path / "data").rglob("*") if f.is_file()]  # no checkpoint bytes left behind
    assert (tmp_path / "out" / "ckpt_benchmark.csv").exists()


@pytest.mark.parametrize(
    "signame,code,said",
    [("SIGTERM", 143, "terminated (SIGTERM); "), ("SIGINT", 130, "interrupted; ")],
)
def test_a_signal_to_the_launcher_stops_a_dcp_job_and_cleans_up(tmp_path, signame, code, said):
    """SIGTERM or SIGINT to a self-launched `opbench ckpt` (kill PID, `timeout -s INT`; a terminal's Ctrl-C
    reaches the launcher alone too, torchrun runs in a process group of its own) while its ranks run DCP saves:
    it reaches the ranks through torchrun, they remove the data, no interrupted save becomes an error row, the
    launcher exits 143 / 130 with no torchrun traceback and says so once, and torchrun's OMP_NUM_THREADS banner
    never shows (the launcher sets that variable itself). Before the SIGINT, a Ctrl-Z (SIGTSTP) to the launcher
    stops every process of the job, and SIGCONT (`fg`) runs them all again."""
    import signal
    import time

    from opbench.core.dist import _descendants

    def states(pid: int) -> dict[int, str]:
        out = {}
        for p in [pid, *_descendants(pid)]:
            try:
                out[p] = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]
            except OSError:
                pass
        return out

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    cmd = [sys.executable, "-m", "opbench", "ckpt", "--nproc-per-node", "2", "--size-mb", "16", "--methods", "dcp", "--no-raw",
           "--iterations", "200", "--storage", str(tmp_path / "data"), "--report-dir-path", str(tmp_path / "out"),
           "--timeout", "120"]  # fmt: skip
    # --timeout 120: on a loaded CI machine; what is tested is the signal, not --timeout
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a CI shell may start us with it ignored
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None and not _written(tmp_path / "data", ".distcp"):
        time.sleep(0.1)
    if not _written(tmp_path / "data", ".distcp"):
        proc.kill()
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"no DCP checkpoint written (exit {proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
    time.sleep(0.5)
    if signame == "SIGINT":
        proc.send_signal(signal.SIGTSTP)
        time.sleep(1.0)
        stopped = states(proc.pid)
        assert len(stopped) >= 4 and set(stopped.values()) == {"T"}, stopped  # launcher, torchrun, 2 ranks
        proc.send_signal(signal.SIGCONT)
        time.sleep(1.0)
        assert "T" not in states(proc.pid).values(), states(proc.pid)
    stopped_at = time.monotonic()
    proc.send_signal(getattr(signal, signame))
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == code, err[-3000:]
    assert time.monotonic() - stopped_at < 45, err[-3000:]  # 3 × STOP_GRACE_S at most, then the job is killed
    assert err.count(said) == 1 and "Traceback" not in err, err[-3000:]
    said_line = next(line for line in err.splitlines() if said in line)  # rank 0's, naming its CSV
    assert said_line.endswith(str(tmp_path / "out" / "ckpt_benchmark.csv")) or (
        f"({tmp_path / 'out' / 'ckpt_benchmark.csv'} has none)" in said_line
    ), said_line
    rows = list(csv.DictReader(open(tmp_path / "out" / "ckpt_benchmark.csv")))
    assert all(r["status"] == "ok" for r in rows), rows  # the interrupted case is no row, least of all an error
    assert "Setting OMP_NUM_THREADS" not in err, err[-3000:]
    assert not [f for f in (tmp_path / "data").rglob("*") if f.is_file()]
    meta = json.loads((tmp_path / "out" / "ckpt_benchmark.meta.json").read_text())
    assert meta["command"] == shlex.join(cmd)  # the launcher's line, not a rank's 1-rank child command


def test_per_rank_times_name_the_slow_rank(tmp_path):
    """OPBENCH_FAULTS=slow:1:6 makes rank 1's saves and loads take 6× as long: the row keeps the slowest rank's
    time (what the job waits for), the typical rank's below it, and names rank 1 as the slowest."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "opbench", "ckpt", "--nproc-per-node", "2", "--size-mb", "8", "--methods",
           "torch_save", "--iterations", "3", "--storage", str(tmp_path / "data"), "--report-dir-path", str(out)]  # fmt: skip
    proc = _run(cmd, {"OPBENCH_FAULTS": "slow:1:6"}, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = pd.read_csv(out / "ckpt_benchmark.csv").set_index("method")
    assert list(rows.index) == ["raw", "torch_save"]
    for _, r in rows.iterrows():
        assert r.slowest_save_rank == 1 and r.slowest_load_rank == 1
        assert r.save_total_time_rank_median < r.save_total_time and r.load_time_rank_median < r.load_time


def test_storage_one_rank_cannot_see_is_one_clear_error(tmp_path):
    """Rank 1 runs in its own mount namespace with a fresh tmpfs over the storage folder: its 'data' is a
    different disk, as a node-local path is on another node. Every rank stops before measuring, rank 0 with one
    line naming the rank that cannot see its files and the flag; nothing is left in rank 0's folder."""
    import shutil

    if not shutil.which("unshare") or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("needs unshare -m (a private mount namespace) to give one rank its own disk")
    data = tmp_path / "data"
    data.mkdir()
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    procs = []
    for rank in (0, 1):
        env = {**base, "OMP_NUM_THREADS": "1", "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2",
               "SLURM_LOCALID": "0", "SLURM_NNODES": "2", "SLURM_NODEID": str(rank), "SLURM_STEP_ID": "0",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        cmd = [sys.executable, "-m", "opbench.ckpt", "--size-mb", "1", "--methods", "torch_save", "--storage",
               str(data), "--report-dir-path", str(tmp_path / "out"), "--timeout", "60"]  # fmt: skip
        if rank == 1:  # its own view of the storage folder: an empty tmpfs mounted over it
            cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                   f'mount -t tmpfs none "{data}" && exec "$@"', "rank1", *cmd]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=200) for p in procs]
    assert [p.returncode for p in procs] == [2, 2], results
    err = results[0][1].strip().splitlines()
    assert len(err) == 1 and "rank 1 on " in err[0] and "cannot see what rank 0 wrote" in err[0], err
    assert "field '--storage'" in err[0] and "Traceback" not in results[1][1]
    assert not list(data.iterdir())
