"""Published peaks of the accelerators opbench knows, torch-free so that planning and projecting need no torch
(docs/conventions.md, "Peaks")."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
D = TypeVar("D")


@dataclass(frozen=True)
class Peak:
    """Dense (no sparsity) datasheet peaks; docs/conventions.md, "Peaks". fp16 equals bf16 on every listed part."""

    bf16_tflops: float
    fp8_tflops: float | None  # None: no FP8 tensor cores (A100)
    fp32_tflops: float
    hbm_tbs: float
    # The best matmul TFLOP/s published for the part (its sibling's share where it has none), bf16 and FP8: what a
    # GEMM reaches of the peak differs by part (H100 0.80, MI300X 0.51 in bf16); None: nothing published
    mamf_bf16_tflops: float | None = None
    mamf_fp8_tflops: float | None = None
    # the part whose best matmul's share of the peak these figures take (None: measured on this part itself): its
    # rates are datasheet estimates, which a projection says (docs/project.md, "Parts")
    matmul_of: str | None = None
    # What the part's training steps reach of its best matmul over what an H100's reach of its own, measured on one
    # published recipe run on both (TRAINING_FP8_TFLOPS); 1: none published (or the H100 itself)
    training: float = 1.0

    def tflops(self, dtype: str) -> float | None:
        return {
            "bf16": self.bf16_tflops,
            "fp16": self.bf16_tflops,
            "fp8": self.fp8_tflops,
            "fp32": self.fp32_tflops,
        }.get(dtype)

    def best_matmul_tflops(self, dtype: str) -> float | None:
        """The best matmul TFLOP/s published for the part in ``dtype`` (bf16 for fp16; None for fp32, whose peak is
        the vector one, and for an FP8 figure nobody published)."""
        return {"bf16": self.mamf_bf16_tflops, "fp16": self.mamf_bf16_tflops, "fp8": self.mamf_fp8_tflops}.get(dtype)

    def matmul_share(self, dtype: str) -> float | None:
        """The published best matmul's share of the dense peak in ``dtype`` (fp8, or bf16 for the 16-bit types); an
        FP8 share nobody published is taken as the bf16 one; None: neither is published, or fp32 (its peak is the
        vector units', which no tensor-core figure describes)."""
        if dtype not in ("bf16", "fp16", "fp8"):
            return None
        bf16 = self.mamf_bf16_tflops / self.bf16_tflops if self.mamf_bf16_tflops else None
        if dtype == "fp8" and self.mamf_fp8_tflops and self.fp8_tflops:
            return self.mamf_fp8_tflops / self.fp8_tflops
        return bf16


# Matched in order against the lower-cased device name; the first hit wins (so "h100 pcie" before "h100").
# fp32 is the non-tensor-core vector peak (H100/H200 SXM 67 TFLOPS; MI300X/MI325X 163.4 TFLOPS). The PCIe and
# NVL H100s have lower clocks and power (and, for PCIe, HBM2e): their own datasheet lines.
# The APU MI300A (228 CUs) and the NVL parts have their own lines; Grace Hopper ("GH200") has none (its memory
# differs between versions), and the (?<!g) keeps it from taking the H200/H100 lines. GB200 comes before B200;
# Blackwell's per-GPU figures are the HGX B200 and GB200 NVL72 tables' sparse totals halved and divided by the
# GPUs; MI350X/MI355X's are the CDNA 4 peaks (clock × matrix cores). The A100 has no FP8.
# The last two figures are the best matmul TFLOP/s published (docs/conventions.md, "Peaks", gives the sources):
# torch matmul searched over shapes (stas00's MAMF table), AMD's hipBLASLt MAF for MI300X/MI325X FP8; a part
# without a figure of its own takes its sibling's share of its own peak (MI350X MI355X's, MI300A MI300X's, H200 NVL
# H200's, the other H100s and the A100 40GB the SXM one's; stas00 finds H200's bf16 figure the same as H100's).
_H100_BF16, _H100_FP8 = 794.5 / 989.0, 1402.6 / 1979.0
_A100_BF16 = 271.2 / 312.0
_CDNA4_BF16 = 1565.0 / 2516.6
_CDNA3_BF16, _CDNA3_FP8 = 668.4 / 1307.4, 1273.0 / 2614.9
# Model TFLOP/s per GPU of one training recipe published on several parts in one release (Megatron-Bridge's
# performance summary, 25.11 NeMo container: Llama-3 8B, FP8 current scaling, 8 GPUs, sequence 8,192; H100 mbs 1
# under FSDP, B200, GB200 and GB300 mbs 2): what a part's training step reaches of its best FP8 matmul over what
# H100's does is its ``training`` factor (GB200 0.846, B200 0.866, GB300 1.008 over GB200's matmul share): the share
# of the matmul rate these parts' GEMMs and attention keep in training, which their best matmuls alone misstate
# (docs/project.md, "Parts")
TRAINING_FP8_TFLOPS = {"H100": 744.0, "B200": 1576.0, "GB200": 1622.0, "GB300": 1933.0}


def _training(part: str, best_fp8: float) -> float:
    return round(TRAINING_FP8_TFLOPS[part] / best_fp8 / (TRAINING_FP8_TFLOPS["H100"] / (_H100_FP8 * 1979.0)), 4)


def _at(peak: float, share: float) -> float:
    return round(peak * share, 1)


PEAKS: list[tuple[str, Peak]] = [
    (r"mi355", Peak(2516.6, 5033.2, 157.3, 8.0, 1565.0)),
    (r"mi350", Peak(2306.9, 4613.7, 144.2, 8.0, _at(2306.9, _CDNA4_BF16), matmul_of="MI355X")),
    (r"mi325", Peak(1307.4, 2614.9, 163.4, 6.0, 784.9, 1519.0)),
    (r"mi300a", Peak(980.6, 1961.2, 122.6, 5.3, _at(980.6, _CDNA3_BF16), _at(1961.2, _CDNA3_FP8), "MI300X")),
    (r"mi300x|mi300", Peak(1307.4, 2614.9, 163.4, 5.3, 668.4, 1273.0)),
    (r"(?<!g)h200.*nvl", Peak(835.0, 1671.0, 60.0, 4.8, _at(835.0, _H100_BF16), _at(1671.0, 1453.4 / 1979.0), "H200")),
    (r"(?<!g)h200", Peak(989.0, 1979.0, 67.0, 4.8, 794.5, 1453.4)),
    (r"(?<!g)h100.*pcie", Peak(756.0, 1513.0, 51.0, 2.0, _at(756.0, _H100_BF16), _at(1513.0, _H100_FP8), "H100 SXM")),
    (r"(?<!g)h100.*nvl", Peak(835.0, 1671.0, 60.0, 3.9, _at(835.0, _H100_BF16), _at(1671.0, _H100_FP8), "H100 SXM")),
    (r"(?<!g)h100", Peak(989.0, 1979.0, 67.0, 3.35, 794.5, 1402.6)),
    # Blackwell Ultra: the dense FP8/bf16 peaks of its Blackwell sibling (GB300 NVL72: 360 PFLOPS FP8 dense over 72;
    # HGX B300: 4.5 / 2.25 PFLOPS a GPU) and, with no matmul figure of its own, the sibling's share of them (an
    # estimate); GB300's training factor is its own (the 25.11 recipe above), B300's its sibling's (none published)
    (r"gb300", Peak(2500.0, 5000.0, 80.0, 8.0, 1822.0, 3615.6, "GB200", training=_training("GB300", 3615.6))),
    (r"b300", Peak(2250.0, 4500.0, 75.0, 8.0, 1745.0, 3432.5, "B200", training=_training("B200", 3432.5))),
    (r"gb200", Peak(2500.0, 5000.0, 80.0, 8.0, 1822.0, 3615.6, training=_training("GB200", 3615.6))),
    (r"b200", Peak(2250.0, 4500.0, 75.0, 8.0, 1745.0, 3432.5, training=_training("B200", 3432.5))),
    (r"a100.*pcie", Peak(312.0, None, 19.5, 1.935, 252.9)),
    (r"a100.*40gb", Peak(312.0, None, 19.5, 1.555, _at(312.0, _A100_BF16), matmul_of="A100 80GB SXM")),
    (r"a100", Peak(312.0, None, 19.5, 2.039, 271.2)),
]
H100_BF16_MATMUL_SHARE = _H100_BF16  # the share the projection's default GEMM efficiency is set against


def lookup_peak(name: str) -> Peak | None:
    low = name.lower()
    for pattern, peak in PEAKS:
        if re.search(pattern, low):
            return peak
    return None


def by_part(table: Sequence[tuple[str, T]], name: str | None, default: D) -> T | D:
    """The value of the first row of a per-part table (regex on the lower-cased device name, first hit wins) that
    matches ``name``, else ``default``: how every per-part figure here and in the tools is looked up."""
    low = (name or "").lower()
    return next((value for pattern, value in table if re.search(pattern, low)), default)


GPU_NAME_WORDS = ("nvidia", "geforce", "tesla", "quadro", "instinct", "radeon")  # in the device names torch reports


CPU_NAME_WORDS = ("ryzen", "epyc", "xeon", "core(tm)", "neoverse", "apple m")  # APUs name their Radeon graphics


def is_gpu_name(name: str | None) -> bool:
    """Whether a device name is a GPU's: a part the peak table knows, one whose name says so (an unlisted GPU), or
    what ROCm reports without a marketing name (its arch, 'gfx942:…', or 'gpu'); a CPU's name (torch's 'cpu', the
    model name opbench writes, e.g. 'AMD EPYC', an APU's 'AMD Ryzen 7 7840U w/ Radeon 780M Graphics') is neither."""
    low = (name or "").strip().lower()
    if any(word in low for word in CPU_NAME_WORDS):
        return False
    return (
        lookup_peak(low) is not None
        or any(word in low for word in GPU_NAME_WORDS)
        or low.startswith("gfx")
        or low == "gpu"
    )


# GPUs sharing one NVLink/NVSwitch fabric where it reaches beyond the node (docs/project.md, "NVLink domains"):
# NVIDIA's GB200 NVL72 and GB300 NVL72 datasheets, "72 Blackwell GPUs ... NVLink domain", fifth-generation NVLink
# at 1.8 TB/s per GPU (900 GB/s per direction) through the rack's NVLink switch trays. Every other part's domain is
# its node (HGX boards of 8, MI300X/MI325X/MI355X platforms of 8 on xGMI).
NVLINK_DOMAINS: list[tuple[str, int]] = [(r"gb[23]00", 72)]


def nvlink_domain_of(name: str | None) -> int | None:
    """The NVLink domain a part is sold in when it is larger than a node (GB200/GB300: 72); None: the node."""
    return by_part(NVLINK_DOMAINS, name, None)


# GPUs per node (one OS image, its own CPUs and NICs) where a part is not sold in boards of 8: a GB200/GB300 NVL72
# compute tray holds 2 Grace CPUs and 4 GPUs (NVIDIA's GB200 NVL72 datasheet: 18 compute trays, 72 GPUs).
NODE_GPUS: list[tuple[str, int]] = [(r"gb[23]00", 4)]
DEFAULT_NODE_GPUS = 8  # HGX/DGX boards and the MI300X/MI325X/MI355X platforms


def node_gpus_of(name: str | None) -> int:
    """GPUs in one node of the part (GB200/GB300: a compute tray of 4; else 8)."""
    return by_part(NODE_GPUS, name, DEFAULT_NODE_GPUS)


# The CPU that issues a part's kernels, where it is not an x86 server's (docs/project.md, "Host-bound steps"): the
# Grace superchips (GB200/GB300 NVL72, GH200) pair each GPU with NVIDIA's Arm Grace CPU, whose single-thread issue of
# a PyTorch operator is 2.75× a DGX H100's Xeon's (TransformerEngine issue #2053's measurement). Every other listed
# part sits in an x86 server (DGX/HGX boards, MI300X/MI325X/MI355X platforms).
HOST_CPUS: list[tuple[str, str]] = [(r"gb[23]00|gh200", "grace")]


# Parts whose tensor cores take MXFP8 (OCP microscaling: E4M3 with an E8M0 scale per 32 elements) natively:
# NVIDIA Blackwell (B200/GB200, B300/GB300) and AMD CDNA 4 (MI350X/MI355X); Hopper and CDNA 3 have none, and
# Transformer Engine refuses the recipe there (docs/project.md, "FP8").
MX_PARTS = r"b[23]00|mi35"


def has_mxfp8(name: str | None) -> bool:
    """Whether the part runs MXFP8 GEMMs (MX_PARTS)."""
    return bool(re.search(MX_PARTS, (name or "").lower()))


def host_cpu(name: str | None) -> str:
    """'grace' or 'x86': the CPU that launches a part's kernels."""
    return by_part(HOST_CPUS, name, "x86")
