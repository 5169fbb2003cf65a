"""Published peaks of the accelerators opbench knows, torch-free so that planning and projecting need no torch
(docs/conventions.md, "Peaks")."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    """Dense (no sparsity) datasheet peaks; docs/conventions.md, "Peaks". fp16 equals bf16 on every listed part."""

    bf16_tflops: float
    fp8_tflops: float | None  # None: no FP8 tensor cores (A100)
    fp32_tflops: float
    hbm_tbs: float

    def tflops(self, dtype: str) -> float | None:
        return {
            "bf16": self.bf16_tflops,
            "fp16": self.bf16_tflops,
            "fp8": self.fp8_tflops,
            "fp32": self.fp32_tflops,
        }.get(dtype)


# Matched in order against the lower-cased device name; the first hit wins (so "h100 pcie" before "h100").
# fp32 is the non-tensor-core vector peak (H100/H200 SXM 67 TFLOPS; MI300X/MI325X 163.4 TFLOPS). The PCIe and
# NVL H100s have lower clocks and power (and, for PCIe, HBM2e): their own datasheet lines.
# The APU MI300A (228 CUs) and the NVL parts have their own lines; Grace Hopper ("GH200") has none (its memory
# differs between versions), and the (?<!g) keeps it from taking the H200/H100 lines. GB200 comes before B200;
# Blackwell's per-GPU figures are the HGX B200 and GB200 NVL72 tables' sparse totals halved and divided by the
# GPUs; MI350X/MI355X's are the CDNA 4 peaks (clock × matrix cores). The A100 has no FP8.
PEAKS: list[tuple[str, Peak]] = [
    (r"mi355", Peak(2516.6, 5033.2, 157.3, 8.0)),
    (r"mi350", Peak(2306.9, 4613.7, 144.2, 8.0)),
    (r"mi325", Peak(1307.4, 2614.9, 163.4, 6.0)),
    (r"mi300a", Peak(980.6, 1961.2, 122.6, 5.3)),
    (r"mi300x|mi300", Peak(1307.4, 2614.9, 163.4, 5.3)),
    (r"(?<!g)h200.*nvl", Peak(835.0, 1671.0, 60.0, 4.8)),
    (r"(?<!g)h200", Peak(989.0, 1979.0, 67.0, 4.8)),
    (r"(?<!g)h100.*pcie", Peak(756.0, 1513.0, 51.0, 2.0)),
    (r"(?<!g)h100.*nvl", Peak(835.0, 1671.0, 60.0, 3.9)),
    (r"(?<!g)h100", Peak(989.0, 1979.0, 67.0, 3.35)),
    (r"gb200", Peak(2500.0, 5000.0, 80.0, 8.0)),
    (r"b200", Peak(2250.0, 4500.0, 75.0, 8.0)),
    (r"a100.*pcie", Peak(312.0, None, 19.5, 1.935)),
    (r"a100.*40gb", Peak(312.0, None, 19.5, 1.555)),
    (r"a100", Peak(312.0, None, 19.5, 2.039)),
]


def lookup_peak(name: str) -> Peak | None:
    low = name.lower()
    for pattern, peak in PEAKS:
        if re.search(pattern, low):
            return peak
    return None
