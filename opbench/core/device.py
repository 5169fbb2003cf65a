"""Device layer: which accelerator we run on (CPU, CUDA, ROCm), its name, and its published peaks."""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from functools import cache

import torch

from . import dtypes
from .errors import UsageError
from .peaks import PEAKS, Peak, lookup_peak  # noqa: F401 - the peak table's public home is torch-free core.peaks


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" | "cuda" | "rocm"
    name: str
    device: torch.device
    peak: Peak | None

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("cuda", "rocm")

    def peak_tflops(self, dtype: str) -> float | None:
        return self.peak.tflops(dtype) if self.peak else None

    def best_matmul_tflops(self, dtype: str) -> float | None:
        return self.peak.best_matmul_tflops(dtype) if self.peak else None


def gpu_backend() -> str | None:
    """'rocm' when torch was built for HIP (ROCm reuses the torch.cuda API), 'cuda' for CUDA, else None."""
    if not torch.cuda.is_available():
        return None
    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def resolve_device(spec: str | None = None, local_rank: int | None = None) -> torch.device:
    """The one LOCAL_RANK → device rule. 'auto'/None picks the GPU when there is one, else the CPU; 'auto' and a
    bare 'cuda' take GPU number ``local_rank`` (default: the launcher's local rank — torchrun's LOCAL_RANK or
    srun's SLURM_LOCALID — else 0) modulo the GPUs this node has; 'cpu' and 'cuda:N' are taken as given, and
    checked."""
    if spec in (None, "", "auto") and not torch.cuda.is_available():
        return torch.device("cpu")
    if spec in (None, "", "auto", "cuda"):
        if not torch.cuda.is_available():
            raise UsageError("a GPU was asked for but torch sees none (CPU-only build or no driver)", field="--device")
        if local_rank is None:
            from .launch import detect

            launched = detect()
            local_rank = launched.local_rank if launched else 0
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    try:
        dev = torch.device(spec)
    except RuntimeError as exc:
        raise UsageError(f"unknown device '{spec}' ({exc})", field="--device") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("a GPU was asked for but torch sees none (CPU-only build or no driver)", field="--device")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UsageError(f"GPU {dev.index} does not exist (torch sees {torch.cuda.device_count()})", field="--device")
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"device type '{dev.type}' is not supported (use cpu or cuda)", field="--device")
    return dev


def use_device(spec: str | None = None, local_rank: int | None = None) -> torch.device:
    """resolve_device, made this process's current device: CUDA events, streams, torch.cuda._sleep and Triton
    launches use the current device, so timing a GEMM on cuda:1 while cuda:0 is current would time nothing."""
    dev = resolve_device(spec, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


@cache
def device_info(device: torch.device | str | None = None) -> DeviceInfo:
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        # On ROCm, gcnArchName (e.g. gfx942) is more telling than the marketing name, which can be empty.
        name = props.name or getattr(props, "gcnArchName", "") or "gpu"
        return DeviceInfo(gpu_backend() or "cuda", name, dev, lookup_peak(name))
    return DeviceInfo("cpu", cpu_name(), dev, None)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def last_level_cache_bytes(device: torch.device) -> int:
    """Size of the cache a cold measurement must evict: GPU L2 (or MI300's Infinity Cache), CPU L3."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        # MI300X/MI325X have a 256 MiB Infinity Cache behind the L2 that props do not report.
        if gpu_backend() == "rocm" and lookup_peak(props.name or "") is not None:
            l2 = max(l2, 256 << 20)
        return l2 or (64 << 20)
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            try:
                with open(os.path.join(base, entry, "size")) as fh:
                    text = fh.read().strip()
            except OSError:
                continue
            m = re.fullmatch(r"(\d+)([KMG]?)", text)
            if m:
                best = max(best, int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)])
    except OSError:
        pass
    return best or (32 << 20)


def default_dtype_name(device: torch.device) -> str:
    """bf16 on GPUs, fp32 on the CPU (no native bf16 here; emulated bf16 GEMM runs at ~1 GFLOPS)."""
    return "bf16" if device.type == "cuda" else "fp32"


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of an opbench dtype name (core.dtypes); fp8 is the platform's e4m3 flavour (fnuz on MI300)."""
    found = dtypes.lookup(name)
    if found is None:
        raise UsageError(f"unknown dtype '{name}' (choose from {', '.join(dtypes.DTYPES)})", field="--dtype")
    if found.name == "fp8" and gpu_backend() == "rocm" and hasattr(torch, "float8_e4m3fnuz"):
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        if "gfx94" in getattr(props, "gcnArchName", ""):
            return torch.float8_e4m3fnuz
    return getattr(torch, found.torch_name)
