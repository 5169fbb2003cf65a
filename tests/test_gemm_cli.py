"""The GEMM command as users run it: CSV contract, failure rows, bad input, Ctrl-C, triton under the interpreter."""

import csv
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

CONTRACT = [
    "model",
    "layer",
    "pass",
    "mbs",
    "m",
    "n",
    "k",
    "groups",
    "transA",
    "transB",
    "dtype",
    "backend",
    "time_s",
    "time_min_s",
    "time_p10_s",
    "time_p90_s",
    "time_std_s",
    "iters",
    "tflops",
    "bandwidth_gbs",
    "pct_of_peak",
    "max_rel_err",
    "status",
    "error",
]


def read(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_timed_rows_follow_the_contract(run, tmp_path):
    r = run(
        "opbench.gemm",
        "--model-config-path",
        "shapes/model_configs.json",
        "--model",
        "Llama3.1_8B",
        "--seqlen",
        "64",
        "--layers",
        "qkv,attn_out",
        "--passes",
        "fwd,wgrad",
        "--quick",
        "--report-dir-path",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    rows = read(tmp_path / "benchmark_gemm_Llama3.1_8B.csv")
    assert list(rows[0])[: len(CONTRACT)] != [] and all(c in rows[0] for c in CONTRACT)
    assert [(x["layer"], x["pass"]) for x in rows] == [
        ("qkv", "fwd"),
        ("qkv", "wgrad"),
        ("attn_out", "fwd"),
        ("attn_out", "wgrad"),
    ]
    for x in rows:
        assert x["status"] == "ok" and x["dtype"] == "fp32" and x["backend"] == "torch"
        m, n, k, t = int(x["m"]), int(x["n"]), int(x["k"]), float(x["time_s"])
        assert t > 0 and float(x["time_min_s"]) <= t <= float(x["time_max_s"])
        assert float(x["tflops"]) == pytest.approx(2 * m * n * k / t / 1e12, rel=1e-3)
        assert float(x["max_rel_err"]) < 1e-5
        assert int(x["iters"]) >= 3
    assert rows[0]["m"] == "64" and rows[0]["n"] == str(48 * 128) and rows[1]["k"] == "64"
    assert (tmp_path / "benchmark_gemm_Llama3.1_8B.meta.json").exists()
    assert "qkv" in r.stdout  # console summary


def test_grouped_and_unsupported_backends_become_rows(run, tmp_path):
    r = run(
        "opbench.gemm",
        "--model-config-path",
        str(ROOT / "examples" / "configs" / "tiny-qwen3-moe"),  # 8 experts, small enough to time in seconds
        "--seqlen",
        "32",
        "--layers",
        "expert_down,router",
        "--passes",
        "fwd",
        "--backends",
        "torch,torch_grouped,fp8,triton",
        "--quick",
        "--report-dir-path",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    rows = {(x["layer"], x["backend"]): x for x in read(tmp_path / "benchmark_gemm_tiny-qwen3-moe.csv")}
    g = rows[("expert_down", "torch_grouped")]
    assert g["status"] == "ok" and g["groups"] == "8" and ("grouped" in g["impl"] or "loop" in g["impl"]), g
    assert rows[("expert_down", "torch")]["impl"].startswith("torch.bmm")
    for backend in ("fp8", "triton"):
        row = rows[("expert_down", backend)]
        assert row["status"] == "unsupported" and row["error"] and row["time_s"] == "" and row["tflops"] == ""
    assert rows[("router", "torch_grouped")]["status"] == "unsupported"
    assert rows[("router", "torch")]["status"] == "ok"


def test_dry_run_plans_every_row(run, tmp_path):
    r = run(
        "opbench.gemm",
        "--model",
        "DeepSeek_V3",
        "--seqlen",
        "4096",
        "--tp",
        "8",
        "--ep",
        "8",
        "--mbs",
        "1,2",
        "--dry-run",
        "--report-dir-path",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr
    rows = read(tmp_path / "benchmark_gemm_DeepSeek_V3.plan.csv")  # a plan has a file of its own
    assert len(rows) == 13 * 3 * 2 and {x["status"] for x in rows} == {"planned"}
    assert not (tmp_path / "benchmark_gemm_DeepSeek_V3.csv").exists()
    assert all(x["time_s"] == "" for x in rows)


def test_raw_shapes_as_primus_mnk(run, tmp_path):
    """Primus' --M --N --K --trans_a --trans_b: shapes without a model, in the layout asked for."""
    r = run(
        "opbench.gemm", "--mnk", "96x64x32,40x24x16", "--layout", "TN", "--quick", "--report-dir-path", str(tmp_path)
    )
    assert r.returncode == 0, r.stderr
    rows = read(tmp_path / "benchmark_gemm_raw.csv")
    assert [(x["layer"], x["pass"], x["m"], x["n"], x["k"]) for x in rows] == [
        ("raw", "raw", "96", "64", "32"),
        ("raw", "raw", "40", "24", "16"),
    ]
    for x in rows:
        assert (x["transA"], x["transB"], x["status"], x["backend"]) == ("True", "False", "ok", "torch")
        assert float(x["max_rel_err"]) < 1e-5
        t = float(x["time_s"])
        assert float(x["tflops"]) == pytest.approx(2 * int(x["m"]) * int(x["n"]) * int(x["k"]) / t / 1e12, rel=1e-3)


def test_noisy_rows_are_marked_and_listed_by_the_report(run, tmp_path):
    """--max-spread 0: no spread is small enough, so every row ends noisy (status ok, a note), with its IQR."""
    res = tmp_path / "res"
    r = run("opbench.gemm", "--mnk", "64x64x64,32x32x32", "--quick", "--max-spread", "0", "--report-dir-path", str(res))
    assert r.returncode == 0, r.stderr
    rows = read(res / "benchmark_gemm_raw.csv")
    assert all(
        x["status"] == "ok" and x["note"].startswith("noisy: IQR ") and float(x["time_iqr_rel"]) > 0 for x in rows
    )
    # the console says it under the table, with what to do
    said = " ".join(r.stdout.split())  # the advice is wrapped at 120 characters
    assert "time_iqr_rel" in r.stdout and "2 of 2 rows are noisy" in said and "larger --budget" in said
    rep = run("opbench.report", str(res), "--report-dir-path", str(tmp_path / "rep"))
    assert rep.returncode == 0, rep.stderr
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "2 row(s) are noisy" in text and "Noisy rows" in text and text.count("noisy: IQR") >= 2


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--model-config-path", "missing.json"], "missing.json: file not found"),
        (["--model", "NoSuchModel"], "unknown model 'NoSuchModel'; available: Llama2_7B"),
        (["--model", "Llama2_7B", "--tp", "3"], "field '--tp'"),
        (["--model", "Llama2_7B", "--backends", "cublas"], "unknown backend"),
        (["--model", "Llama2_7B", "--mbs", "0"], "field '--mbs': must be positive"),
        (["--model", "Llama2_7B", "--max-iters", "0"], "field '--max-iters': must be at least 1"),
        (["--model", "Llama2_7B", "--min-iters", "9", "--max-iters", "3"], "exceeds --max-iters 3"),
        (["--mnk", "4096x4096"], "'4096x4096' is not MxNxK with positive integers"),
        (["--mnk", "8x8x0"], "'8x8x0' is not MxNxK"),
        (["--mnk", "8x8x8", "--model", "Llama2_7B"], "raw shapes take no model"),
        # a misspelled flag or choice names the one meant (difflib over the parser's flags and the choices)
        (["--seq-len", "512"], "unrecognized arguments: --seq-len 512; did you mean --seqlen? (see --help)"),
        (["--seq_len=512"], "unrecognized arguments: --seq_len=512; did you mean --seqlen? (see --help)"),
        (["seqlen", "512"], "unrecognized arguments: seqlen 512; did you mean --seqlen? (see --help)"),
        (["--cache", "cld"], "field '--cache': invalid choice: 'cld' (choose from "),
        (["--cache", "cld"], "; did you mean 'cold'?"),
        (["--layout", "nt"], "; did you mean 'NT'?"),
        (["--model-config-path", "Qwen/Qwen3-8B"], "it looks like a Hugging Face model id"),
    ],
)
def test_bad_input_is_one_line_exit_2(run, tmp_path, args, needle):
    r = run("opbench.gemm", *args, "--dry-run", "--report-dir-path", str(tmp_path))
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_flag_nothing_is_close_to_gets_no_guess(run, tmp_path):
    """--dry-rn is close to --dry-run; --xyz to nothing: the line says so without a wild guess."""
    r = run("opbench.gemm", "--dry-rn", "--report-dir-path", str(tmp_path))
    assert r.returncode == 2 and r.stderr.strip().endswith("--dry-rn; did you mean --dry-run? (see --help)")
    r = run("opbench.gemm", "--xyz", "--dry-run", "--report-dir-path", str(tmp_path))
    assert r.returncode == 2 and "did you mean" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "typed,meant", [("gem", "gemm"), ("atention", "attention"), ("selftst", "selftest"), ("nccl_tests", "nccl-tests")]
)
def test_a_misspelled_subcommand_names_the_one_meant(run, typed, meant):
    r = run("opbench", typed)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"opbench: error: unknown subcommand '{typed}'; did you mean {meant}? (choose from ")
    r = run("opbench", "zzz")
    assert r.returncode == 2 and "did you mean" not in r.stderr and "(choose from gemm, attention" in r.stderr


REQUIRED = {"fsdp": ["--world-size", "8"], "project": ["--world-size", "8"], "trace": ["x.log"]}
REQUIRED |= {"nccl-tests": ["x.out"], "report": ["results"]}  # parsed before any file is looked at


@pytest.mark.parametrize(
    "tool",
    ["gemm", "attention", "comm", "fsdp", "trace", "nccl-tests", "ckpt", "report", "selftest", "cluster", "project"],
)
def test_every_tool_names_the_flag_meant(tool, capsys):
    """The one ArgumentParser of core.cli: every tool's misspelled flag gets the hint, in one line, exit 2."""
    import importlib

    from opbench.core.cli import SUBCOMMANDS
    from opbench.core.errors import run_cli

    module = importlib.import_module(SUBCOMMANDS[tool][0])
    assert run_cli(module.main, [*REQUIRED.get(tool, []), "--hepl"], prog=f"opbench {tool}") == 2
    err = capsys.readouterr().err
    assert err == f"opbench {tool}: error: unrecognized arguments: --hepl; did you mean --help? (see --help)\n"


def test_malformed_json_names_file(run, tmp_path):
    bad = tmp_path / "cfg.json"
    bad.write_text('[{"model": "x", "hidden_size": 1,,}]')
    r = run("opbench", "gemm", "--model-config-path", str(bad), "--dry-run")
    assert r.returncode == 2 and f"{bad}: malformed JSON at line 1" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "sig,code,said", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")]
)
def test_ctrl_c_keeps_finished_rows(tmp_path, sig, code, said):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "opbench.gemm",
            "--model",
            "Llama2_7B",
            "--seqlen",
            "128",
            "--quick",
            "--report-dir-path",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    path = tmp_path / "benchmark_gemm_Llama2_7B.csv"
    deadline = time.time() + 300
    while time.time() < deadline and (not path.exists() or len(read(path)) < 2):
        time.sleep(0.2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err and said in err
    rows = read(path)
    assert 2 <= len(rows) < 15
    assert all(r["status"] == "ok" and float(r["time_s"]) > 0 for r in rows)
    # the finished rows are on the console too, as a table (issue 26 item 1), not only "in the report"
    finished = out[out.index(f"interrupted after {len(rows)} of ") :]
    table_rows = [line for line in finished.splitlines() if line.split()[:2] in (["qkv", "fwd"], ["qkv", "dgrad"])]
    assert len(table_rows) >= 2 and f"they are in {path}" in finished
    # and the one line on stderr names the CSV and its rows, not "the report"
    assert f"gemm: {said}; the {len(rows)} rows finished so far are in {path}\n" in err, err


def test_triton_matmul_compiles_for_gpu_targets_and_fp32_stays_fp32():
    """The interpreter does no type checking: compile the matmul for an H100 (sm90) and an MI300X (gfx942) with
    Triton's own compilers (no GPU needed). fp32 must be real fp32 FMAs, as torch.mm computes it: tl.dot's
    default would use TF32 tensor-core MMAs on NVIDIA."""
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from opbench.gemm.triton_matmul import _matmul_kernel

    fn = _matmul_kernel.fn

    def compile_for(backend: str, arch: int | str, dtype: str, ieee: bool):
        consts = {"IEEE_FP32": ieee, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8}
        sig = {n: "constexpr" if n in consts else f"*{dtype}" if n.endswith("_ptr") else "i32" for n in fn.arg_names}
        src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
        target = GPUTarget(backend, arch, 32 if backend == "cuda" else 64)
        return triton.compile(src, target=target, options={"num_warps": 4, "num_stages": 3})

    ieee = compile_for("cuda", 90, "fp32", True).asm["ptx"]
    assert "fma.rn.f32" in ieee and "tf32" not in ieee and "mma" not in ieee
    assert "tf32" in compile_for("cuda", 90, "fp32", False).asm["ptx"]  # what the flag avoids
    assert "mfma" in compile_for("hip", "gfx942", "bf16", False).asm["amdgcn"]


def test_triton_kernel_under_interpreter(tmp_path):
    code = """
import torch
from opbench.gemm.triton_matmul import matmul
torch.manual_seed(0)
cases = [(37, 29, 45, 1, False, True), (16, 33, 20, 3, True, False), (40, 24, 17, 2, False, False)]
for m, n, k, g, ta, tb in cases:
    a = torch.randn(g, k, m).transpose(-1, -2) if ta else torch.randn(g, m, k)
    b = torch.randn(g, n, k).transpose(-1, -2) if tb else torch.randn(g, k, n)
    if g == 1:
        a, b = a[0], b[0]
    c = matmul(a, b)
    ref = (a.double() @ b.double()).float()
    err = (c - ref).abs().max().item()
    assert c.shape == ref.shape and err < 1e-4, (m, n, k, g, err)
print("ok")
"""
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
