"""One benchmark case (state × storage × method × thread count): K timed saves, each into a new directory,
then K timed loads, each verified; turned into one CSV row with Primus' metric names (docs/conventions.md,
"Checkpoint metrics").

Per iteration a time is the slowest rank's (every rank starts together after a barrier); the row holds the
median over iterations, with min/max beside it and every per-rank, per-iteration value in the JSON sidecar.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from opbench.core.device import synchronize
from opbench.core.dist import Ranks
from opbench.core.faults import Faults
from opbench.core.rankstats import rank_stats
from opbench.core.redact import redact_text
from opbench.core.timing import Stats

from .failures import STORAGE_DOWN, describer
from .methods import Method, SaveMarks, SaveOptions
from .state import ShardedState, StateSpec, TensorSpec
from .storage import Storage, corrupt_rank_files, drop_page_cache, folder_size, remove_tree


def bandwidth_mibps(size_bytes: float | None, seconds: float | None) -> float | None:
    """*_bandwidth_mib_per_s (Primus' *_bandwidth_in_mbps): bytes / 2**20 / seconds."""
    if not size_bytes or not seconds:
        return None
    return size_bytes / 2**20 / seconds


@dataclass(frozen=True)
class RunOptions:
    iterations: int = 3
    save_interval: float = 0.0  # simulated training seconds after an async save returns (0: wait at once)
    drop_cache: bool = False
    keep: bool = False
    single_file_per_rank: bool = True
    sync_files: bool = True
    faults: Faults = field(default_factory=Faults)  # OPBENCH_FAULTS (core.faults); none by default
    timeout_s: float = 1800.0


@dataclass(frozen=True)
class Case:
    state_index: int
    storage: Storage
    method: Method
    thread_count: int | None  # None where the method has no thread knob (torch_save)

    @property
    def tag(self) -> str:
        threads = f"_t{self.thread_count}" if self.thread_count else ""
        return f"s{self.state_index}_{self.method.name}{threads}"


@dataclass
class CaseResult:
    """Everything measured for one case; per-iteration lists hold the slowest rank's value, ``per_rank`` keeps
    each rank's own values for the sidecar."""

    block: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    overlapped: list[bool] = field(default_factory=list)
    per_rank: dict[str, list[list[float]]] = field(default_factory=lambda: {"block": [], "total": [], "load": []})
    problems: list[str] = field(default_factory=list)
    cache_dropped: list[bool] = field(default_factory=list)
    phases: list[dict[str, float | None] | None] = field(default_factory=list)  # the slowest rank's, per save
    warmup_s: float | None = None


PHASES = ("staging", "planning", "writing", "finishing")


def save_phases(start: float, marks: SaveMarks | None, end: float) -> dict[str, float | None] | None:
    """A DCP save's time by phase (docs/ckpt.md, "Phases"), adding up to ``end - start``: staging (async: until
    the state is copied to host memory), planning (until the writer starts writing: plans and their collective),
    writing (the writer's file writes, fsync included), finishing (results gathered, .metadata written, the
    future resolved). None for saves without marks (torch_save, raw, process-mode async)."""
    if marks is None or marks.write_start is None or marks.write_end is None:
        return None
    staged = marks.stage_end if marks.stage_end is not None else start
    return {
        "staging": staged - start if marks.stage_end is not None else None,
        "planning": marks.write_start - staged,
        "writing": marks.write_end - marks.write_start,
        "finishing": end - marks.write_end,
    }


def _save_once(
    ranks: Ranks,
    state: ShardedState,
    case: Case,
    path: str,
    opts: SaveOptions,
    save_interval: float,
    save: Callable[[], Any] | None = None,
) -> tuple[float, float, bool, dict[str, float | None] | None]:
    """(block, total, overlapped, phases) on this rank. block: until the call hands control back to the training loop;
    total: until the bytes are stored. With ``save_interval`` an async save gets that many seconds of simulated
    training; if it is still running then, the next checkpoint would have overlapped it (Primus' accurate=false)."""
    ranks.barrier()
    start = time.perf_counter()
    pending = save() if save else case.method.save(state, case.storage, path, opts)
    synchronize(state.device)
    block = time.perf_counter() - start
    overlapped = False
    if case.method.async_type and save_interval > 0:
        time.sleep(save_interval)
        overlapped = not pending.done()
    end = pending.wait()
    return block, max(end - start, block), overlapped, save_phases(start, getattr(pending, "marks", None), end)


def _load_once(
    ranks: Ranks, state: ShardedState, case: Case, path: str, load: Callable[[], Any] | None = None
) -> tuple[float, list[str]]:
    """(seconds, verification problems) on this rank; the check runs after the clock stops."""
    if case.method.loads_in_place:
        state.scramble()
    ranks.barrier()
    start = time.perf_counter()
    loaded = load() if load else case.method.load(state, case.storage, path)
    synchronize(state.device)
    seconds = time.perf_counter() - start
    problems = state.verify(loaded)
    del loaded
    return seconds, problems


def warm_up_state(ranks: Ranks) -> ShardedState:
    """A tiny state for the untimed warm-up round of each case."""
    spec = StateSpec("warmup", (TensorSpec("warmup.weight", (2 * ranks.world_size, 64), "fp32"),))
    return ShardedState.build(spec, ranks.rank, ranks.world_size, ranks.device)


def _warm_up(ranks: Ranks, tiny: ShardedState, case: Case, path: str, opts: SaveOptions) -> float:
    """Save and load a tiny state with the case's method and storage, untimed in the row: first-use costs
    (imports, DCP planner, fsspec sessions, process mode's daemon start) are paid once per job by a trainer,
    not per checkpoint. Returns its seconds for the sidecar."""
    start = time.perf_counter()
    _save_once(ranks, tiny, case, path, opts, 0.0)
    _, problems = _load_once(ranks, tiny, case, path)
    if problems:
        tiny.regenerate()
        raise RuntimeError("warm-up checkpoint did not verify: " + "; ".join(problems))
    return time.perf_counter() - start


def run_case(
    ranks: Ranks,
    state: ShardedState,
    case: Case,
    case_dir: str,
    run: RunOptions,
    tiny: ShardedState | None = None,
    errors: list[str] | None = None,
) -> CaseResult:
    """Measure one case on every rank; raises (on every rank) if any rank failed: RankFailure with a one-line
    message, status failures.STORAGE_DOWN when the storage itself cannot be used; this rank's full traceback is
    appended to ``errors``. Leaves ``state`` holding its original contents whatever happens, and removes the
    case's files unless ``run.keep`` (or the storage is down: nothing there can be reached)."""
    opts = SaveOptions(case.thread_count or 1, run.single_file_per_rank, run.sync_files)
    result = CaseResult()
    paths = [f"{case_dir}/iter_{i:07d}" for i in range(1, run.iterations + 1)]
    faults, rank = run.faults, ranks.rank
    interrupted = storage_down = False
    describe = describer(case.storage, errors if errors is not None else [])

    def agree(fn: Callable[[], Any]) -> Any:
        return ranks.agree(fn, describe)

    try:
        agree(lambda: faults.prepare(rank))
        if tiny is not None:
            result.warmup_s = agree(lambda: _warm_up(ranks, tiny, case, f"{case_dir}/warmup", opts))
        agree(lambda: case.method.prepare(state))
        faults.before_timing(rank, run.timeout_s)
        for path in paths:
            save = faults.timed(partial(case.method.save, state, case.storage, path, opts), rank, state.device)
            mine = agree(lambda: _save_once(ranks, state, case, path, opts, run.save_interval, save))
            everyone = ranks.gather(mine)
            result.per_rank["block"].append([b for b, _, _, _ in everyone])
            result.per_rank["total"].append([t for _, t, _, _ in everyone])
            result.block.append(max(b for b, _, _, _ in everyone))
            result.total.append(max(t for _, t, _, _ in everyone))
            result.overlapped.append(any(o for _, _, o, _ in everyone))
            result.phases.append(max(everyone, key=lambda e: e[1])[3])  # the phases of the rank the job waited for
            result.sizes.append(agree(lambda: folder_size(case.storage, path) if ranks.is_main else 0))
        # The corrupt fault damages what this rank saved, after every save and before any load.
        agree(lambda: [corrupt_rank_files(case.storage, p, rank) for p in paths if faults.corrupts(rank)])
        for path in paths:
            if run.drop_cache:
                dropped = agree(lambda: drop_page_cache(case.storage, path) if ranks.local_rank == 0 else None)
                result.cache_dropped.append(all(d for d in ranks.gather(dropped) if d is not None))
            load = faults.timed(partial(case.method.load, state, case.storage, path), rank, state.device)
            seconds, problems = agree(lambda: _load_once(ranks, state, case, path, load))
            everyone = ranks.gather((seconds, problems))
            result.per_rank["load"].append([s for s, _ in everyone])
            result.load.append(max(s for s, _ in everyone))
            result.problems += [p for _, ps in everyone for p in ps]
            if problems:
                state.regenerate()
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)  # Ctrl-C or SIGTERM (core.errors.Terminated)
        storage_down = getattr(exc, "status", None) == STORAGE_DOWN
        state.regenerate()
        raise
    finally:
        case.method.finish_case()
        if not run.keep and not storage_down:
            _cleanup(ranks, case, case_dir, wait_for_peers=not interrupted)
    return result


def _cleanup(ranks: Ranks, case: Case, case_dir: str, wait_for_peers: bool = True) -> None:
    """Remove the case's checkpoints (rank 0, after every rank is done with them); a failure here is not the
    measurement's, so it is only reported. An interrupted rank waits for no one: a peer may be inside another
    collective, and a barrier here would hold both until --timeout (rank 0 removes what is there)."""
    try:
        if wait_for_peers:
            ranks.barrier()
        if ranks.is_main:
            remove_tree(case.storage, case_dir)
    except Exception as exc:  # noqa: BLE001
        if ranks.is_main:
            print(f"opbench ckpt: warning: could not remove {redact_text(case_dir)}: {redact_text(str(exc))}")


def case_row(case: Case, state: ShardedState, ranks: Ranks, run: RunOptions, result: CaseResult) -> dict[str, Any]:
    """The CSV row: medians over iterations of the slowest rank's time; bandwidth from the median time."""
    block, total, load = (Stats.from_samples(v) for v in (result.block, result.total, result.load))
    size = int(Stats.from_samples([float(s) for s in result.sizes]).median)
    row = base_row(case, state, ranks, run)
    row.update(
        num_saved=len(result.total),
        num_loaded=len(result.load),
        save_block_time=block.median,
        save_total_time=total.median,
        load_time=load.median,
        save_block_time_max=block.max,
        save_total_time_min=total.min,
        save_total_time_max=total.max,
        load_time_min=load.min,
        load_time_max=load.max,
        iter_folder_size=size,
        save_bandwidth_mib_per_s=bandwidth_mibps(size, total.median),
        load_bandwidth_mib_per_s=bandwidth_mibps(size, load.median),
        accurate=not any(result.overlapped),
        verified=not result.problems,
        status="ok" if not result.problems else "error",
        error=None if not result.problems else "verification failed: " + "; ".join(result.problems[:5]),
    )
    row.update(per_rank_columns(result))
    row.update(phase_columns(result))
    if case.method.async_type:
        row["save_overlap_time"] = Stats.from_samples([t - b for b, t in zip(result.block, result.total)]).median
    if run.drop_cache:
        row["drop_cache"] = all(result.cache_dropped)
    return row


def phase_columns(result: CaseResult) -> dict[str, float]:
    """save_<phase>_time: the phases of the median save (the lower middle one for an even count), so they add
    up to that save's slowest-rank total, which is the row's save_total_time for an odd --iterations; empty where
    the method has no such phase. Every save's phases are in the sidecar."""
    timed = [i for i, p in enumerate(result.phases) if p is not None]
    if not timed:
        return {}
    ordered = sorted(timed, key=lambda i: result.total[i])
    phases = result.phases[ordered[(len(ordered) - 1) // 2]] or {}
    return {f"save_{phase}_time": v for phase in PHASES if (v := phases.get(phase)) is not None}


def per_rank_columns(result: CaseResult) -> dict[str, Any]:
    """Who the job waited for: per save and load, the median over ranks of each rank's median time (the typical
    rank; the row's save_total_time / load_time are the slowest rank's, what the job waits for) and the rank that
    was slowest in the most iterations (core.rankstats)."""
    out: dict[str, Any] = {}
    for kind, col in (("total", "save_total_time"), ("load", "load_time")):
        per_iter = result.per_rank[kind]  # iterations × ranks
        if not per_iter:
            continue
        stats = rank_stats([list(r) for r in zip(*per_iter)])
        prefix = "save" if kind == "total" else "load"
        out[f"{col}_rank_median"] = stats.rank_median
        out[f"slowest_{prefix}_rank"] = stats.slowest_rank
    return out


def base_row(case: Case, state: ShardedState, ranks: Ranks, run: RunOptions) -> dict[str, Any]:
    """The columns that describe the case, shared by measured and failed rows."""
    spec = state.spec
    return dict(
        model=spec.label,
        num_layers=spec.num_layers,
        optimizer=spec.optimizer,
        param_dtype=spec.param_dtype,
        state_bytes=spec.total_bytes,
        method=case.method.name,
        storage=case.storage.spec,
        world_size=ranks.world_size,
        thread_count=case.thread_count,
        async_save=case.method.async_type is not None,
        async_type=case.method.async_type,
        async_staging=case.method.staging(state.device),
        single_file_per_rank=run.single_file_per_rank if case.method.uses_threads else None,
        sync_files=run.sync_files,
        drop_cache=run.drop_cache,
    )


def sidecar_entry(case: Case, result: CaseResult) -> dict[str, Any]:
    """Per-iteration and per-rank values for the JSON sidecar."""
    return dict(
        case=case.tag,
        method=case.method.name,
        storage=case.storage.spec,
        thread_count=case.thread_count,
        **{k: v for k, v in asdict(result).items()},
    )
