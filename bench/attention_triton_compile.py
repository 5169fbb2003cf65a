"""Compile opbench's Triton attention kernels ahead of time for GPUs this machine does not have, and report
each configuration's shared memory against the part's limit. No GPU needed: triton's bundled ptxas
(NVIDIA) and AMD backend do the work. It proves the kernels compile for the target and the tiles fit; it
says nothing about speed. (The tests compile one configuration of each kernel; this compiles all of them.)

    python bench/attention_triton_compile.py [--targets cuda:90,hip:gfx942] [--dtypes bf16,fp16,fp32]
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton
from tabulate import tabulate

from opbench.attention.triton_aot import KERNELS, compile_kernel

HEAD_DIMS = ((64, 64), (128, 128), (192, 128))  # (head_dim_qk, head_dim_v); 192/128 is DeepSeek MLA


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default="cuda:90,hip:gfx942")
    p.add_argument("--dtypes", default="bf16,fp16,fp32")
    p.add_argument("--causal", default="true,false", help="mask variants to compile")
    p.add_argument("--windows", default="0,128", help="sliding windows to compile (0: none; causal kernels only)")
    args = p.parse_args()
    rows, failures = [], 0
    causals = [c.strip() == "true" for c in args.causal.split(",")]
    for target_name in args.targets.split(","):
        windows = [int(w) for w in args.windows.split(",")]
        for dtype, (d_qk, d_v), causal, window, kind in itertools.product(
            args.dtypes.split(","), HEAD_DIMS, causals, windows, KERNELS
        ):
            if window and not causal:
                continue  # a sliding window is a causal mask's
            t0 = time.perf_counter()
            try:
                c = compile_kernel(target_name, kind, dtype, d_qk, d_v, causal, window)
                tiles = [c.block_m, c.block_n, c.num_warps, c.num_stages, c.shared_bytes]
                verdict = "fits" if c.fits(target_name) else "TOO BIG"
            except Exception as exc:  # noqa: BLE001 - report every configuration
                tiles = [None] * 5
                verdict = f"FAILED {type(exc).__name__}: {str(exc)[:120]}"
            failures += verdict != "fits"
            rows.append(
                [
                    target_name,
                    dtype,
                    f"{d_qk}/{d_v}",
                    causal,
                    window,
                    kind,
                    *tiles,
                    verdict,
                    f"{time.perf_counter() - t0:.1f}",
                ]
            )
    print(f"triton {triton.__version__}")
    print(
        tabulate(
            rows,
            headers=[
                "target",
                "dtype",
                "dqk/dv",
                "causal",
                "window",
                "kernel",
                "BM",
                "BN",
                "warps",
                "stages",
                "shared B",
                "",
                "compile s",
            ],
        )
    )
    print(f"{failures} configuration(s) failed or do not fit")


if __name__ == "__main__":
    main()
