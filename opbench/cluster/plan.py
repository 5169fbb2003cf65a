"""What a cluster check runs, in which order, and how long that takes at scale. No torch import.

The schedule (docs/cluster.md, "Schedule") keeps the cost of n nodes at O(n) collective rounds:

1. compute and memory: every GPU at once (on a CPU, where ranks share cores, the ranks take turns);
2. intra: one process group per node, all nodes at once;
3. inter: one group per local GPU index ("rail": GPU g of every node), all rails at once; then the world;
4. pairs: n − 1 rounds; in round r node i sends to node (i + r) mod n and receives from node (i − r) mod n, with
   every GPU of the node driving its own stream, so every ordered node pair is measured once and all pairs of a
   round run concurrently; with an even n the round r = n/2 runs in two halves, one direction each
   (``link_phase``). ``--gpu-pairs`` adds the same inside each node over GPU indices.

``simulate`` estimates the wall time of that schedule from stated link speeds and latencies; it is an estimate
(labelled so wherever it is printed), for sizes no test machine can run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

CHECKS = ("compute", "memory", "intra", "inter", "pairs")
PAIRS_PHASE = "pairs (n−1 shifts)"  # the --plan table's "pairs" column (cluster.__main__)
COMM_COLLECTIVES = ("all_reduce", "all_gather")


@dataclass(frozen=True)
class Sizes:
    """The default work of one check run; ``--quick`` and the CPU get smaller ones (tests and laptops)."""

    gemm_n: int  # square GEMM edge (M = N = K)
    memory_bytes: int  # per buffer of the copy / triad kernels
    comm_bytes: tuple[int, ...]  # intra / inter / world sizes (nccl-tests -b semantics)
    pair_bytes: int  # per GPU per direction in the pairs check
    iters: int  # timed iterations of each collective / pair exchange
    warmup: int
    budget_s: float  # per GEMM / memory kernel, timed calls only (core.timing)

    @classmethod
    def default(cls, gpu: bool, quick: bool) -> Sizes:
        if gpu:
            if quick:
                return cls(4096, 256 << 20, (64 << 20,), 64 << 20, 10, 2, 0.3)
            return cls(8192, 1 << 30, (64 << 20, 1 << 30), 256 << 20, 20, 5, 1.0)
        if quick:
            # pairs at 16 MiB even so: at 1 MiB an exchange takes well under a scheduler time slice, and on a
            # loaded machine healthy pairs spread 8x (docs/cluster.md, "Outliers")
            return cls(192, 64 << 20, (256 << 10,), 16 << 20, 5, 1, 0.15)
        return cls(512, 256 << 20, (1 << 20, 16 << 20), 16 << 20, 10, 2, 0.5)


def shift_peers(i: int, r: int, n: int) -> tuple[int, int]:
    """In round r member i sends to (i + r) mod n and receives from (i − r) mod n: (to, from)."""
    return (i + r) % n, (i - r) % n


def link_phase(i: int, r: int, n: int) -> int:
    """The half of round r in which member i's link to (i + r) mod n is measured. Where 2r = n the round pairs
    members both ways (i ↔ i + n/2): measured at once, a slow direction could not be told from the other on the
    same two ranks, so the first half of the members sends in phase 0 and the second half in phase 1; every
    other round runs whole in phase 0."""
    return 1 if 2 * r == n and i >= n // 2 else 0


def shift_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Round r (1 … n−1) as (src, dst) pairs: every ordered pair once, every member sending once per round."""
    return [[(i, shift_peers(i, r, n)[0]) for i in range(n)] for r in range(1, n)]


# -- the simulated schedule --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Assumptions:
    """Link speeds and costs the simulation assumes (GPU defaults: an H100/MI300X-class node with one 400 Gb/s NIC
    per GPU). None of these is measured; they are inputs stated next to every printed estimate."""

    intra_gbs: float = 450.0  # per-GPU bus bandwidth inside a node (NVLink 4 / xGMI class)
    nic_gbs: float = 50.0  # per-GPU network bandwidth, one direction (400 Gb/s)
    intra_latency_s: float = 10e-6  # per ring step inside a node
    inter_latency_s: float = 25e-6  # per ring step / message across nodes
    gemm_tflops: float = 600.0  # achieved dense bf16 GEMM throughput
    hbm_gbs: float = 3000.0  # achieved device-memory bandwidth
    group_setup_s: float = 2.0  # creating one set of process groups (communicator init), fixed part ...
    group_setup_per_node_s: float = 0.005  # ... plus this per node (store round trips grow with the job)
    launch_s: float = 30.0  # rendezvous, imports, first communicator


@dataclass
class Phase:
    name: str
    rounds: int  # collective rounds (each ends in a barrier)
    seconds: float


@dataclass
class Estimate:
    nnodes: int
    gpus_per_node: int
    phases: list[Phase] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def rounds(self) -> int:
        return sum(p.rounds for p in self.phases)


def _ring_time(size: int, n: int, factor: float, bw_gbs: float, latency_s: float, steps: int) -> float:
    """A ring collective's time: bus bytes over the bus bandwidth plus one latency per ring step."""
    return size * factor / (bw_gbs * 1e9) + steps * latency_s


def simulate(
    nnodes: int,
    gpus_per_node: int,
    sizes: Sizes,
    checks: Sequence[str] = CHECKS,
    gpu_pairs: bool = False,
    gemm_count: int = 1,
    a: Assumptions = Assumptions(),
) -> Estimate:
    """Wall time of one cluster check on ``nnodes`` × ``gpus_per_node`` GPUs, phase by phase (an estimate)."""
    est = Estimate(nnodes, gpus_per_node)
    world = nnodes * gpus_per_node
    reps = sizes.iters + sizes.warmup
    est.phases.append(Phase("launch and rendezvous", 1, a.launch_s))

    hops = math.ceil(math.log2(max(2, world)))

    def gather_cost() -> float:  # per case: every rank's per-iteration times to rank 0 (a tree: log2 world hops)
        return hops * a.inter_latency_s + world * sizes.iters * 8 / (a.nic_gbs * 1e9)

    barrier_s = 2 * hops * a.inter_latency_s  # a world barrier: up and down a tree (before each timed pairs exchange)

    if "compute" in checks:
        flops = 2 * sizes.gemm_n**3
        per_gemm = sizes.budget_s + 0.25 + 10 * flops / (a.gemm_tflops * 1e12)  # budget + warm-up + setup
        est.phases.append(Phase("compute (all GPUs at once)", 1, gemm_count * per_gemm + 2 * gather_cost()))
    if "memory" in checks:
        per_kernel = sizes.budget_s + 0.1 + 10 * 3 * sizes.memory_bytes / (a.hbm_gbs * 1e9)
        est.phases.append(Phase("memory (all GPUs at once)", 1, 2 * per_kernel + gather_cost()))

    def comm_phase(n: int, bw_gbs: float, latency_s: float) -> float:
        """all_reduce and all_gather at every size on rings of n ranks, each case followed by its gather."""
        return sum(
            reps * _ring_time(s, n, f, bw_gbs, latency_s, steps) + gather_cost()
            for s in sizes.comm_bytes
            for f, steps in ((2 * (n - 1) / n, 2 * (n - 1)), ((n - 1) / n, n - 1))
        )

    setups = 0
    cases = 2 * len(sizes.comm_bytes)
    if "intra" in checks and gpus_per_node > 1:
        setups += 1
        est.phases.append(
            Phase("intra (every node at once)", cases, comm_phase(gpus_per_node, a.intra_gbs, a.intra_latency_s))
        )
    if "inter" in checks and nnodes > 1:
        setups += 1
        est.phases.append(Phase("inter (every rail at once)", cases, comm_phase(nnodes, a.nic_gbs, a.inter_latency_s)))
        # The world ring crosses the network once per node: bus bandwidth bounded by the NIC, a latency per rank.
        est.phases.append(Phase("inter (world)", cases, comm_phase(world, a.nic_gbs, a.inter_latency_s)))

    def pair_rounds(n: int) -> int:  # n − 1 shifts; with an even n the shift n/2 runs one direction at a time
        return n - 1 + (n % 2 == 0)

    if "pairs" in checks and nnodes > 1:
        per_round = reps * (sizes.pair_bytes / (a.nic_gbs * 1e9) + a.inter_latency_s) + sizes.iters * barrier_s
        per_round += gather_cost()
        est.phases.append(Phase(PAIRS_PHASE, pair_rounds(nnodes), pair_rounds(nnodes) * per_round))
    if gpu_pairs and gpus_per_node > 1:
        per_round = reps * (sizes.pair_bytes / (a.intra_gbs * 1e9) + a.intra_latency_s) + sizes.iters * barrier_s
        per_round += gather_cost()
        g = pair_rounds(gpus_per_node)
        est.phases.append(Phase("GPU pairs (g−1 shifts)", g, g * per_round))
    if setups:
        est.phases.append(
            Phase("process-group setup", setups, setups * (a.group_setup_s + nnodes * a.group_setup_per_node_s))
        )
    return est
