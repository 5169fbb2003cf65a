"""The one collective vocabulary: opbench's names, NCCL's op names, nccl-tests binaries, bus-bandwidth factors,
size/count semantics, reduction names and the nccl-tests / rccl-tests command builder. No torch import: the
torchrun benchmark (comm), the log parser (trace), the FSDP model and the report all ask this module.
The semantics are written out in docs/conventions.md, "Collectives: sizes, counts and bus bandwidth".
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .dtypes import dtype as _dtype


@dataclass(frozen=True)
class Collective:
    """One collective as nccl-tests sees it.

    ``size`` is what nccl-tests calls size (its -b/-e values): total buffer bytes per rank, max(send, recv).
    ``count`` is the per-rank NCCL count (what an NCCL_DEBUG line and nccl-tests' count column show).
    """

    name: str  # opbench name: what every CSV's `collective` column holds
    nccl_op: str  # name in NCCL logs and NCCL's API
    binary: str  # nccl-tests / rccl-tests binary
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


COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective("all_reduce", "AllReduce", "all_reduce_perf", _allreduce, False, has_redop=True),
        Collective("all_gather", "AllGather", "all_gather_perf", _ring, True),
        Collective("reduce_scatter", "ReduceScatter", "reduce_scatter_perf", _ring, True, has_redop=True),
        Collective("all_to_all", "AlltoAll", "alltoall_perf", _ring, True),
        # uneven splits: count is the mean per-peer count (nccl-tests' paramcount), size comes from the split
        # matrix (alltoallv_size_elements), not from count
        Collective("all_to_all_v", "AlltoAllv", "alltoallv_perf", _ring, True),
        Collective("send_recv", "SendRecv", "sendrecv_perf", _one, False),
        Collective("broadcast", "Broadcast", "broadcast_perf", _one, False, has_root=True),
        Collective("reduce", "Reduce", "reduce_perf", _one, False, has_redop=True, has_root=True),
    )
}


def alltoallv_size_elements(splits: Sequence[Sequence[int]]) -> int:
    """nccl-tests 2.19 ``alltoallv_perf``'s size (``AlltoAllvComputeMaxCounts``), in elements: of every rank's send
    total (its row of the split matrix, ``splits[i][j]`` = elements rank i sends to rank j) and receive total (its
    column), the largest. algbw = that size / time and busbw = algbw · (n−1)/n (``AlltoAllvGetBw``): the busiest
    rank's traffic, so a skewed matrix is not credited with the bytes an idle rank did not move."""
    n = len(splits)
    sends = [sum(row) for row in splits]
    recvs = [sum(splits[i][j] for i in range(n)) for j in range(n)]
    return max([0, *sends, *recvs])


def alltoallv_imbalance(splits: Sequence[Sequence[int]]) -> float:
    """The busiest rank's traffic (``alltoallv_size_elements``) over the mean rank's (total elements / n): 1 for
    even splits."""
    total = sum(sum(row) for row in splits)
    return alltoallv_size_elements(splits) * len(splits) / total if total else 0.0


# NCCL log op names (all eras, RCCL included) -> opbench collective name.
NCCL_OP_TO_COLLECTIVE: dict[str, str] = {
    "AllReduce": "all_reduce",
    "AllGather": "all_gather",
    "ReduceScatter": "reduce_scatter",
    "Broadcast": "broadcast",
    "Reduce": "reduce",
    "AlltoAll": "all_to_all",
    "AllToAll": "all_to_all",
    "AllToAllPivot": "all_to_all",
    "Send": "send_recv",
    "Recv": "send_recv",
    "SendRecv": "send_recv",
}
# Every op name an NCCL/RCCL COLL line may carry; Gather and Scatter (NCCL 2.28) have no nccl-tests binary.
NCCL_OPS: tuple[str, ...] = (*NCCL_OP_TO_COLLECTIVE, "Gather", "Scatter")

# ncclRedOp_t values; >= 5 are PreMulSum / user-defined ops (FSDP's gradient pre-divide logs as one).
REDOPS: dict[int, str] = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}
# nccl-tests / rccl-tests -o values for opbench's redop names.
TESTS_REDOP = {"sum": "sum", "prod": "prod", "max": "max", "min": "min", "avg": "avg", "premulsum": "mulsum"}


def redop_name(op: int) -> str:
    """NCCL ncclRedOp_t value to name."""
    return REDOPS.get(op, "premulsum" if op >= 5 else f"op{op}")


def collective_for_op(nccl_op: str) -> str | None:
    """opbench name for an NCCL op name ('AllGather' -> 'all_gather'); None for ops nccl-tests cannot run."""
    return NCCL_OP_TO_COLLECTIVE.get(nccl_op)


# Names a file of nccl-tests output may carry (binary or collective), longest first so 'reduce' is tried last.
_NAME_HINTS = sorted(
    (
        (hint, name)
        for name, c in COLLECTIVES.items()
        for hint in {name, c.binary.removesuffix("_perf"), c.nccl_op.lower()}
    ),
    key=lambda pair: -len(pair[0]),
)


def collective_from_path(*paths: object) -> str | None:
    """Older nccl-tests never print the binary's name: take the collective from an output file's name."""
    for path in paths:
        name = str(path).rsplit("/", 1)[-1].lower()
        for hint, collective in _NAME_HINTS:
            if hint in name:
                return collective
    return None


def nccl_tests_command(
    collective: str,
    size_bytes: int,
    nranks: int,
    dtype: str | int,
    *,
    flavour: str = "nccl",
    launcher: str = "single",
    redop: str | None = None,
    nnodes: int = 1,
    iters: int = 20,
    warmup: int = 5,
    check: bool = False,
) -> str:
    """A runnable nccl-tests/rccl-tests line for one size (-b = -e = ``size_bytes`` in nccl-tests semantics).

    ``launcher='single'``: one process drives all GPUs (``-g nranks``, single node only);
    ``launcher='mpi'``: ``mpirun -np nranks … -g 1`` (one rank per GPU, any node count).
    """
    coll = COLLECTIVES[collective]
    dt = _dtype(dtype)
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
        return shlex.join([*args, "-g", str(nranks)])
    if launcher == "mpi":
        per_node = max(1, nranks // max(1, nnodes))
        host = f" -H {','.join(f'node{i}:{per_node}' for i in range(nnodes))}" if nnodes > 1 else ""
        return f"mpirun -np {nranks}{host} --bind-to numa " + shlex.join([*args, "-g", "1"])
    raise ValueError(f"unknown launcher {launcher!r}")
