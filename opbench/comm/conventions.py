"""nccl-tests / rccl-tests conventions (REFERENCE §4, §5): the one place for byte counts, bus-bandwidth
factors, NCCL datatype/redop enums and benchmark command lines.

Every other module (the torchrun benchmark, the FSDP model, the log parser, the output parser) asks this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Collective:
    """One collective as nccl-tests sees it.

    ``size`` is what nccl-tests calls size (its -b/-e values): total buffer bytes per rank, max(send, recv).
    ``count`` is the per-rank NCCL count (what an NCCL_DEBUG line and nccl-tests' count column show).
    """

    name: str                    # opbench name
    nccl_op: str                 # name in NCCL logs
    binary: str                  # nccl-tests / rccl-tests binary
    busbw_factor: Callable[[int], float]
    count_scales_with_ranks: bool  # size = count·n·elt (gathers, scatters, all-to-all) vs count·elt
    has_redop: bool = False
    has_root: bool = False

    def size_bytes(self, count: int, nranks: int, elt_size: int) -> int:
        return count * elt_size * (nranks if self.count_scales_with_ranks else 1)

    def count_for_size(self, size_bytes: int, nranks: int, elt_size: int) -> int:
        """Per-rank count for a -b size, rounded down as nccl-tests does."""
        return size_bytes // elt_size // (nranks if self.count_scales_with_ranks else 1)

    def algbw_gbs(self, size_bytes: int, time_s: float) -> float:
        return size_bytes / time_s / 1e9

    def busbw_gbs(self, size_bytes: int, time_s: float, nranks: int) -> float:
        return self.algbw_gbs(size_bytes, time_s) * self.busbw_factor(nranks)


def _ring(n: int) -> float:
    return (n - 1) / n if n > 0 else 0.0


def _allreduce(n: int) -> float:
    return 2 * (n - 1) / n if n > 0 else 0.0


def _one(n: int) -> float:
    return 1.0


COLLECTIVES: dict[str, Collective] = {c.name: c for c in (
    Collective("all_reduce", "AllReduce", "all_reduce_perf", _allreduce, False, has_redop=True),
    Collective("all_gather", "AllGather", "all_gather_perf", _ring, True),
    Collective("reduce_scatter", "ReduceScatter", "reduce_scatter_perf", _ring, True, has_redop=True),
    Collective("all_to_all", "AlltoAll", "alltoall_perf", _ring, True),
    Collective("send_recv", "SendRecv", "sendrecv_perf", _one, False),
    Collective("broadcast", "Broadcast", "broadcast_perf", _one, False, has_root=True),
    Collective("reduce", "Reduce", "reduce_perf", _one, False, has_redop=True, has_root=True),
)}

# NCCL log op names (all eras, RCCL included) -> opbench collective name.
NCCL_OP_TO_COLLECTIVE: dict[str, str] = {
    "AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
    "Broadcast": "broadcast", "Reduce": "reduce", "AlltoAll": "all_to_all", "AllToAll": "all_to_all",
    "AllToAllPivot": "all_to_all", "Send": "send_recv", "Recv": "send_recv", "SendRecv": "send_recv",
}


@dataclass(frozen=True)
class NcclDtype:
    enum: int
    name: str          # NCCL's name
    size: int          # bytes per element
    nccl_tests: str    # -d value for nccl-tests
    rccl_tests: str    # -d value for rccl-tests
    torch_name: str | None


NCCL_DTYPES: dict[int, NcclDtype] = {d.enum: d for d in (
    NcclDtype(0, "int8", 1, "int8", "int8", "int8"),
    NcclDtype(1, "uint8", 1, "uint8", "uint8", "uint8"),
    NcclDtype(2, "int32", 4, "int32", "int32", "int32"),
    NcclDtype(3, "uint32", 4, "uint32", "uint32", "uint32"),
    NcclDtype(4, "int64", 8, "int64", "int64", "int64"),
    NcclDtype(5, "uint64", 8, "uint64", "uint64", "uint64"),
    NcclDtype(6, "float16", 2, "half", "half", "float16"),
    NcclDtype(7, "float32", 4, "float", "float", "float32"),
    NcclDtype(8, "float64", 8, "double", "double", "float64"),
    NcclDtype(9, "bfloat16", 2, "bfloat16", "bfloat16", "bfloat16"),
    NcclDtype(10, "float8e4m3", 1, "f8e4m3", "fp8_e4m3", "float8_e4m3fn"),
    NcclDtype(11, "float8e5m2", 1, "f8e5m2", "fp8_e5m2", "float8_e5m2"),
)}

# opbench CLI dtype names -> NCCL enum
DTYPE_ENUM_BY_NAME: dict[str, int] = {
    "int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
    "fp16": 6, "float16": 6, "half": 6, "fp32": 7, "float32": 7, "float": 7, "fp64": 8, "float64": 8,
    "double": 8, "bf16": 9, "bfloat16": 9, "fp8": 10, "float8e4m3": 10, "fp8_e4m3": 10, "f8e4m3": 10,
    "float8e5m2": 11, "fp8_e5m2": 11, "f8e5m2": 11,
}

REDOPS: dict[int, str] = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}


def nccl_dtype(name_or_enum: str | int) -> NcclDtype:
    if isinstance(name_or_enum, int):
        return NCCL_DTYPES[name_or_enum]
    return NCCL_DTYPES[DTYPE_ENUM_BY_NAME[name_or_enum.lower()]]


def redop_name(op: int) -> str:
    """NCCL ncclRedOp_t value to name; values >= 5 are PreMulSum/user-defined ops (ncclRedOpCreatePreMulSum)."""
    return REDOPS.get(op, "premulsum" if op >= 5 else f"op{op}")


def nccl_tests_command(collective: str, size_bytes: int, nranks: int, dtype: str | int, *,
                       flavour: str = "nccl", launcher: str = "single", redop: str | None = None,
                       nnodes: int = 1, iters: int = 20, warmup: int = 5, check: bool = False) -> str:
    """A runnable nccl-tests/rccl-tests line for one size (-b = -e = ``size_bytes`` in nccl-tests semantics).

    ``launcher='single'``: one process drives all GPUs (``-g nranks``, single node only);
    ``launcher='mpi'``: ``mpirun -np nranks … -g 1`` (one rank per GPU, any node count).
    """
    coll = COLLECTIVES[collective]
    dt = nccl_dtype(dtype)
    d = dt.rccl_tests if flavour == "rccl" else dt.nccl_tests
    args = [f"./build/{coll.binary}", "-b", str(size_bytes), "-e", str(size_bytes), "-d", d]
    if coll.has_redop and redop:
        args += ["-o", redop]
    args += ["-n", str(iters), "-w", str(warmup)]
    if check:
        args += ["-c", "1"]
    if launcher == "single":
        if nnodes != 1:
            raise ValueError("a single-process nccl-tests run drives one node; use launcher='mpi'")
        return " ".join([*args, "-g", str(nranks)])
    if launcher == "mpi":
        per_node = max(1, nranks // max(1, nnodes))
        host = f" -H {','.join(f'node{i}:{per_node}' for i in range(nnodes))}" if nnodes > 1 else ""
        return f"mpirun -np {nranks}{host} --bind-to numa " + " ".join([*args, "-g", "1"])
    raise ValueError(f"unknown launcher {launcher!r}")
