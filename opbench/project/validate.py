"""``opbench project --validate``: train the model for real on this machine and set the projection beside it.

The rates come from opbench's own tools run here on the model's shapes, exactly as a user would measure a cluster
(``opbench gemm``, ``opbench attention``, ``opbench cluster --checks memory``, and ``opbench comm`` for two ranks),
into a results folder; the projection reads that folder. Then the transformers model is built from its config
(random weights) and trained: forward, backward and AdamW for ``--steps`` steps (after one untimed step), in one
process or, with ``--nproc-per-node 2``, as real FSDP2 over gloo/NCCL. Peak memory is the allocator's peak on a
GPU; on a CPU, which has no such counter, it is what the step holds: parameters, gradients and optimizer state
(counted from the real tensors), the activations one micro-batch saves for backward (counted by
``torch.autograd.graph.saved_tensors_hooks``) and the peak of every live tensor over one more step of one
micro-batch (torch's MemTracker; FSDPMemTracker under FSDP). (docs/project.md, "Validation")
"""

from __future__ import annotations

import argparse
import copy
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from opbench.core.cli import earlier_policy
from opbench.core.clock import note as clock_note
from opbench.core.clock import seconds_clock
from opbench.core.errors import UsageError, describe_os_error
from opbench.core.redact import redact_text
from opbench.core.results import CsvReport, environment
from opbench.core.units import one_line
from opbench.models import ModelConfig
from opbench.models.params import parameter_shapes

from .memory import GIB
from .plan import Plan
from .rates import Rates
from .schema import VALIDATE_SCHEMA
from .step import Projection, Projector

MAX_PARAMS = {"cpu": 1_500_000_000, "cuda": 8_000_000_000}  # validation trains the whole model on one machine
# A calibration above this is not the kernels' shortfall but the host's: the step waits on its launches
HOST_BOUND_SCALE = 2.0
MAX_WHY = 400  # characters of transformers' reason shown when it cannot build a model
# Every --validate optimizer: AdamW's per-parameter loop. Its default on a GPU, foreach, holds a copy of the second
# moments during the step, which no projection counts (docs/project.md, "Validation").
ADAMW: dict[str, Any] = {"lr": 1e-4, "foreach": False}


@dataclass
class Measured:
    step_s: list[float]
    params: int
    grads: int
    optimizer: int
    activations: int  # CPU: saved for backward by one micro-batch; GPU: 0 (peak below covers it)
    peak: int | None  # GPU: torch.cuda.max_memory_allocated over a step
    # CPU: the peak of every live tensor over a step of one micro-batch (torch's MemTracker / FSDPMemTracker);
    # None where the tracker is missing or cannot follow the model (DDP)
    peak_one_microbatch: int | None = None

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_s)

    @property
    def accounted(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations


def threads_per_rank(world: int) -> int:
    """CPU ranks share this process's threads (OMP_NUM_THREADS, else the cores): each rank gets its share, in the
    rate measurements and in training alike."""
    import torch

    return max(1, torch.get_num_threads() // world)


def _tool(args: list[str], what: str, threads: int | None = None) -> None:
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    proc = subprocess.run([sys.executable, "-m", "opbench", *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        last = lines[-1] if lines else "no output"
        if proc.returncode == 2:  # the tool refused its input: its one line says why
            raise UsageError(f"measuring {what} (opbench {args[0]}): {last}", field="--validate")
        tail = "\n".join(lines[-5:])
        raise RuntimeError(f"measuring {what} failed (opbench {' '.join(args[:1])}, exit {proc.returncode}):\n{tail}")


def check_buildable(cfg: ModelConfig) -> None:
    """Build the transformers model on the meta device (no memory, no time) with the implementations training
    uses, so a model transformers cannot train this way is one line before anything is measured."""
    import torch

    from opbench.models.hf import build_model

    strict: tuple[type[Exception], ...] = ()
    try:  # transformers' configs check their fields through huggingface_hub's strict dataclasses
        from huggingface_hub.errors import StrictDataclassError

        strict = (StrictDataclassError,)
    except ImportError:  # an older huggingface_hub: the configs raise ValueError
        pass

    experts = "grouped_mm" if cfg.is_moe else "eager"
    refused: tuple[type[Exception], ...] = (
        ValueError,
        TypeError,
        KeyError,
        AttributeError,
        NotImplementedError,
        RuntimeError,
        ImportError,
        AssertionError,  # torch's own checks while building (an embedding's padding_idx beyond its vocabulary)
        *strict,  # a field of the wrong type, or a check across fields (hidden_size % heads, RoPE)
    )
    try:
        model = build_model(
            cfg, device="meta", dtype=torch.float32, attn_implementation="sdpa", experts_implementation=experts
        )
    except refused as exc:
        # the whole message on one line: a strict dataclass's first line only names the failing validator
        why = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, KeyError):  # str(KeyError) is just the key
            why = f"KeyError {why}"
        why = why if len(why) <= MAX_WHY else why[: MAX_WHY - 1] + "…"
        raise UsageError(
            f"transformers cannot build {cfg.name} ({cfg.architecture}) for training here: {why}",
            source=cfg.source or None,
            field="--validate",
        ) from None
    check_router_groups(cfg, model.config)
    check_same_parameters(cfg, model)


def check_same_parameters(cfg: ModelConfig, model: Any) -> None:
    """The model transformers built has every parameter opbench's description of the config has, by name and
    shape: where the two read the config differently (a field transformers reads under another name for this
    model_type, or ignores), the projection would be of another model than the one trained, the ratios silently
    wrong."""
    from itertools import zip_longest

    built = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    described = [(s.name, s.shape) for s in parameter_shapes(cfg)]
    for got, want in zip_longest(built, described):
        if got != want:
            have = f"{got[0]} {list(got[1])}" if got else "no more parameters"
            says = f"{want[0]} {list(want[1])}" if want else "no more"
            raise UsageError(
                f"transformers builds {cfg.name} ({cfg.architecture}) with {have} where opbench reads the config as "
                f"{says}: a field transformers reads under another name or leaves out for {cfg.architecture}, so "
                "the projection would not be of the model trained",
                source=cfg.source or None,
                field="--validate",
            )


def check_router_groups(cfg: ModelConfig, hf_cfg: Any) -> None:
    """DeepSeek-V3's router (and GLM-4.5's, and V2's group_limited_greedy) splits the routed experts into
    ``n_group`` groups, scores each by its top two experts and keeps ``topk_group`` of them: a tiny expert count
    under transformers' default groups (8 and 4 for deepseek_v3) fails in the first forward, after measuring."""
    groups, kept = getattr(hf_cfg, "n_group", None), getattr(hf_cfg, "topk_group", None)
    if not cfg.is_moe or not isinstance(groups, int) or not isinstance(kept, int):
        return
    if cfg.architecture == "deepseek_v2" and getattr(hf_cfg, "topk_method", None) != "group_limited_greedy":
        return  # greedy: no groups
    experts, per_group = cfg.n_routed_experts, 2 if cfg.architecture != "deepseek_v2" else 1
    default = "" if "n_group" in cfg.raw else f" (transformers' default for {cfg.architecture}; give n_group)"
    why, where = None, "n_group"
    if groups < 1 or experts % groups:
        why = f"{experts} routed experts do not split into n_group {groups} groups{default}"
    elif experts // groups < per_group:
        why = (
            f"n_group {groups} leaves {experts // groups} routed expert(s) per group{default}; the router scores a "
            f"group by its top {per_group} experts"
        )
    elif not 1 <= kept <= groups:
        why, where = f"topk_group {kept} is not between 1 and n_group {groups}", "topk_group"
        why += "" if "topk_group" in cfg.raw else " (transformers' default; give topk_group)"
    if why:
        raise UsageError(f"--validate cannot route {cfg.name}'s tokens: {why}", source=cfg.source or None, field=where)


def measure_rates(
    cfg: ModelConfig, plan: Plan, args: argparse.Namespace, folder: Path, device: str, collectives: str | None = None
) -> None:
    """The rates of this model's step on this machine, by opbench's tools, into ``folder``: with more than one
    rank, the collectives the plan's sharding sends (or ``collectives``, a comma list, for a folder that serves
    several layouts' ``--validate --results``)."""
    model = ["--model", cfg.name] + (["--model-config-path", args.model_config_path] if args.model_config_path else [])
    if args.model_name:
        model += ["--model-name", args.model_name]
    common = ["--device", device, "--dtype", plan.dtype, "--report-dir-path", str(folder)]
    shape = ["--seqlen", str(plan.seqlen), "--mbs", str(plan.mbs)]
    threads = threads_per_rank(plan.world) if device == "cpu" else None
    _tool(["gemm", *model, *shape, *common, "--budget", "0.5"], "GEMMs", threads)
    _tool(
        [
            "attention",
            *model,
            *shape,
            *common,
            "--max-seqlen",
            "0",
            "--backends",
            "sdpa,gdn_torch,indexer_torch,mamba2_torch,kda_torch,v4_torch,hc_torch",  # each kind's torch-ops kernel
            "--passes",
            "fwd,bwd",
            "--budget",
            "0.5",
        ],
        "attention",
        threads,
    )
    _tool(
        ["cluster", "--checks", "memory", "--quick", "--device", device, "--report-dir-path", str(folder)],
        "memory",
        threads,
    )
    if plan.world > 1:
        # the sizes this step sends: FSDP's per-layer and root gathers, or the whole gradient
        numels = [s.numel for s in parameter_shapes(cfg)]
        largest = max(sum(numels), 1) * 4 * plan.world
        top = 1 << max(20, (largest - 1).bit_length())
        collectives = collectives or {"fsdp": "all_gather,reduce_scatter", "zero1": "all_reduce,broadcast"}.get(
            plan.sharding, "all_reduce"
        )
        _tool(
            [
                "comm",
                "--nproc-per-node",
                str(plan.world),
                "--collectives",
                collectives,
                "-b",
                str(top >> 8),
                "-e",
                str(top),
                "-f",
                "4",
                "--dtype",
                "fp32",
                "--device",
                device,
                "-w",
                "1",
                "-n",
                "3",
                "--report-dir-path",
                str(folder),
            ],
            "collectives",
        )


def check_same_machine(measured_on: str | None, device: str) -> None:
    """--validate compares the projection with training here: rates from --results must be this machine's kind,
    or the comparison measures the difference between two machines."""
    from opbench.core.device import device_info

    here = device_info(device).name
    if measured_on != here:
        raise UsageError(
            f"--validate trains on this machine ({here}) and --results holds rates measured on "
            f"{measured_on or 'an unnamed device'}: leave out --results to measure here",
            field="--results",
        )


def _saved_bytes(model: Any, batch: Any) -> int:
    """Bytes the forward saves for backward: every distinct storage autograd keeps, parameters excluded."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and t.device.type != "meta":
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=batch, labels=batch).loss
    del loss
    return sum(seen.values())


class MainGradAdamW:
    """Megatron-Core's mixed-precision recipe, the one the projection's state bytes assume for layouts without FSDP
    (docs/project.md, "Memory"), for a model whose parameters are 16-bit: each 16-bit gradient is added, as
    backward produces it, into a main gradient (fp32, or bf16 with ``--grad-dtype bf16``) held in one contiguous
    buffer, and freed; the rank keeps an fp32 master copy and AdamW's two moments for the parameters it updates
    (all of them, or under ZeRO-1 its share, whole parameters as ``memory.zero1_owners`` assigns them); a step
    averages the buffer over the ranks, updates the masters, copies them into the 16-bit weights and broadcasts each
    weight from the rank that updated it. A plain AdamW on 16-bit parameters would keep 2 + 2 + 4 bytes per
    parameter where Megatron keeps 2 + 4 + 12."""

    def __init__(self, model: Any, plan: Plan, rank: int, world: int) -> None:
        import torch

        from .memory import grad_bytes_per_param, zero1_owners

        self.params = [p for p in model.parameters() if p.requires_grad]
        self.world = world
        grad_dtype = torch.float32 if grad_bytes_per_param(plan) == 4 else torch.bfloat16
        self.buffer = torch.zeros(sum(p.numel() for p in self.params), dtype=grad_dtype, device=self.params[0].device)
        self.main_grads = []
        offset = 0
        for p in self.params:
            main = self.buffer[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
            self.main_grads.append(main)
            p.register_post_accumulate_grad_hook(self._accumulate_into(main))
        shard = world if plan.sharding == "zero1" else 1
        self.owners = zero1_owners([p.numel() for p in self.params], shard)
        self.mine = [i for i, owner in enumerate(self.owners) if owner == rank]
        self.masters = [self.params[i].detach().float() for i in self.mine]  # a copy: the parameters are 16-bit
        self.optim = torch.optim.AdamW(self.masters, **ADAMW)

    @staticmethod
    def _accumulate_into(main: Any) -> Any:
        def hook(p: Any) -> None:
            main.add_(p.grad)
            p.grad = None

        return hook

    def step(self) -> None:
        import torch
        import torch.distributed as dist

        if self.world > 1:
            dist.all_reduce(self.buffer)
            self.buffer.div_(self.world)
        for master, i in zip(self.masters, self.mine):
            grad = self.main_grads[i]
            master.grad = grad if grad.dtype == torch.float32 else grad.float()
        self.optim.step()
        with torch.no_grad():
            for master, i in zip(self.masters, self.mine):
                self.params[i].copy_(master)
                master.grad = None
            if self.world > 1 and len(self.mine) < len(self.params):  # ZeRO-1: each weight from its updater
                for p, owner in zip(self.params, self.owners):
                    dist.broadcast(p, src=owner)

    def zero_grad(self, set_to_none: bool = False) -> None:
        self.buffer.zero_()  # Megatron's persistent buffer: zeroed, never freed

    def state_bytes(self) -> tuple[int, int]:
        """(main gradients, masters + moments + step counters) bytes on this rank."""
        opt = sum(m.numel() * 4 for m in self.masters) + sum(
            v.numel() * v.element_size() for st in self.optim.state.values() for v in st.values() if hasattr(v, "numel")
        )
        return self.buffer.numel() * self.buffer.element_size(), opt


def _state_bytes(model: Any, optimizer: Any) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes this rank holds, from the real tensors (local shards under FSDP)."""

    def local(t: Any) -> Any:
        return t.to_local() if hasattr(t, "to_local") else t

    params = sum(local(p).untyped_storage().nbytes() for p in model.parameters())
    if isinstance(optimizer, MainGradAdamW):
        return (params, *optimizer.state_bytes())
    grads = sum(local(p.grad).numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its rank's optimizer there
    opt = sum(
        local(v).numel() * v.element_size()
        for state in inner.state.values()
        for v in state.values()
        if hasattr(v, "element_size")
    )
    return params, grads, opt


def _tracked_peak(model: Any, optimizer: Any, batch: Any, fsdp: bool) -> int | None:
    """Bytes of every live tensor at the peak of one training step of one micro-batch, as torch's memory tracker
    (``torch.distributed._tools``) counts them: a CPU's stand-in for max_memory_allocated. Under FSDP the step
    starts without gradients (``zero_grad()`` sets them to None, as torchtitan does); otherwise the main gradients
    stay allocated (Megatron's persistent buffers; ``zero_grad(set_to_none=False)``). None when the tracker is
    not in this torch or fails on the model."""
    import torch

    try:
        if fsdp:
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

            optimizer.zero_grad(set_to_none=True)
            tracker: Any = FSDPMemTracker(model, optimizer)
            tracker.track_inputs((batch,))
        else:
            from torch.distributed._tools.mem_tracker import MemTracker

            tracker = MemTracker()
            if isinstance(optimizer, MainGradAdamW):  # its state: the inner AdamW, the gradient buffer
                tracker.track_external(model, optimizer.optim, optimizer.buffer, batch)
            else:
                tracker.track_external(model, optimizer, batch)
        with tracker:
            model(input_ids=batch, labels=batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=fsdp)
        return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])
    except (ImportError, AttributeError, KeyError, NotImplementedError, RuntimeError) as exc:
        print(f"note: no CPU peak memory: torch's memory tracker failed ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None


def train(
    cfg: ModelConfig,
    plan: Plan,
    steps: int,
    device: str,
    rank: int = 0,
    world: int = 1,
    compile_blocks: bool = False,
) -> Measured:
    """Real training steps: micro-batches of random tokens, forward + backward each, then AdamW. ``compile_blocks``:
    every decoder layer through torch.compile first (Inductor), as torchtitan compiles each block before FSDP."""
    import torch

    from opbench.models.hf import build_model, decoder_layer_list

    dev = torch.device(device if device != "cuda" else f"cuda:{rank}")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[plan.dtype]
    mixed = dtype != torch.float32
    fsdp = world > 1 and plan.sharding == "fsdp"
    # SDPA attention and grouped-GEMM experts: the kernels opbench attention / gemm time (sdpa, torch._grouped_mm)
    experts = "grouped_mm" if cfg.is_moe else "eager"  # dense models take no experts implementation but eager
    model = build_model(
        cfg,
        device=str(dev),
        dtype=torch.float32 if fsdp else dtype,  # FSDP2 keeps fp32 shards and computes in param_dtype
        attn_implementation="sdpa",
        experts_implementation=experts,
    )
    model.train()
    if compile_blocks:  # torchtitan's apply_compile: each block on its own, before fully_shard
        for layer in decoder_layer_list(model, cfg):
            layer.compile()
    optimizer: Any
    if fsdp:  # the recipe the projection assumes for FSDP: param_dtype 16-bit, reduce_dtype fp32 (torchtitan's)
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        for layer in decoder_layer_list(model, cfg):
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        optimizer = torch.optim.AdamW(model.parameters(), **ADAMW)
    elif mixed:  # Megatron's: 16-bit weights, fp32 main gradients, master copy and moments
        optimizer = MainGradAdamW(model, plan, rank, world)
    elif world > 1 and plan.sharding == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **ADAMW)
    else:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model) if world > 1 else model
        optimizer = torch.optim.AdamW(model.parameters(), **ADAMW)
    gen = torch.Generator(device="cpu").manual_seed(rank)
    batches = [
        torch.randint(0, cfg.vocab_size, (plan.mbs, plan.seqlen), generator=gen).to(dev)
        for _ in range(plan.microbatches)
    ]

    def step() -> None:
        # FSDP with one micro-batch: gradients freed before the forward, as the projection assumes (torchtitan's
        # zero_grad); otherwise zeroed and kept, as Megatron's persistent gradient buffers are. At the start, so the
        # last step's gradients are there to be counted.
        optimizer.zero_grad(set_to_none=fsdp and plan.microbatches == 1)
        for batch in batches:
            (model(input_ids=batch, labels=batch).loss / len(batches)).backward()
        optimizer.step()

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if world > 1:
            torch.distributed.barrier()

    step()  # untimed: allocates gradients and optimizer state, warms the kernels
    times = []
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    # a CPU step on the clock opbench's CPU rates were measured with: wall time, or CPU time (OPBENCH_CLOCK=cpu)
    clock = seconds_clock() if dev.type == "cpu" else time.perf_counter
    for _ in range(steps):
        sync()
        start = clock()
        step()
        sync()
        times.append(clock() - start)
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    params, grads, opt = _state_bytes(model, optimizer)
    # one process on a CPU: what a micro-batch saves (under FSDP the saved weights are all-gathered copies, which
    # are FSDP's buffers, not activations; a GPU has its allocator's peak instead)
    acts = _saved_bytes(model, batches[0]) if dev.type == "cpu" and world == 1 else 0
    peak_one = None
    if dev.type == "cpu" and (world == 1 or plan.sharding == "fsdp"):
        peak_one = _tracked_peak(model, optimizer, batches[0], fsdp=world > 1 and plan.sharding == "fsdp")
    return Measured(times, params, grads, opt, acts, peak, peak_one)


class RankFailed(Exception):
    """A rank of a two-rank validation died, failed or hung past --timeout: one line, exit 1."""


def _worker(
    rank: int,
    world: int,
    port: int,
    cfg: ModelConfig,
    plan: Plan,
    steps: int,
    device: str,
    out: str,
    timeout_s: float = 300.0,
    compile_blocks: bool = False,
) -> None:
    import datetime
    import json

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads_per_rank(world))
    # --timeout bounds every collective: a rank that died or hangs ends the survivor's wait with an error
    timeout = datetime.timedelta(seconds=timeout_s)
    gpu = torch.device("cuda", rank) if device == "cuda" else None
    if gpu is not None:  # this rank's GPU, current before NCCL starts: FSDP2 and NCCL take the current device
        torch.cuda.set_device(gpu)
    dist.init_process_group(
        "nccl" if gpu is not None else "gloo", rank=rank, world_size=world, timeout=timeout, device_id=gpu
    )
    try:
        m = train(cfg, plan, steps, device, rank, world, compile_blocks)
        times = torch.tensor(m.step_s, device=gpu)  # NCCL reduces GPU tensors only
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a step ends when the slowest rank's does
        if rank == 0:
            Path(out).write_text(json.dumps({**m.__dict__, "step_s": times.tolist()}))
    finally:
        dist.destroy_process_group()


def train_distributed(
    cfg: ModelConfig, plan: Plan, steps: int, device: str, timeout_s: float = 300.0, compile_blocks: bool = False
) -> Measured:
    """Train on ``plan.world`` ranks (spawned); a rank that dies, fails or hangs past ``timeout_s`` in a collective
    ends it with RankFailed (the others are stopped), never a traceback or a wait without end."""
    import json

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.json")
        args = (plan.world, port, cfg, plan, steps, device, out, timeout_s, compile_blocks)
        ctx = mp.start_processes(_worker, args=args, nprocs=plan.world, join=False, start_method="spawn")
        try:
            while not ctx.join(timeout=1.0):
                pass
        except mp.ProcessExitedException as exc:  # killed, or exited without a Python error
            raise RankFailed(
                f"rank {exc.error_index} ended ({f'killed by {exc.signal_name}' if exc.signal_name else f'exit code {exc.exit_code}'}); "
                "the other rank was stopped"
            ) from None
        except mp.ProcessRaisedException as exc:  # a Python error in a rank (a peer lost, a collective timed out)
            last = [line for line in str(exc).strip().splitlines() if line.strip()][-1:] or ["an error"]
            raise RankFailed(f"rank {exc.error_index} failed: {last[0].strip()}; the other rank was stopped") from None
        finally:
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.kill()  # SIGKILL: also ends a stopped (SIGSTOP) rank
        return Measured(**json.loads(Path(out).read_text()))


def check_plan(cfg: ModelConfig, plan: Plan, args: argparse.Namespace, device: str) -> None:
    if plan.world != args.nproc_per_node:
        raise UsageError(
            f"--validate trains on this machine: --world-size must equal --nproc-per-node ({args.nproc_per_node})",
            field="--world-size",
        )
    if plan.world > 2:
        raise UsageError("--validate runs one or two ranks", field="--nproc-per-node")
    split = next(
        (
            flag
            for flag, size in (("--tp", plan.tp), ("--pp", plan.pp), ("--cp", plan.cp), ("--ep", plan.ep))
            if size > 1
        ),
        None,
    )
    if split:
        raise UsageError("--validate runs data parallelism only (tp = pp = cp = ep = 1)", field=split)
    if plan.seqlen < 2:  # the loss of token t is its prediction of token t + 1: one token has none (NaN loss)
        raise UsageError(
            f"--validate trains a causal language model: at --seqlen {plan.seqlen} no token has a next one to "
            "predict, so the loss is NaN and there is no step to time; give 2 or more",
            field="--seqlen",
        )
    positions = cfg.extra.get("n_positions")  # learned absolute positions (GPT-2): one embedding row each
    if positions is not None and plan.seqlen > positions:
        raise UsageError(
            f"--seqlen {plan.seqlen} is longer than the {positions} positions {cfg.name}'s learned position "
            "embedding holds (n_positions): training would index past it",
            source=cfg.source or None,
            field="--seqlen",
        )
    n = sum(p.numel for p in parameter_shapes(cfg))
    limit = MAX_PARAMS["cuda" if device == "cuda" else "cpu"]
    if n > limit:
        raise UsageError(
            f"{cfg.name} has {n / 1e9:.2f} B parameters; --validate trains models up to {limit / 1e9:g} B here "
            "(pass --num-layers-like smaller configs, or project without --validate)",
            field="--validate",
        )


def check_fits(projection: Projection, reserve_gib: float, device: str) -> None:
    """A layout whose projected peak does not fit this GPU is one line before training, not an out-of-memory
    traceback from a rank."""
    if device != "cuda":
        return
    import torch

    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    need = projection.memory.total + reserve_gib * GIB
    if need > total:
        raise UsageError(
            f"the projected peak, {projection.memory.total / GIB:.1f} GiB + {reserve_gib:g} GiB reserve, does not "
            f"fit this GPU's {total / GIB:.1f} GiB: validate a smaller model, --seqlen or --mbs",
            field="--validate",
        )


def comparison(
    projection: Projection, measured: Measured, on_gpu: bool, one_microbatch: int | None = None
) -> list[tuple[str, float, float]]:
    """(quantity, projected, measured) for every figure both sides have. ``one_microbatch``: the projected peak
    of the same layout with one micro-batch (what the CPU's tracked step runs)."""
    p = projection
    rows = [("step_time_s", p.step_s, measured.median_s)]
    m = p.memory
    if on_gpu and measured.peak is not None:
        rows.append(("peak_memory_bytes", m.total, measured.peak))
    if one_microbatch is not None and measured.peak_one_microbatch:
        rows.append(("peak_memory_one_microbatch_bytes", one_microbatch, measured.peak_one_microbatch))
    rows += [
        ("params_bytes", m.params, measured.params),
        ("grads_bytes", m.grads, measured.grads),
        ("optimizer_bytes", m.optimizer, measured.optimizer),
    ]
    if measured.activations:
        rows.append(("activation_bytes", m.activations, measured.activations))
    return rows


def calibration(
    projection: Projection,
    measured_s: float,
    scale: float = 1.0,
    reproject: Callable[[float], Projection] | None = None,
) -> float | None:
    """The --compute-scale that makes ``projection``'s step ``measured_s``: compute (already × ``scale``) takes what
    the measured step leaves after the projected communication, bubble and optimizer. What communication leaves
    exposed shrinks as compute grows (it hides behind GEMMs and attention), so with ``reproject`` (the same layout
    projected at a given scale) the factor is refined until the projected step is the measured one. None when the
    rest alone outlasts the measured step, or the factor is beyond the flag's bounds (0.01 to 100)."""
    factor = _calibration_step(projection, measured_s, scale)
    for _ in range(20 if reproject else 0):
        if factor is None:
            return None
        assert reproject is not None  # the loop runs only with it
        again = reproject(factor)
        if abs(again.step_s - measured_s) <= 1e-9 * measured_s:
            break
        factor = _calibration_step(again, measured_s, factor)
    return factor


def _calibration_step(projection: Projection, measured_s: float, scale: float) -> float | None:
    other = projection.step_s - projection.compute_s
    if projection.compute_s <= 0 or measured_s <= other:
        return None
    factor = scale * (measured_s - other) / projection.compute_s
    return factor if 0.01 <= factor <= 100 else None


def rates_scaled(rates: Rates, scale: float) -> Rates:
    """The same measured rates with another --compute-scale (nothing read again)."""
    scaled = copy.copy(rates)
    scaled.a = replace(rates.a, compute_scale=scale)
    return scaled


LABELS = {
    "step_time_s": "step time (s)",
    "peak_memory_bytes": "peak memory (GiB)",
    "peak_memory_one_microbatch_bytes": "peak memory, one micro-batch (GiB)",
    "params_bytes": "parameters (GiB)",
    "grads_bytes": "gradients (GiB)",
    "optimizer_bytes": "optimizer state (GiB)",
    "activation_bytes": "activations, one micro-batch (GiB)",
}


def report(rows: list[tuple[str, float, float]], measured: Measured, on_cpu: bool = True) -> str:
    rows = [(LABELS[k], a / (1 if k.endswith("_s") else GIB), b / (1 if k.endswith("_s") else GIB)) for k, a, b in rows]
    width = max(len(r[0]) for r in rows)
    lines = [f"{'':<{width}}  {'projected':>12}  {'measured':>12}  {'ratio':>7}"]
    for name, proj, meas in rows:
        ratio = f"{proj / meas:7.3f}" if meas else "      -"
        lines.append(f"{name:<{width}}  {proj:12.5g}  {meas:12.5g}  {ratio}")
    spread = f"{min(measured.step_s):.4g}–{max(measured.step_s):.4g} s over {len(measured.step_s)} steps"
    clock = clock_note() if on_cpu else None  # a GPU step is timed in wall time whatever OPBENCH_CLOCK says
    lines.append(f"(measured step time: median of {spread}{'; ' + clock if clock else ''})")
    return "\n".join(lines)


def validate(cfg: ModelConfig, plan: Plan, args: argparse.Namespace) -> int:
    import torch

    from .search import assumptions, breakdown

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and plan.dtype != "fp32":
        print(f"note: --validate on a CPU trains in fp32 ({plan.dtype} is emulated there)", file=sys.stderr)
        plan = replace(plan, dtype="fp32")
    check_plan(cfg, plan, args, device)
    check_buildable(cfg)
    folder = Path(args.report_dir_path or tempfile.mkdtemp(prefix="opbench-validate-"))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the folder: {describe_os_error(exc)}", source=str(folder)) from None
    # transformers' model runs its operators op by op; --compile trains it compiled as well, projected below
    stated = replace(assumptions(args), memory_ops="eager", compile_memory_time=None)
    if device == "cpu":  # gloo's collectives run on the same cores as the compute: nothing hides behind it
        stated = replace(stated, dp_overlap=False, cp_overlap=False)
    elif plan.dtype != "fp32" and plan.sharding != "fsdp":  # MainGradAdamW reduces its buffer after backward
        stated = replace(stated, dp_overlap=False)
    if args.results:  # rates this machine already measured (another layout's --validate, or the tools themselves)
        rates = Rates(args.results, None, plan.dtype, stated, plan.gpus_per_node)
        check_same_machine(rates.device, device)
        print(f"rates from --results {' '.join(args.results)} (not measured again)")
    else:
        t0 = time.perf_counter()
        measure_rates(cfg, plan, args, folder, device)
        print(f"measured this machine's rates for {cfg.name} into {folder} ({time.perf_counter() - t0:.0f} s)")
        rates = Rates([folder], None, plan.dtype, stated, plan.gpus_per_node)
    for note in rates.notes:
        print(f"note: {note}", file=sys.stderr)
    projector = Projector(cfg, rates, profile="eager")
    projection = projector.project(plan)
    print(breakdown(cfg, projection, rates.device, None))
    check_fits(projection, args.memory_reserve_gib, device)
    t0 = time.perf_counter()
    if plan.world > 1:
        try:
            measured = train_distributed(cfg, plan, args.steps, device, args.timeout)
        except RankFailed as exc:
            print(f"opbench project: error: --validate: {one_line(redact_text(str(exc)))}", file=sys.stderr)
            return 1
    else:
        measured = train(cfg, plan, args.steps, device)
    print(f"\ntrained {cfg.name} here: {args.steps} timed steps ({time.perf_counter() - t0:.0f} s)")
    one = projector.project(replace(plan, global_batch=plan.mbs * plan.dp)).memory.total if device == "cpu" else None
    rows = comparison(projection, measured, device == "cuda", one)
    print(report(rows, measured, on_cpu=device == "cpu"))
    scale = calibration(
        projection,
        measured.median_s,
        rates.a.compute_scale,
        lambda k: Projector(cfg, rates_scaled(rates, k), profile="eager").project(plan),
    )
    if scale is not None:
        print(
            f"calibration: --compute-scale {scale:.3g} makes this layout's projected step the measured one (the "
            "step's time beyond its kernels' measured rates); pass it with --results from this machine's kind"
        )
        if scale > HOST_BOUND_SCALE:
            print(
                f"note: the step's compute took {scale:.3g}x what its kernels' rates give: a step this small is "
                "bound by the host launching its kernels (PyTorch eager, about 10 us each), which no projection counts; "
                "calibrate on a larger micro-batch (--mbs, --seqlen) before carrying --compute-scale to a cluster "
                "(docs/project.md, 'Validation')",
                file=sys.stderr,
            )
    compiled_rows: list[tuple[str, float, float]] = []
    compiled_ok = True
    if getattr(args, "compile", False):
        try:
            compiled_rows = validate_compile(cfg, plan, args, rates, projection, measured, scale, device)
        except CompileFailed as exc:
            print(f"opbench project: error: --compile: {one_line(redact_text(str(exc)))}", file=sys.stderr)
            compiled_ok = False
    meta = environment(None, {"model_config": cfg.to_dict(), "plan": plan.__dict__, "steps": measured.step_s})
    with CsvReport(folder / "project_validate.csv", VALIDATE_SCHEMA, meta, earlier=earlier_policy(args)) as out:
        for key, projected, got in rows:
            out.append(
                {
                    "model": cfg.name,
                    "layout": plan.label(),
                    "world_size": plan.world,
                    "quantity": key,
                    "projected": projected,
                    "measured": got,
                    "ratio": projected / got if got else None,
                }
            )
        if compiled_rows:
            for key, projected, got in compiled_rows:
                out.append(
                    {
                        "model": cfg.name,
                        "layout": plan.label(),
                        "world_size": plan.world,
                        "quantity": f"compiled_{key}",
                        "projected": projected,
                        "measured": got,
                        "ratio": projected / got if got else None,
                    }
                )
    print(f"wrote {one_line(str(folder / 'project_validate.csv'))}")
    return 0 if compiled_ok else 1


class CompileFailed(Exception):
    """torch.compile could not compile the model here (no C++ compiler for Inductor's CPU kernels, an operator it
    cannot trace): one line, exit 1, after the eager comparison."""


def validate_compile(
    cfg: ModelConfig,
    plan: Plan,
    args: argparse.Namespace,
    rates: Rates,
    eager: Projection,
    measured: Measured,
    scale: float | None,
    device: str,
) -> list[tuple[str, float, float]]:
    """``--validate --compile``: train the same layout with every decoder block compiled, set the compiled projection
    beside it, and print compile's effect as measured and as projected: step time, activations and peak, compiled
    over eager, and the ``--compile-memory-time`` the two measured steps imply (torch_compile.py)."""
    from torch._dynamo.exc import TorchDynamoException

    from .torch_compile import compile_factor, implied_memory_time

    factor = compile_factor(args)
    assert factor is not None  # --compile is set
    t0 = time.perf_counter()
    try:
        if plan.world > 1:
            got = train_distributed(cfg, plan, args.steps, device, args.timeout, compile_blocks=True)
        else:
            got = train(cfg, plan, args.steps, device, compile_blocks=True)
    except TorchDynamoException as exc:  # BackendCompilerFailed, InductorError (a missing C++ compiler among them)
        raise CompileFailed(f"torch.compile failed here ({type(exc).__name__}: {exc})") from None
    print(f"\ntrained {cfg.name} compiled (torch.compile of every decoder block): {args.steps} timed steps "
          f"({time.perf_counter() - t0:.0f} s, compiling included)")  # fmt: skip
    projector = Projector(cfg, _with_compile(rates, factor), profile="eager")
    projection = projector.project(plan)
    one = projector.project(replace(plan, global_batch=plan.mbs * plan.dp)).memory.total if device == "cpu" else None
    rows = comparison(projection, got, device == "cuda", one)
    print(report(rows, got, on_cpu=device == "cpu"))
    # compile's effect, compiled over eager, as measured here and as projected
    effect = [("step time", projection.step_s / eager.step_s, got.median_s / measured.median_s)]
    if got.activations and measured.activations:
        effect.append(("activations", projection.memory.activations / eager.memory.activations,
                       got.activations / measured.activations))  # fmt: skip
    if device == "cuda":
        peak, eager_peak = got.peak, measured.peak
        projected = projection.memory.total / eager.memory.total
    else:  # the CPU's tracked step runs one micro-batch: its projection too
        peak, eager_peak = got.peak_one_microbatch, measured.peak_one_microbatch
        one_eager = Projector(cfg, rates, profile="eager").project(replace(plan, global_batch=plan.mbs * plan.dp))
        projected = (one or 0) / one_eager.memory.total
    if peak and eager_peak:
        effect.append(("peak memory" + ("" if device == "cuda" else ", one micro-batch"), projected, peak / eager_peak))
    print("torch.compile's effect, compiled / eager:  projected  measured")
    for name, proj, meas in effect:
        print(f"  {name:<38}  {proj:9.3f}  {meas:8.3f}")
    # the blocks' memory-bound time in the eager step: what a factor of 0 would remove, in measured terms
    none = Projector(cfg, _with_compile(rates, 0.0), profile="eager").project(plan)
    memory_s = (eager.step_s - none.step_s) * (scale / rates.a.compute_scale if scale else 1.0)
    implied = implied_memory_time(measured.median_s, got.median_s, memory_s)
    if implied is not None:
        print(
            f"the two measured steps imply --compile-memory-time {implied:.3g} (the blocks' memory-bound time "
            f"compiled, of eager's, here; projected with {factor:.3g}); steps timed minutes apart move with this "
            "machine's load: pass it for this machine's kind only after a run on a quiet one"
        )
    return rows


def _with_compile(rates: Rates, factor: float) -> Rates:
    """The same measured rates projecting every decoder block compiled, its memory-bound time × ``factor``."""
    compiled = copy.copy(rates)
    compiled.a = replace(rates.a, compile_memory_time=factor)
    return compiled
