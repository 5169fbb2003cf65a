"""The FSDP model's arithmetic, its CLI (CSV contract, nccl-tests lines, errors) and --run through opbench comm.
Agreement with real FSDP is in test_fsdp_real.py."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from opbench.core.errors import run_cli
from opbench.fsdp_model.__main__ import main
from opbench.fsdp_model.approx import approx_collectives, compare
from opbench.fsdp_model.commands import comm_runs, commands_text
from opbench.fsdp_model.model import (
    fsdp1_alignment_numel,
    fsdp1_shard_numel,
    fsdp2_shard_numel,
    fsdp_collectives,
    step_totals,
    unit_range,
)
from opbench.models import load_model_configs, select_models

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "examples" / "configs" / "tiny-llama")


def builtin(name):
    (cfg,) = select_models(load_model_configs(), name)
    return cfg


def by_key(rows):
    return {(r.unit, r.collective): r for r in rows}


def test_llama3_70b_8_ranks_matches_the_nccl_trace():
    rows = by_key(fsdp_collectives(builtin("Llama3.1_70B"), 8))
    ag = rows[("layers.0", "all_gather")]
    assert ag.count == 106956800  # docs/conventions.md, "FSDP collective sizes", real NCCL trace
    assert (ag.dtype, ag.nranks, ag.calls_per_step) == ("bf16", 8, 2)
    assert ag.bytes_per_rank == 106956800 * 2
    assert ag.nccl_tests_bytes == 106956800 * 2 * 8  # the gathered buffer, not the shard
    rs = rows[("layers.79", "reduce_scatter")]
    # the trace's "ReduceScatter … count 106956800 datatype 9 op 4": bf16 with avg, FSDP2 without a reduce_dtype
    assert (rs.count, rs.dtype, rs.redop, rs.calls_per_step) == (106956800, "bf16", "avg", 1)
    assert rs.nccl_tests_bytes == 106956800 * 2 * 8
    titan = by_key(fsdp_collectives(builtin("Llama3.1_70B"), 8, reduce_dtype="fp32"))[("layers.79", "reduce_scatter")]
    assert (titan.dtype, titan.redop, titan.nccl_tests_bytes) == ("fp32", "avg", 106956800 * 4 * 8)
    root = rows[("root", "all_gather")]
    assert root.count == (2 * 128256 * 8192 + 8192) // 8 and root.calls_per_step == 1
    assert len(rows) == 2 * 81


def test_approx_is_primus_formula_and_difference_is_the_norms():
    cfg = builtin("Llama3.1_70B")
    approx = by_key(approx_collectives(cfg, 8))
    h, ff, heads, kv, hd = 8192, 28672, 64, 8, 128
    assert approx[("layers.0", "all_gather")].count == (3 * h * ff + 2 * h * heads * hd + 2 * h * kv * hd) // 8
    assert approx[("layers.0", "all_gather")].count == 106954752
    assert ("root", "all_gather") not in approx
    diff = {(r["unit"], r["collective"]): r for r in compare(fsdp_collectives(cfg, 8), list(approx.values()))}
    assert diff[("layers.0-79", "all_gather")]["missing_elements"] == 2 * h // 8
    assert diff[("root", "all_gather")]["approx_count"] == 0


def test_fsdp2_padding_is_per_parameter():
    assert fsdp2_shard_numel((67, 35), 4) == 17 * 35
    assert fsdp2_shard_numel((35,), 3) == 12
    assert fsdp2_shard_numel((3, 26, 35), 4) == 1 * 26 * 35  # fused experts: fewer experts than ranks
    assert fsdp2_shard_numel((1, 35), 8) == 35


def test_fsdp1_flat_parameter_padding():
    # use_orig_params=True, bf16: each parameter starts on 8 elements, total padded to the world size
    assert fsdp1_alignment_numel("bf16", True) == 8 and fsdp1_alignment_numel("fp32", True) == 4
    assert fsdp1_alignment_numel("bf16", False) == 0
    assert fsdp1_shard_numel([5, 3], 4, 8) == 3  # 5 + pad 3 + 3 = 11 -> 12 / 4
    assert fsdp1_shard_numel([5, 3], 4, 0) == 2  # 8 / 4
    assert fsdp1_shard_numel([7], 3, 0) == 3  # chunked: ceil(7 / 3)


def test_reshard_hsdp_and_totals():
    cfg = builtin("Llama3.1_8B")
    no_reshard = by_key(fsdp_collectives(cfg, 8, reshard_after_forward=False))
    assert no_reshard[("layers.3", "all_gather")].calls_per_step == 1
    hsdp = by_key(fsdp_collectives(cfg, 16, replicate=2, nnodes=2))
    ag, ar = hsdp[("layers.0", "all_gather")], hsdp[("layers.0", "all_reduce")]
    assert (ag.nranks, ag.nnodes) == (8, 1)
    assert (ar.count, ar.nranks, ar.nnodes, ar.dtype, ar.redop) == (ag.count, 2, 2, "bf16", "avg")
    assert ar.nccl_tests_bytes == ag.count * 2
    only_replicas = fsdp_collectives(cfg, 4, replicate=4)  # shard groups of 1: FSDP skips AG/RS
    assert {r.collective for r in only_replicas} == {"all_reduce"}
    totals = {t["collective"]: t for t in step_totals(list(hsdp.values()))}
    assert totals["total"]["bytes_per_step"] == sum(r.bytes_per_step for r in hsdp.values())
    assert totals["all_gather"]["busbw_bytes_per_step"] == round(totals["all_gather"]["bytes_per_step"] * 7 / 8)


def test_commands_use_nccl_tests_sizes_and_runs_group_by_dtype():
    rows = fsdp_collectives(builtin("Llama3.1_70B"), 8, reduce_dtype="fp32")  # torchtitan's fp32 reductions
    text = commands_text(rows)
    assert "./build/all_gather_perf -b 1711308800 -e 1711308800 -d bfloat16 -n 20 -w 5 -g 8" in text
    assert "mpirun -np 8 --bind-to numa ./build/all_gather_perf -b 1711308800" in text
    assert "./build/reduce_scatter_perf -b 3422617600 -e 3422617600 -d float -o avg" in text
    assert "-b 213909504" not in text and "-b 213913600" not in text  # never the per-rank shard
    runs = comm_runs(rows)
    assert [(r.collectives, r.dtype, r.sizes) for r in runs] == [
        (("all_gather",), "bf16", (4202708992, 1711308800)),
        (("reduce_scatter",), "fp32", (8405417984, 3422617600)),
    ]
    same_dtype = comm_runs(fsdp_collectives(builtin("Llama3.1_70B"), 8))  # the default: reduce in the param dtype
    assert len(same_dtype) == 1 and same_dtype[0].collectives == ("all_gather", "reduce_scatter")


def test_multi_node_groups_get_mpi_lines_only():
    text = commands_text(fsdp_collectives(builtin("Llama3.1_8B"), 16, nnodes=2))
    assert "-g 16" not in text and "mpirun -np 16 -H node0:8,node1:8" in text


def test_unit_range():
    assert unit_range(["layers.0", "layers.1", "layers.2"]) == "layers.0-2"
    assert unit_range(["layers.1", "layers.3", "layers.4", "layers.5"]) == "layers.1,3-5"
    assert unit_range(["root"]) == "root"


def test_cli_csv_contract(run, tmp_path):
    out = tmp_path / "fsdp.csv"
    res = run("opbench.fsdp_model", "--model", "Llama3.1_70B", "--world-size", "8", "--csv", str(out), "--commands")
    assert res.returncode == 0, res.stderr
    assert "layers.0-79" in res.stdout and "106956800" in res.stdout
    assert "./build/all_gather_perf -b 1711308800" in res.stdout
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 162
    layer = next(r for r in rows if r["unit"] == "layers.0" and r["collective"] == "all_gather")
    assert (
        layer["count"],
        layer["dtype"],
        layer["bytes_per_rank"],
        layer["calls_per_step"],
        layer["nccl_tests_bytes"],
    ) == ("106956800", "bf16", "213913600", "2", "1711308800")
    assert json.loads(out.with_suffix(".meta.json").read_text())["world_size"] == 8


def test_cli_approx_reports_difference(capsys):
    assert run_cli(main, ["--model", "Llama3.1_70B", "--world-size", "8", "--mode", "approx"]) == 0
    out = capsys.readouterr().out
    assert "106954752" in out and "approx vs exact" in out and "2048" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--world-size", "8", "--replicate", "3", "--model", "Llama3.1_8B"], "field '--replicate'"),
        (["--world-size", "8", "--nnodes", "3", "--model", "Llama3.1_8B"], "field '--nnodes'"),
        (["--world-size", "8", "--model-config-path", "missing.json"], "missing.json: file not found"),
        (["--world-size", "8", "--model", "NoSuchModel"], "unknown model 'NoSuchModel'"),
        (["--world-size", "1", "--model", "Llama3.1_8B"], "a world of 1 rank shards nothing"),
    ],
)
def test_cli_usage_errors(capsys, args, message):
    assert run_cli(main, args, prog="opbench fsdp") == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_printed_names_and_paths_cannot_start_a_line(tmp_path, capsys):
    """A model name or folder holding a newline: the '== name' header shows it as '?', and the printed opbench comm
    line quotes it on one line (bash's $'…') so that pasting it gives back the very same arguments."""
    folder = str(tmp_path / "d\nrm -rf 'x\\")
    argv = ["--model-name", "m\ntouch /tmp/x", "--model-config-path", TINY, "--world-size", "2", "--commands"]
    assert run_cli(main, [*argv, "--report-dir-path", folder], prog="opbench fsdp") == 0
    lines = capsys.readouterr().out.splitlines()
    assert not [ln for ln in lines if ln.startswith(("touch", "rm"))], lines
    assert lines[0].startswith("== m?touch /tmp/x: FSDP2 exact, world size 2")
    (comm,) = [ln for ln in lines if ln.startswith("opbench comm ")]
    words = subprocess.run(
        ["bash", "-c", "printf '%s\\0' " + comm.removeprefix("opbench comm ")], capture_output=True, text=True
    ).stdout.split("\0")
    assert words[words.index("--report-dir-path") + 1] == folder


def test_run_script_fsdp_stage_models_the_target_world_from_one_process(tmp_path):
    """run_script.sh on one process (one GPU): the fsdp stage models FSDP_WORLD, 8 by default, and writes rows;
    the comm stage says in one line that one rank has no link to measure."""
    report = tmp_path / "run"
    env = {**os.environ, "NPROC_PER_NODE": "1", "STAGES": "comm fsdp", "REPORT_DIR": str(report), "MODEL": "Qwen3_0.6B"}
    res = subprocess.run(["bash", "run_script.sh"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "=== comm: skipped: a job of 1 rank has no link to measure" in res.stdout
    assert "  comm: skipped (a job of 1 rank has no link to measure)\n  fsdp: ok in" in res.stdout
    assert "(fsdp models 8 ranks on 1 node(s))" in res.stdout
    rows = list(csv.DictReader((report / "fsdp" / "fsdp_model.csv").open()))
    assert rows and {r["world_size"] for r in rows} == {"8"} and {r["model"] for r in rows} == {"Qwen3_0.6B"}
    assert {r["collective"] for r in rows} == {"all_gather", "reduce_scatter"}
    res = subprocess.run(
        ["bash", "run_script.sh"], capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**env, "STAGES": "fsdp", "FSDP_WORLD": "16", "FSDP_NNODES": "2", "REPORT_DIR": str(tmp_path / "b")},
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:]
    rows = list(csv.DictReader((tmp_path / "b" / "fsdp" / "fsdp_model.csv").open()))
    assert {r["world_size"] for r in rows} == {"16"} and "mpirun -np 16 -H node0:8,node1:8" in res.stdout


def test_cli_missing_layer_count(run, tmp_path):
    cfg = tmp_path / "nolayers.json"
    cfg.write_text(
        json.dumps(
            {"model": "x", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100}
        )
    )
    opbench = shutil.which("opbench")
    if opbench is None:
        pytest.skip("the opbench console script is not installed")
    res = subprocess.run(
        [opbench, "fsdp", "--model-config-path", str(cfg), "--world-size", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2 and "opbench fsdp: error:" in res.stderr and "field 'num_hidden_layers'" in res.stderr


@pytest.mark.slow
def test_cli_run_times_the_sizes_with_opbench_comm(run, tmp_path):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 24,
                "intermediate_size": 40,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "num_hidden_layers": 2,
                "vocab_size": 67,
            }
        )
    )
    report = tmp_path / "comm"
    res = run(
        "opbench.fsdp_model",
        "--model-config-path",
        str(cfg),
        "--world-size",
        "2",
        "--run",
        "--param-dtype",
        "fp32",
        "--reduce-dtype",
        "fp32",
        "--report-dir-path",
        str(report),
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    expected = {
        (r.collective, r.nccl_tests_bytes)
        for r in fsdp_collectives(load_model_configs(cfg)[0], 2, param_dtype="fp32", reduce_dtype="fp32")
    }
    measured = set()
    for name in ("all_gather", "reduce_scatter"):
        for row in csv.DictReader((report / f"{name}_benchmark.csv").open()):
            assert row["status"] == "ok" and row["source"] == "fsdp" and float(row["time_us"]) > 0
            measured.add((name, int(row["size_bytes"])))
    assert measured == expected


def test_run_passes_the_keep_flags_once_and_appends_where_an_earlier_run_wrote(monkeypatch, tmp_path):
    """fsdp --run launches one comm run per (dtype, group, nodes): the user's --overwrite/--append goes to each,
    and a run writing a collective CSV that an earlier run (of this model or an earlier one) wrote appends, so one
    command never sets its own rows aside."""
    from opbench.fsdp_model.commands import run_comm

    launched = []
    monkeypatch.setattr(subprocess, "run", lambda argv: launched.append(argv) or subprocess.CompletedProcess(argv, 0))
    rows = fsdp_collectives(builtin("Qwen3_0.6B"), 8, param_dtype="bf16", reduce_dtype="fp32")
    runs = comm_runs(rows)
    assert len(runs) == 2  # bf16 all-gathers, fp32 reduce-scatters
    written: set[str] = set()
    assert run_comm(rows, str(tmp_path), earlier=["--overwrite"], written=written) == 0
    assert run_comm(rows, str(tmp_path), earlier=["--overwrite"], written=written) == 0  # a second model
    policies = [[a for a in argv if a in ("--overwrite", "--append")] for argv in launched]
    assert policies == [["--overwrite"], ["--overwrite"], ["--append"], ["--append"]]
