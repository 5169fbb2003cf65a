"""The checks behind ``opbench selftest``: each backend on a tiny case, against the reference its tool uses.

GEMM and attention run in this process through the tools' own runners (``gemm.runner.run_case``,
``attention.runner.run_case``), so the check is the one a real run makes before timing. Collectives and
checkpoints run their tools as subprocesses (2 ranks under ``opbench comm --check 1``; one rank of
``opbench ckpt``, which verifies what it loads), and their CSVs are read back. A check yields rows of
``schema.SCHEMA``: ``unsupported`` when the backend cannot run here (and why), ``error`` when it ran and gave a
wrong answer or crashed, ``ok`` otherwise. Timings are one quick median: a rough figure, not a benchmark.
"""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from opbench.core.sweep import STATUS_ERROR, STATUS_OK, STATUS_UNSUPPORTED, Unsupported
from opbench.core.timing import TimingConfig

# max |C - C_ref| / max |C_ref| allowed for a 256x256x256 GEMM. A wrong layout or kernel gives errors of order 1;
# fp32 leaves room for TF32 on GPU, fp8 for bf16 output rounding (its reference uses the fp8-rounded inputs).
GEMM_TOLERANCE = {"fp32": 1e-3, "fp16": 5e-3, "bf16": 2e-2, "fp8": 5e-2}
GEMM_SIZE = 256
GEMM_GROUPS = 4  # for grouped-only backends
COMM_BYTES = "1M"
CKPT_MIB = 16
SUBPROCESS_TIMEOUT_S = 120


def row(area: str, backend: str, device: str, dtype: str, **fields: Any) -> dict[str, Any]:
    return {"area": area, "backend": backend, "device": device, "dtype": dtype, **fields}


def _verdict(err: float | None, tol: float) -> bool:
    return err is not None and not math.isnan(err) and err <= tol


def gemm_rows(device: torch.device, dtype: str, timing: TimingConfig) -> Iterator[dict[str, Any]]:
    """Every registered GEMM backend on a 256³ GEMM (4 groups for grouped-only backends)."""
    from opbench.core.device import device_info
    from opbench.gemm.backends import BACKENDS
    from opbench.gemm.runner import GemmCase, run_case
    from opbench.gemm.shapes import GemmShape

    info = device_info(device)
    for name, backend in BACKENDS.items():
        groups = GEMM_GROUPS if backend.grouped_only else 1
        shape = GemmShape("selftest", "selftest", "fwd", 1, GEMM_SIZE, GEMM_SIZE, GEMM_SIZE, groups, False, False)
        case = GemmCase(shape, name, dtype)
        used = case.effective_dtype
        tol = GEMM_TOLERANCE.get(used, 5e-2)
        base = row("gemm", name, str(device), used, tolerance=tol)
        t0 = time.perf_counter()
        try:
            result = run_case(case, info, timing, cold=False)
        except Unsupported as exc:
            yield {**base, "available": False, "status": STATUS_UNSUPPORTED, "error": str(exc)}
            continue
        except Exception as exc:  # noqa: BLE001 - a crash of an available backend is a broken install: a row
            yield {**base, "available": True, "correct": False, "status": STATUS_ERROR, "error": _why(exc)}
            continue
        err = result["max_rel_err"]
        good = _verdict(err, tol)
        yield {
            **base,
            "available": True,
            "correct": good,
            "max_error": err,
            "tflops": result["tflops"],
            "seconds": time.perf_counter() - t0,
            "status": STATUS_OK if good else STATUS_ERROR,
            "error": result["impl"] if good else f"wrong result: max rel err {err:.3g} > {tol:g} ({result['impl']})",
        }


def attention_rows(device: torch.device, dtype: str, timing: TimingConfig) -> Iterator[dict[str, Any]]:
    """Every attention backend, forward and backward, on a small causal case of the operator it implements (softmax:
    equal q and kv heads, the case every kernel takes; GQA and MLA head layouts are the attention tool's own
    tests; gated DeltaNet, the DSA indexer and Mamba-2: their own small cases)."""
    from opbench.attention.backends import BACKENDS
    from opbench.attention.runner import TOLERANCE, AttentionCase, ProblemCache, run_case
    from opbench.attention.schema import (
        HC_BACKENDS,
        INDEXER_BACKENDS,
        KDA_BACKENDS,
        LINEAR_BACKENDS,
        MAMBA2_BACKENDS,
        V4_BACKENDS,
    )
    from opbench.attention.shapes import AttentionShape

    softmax = AttentionShape("selftest", 128, 128, 4, 4, 64, 64, True)
    linear = AttentionShape("selftest", 128, 128, 4, 2, 64, 64, True, "linear", 64)
    indexer = AttentionShape("selftest", 128, 128, 4, 1, 64, 1, True, "indexer", 16)
    # Mamba-2: 4 heads in 2 groups, state size 16, head dim 32, chunks of 64 (attention.flops.mamba2_flops)
    mamba2 = AttentionShape("selftest", 128, 128, 4, 2, 16, 32, True, "mamba2", 64)
    # Kimi Delta Attention: 4 heads of 64, chunks of 64 (attention.flops.kda_flops)
    kda = AttentionShape("selftest", 128, 128, 4, 4, 64, 64, True, "kda", 64)
    # DeepSeek-V4: csa over a 16-token window and the top-8 of keys pooled 4:1, one shared KV head, sinks; a
    # hyper-connection site of 4 streams of 64 with 20 Sinkhorn steps (attention.operators)
    csa = AttentionShape("selftest", 128, 128, 4, 1, 64, 64, True, "csa", 16, True, compress=4, topk=8)
    hc = AttentionShape("selftest", 128, 128, 4, 4, 64, 64, True, "hc", 20)
    cache = ProblemCache()
    tol = TOLERANCE.get(dtype, 5e-3)
    for name in BACKENDS:
        kinds: tuple[tuple[tuple[str, ...], AttentionShape], ...] = (
            (LINEAR_BACKENDS, linear),
            (INDEXER_BACKENDS, indexer),
            (MAMBA2_BACKENDS, mamba2),
            (KDA_BACKENDS, kda),
            (V4_BACKENDS, csa),
            (HC_BACKENDS, hc),
        )
        shape = next((s for names, s in kinds if name in names), softmax)
        base = row("attention", name, str(device), dtype, tolerance=tol)
        t0 = time.perf_counter()
        try:
            result = run_case(AttentionCase(shape, 1, name, dtype), device, ("fwd", "bwd"), timing, cache)
        except Unsupported as exc:  # found out when called (an SDPA kernel refusing this case)
            yield {**base, "available": False, "status": STATUS_UNSUPPORTED, "error": str(exc)}
            continue
        except Exception as exc:  # noqa: BLE001 - as for GEMM: a crash is a row
            yield {**base, "available": True, "correct": False, "status": STATUS_ERROR, "error": _why(exc)}
            continue
        errs = [result.get(c) for c in ("max_rel_err", "grad_max_rel_err")]
        err = max((e for e in errs if e is not None), default=None)
        checked = err is not None
        if result["status"] == STATUS_UNSUPPORTED and not checked:
            yield {**base, "available": False, "status": STATUS_UNSUPPORTED, "error": result["error"]}
            continue
        good = result["status"] != STATUS_ERROR
        yield {
            **base,
            "available": True,
            "correct": good,
            "max_error": err,
            "tflops": result.get("fwd_tflops"),
            "seconds": time.perf_counter() - t0,
            "status": STATUS_OK if good else STATUS_ERROR,
            # checked but untimed (Triton under the CPU interpreter) says so here
            "error": result.get("error") or result.get("note"),
        }


def comm_rows(device: torch.device, work: Path) -> Iterator[dict[str, Any]]:
    """Every collective on 2 ranks, checked element by element (opbench comm --check 1)."""
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    on = "cuda" if gpus >= 2 else "cpu"
    if device.type == "cuda" and gpus < 2:
        yield row(
            "comm",
            "nccl",
            "cuda",
            "",
            available=False,
            status=STATUS_UNSUPPORTED,
            error=f"2 ranks need 2 GPUs, this node has {gpus}; collectives checked over gloo on CPU instead",
        )
    out = work / "comm"
    cmd = [sys.executable, "-m", "opbench.comm", "--nproc-per-node", "2", "--device", on, "--sizes", COMM_BYTES]
    cmd += ["-w", "2", "-n", "5", "--trials", "1", "--check", "1", "--timeout", "60", "--report-dir-path", str(out)]
    t0 = time.perf_counter()
    failure = _run(cmd)
    rows = _csv_rows(out, "*_benchmark.csv")
    if failure and not rows:
        yield row(
            "comm", "torch.distributed", on, "", available=True, correct=False, status=STATUS_ERROR, error=failure
        )
        return
    for r in rows:
        wrong_count = _float(r.get("wrong"))
        wrong = None if wrong_count is None else int(wrong_count)
        ok = r.get("status") == STATUS_OK and wrong == 0
        yield row(
            "comm",
            f"{r['backend']} {r['collective']}" + (" in-place" if r.get("inplace") == "True" else ""),
            on,
            r.get("dtype", ""),
            available=r.get("status") != STATUS_UNSUPPORTED,
            correct=ok if r.get("status") != STATUS_UNSUPPORTED else None,
            max_error=wrong,
            tolerance=0,
            gbs=_float(r.get("busbw_gbs")),
            seconds=time.perf_counter() - t0,
            status=STATUS_OK if ok else (STATUS_UNSUPPORTED if r.get("status") == STATUS_UNSUPPORTED else STATUS_ERROR),
            error=r.get("error") or (f"{wrong} wrong elements" if wrong else "busbw of one 1 MiB size, 2 ranks"),
        )


def ckpt_rows(device: torch.device, work: Path) -> Iterator[dict[str, Any]]:
    """A checkpoint round trip per method: save, load, compare (opbench ckpt verifies what it loads)."""
    out = work / "ckpt"
    cmd = [sys.executable, "-m", "opbench.ckpt", "--nproc-per-node", "1", "--size-mb", str(CKPT_MIB)]
    # dcp_async too: on a GPU it is the pinned-memory staging path, which nothing else here runs
    cmd += ["--methods", "torch_save,dcp,dcp_async", "--no-raw", "--device", str(device), "--report-dir-path", str(out)]
    t0 = time.perf_counter()
    failure = _run(cmd)
    rows = _csv_rows(out, "ckpt_benchmark.csv")
    if failure and not rows:
        yield row(
            "ckpt", "checkpoint", device.type, "", available=True, correct=False, status=STATUS_ERROR, error=failure
        )
        return
    for r in rows:
        good = r.get("status") == STATUS_OK and r.get("verified") == "True"
        save, load = _float(r.get("save_bandwidth_mib_per_s")), _float(r.get("load_bandwidth_mib_per_s"))
        yield row(
            "ckpt",
            r.get("method", "?"),
            device.type,
            r.get("param_dtype", ""),
            available=r.get("status") != STATUS_UNSUPPORTED,
            correct=good,
            gbs=save * 2**20 / 1e9 if save is not None else None,
            seconds=time.perf_counter() - t0,
            status=STATUS_OK if good else STATUS_ERROR,
            error=r.get("error")
            or (f"{CKPT_MIB} MiB; GB/s is save, load {load * 2**20 / 1e9:.3g} GB/s" if load is not None else None),
        )


def _run(cmd: list[str]) -> str | None:
    """Run a tool; None when it succeeded, else the last line it printed (its own one-line error)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return f"{' '.join(cmd[2:4])} did not finish in {SUBPROCESS_TIMEOUT_S} s"
    if res.returncode == 0:
        return None
    lines = [line for line in (res.stderr or res.stdout).splitlines() if line.strip()]
    return f"exit {res.returncode}: " + (lines[-1] if lines else "no output")


def _csv_rows(folder: Path, pattern: str) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for path in sorted(folder.glob(pattern)):
        with open(path, newline="", encoding="utf-8") as fh:
            rows += list(csv.DictReader(fh))
    return rows


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: " + " ".join(str(exc).split())[:200]


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None
