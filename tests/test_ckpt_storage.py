"""Checkpoint storage that fails, on real S3 servers (moto): the three ways it fails at the door are named apart
(endpoint unreachable, bucket missing, access denied — moto's authenticating mode), an endpoint that dies
mid-run ends the storage's remaining cases at once with one line each (tracebacks in a log beside the CSV), and
credentials given in --storage-options reach no file and no console line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from opbench.ckpt.__main__ import main
from opbench.core.errors import run_cli

BUCKET = "opbench-ckpt"
KEY, SECRET = "AKIAOPBENCHTESTKEY01", "s3cr3t/OPBENCH+never-written"  # moto without auth accepts any pair
CREDS = dict(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def moto():
    """A moto S3 server in this process (no authentication) with one bucket; stop() kills it mid-test."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    import s3fs

    s3fs.S3FileSystem(endpoint_url=url, key="testing", secret="testing", skip_instance_cache=True).makedirs(
        BUCKET, exist_ok=True
    )
    server.url = url  # type: ignore[attr-defined]
    yield server
    try:
        server.stop()
    except Exception:  # noqa: BLE001 - stopped by the test already
        pass


@pytest.fixture
def moto_auth():
    """moto in its authenticating mode (INITIAL_NO_AUTH_ACTION_COUNT=0: every request is checked against moto's
    IAM, where no access key exists), as its own process: the mode is read when moto is imported."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def aws_env(monkeypatch):
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)


def _ckpt(capsys, tmp_path, storage: str, options: dict, *extra: str) -> tuple[int, str, str]:
    argv = ["--size-mb", "1", "--iterations", "1", "--device", "cpu", "--storage", storage]
    argv += ["--storage-options", json.dumps(options), "--report-dir-path", str(tmp_path / "out"), *extra]
    rc = run_cli(main, argv, prog="opbench ckpt")
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_unreachable_missing_bucket_and_refused_credentials_are_three_clear_lines(
    tmp_path, capsys, aws_env, moto, moto_auth
):
    closed = f"http://127.0.0.1:{_free_port()}"
    cases = [
        ({"endpoint_url": closed}, f"s3://{BUCKET}/x", f"endpoint unreachable: cannot connect to {closed}"),
        ({"endpoint_url": moto.url}, "s3://no-such-bucket/x", "bucket 'no-such-bucket' does not exist"),
        (
            {"endpoint_url": moto_auth, "key": KEY, "secret": SECRET},
            f"s3://{BUCKET}/x",
            "access denied: the storage refused these credentials (InvalidAccessKeyId: The AWS Access Key Id",
        ),
    ]
    for options, storage, needle in cases:
        start = time.perf_counter()
        rc, out, err = _ckpt(capsys, tmp_path, storage, options)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert f"{storage}: field '--storage': {needle}" in err, err
        assert SECRET not in err + out and KEY not in err + out
        assert time.perf_counter() - start < 30  # bounded retries (botocore's default would take minutes here)
        assert not (tmp_path / "out" / "ckpt_benchmark.csv").exists()


def test_a_storage_that_dies_mid_run_ends_its_cases_at_once_with_one_line(
    tmp_path, capsys, aws_env, moto, monkeypatch, record
):
    """The endpoint goes away after the first S3 case (the local storage's cases ran before): the next S3 case
    fails within seconds (bounded retries) and the storage's remaining cases get the same one-line reason without
    being tried. Error cells are one line; the traceback is in ckpt_benchmark.errors.log."""
    from opbench.ckpt import runner

    real_run_case, stopped = runner.run_case, {}

    def run_case_then_kill_s3(ranks, state, case, *args, **kwargs):
        result = real_run_case(ranks, state, case, *args, **kwargs)
        if case.storage.is_url and not stopped:
            moto.stop()
            stopped["at"] = time.perf_counter()
        return result

    monkeypatch.setattr(runner, "run_case", run_case_then_kill_s3)
    local = tmp_path / "local"
    rc, _, err = _ckpt(
        capsys,
        tmp_path,
        f"{local},s3://{BUCKET}/x",
        {"endpoint_url": moto.url, "key": KEY, "secret": SECRET},
        "--methods",
        "torch_save,dcp,dcp_async",
        "--thread-count",
        "1,2",
    )
    ended = time.perf_counter() - stopped["at"]
    assert rc == 1
    rows = pd.read_csv(tmp_path / "out" / "ckpt_benchmark.csv", keep_default_na=False)
    s3 = rows[rows["storage"].str.startswith("s3://")]
    assert list(s3["status"]) == ["ok"] + ["error"] * 5  # raw ran; torch_save, dcp ×2, dcp_async ×2 did not
    reason = f"endpoint unreachable: cannot connect to {moto.url}"
    assert set(s3["error"][1:]) == {reason}, s3["error"].tolist()
    assert set(rows[~rows.index.isin(s3.index)]["status"]) == {"ok"} and len(rows) == 12
    assert ended < 15, f"{ended:.1f} s from the endpoint's death to the end of the run"
    assert f"s3://{BUCKET}/x: {reason}; its remaining cases were not run" in err
    log = (tmp_path / "out" / "ckpt_benchmark.errors.log").read_text()
    assert "Traceback" in log and "s0_torch_save on s3://" in log and log.count("--- ") == 1
    for path in (tmp_path / "out").iterdir():
        text = path.read_text()
        assert SECRET not in text and KEY not in text, path
    meta = json.loads((tmp_path / "out" / "ckpt_benchmark.meta.json").read_text())
    assert meta["args"]["storage_options"] == {"endpoint_url": moto.url, "key": "***", "secret": "***"}  # parsed
    record(f"ckpt: S3 endpoint killed mid-run: the run ended {ended:.1f} s later (5 cases left on it)")


def test_credentials_in_storage_options_reach_no_file_and_no_console_line(tmp_path, aws_env, moto):
    """Two ranks (opbench starts torchrun, printing its command line) save to S3 with the key and secret given in
    --storage-options: every file written and everything printed holds them as ***, never their values."""
    out = tmp_path / "out"
    options = json.dumps({"endpoint_url": moto.url, "key": KEY, "secret": SECRET})
    cmd = [sys.executable, "-m", "opbench.ckpt", "--nproc-per-node", "2", "--size-mb", "1", "--iterations", "1"]
    cmd += ["--methods", "dcp", "--storage", f"s3://{BUCKET}/x", "--storage-options", options]
    cmd += ["--report-dir-path", str(out)]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = proc.stdout + proc.stderr
    assert SECRET not in printed and KEY not in printed and '"secret": "***"' in printed  # the torchrun line
    files = [p for p in Path(out).rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"ckpt_benchmark.csv", "ckpt_benchmark.meta.json"}
    for path in files:
        text = path.read_text()
        assert SECRET not in text and KEY not in text, path
    meta = json.loads((out / "ckpt_benchmark.meta.json").read_text())
    assert meta["args"]["storage_options"] == {"endpoint_url": moto.url, "key": "***", "secret": "***"}  # parsed


def test_s3_retries_are_bounded_unless_the_user_sets_them():
    from opbench.ckpt.storage import S3_RETRIES, Storage

    assert Storage("s3://b/x").fs_options == {"config_kwargs": {"retries": S3_RETRIES}}
    mine = {"config_kwargs": {"retries": {"max_attempts": 10}, "connect_timeout": 3}, "default_block_size": 5}
    assert Storage("s3://b/x", mine).fs_options == mine
    assert Storage("s3://b/x", {"config_kwargs": {"connect_timeout": 3}}).fs_options == {
        "config_kwargs": {"retries": S3_RETRIES, "connect_timeout": 3}
    }
    assert Storage("gs://b/x", {"token": "t"}).fs_options == {"token": "t"} and Storage("/d").fs_options == {}
