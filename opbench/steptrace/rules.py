"""Which class a kernel or CPU operator belongs to: the attribution rules, written once and in order.

Each rule is a regular expression on a GPU kernel's name (CUDA and ROCm libraries alike) or on an ATen operator's
name (the operator that launched a kernel, or on a CPU trace the operator itself). The first rule that matches
decides; nothing matched is ``other``. The classes are the projection's line items (``opbench.project.workload``:
gemm, attention, memory) plus the collectives, the optimizer and copies. Tests: tests/test_step_rules.py, on
kernel names copied from real traces of both vendors. No torch import.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

GEMM, ATTENTION, MEMORY, COMM, OPTIMIZER, MEMCPY, OTHER = (
    "gemm", "attention", "memory", "comm", "optimizer", "memcpy", "other",
)  # fmt: skip
CLASSES = (GEMM, ATTENTION, MEMORY, OPTIMIZER, OTHER, COMM, MEMCPY)
COMPUTE = (GEMM, ATTENTION, MEMORY, OPTIMIZER, OTHER)  # a kernel of these keeps the device busy
COLLECTIVE_KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv", "broadcast", "other")


@dataclass(frozen=True)
class Rule:
    klass: str
    pattern: re.Pattern[str]
    why: str  # the library or operator family the pattern stands for (docs/step.md lists them)


def _r(klass: str, pattern: str, why: str) -> Rule:
    return Rule(klass, re.compile(pattern), why)


# GPU kernel names. Order matters: NCCL/RCCL first (their names hold "Reduce"), attention before GEMM (flash and
# CK attention kernels are built from cutlass / CK GEMM pieces), explicit optimizer kernels before elementwise.
KERNEL_RULES: tuple[Rule, ...] = (
    _r(
        COMM,
        r"^ncclDevKernel_|^ncclKernel_|^nccl|rccl|^void ncclKernel|msccl|^allreduce_|DeepEP|deep_ep",
        "NCCL / RCCL",
    ),
    _r(
        ATTENTION,
        r"flash_fwd|flash_bwd|flash::|FlashAttn|FlashAttention|flash_attn|pytorch_flash",
        "FlashAttention 2/3",
    ),
    _r(ATTENTION, r"cudnn_generated_fort_native_sdpa|_sdpa_|sdpa_|cudnn.*(fprop|bprop).*(attn|sdpa|mha)", "cuDNN SDPA"),
    _r(
        ATTENTION,
        r"fmha|Fmha|FMHA|efficient_attention|mem_efficient|attention_kernel|AttentionKernel",
        "mem-efficient / CK",
    ),
    _r(
        ATTENTION,
        r"aiter.*(mha|fmha|attn)|_attn_fwd|_attn_bwd|attn_fwd|attn_bwd|mha_fwd|mha_bwd|paged_attention",
        "aiter / triton attention",
    ),
    _r(OPTIMIZER, r"[Aa]dam[Ww]?|FusedAdam|fused_sgd|[Ll]amb(Stage|_)|FusedLAMB|lion_", "optimizer kernels"),
    _r(
        GEMM,
        r"gemm|Gemm|GEMM|nvjet|xmma|cutlass|Cijk_|cublas|hipblaslt|rocblas|Tensile|gemv|Gemv|splitKreduce",
        "cuBLAS / hipBLASLt / CK / cutlass",
    ),
    _r(
        GEMM,
        r"wgmma|matmul|_mm_kernel|triton_tem_fused_(addmm|mm|bmm)|triton_.*_mm_|grouped_mm|GroupedGemm",
        "triton / grouped matmul",
    ),
    _r(
        MEMORY,
        r"elementwise|reduce_kernel|Reduce|reduction|triton_(poi|red|per)_|[Nn]orm|softmax|Softmax|cross_entropy|nll_loss",
        "elementwise / reduction",
    ),
    _r(
        MEMORY,
        r"index|Index|gather|scatter|Cat|cat_|copy|Copy|fill|Fill|embedding|Embedding|rotary|[Rr]ope|transpose|permute|cast|Cast",
        "data movement",
    ),
    _r(
        MEMORY,
        r"vectorized|unrolled|at::native|multi_tensor_apply|silu|gelu|swiglu|dropout|topk|sort|cumsum|scan|quantize|amax|__amd_rocclr",
        "PyTorch native / ROCm runtime",
    ),
    _r(
        MEMORY,
        r"^triton_|^kernel_elementwise|ck::kernel_elementwise|memcpy|memset|Memcpy|Memset",
        "triton pointwise / CK",
    ),
)

# ATen (and c10d / autograd) operator names: CPU traces, and the launching operator where a kernel's name says nothing
OP_RULES: tuple[Rule, ...] = (
    _r(COMM, r"^record_param_comms$|^c10d::|^gloo:|^nccl:|^c10d_functional::|^_c10d_functional::", "torch.distributed"),
    # FSDP2's spans around its collectives and their waits (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py)
    _r(COMM, r"^FSDP::all_gather(?!_copy)|^FSDP::post_backward_reduce|^FSDP::reduce_scatter", "FSDP2 collectives"),
    _r(
        ATTENTION,
        r"^aten::_?scaled_dot_product|^aten::_flash_attention|^aten::_efficient_attention|^aten::_cudnn_attention|^flash_attn|^aten::_fused_sdp",
        "SDPA and its backends",
    ),
    _r(OPTIMIZER, r"^aten::_fused_adam|^aten::_fused_sgd|^aten::_fused_adagrad|^Optimizer\.step#", "fused optimizers"),
    _r(
        GEMM,
        r"^aten::(mm|addmm|_addmm_activation|bmm|baddbmm|matmul|linear|_scaled_mm|_grouped_mm|_scaled_grouped_mm|addmv|mv|einsum)$",
        "ATen matmuls",
    ),
    _r(MEMORY, r"^aten::", "every other ATen operator with work to do"),
)

# ATen operators that move no data (views, allocations, metadata): they take their enclosing operator's class
NO_WORK = re.compile(
    r"^aten::(view|_?reshape\w*|_unsafe_view|t|transpose|permute|expand|expand_as|as_strided|unsqueeze|squeeze|slice|"
    r"select|detach|detach_|alias|empty|empty_like|empty_strided|resize_|lift_fresh|unbind|split|split_with_sizes|"
    r"chunk|narrow|contiguous|numpy_T|unflatten|flatten|lift|_nested\w*|set_|is_nonzero|item|_local_scalar_dense|"
    r"size|stride|dim|result_type|to|_to_copy_view|resolve_conj|resolve_neg)$"
)

_COMM_KINDS = (
    ("reducescatter", "reduce_scatter"),
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("sendrecv", "send_recv"),
    ("send", "send_recv"),
    ("recv", "send_recv"),
    ("broadcast", "broadcast"),
)
_BACKWARD = re.compile(r"bwd|Bwd|BWD|backward|Backward|bprop|dgrad|_dq|dkdv|dot_do_o")


@lru_cache(maxsize=1 << 16)
def kernel_class(name: str) -> str:
    """The class of a GPU kernel, copy or memset by its name."""
    for rule in KERNEL_RULES:
        if rule.pattern.search(name):
            return rule.klass
    return OTHER


@lru_cache(maxsize=1 << 14)
def op_class(name: str) -> str | None:
    """The class of a CPU operator; None for one that does no work of its own (a view, an autograd or module span),
    which takes its enclosing operator's."""
    if NO_WORK.match(name):
        return None
    for rule in OP_RULES:
        if rule.pattern.search(name):
            return rule.klass
    return None


def collective_kind(name: str) -> str:
    """all_reduce, reduce_scatter, … from an NCCL kernel name, a c10d operator or record_param_comms' "Collective
    name" (``_reduce_scatter_base``, ``allgather_into_tensor_coalesced``, ``all_to_allv``, ``ncclDevKernel_SendRecv``)."""
    flat = re.sub(r"[^a-z]", "", name.lower().replace("nccl", "").replace("kernel", ""))
    if "postbackwardreduce" in flat:  # FSDP2's gradient reduce-scatter (an all-reduce too under HSDP)
        return "reduce_scatter"
    for word, kind in _COMM_KINDS:
        if word in flat:
            return kind
    return "other"


def direction(name: str) -> str:
    """fwd or bwd, from an attention kernel's or operator's name."""
    return "bwd" if _BACKWARD.search(name) else "fwd"


def attention_backend(name: str) -> str:
    low = name.lower()
    for word, backend in (
        ("sm90", "fa3"), ("flashattnfwdsm", "fa3"), ("flashattnbwdsm", "fa3"), ("cudnn", "cudnn"),
        ("ck_tile", "ck"), ("aiter", "aiter"), ("efficient", "mem_efficient"), ("fmha", "mem_efficient"),
        ("flash", "flash"), ("triton", "triton"), ("math", "math"),
    ):  # fmt: skip
        if word in low:
            return backend
    return "other"


DTYPES = {
    "c10::bfloat16": "bf16", "c10::half": "fp16", "float": "fp32", "double": "fp64",
    "c10::float8_e4m3fn": "fp8", "c10::float8_e5m2": "fp8", "c10::float8_e4m3fnuz": "fp8", "c10::float8_e5m2fnuz": "fp8",
}  # fmt: skip
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8, "fp8": 1, "int64": 8, "int32": 4, "int8": 1, "uint8": 1}
# record_param_comms' dtype: c10's ScalarType names
COMM_DTYPES = {"BFloat16": "bf16", "Half": "fp16", "Float": "fp32", "Double": "fp64", "Long": "int64",
               "Int": "int32", "Char": "int8", "Byte": "uint8", "Float8_e4m3fn": "fp8", "Float8_e5m2": "fp8"}  # fmt: skip


def dtype_name(type_text: object) -> str:
    return DTYPES.get(str(type_text).lower(), str(type_text) if type_text else "")


def _dims(value: object) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None


def gemm_shape(op: str, dims: list[object] | None) -> tuple[int, int, int, int] | None:
    """(m, n, k, groups) of a matmul operator from its ``Input Dims`` (docs/conventions.md, "GEMM shapes": C[m,n] =
    A[m,k] · B[k,n]); None when the operator or its dims say nothing."""
    if not dims:
        return None
    base = op.removeprefix("aten::")
    args = [_dims(d) for d in dims]
    a, b = (args[1], args[2]) if base in ("addmm", "baddbmm", "_addmm_activation") and len(args) > 2 else (
        args[0], args[1] if len(args) > 1 else None)  # fmt: skip
    if not a or not b:
        return None
    if base == "linear":  # x[..., k] · W[n, k]ᵀ
        if len(b) != 2:
            return None
        return math.prod(a[:-1]), b[0], a[-1], 1
    if base in ("_grouped_mm", "_scaled_grouped_mm") and len(b) == 3 and len(a) == 2:
        return math.ceil(a[0] / max(b[0], 1)), b[2], a[1], b[0]
    if len(a) < 2 or len(b) < 1:
        return None
    if len(b) == 1:  # matrix-vector
        return math.prod(a[:-1]), 1, a[-1], 1
    if len(b) == 2:
        return math.prod(a[:-1]), b[1], a[-1], 1
    groups = math.prod(b[:-2])
    return a[-2], b[-1], a[-1], groups


def comm_input(op: str, dims: list[object], types: object) -> tuple[int | None, str]:
    """(elements, dtype) of a c10d operator's input tensor, nccl-tests' and record_param_comms' "In msg nelems":
    the second argument of the ``*_base_`` / ``*_tensor*`` forms (output first), else the first."""
    index = 1 if re.search(r"_base_|into_tensor|_tensor_|_single", op) and len(dims) > 1 else 0
    shape = _dims(dims[index]) if index < len(dims) else None
    kinds = types if isinstance(types, list) else []
    dtype = dtype_name(kinds[index]) if index < len(kinds) else ""
    return (math.prod(shape) if shape else None), dtype
