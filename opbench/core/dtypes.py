"""The one dtype vocabulary: opbench's short names and what each is called by torch, NCCL, nccl-tests and
rccl-tests. No torch import: the log parser, the FSDP model and the report use it too. The device layer
(``core.device.torch_dtype``) turns a name into a ``torch.dtype``. Enums and names: docs/conventions.md,
"NCCL datatypes and reductions".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    """One element type. ``name`` is what opbench's flags and CSVs use (bf16, fp32, …)."""

    name: str
    size: int  # bytes per element
    torch_name: str  # attribute of the torch module (fp8: the OCP e4m3 flavour; MI300 swaps in fnuz)
    nccl_enum: int  # ncclDataType_t, as NCCL_DEBUG lines print it ("datatype 9")
    nccl_name: str  # NCCL's own name
    nccl_tests: str  # nccl-tests -d value
    rccl_tests: str  # rccl-tests -d value
    aliases: tuple[str, ...] = ()

    @property
    def is_float(self) -> bool:
        return self.name.startswith(("fp", "bf"))


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("int8", 1, "int8", 0, "int8", "int8", "int8"),
        DType("uint8", 1, "uint8", 1, "uint8", "uint8", "uint8"),
        DType("int32", 4, "int32", 2, "int32", "int32", "int32"),
        DType("uint32", 4, "uint32", 3, "uint32", "uint32", "uint32"),
        DType("int64", 8, "int64", 4, "int64", "int64", "int64"),
        DType("uint64", 8, "uint64", 5, "uint64", "uint64", "uint64"),
        DType("fp16", 2, "float16", 6, "float16", "half", "half", ("float16", "half")),
        DType("fp32", 4, "float32", 7, "float32", "float", "float", ("float32", "float")),
        DType("fp64", 8, "float64", 8, "float64", "double", "double", ("float64", "double")),
        DType("bf16", 2, "bfloat16", 9, "bfloat16", "bfloat16", "bfloat16", ("bfloat16",)),
        DType("fp8", 1, "float8_e4m3fn", 10, "float8e4m3", "f8e4m3", "fp8_e4m3", ("float8e4m3", "fp8_e4m3", "f8e4m3")),
        DType("fp8_e5m2", 1, "float8_e5m2", 11, "float8e5m2", "f8e5m2", "fp8_e5m2", ("float8e5m2", "f8e5m2")),
    )
}

BY_ENUM: dict[int, DType] = {d.nccl_enum: d for d in DTYPES.values()}
_BY_ANY_NAME: dict[str, DType] = {n.lower(): d for d in DTYPES.values() for n in (d.name, *d.aliases)}

# The element types each tool offers on its command line.
FLOAT_DTYPES = ("bf16", "fp16", "fp32")  # parameters, gradients, attention
GEMM_DTYPES = (*FLOAT_DTYPES, "fp8")
COMM_DTYPES = ("bf16", "fp16", "fp32", "fp64", "fp8", "fp8_e5m2", "int8", "uint8", "int32", "int64")


def lookup(name_or_enum: str | int) -> DType | None:
    """The dtype for an opbench name, any alias (torch's, NCCL's, nccl-tests' -d) or an NCCL enum; None if unknown."""
    if isinstance(name_or_enum, int):
        return BY_ENUM.get(name_or_enum)
    return _BY_ANY_NAME.get(str(name_or_enum).strip().lower())


def dtype(name_or_enum: str | int) -> DType:
    """Like ``lookup`` but a KeyError for an unknown name, for names the code itself chose."""
    found = lookup(name_or_enum)
    if found is None:
        raise KeyError(f"unknown dtype {name_or_enum!r}")
    return found


def element_size(name: str) -> int:
    return dtype(name).size
