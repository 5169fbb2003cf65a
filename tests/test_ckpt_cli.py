"""Bad input to `opbench ckpt` is one line and exit 2, with no report written; --dry-run lists the sweep."""

from __future__ import annotations

import pytest

from opbench.ckpt.__main__ import main
from opbench.core.errors import run_cli


def run(argv, capsys):
    rc = run_cli(main, argv, prog="opbench ckpt")
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--size-mb", "8", "--model", "Llama2_7B"], "--size-mb"),
        (["--size-mb", "-1"], "field '--size-mb': must be a positive, finite number of MiB"),
        (["--methods", "torch_save,zip"], "unknown method 'zip'"),
        (["--storage-options", "{nope"], "field '--storage-options': malformed JSON at line 1"),
        (["--storage-options", "[1]"], "must be a JSON object"),
        (["--storage-options", '{"a": ' + "9" * 5000 + "}"], "'--storage-options': holds a number of more than 4,300"),
        (["--storage-options", "[" * 100000], "field '--storage-options': JSON nested too deeply"),
        (["--model-config-path", "/nonexistent/cfg.json"], "/nonexistent/cfg.json"),
        (["--model", "Llama2_70B", "--device", "cpu"], "use --num-layers"),
        (["--save-interval", "-2"], "--save-interval"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, needle):
    rc, _, err = run([*argv, "--report-dir-path", str(tmp_path)], capsys)
    assert rc == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "ckpt_benchmark.csv").exists()


@pytest.mark.parametrize(
    "storage, needle",
    [
        ("/etc/hostname/ckpt", "cannot write there"),  # a path under a regular file
        ("memory://ckpt", "memory:// is private to each process"),
        ("nosuchproto://bucket/x", "no fsspec file system"),
    ],
)
def test_unusable_storage_fails_before_any_rank_starts(tmp_path, capsys, storage, needle):
    rc, _, err = run(
        ["--size-mb", "1", "--nproc-per-node", "2", "--storage", storage, "--report-dir-path", str(tmp_path)], capsys
    )
    assert rc == 2 and needle in err and storage.split("/")[0] in err
    assert not (tmp_path / "ckpt_benchmark.csv").exists()


def test_not_enough_free_space_is_a_usage_error(tmp_path, capsys):
    rc, _, err = run(
        [
            "--size-mb",
            "1024",
            "--iterations",
            "100000",
            "--nproc-per-node",
            "2",
            "--storage",
            str(tmp_path / "data"),
            "--report-dir-path",
            str(tmp_path),
        ],
        capsys,
    )
    assert rc == 2 and "GiB free" in err
    assert not list((tmp_path / "data").iterdir())  # the probe directory is gone again


def test_dry_run_lists_states_and_the_cartesian_product(tmp_path, capsys):
    rc, out, _ = run(
        [
            "--dry-run",
            "--size-mb",
            "16,32",
            "--methods",
            "torch_save,dcp,dcp_async",
            "--thread-count",
            "1,4",
            "--storage",
            f"{tmp_path},s3://b/p",
            "--nproc-per-node",
            "4",
        ],
        capsys,
    )
    assert rc == 0
    assert "synthetic_16MiB" in out and "synthetic_32MiB" in out
    # per storage: raw and torch_save once each (no thread knob) + 2 DCP methods x 2 thread counts = 6
    assert "12 cases per state" in out
