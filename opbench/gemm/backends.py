"""GEMM backends: a registry where each backend is a few lines.

A backend receives the operands already laid out for the pass (``a``: [m,k] or [G,m,k], ``b``: [k,n] or
[G,k,n], possibly transposed views) and returns a zero-argument callable that computes C into a preallocated
output. It raises ``Unsupported`` when it cannot run the shape on this device/dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from opbench.core.device import gpu_backend
from opbench.core.sweep import Unsupported

from .schema import BACKEND_NAMES

GemmFn = Callable[[], torch.Tensor]


@dataclass(frozen=True)
class Backend:
    name: str
    build: Callable[[torch.Tensor, torch.Tensor, str], tuple[GemmFn, str]]  # (a, b, dtype) -> (fn, impl)
    grouped_only: bool = False
    input_dtype: str | None = None  # forces the operand dtype (fp8)


BACKENDS: dict[str, Backend] = {}


def register(name: str, *, grouped_only: bool = False, input_dtype: str | None = None):
    def deco(fn):
        BACKENDS[name] = Backend(name, fn, grouped_only, input_dtype)
        return fn

    return deco


def _out(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.empty((*a.shape[:-1], b.shape[-1]), dtype=dtype or a.dtype, device=a.device)


@register("torch")
def _torch(a: torch.Tensor, b: torch.Tensor, dtype: str) -> tuple[GemmFn, str]:
    """torch.mm (cuBLAS / hipBLASLt / MKL-oneDNN); equal-size expert groups as one torch.bmm."""
    if dtype == "fp8":
        raise Unsupported("plain torch.mm has no fp8 path; use backend fp8 (torch._scaled_mm)")
    c = _out(a, b)
    if a.dim() == 3:
        return (lambda: torch.bmm(a, b, out=c)), "torch.bmm"
    return (lambda: torch.mm(a, b, out=c)), "torch.mm"


@register("torch_grouped", grouped_only=True)
def _torch_grouped(a: torch.Tensor, b: torch.Tensor, dtype: str) -> tuple[GemmFn, str]:
    """Grouped GEMM for routed experts: torch._grouped_mm where the build has it, else a loop over experts."""
    if dtype == "fp8":
        raise Unsupported("grouped fp8 GEMM is not implemented; use backend fp8 per expert shape")
    if hasattr(torch, "_grouped_mm"):
        try:
            torch._grouped_mm(a[:, :1], b[:, :, :1])  # probe: dtype/arch/layout support varies per build
        except (RuntimeError, NotImplementedError) as exc:
            reason = " ".join(str(exc).split())[:120]
        else:
            # _grouped_mm has no out=: its output allocation (caching allocator on GPU) is inside the timing.
            impl = f"torch._grouped_mm ({grouped_mm_kernel(a)}, allocates its output)"
            return (lambda: torch._grouped_mm(a, b)), impl
    else:
        reason = "torch._grouped_mm absent in this build"
    c = _out(a, b)

    def loop() -> torch.Tensor:
        for g in range(a.shape[0]):
            torch.mm(a[g], b[g], out=c[g])
        return c

    return loop, f"loop over experts ({reason})"


def grouped_mm_kernel(a: torch.Tensor) -> str:
    """What torch._grouped_mm runs for these operands (aten GroupedBlas.cpp): on CUDA, a CUTLASS grouped kernel for
    bf16 on compute capability 9.x/10.x, else a fallback that is torch.bmm for 3-D operands; on ROCm the build
    decides (a CK kernel or the same fallback)."""
    if a.device.type != "cuda":
        return "CPU: bmm fallback"
    if gpu_backend() == "rocm":
        return "ROCm: CK kernel or bmm fallback, by build"
    major = torch.cuda.get_device_capability(a.device)[0]
    return "CUTLASS grouped kernel" if a.dtype == torch.bfloat16 and major in (9, 10) else "bmm fallback"


def fp8_supported() -> str | None:
    """None when this device can run torch._scaled_mm, else the reason it cannot."""
    if not torch.cuda.is_available():
        return "fp8 GEMM needs a GPU (H100/H200 sm_89+, MI300 gfx942+)"
    if not hasattr(torch, "_scaled_mm"):
        return "torch._scaled_mm is absent in this torch build"
    if gpu_backend() == "rocm":
        arch = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "gcnArchName", "")
        return rocm_fp8_unsupported(arch.split(":")[0], str(torch.version.hip))
    major, minor = torch.cuda.get_device_capability()
    return None if (major, minor) >= (8, 9) else f"fp8 needs compute capability 8.9+, this GPU is {major}.{minor}"


def rocm_fp8_unsupported(arch: str, hip: str) -> str | None:
    """torch._scaled_mm's own ROCm rule: gfx942 (MI300X/MI325X) always; gfx950 (MI355X) and gfx1200/gfx1201 from
    ROCm 6.5; nothing else (gfx940/941 and older ROCm fail inside torch, as an error row rather than a reason)."""
    if arch == "gfx942":
        return None
    if arch in ("gfx950", "gfx1200", "gfx1201"):
        try:
            version = tuple(int(x) for x in hip.split(".")[:2])
        except ValueError:
            version = (0, 0)
        return None if version >= (6, 5) else f"torch._scaled_mm supports {arch} from ROCm 6.5 (this torch: {hip})"
    return f"torch._scaled_mm has no fp8 path on {arch or 'this GPU'} (gfx942, gfx950, gfx1200/1201)"


@register("fp8", input_dtype="fp8")
def _fp8(a: torch.Tensor, b: torch.Tensor, dtype: str) -> tuple[GemmFn, str]:
    """torch._scaled_mm with per-tensor scales, bf16 output. cuBLASLt/hipBLASLt take only A row-major and
    B column-major, so dgrad/wgrad operands are re-laid out once, untimed (as fp8 training recipes do)."""
    reason = fp8_supported()
    if reason:
        raise Unsupported(reason)
    if a.dim() == 3:
        raise Unsupported("grouped fp8 GEMM is not implemented")
    k, n = b.shape
    if k % 16 or n % 16:
        raise Unsupported(f"torch._scaled_mm needs K and N divisible by 16 (K={k}, N={n})")
    relaid = not (a.is_contiguous() and b.t().is_contiguous())
    a2 = a.contiguous()
    b2 = b.t().contiguous().t()
    one = torch.ones((), dtype=torch.float32, device=a.device)
    c = _out(a2, b2, torch.bfloat16)
    # use_fast_accum stays off (torch's default): H100's fast mode accumulates in lower precision and runs faster
    impl = "torch._scaled_mm, use_fast_accum=False" + (" (operands re-laid out as TN)" if relaid else "")
    return (lambda: torch._scaled_mm(a2, b2, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, out=c)), impl


@register("triton")
def _triton(a: torch.Tensor, b: torch.Tensor, dtype: str) -> tuple[GemmFn, str]:
    """opbench's own tiled Triton matmul (autotuned on GPU). Never timed under the CPU interpreter."""
    if a.device.type != "cuda":
        raise Unsupported("triton kernels are timed only on GPU (CPU correctness runs under TRITON_INTERPRET=1)")
    if dtype == "fp8":
        raise Unsupported("the triton matmul has no fp8 path")
    try:
        from .triton_matmul import matmul
    except ImportError as exc:
        raise Unsupported(f"triton is not installed ({exc})") from None
    c = _out(a, b)
    return (lambda: matmul(a, b, out=c)), "opbench triton tiled matmul"


if tuple(BACKENDS) != BACKEND_NAMES:  # the CLI lists schema.BACKEND_NAMES without importing this module
    raise RuntimeError(f"gemm backends {tuple(BACKENDS)} differ from schema.BACKEND_NAMES {BACKEND_NAMES}")
