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


def _row(method, block, total, load, **kw):
    row = dict(model="s", storage="/d", thread_count=1 if method.startswith("dcp") else None, method=method)
    row |= dict(status="ok", save_block_time=block, save_total_time=total, load_time=load)
    row |= dict(async_staging="host memory (pageable)" if method == "dcp_async" else None)
    return row | kw


def test_the_async_note_says_it_blocked_longer_only_when_a_row_shows_it():
    """The note under the table follows the rows: what async block time holds, always; that it blocked longer than
    the dcp save beside it, only when it did (16 ms against 87 ms is no such case), with both figures."""
    from opbench.ckpt.__main__ import async_note
    from opbench.core.units import wrapped

    assert async_note([_row("raw", 0.05, 0.05, 0.04), _row("dcp", 0.087, 0.087, 0.1)], "cpu") is None
    faster = async_note([_row("dcp", 0.087, 0.087, 0.1), _row("dcp_async", 0.016, 0.3, 0.1)], "cpu")
    assert faster == (
        "async save_block_time = copying the state into host memory (pageable) (staging); planning and writing run "
        "in the background."
    )
    slower = async_note([_row("dcp", 0.352, 0.352, 0.1), _row("dcp_async", 0.402, 0.83, 0.1)], "cpu")
    assert slower is not None and slower.startswith(faster)
    assert "Here dcp_async blocked longer than dcp's whole save (0.402 s against 0.352 s): on a CPU" in slower
    other_threads = _row("dcp_async", 0.402, 0.83, 0.1, thread_count=4)  # compared with dcp of its own threads only
    assert "longer" not in async_note([_row("dcp", 0.352, 0.352, 0.1), other_threads], "cpu")
    assert all(len(line) <= 120 for line in wrapped(slower).splitlines())


def test_the_raw_note_comes_only_with_a_row_above_raw_and_shows_raws_own_spread():
    from opbench.ckpt.__main__ import raw_note

    raw = _row("raw", 1.07, 1.07, 0.29, save_total_time_min=1.04, save_total_time_max=1.13)
    raw |= dict(load_time_min=0.2, load_time_max=0.3, pct_of_raw_save=100.0, pct_of_raw_load=100.0)
    below = _row("torch_save", 0.5, 2.0, 0.4, pct_of_raw_save=53.5, pct_of_raw_load=72.5)
    assert raw_note([raw, below]) is None
    above = _row("torch_save", 0.484, 0.484, 0.4, pct_of_raw_save=221.1, pct_of_raw_load=72.5)
    text = raw_note([raw, above])
    assert text is not None and text.startswith(
        "above 100 % of raw: torch_save save 221 % (0.484 s, raw's own saves 1.04-1.13 s). raw writes and reads"
    )
    assert "loaded in place, as dcp" in text and "bench/ckpt_dcp_vs_raw.py" in text


def test_raw_loads_in_place_and_refuses_a_file_of_another_size(tmp_path):
    """raw's load reads into the state's own tensors (no buffer of its own to allocate, as dcp.load), and a file
    shorter or longer than the state is an error, not a pass."""
    import torch

    from opbench.ckpt.methods import Raw, SaveOptions
    from opbench.ckpt.spec import synthetic_state_spec
    from opbench.ckpt.state import ShardedState
    from opbench.ckpt.storage import Storage

    state = ShardedState.build(synthetic_state_spec(1 << 20, "bf16"), 0, 1, torch.device("cpu"))
    storage, path = Storage(str(tmp_path)), str(tmp_path / "it1")
    Raw().save(state, storage, path, SaveOptions())
    assert Raw.loads_in_place
    state.scramble()
    loaded = Raw().load(state, storage, path)
    assert all(loaded[k] is t for k, t in state.tensors.items()) and state.verify(loaded) == []
    target = tmp_path / "it1" / "rank_00000.bin"
    data = target.read_bytes()
    target.write_bytes(data + b"x")
    with pytest.raises(RuntimeError, match=f"holds more than {len(data)} bytes, expected {len(data)}"):
        Raw().load(state, storage, path)
    target.write_bytes(data[:-1])
    with pytest.raises(RuntimeError, match=f"holds {len(data) - 1} bytes, expected {len(data)}"):
        Raw().load(state, storage, path)
