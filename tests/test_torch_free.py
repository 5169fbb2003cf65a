"""The tools that need no GPU code must not import torch: the log parser, the nccl-tests parser, the FSDP size
model (not --run), the report, and `opbench comm --help` / `--dry-run`. They are what users run on a login
node, or on new hardware before PyTorch works there. Every subcommand's --help and its usage errors must not
import torch either (torch takes seconds to import; help should not). Checked in a fresh interpreter by running
each CLI on real inputs and looking at sys.modules after it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import contextlib, io, sys
    from opbench.core.cli import main

    log, out, res = sys.argv[1:4]
    open(log, "w").write(
        "node1:11:12 [0] NCCL INFO AllGather: opCount 0 sendbuff 0x1 recvbuff 0x2 count 1024 datatype 9 op 0 "
        "root 0 comm 0xa [nranks=2] stream 0xb\\n")
    open(out, "w").write(
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\\n"
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\\n"
        "        1024           256     float     sum      -1    10.50    0.10    0.10      0    10.20    0.11    0.11      0\\n")
    runs = {
        "trace": ["trace", log, "--report-dir-path", res, "--commands"],
        "nccl-tests": ["nccl-tests", out, "--report-dir-path", res],
        "fsdp": ["fsdp", "--model", "Llama3.1_8B", "--world-size", "8", "--commands", "--report-dir-path", res],
        "report": ["report", res, "--no-plots"],
        "comm --dry-run": ["comm", "--dry-run", "--nproc-per-node", "8", "--model", "Llama3.1_8B", "--tp", "8"],
        "comm --help": ["comm", "--help"],
        "cluster --plan": ["cluster", "--plan", "2,1024", "--nproc-per-node", "8"],
        "cluster --help": ["cluster", "--help"],
        "project": ["project", "--model", "Llama3.1_8B", "--world-size", "16", "--tp", "8", "--device", "H100",
                    "--report-dir-path", res],
        # an MoE search across nodes (2 GPUs a node): the modules of a 16-GPU search, 5 s instead of 26 s
        "project --search": ["project", "--model", "Qwen3_30B_A3B", "--world-size", "4", "--gpus-per-node", "2",
                             "--search", "--device", "MI300X"],
    }
    tools = ("gemm", "attention", "comm", "fsdp", "trace", "nccl-tests", "ckpt", "report", "cluster", "selftest",
             "project")
    usage_errors = {
        "gemm --backends": ["gemm", "--backends", "nope"],
        "gemm --model": ["gemm", "--model", "nope"],
        "attention --backends": ["attention", "--backends", "nope"],
        "ckpt --methods": ["ckpt", "--methods", "nope"],
        "ckpt --size-mb": ["ckpt", "--size-mb", "1e12", "--dry-run"],
        "trace missing": ["trace", log + ".missing"],
        "gemm --device": ["gemm", "--device", "gpu0"],
        "ckpt --device": ["ckpt", "--device", "bogus", "--dry-run"],
        "project --tp": ["project", "--model", "Llama3.1_8B", "--world-size", "8", "--tp", "3", "--device", "H100"],
    }
    for name, argv in [*runs.items(), *((f"{t} help", [t, "--help"]) for t in tools), *usage_errors.items()]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            try:
                rc = main(argv)
            except SystemExit as exc:
                rc = exc.code
        assert rc == (2 if name in usage_errors else 0), (name, rc)
        assert "torch" not in sys.modules, f"{name} imported torch"
        if name.endswith("help"):  # true defaults, said once, lists as text (not Python reprs)
            text = out.getvalue()
            assert "default: None" not in text and "['" not in text, (name, text)
            assert not [line for line in text.splitlines() if line.count("(default:") > 1], (name, text)
    print("ok", len(runs) + len(tools) + len(usage_errors))
""")


def test_tools_without_gpu_code_never_import_torch(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "nccl.log"), str(tmp_path / "ar.out"), str(tmp_path / "res")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.split() == ["ok", "30"]
    assert (tmp_path / "res" / "trace_summary.csv").exists() and (tmp_path / "res" / "nccl_tests.csv").exists()
    assert (tmp_path / "res" / "fsdp_collectives.csv").exists() and (tmp_path / "res" / "report" / "report.md").exists()
