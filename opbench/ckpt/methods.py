"""The save/load methods, one small class each: torch.save per rank, DCP, and DCP's async_save (thread, process).

Each ``save`` returns when the training loop could go on (``PendingSave``); ``wait`` returns when the bytes are
stored. Each ``load`` returns this rank's loaded tensors by key so the caller can verify them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from opbench.core.sweep import Unsupported

from .schema import METHOD_NAMES
from .state import ShardedState
from .storage import Storage


@dataclass(frozen=True)
class SaveOptions:
    """FileSystemWriter knobs (--thread-count, --single-file-per-rank, --sync-files)."""

    thread_count: int = 1
    single_file_per_rank: bool = True
    sync_files: bool = True


@dataclass
class SaveMarks:
    """perf_counter() times inside one DCP save, from which the runner derives its phases (docs/ckpt.md, "Phases"):
    when staging ended (async), when the writer's write_data began and when its writes were done."""

    stage_end: float | None = None
    write_start: float | None = None
    write_end: float | None = None


def _instrument(writer: Any, marks: SaveMarks, stager: Any = None, device: torch.device | None = None) -> None:
    """Wrap this writer instance's write_data (and the stager's stage) to fill ``marks``. DCP calls them as
    attributes of the instances it is given, in the order docs/ckpt.md describes; the thread executor of
    async_save uses the same instance, so the marks come from the background thread there. A reused stager
    must be given back its own ``stage`` after the save (``_uninstrument``), or the wrappers would nest."""
    write_data = writer.write_data

    def timed_write(plan: Any, planner: Any) -> Any:
        if device is not None and device.type == "cuda":
            # async_save writes in a fresh thread, whose current GPU is 0; DCP's one-thread writer takes that
            # GPU's stream, so every rank would open a context on GPU 0 without this
            torch.cuda.set_device(device)
        marks.write_start = time.perf_counter()
        future = write_data(plan, planner)
        future.wait()  # DCP waits here too, right after the call
        marks.write_end = time.perf_counter()
        return future

    writer.write_data = timed_write
    if stager is not None:
        stage = stager.stage

        def timed_stage(state_dict: Any) -> Any:
            out = stage(state_dict)
            marks.stage_end = time.perf_counter()
            return out

        stager.stage = timed_stage


def _uninstrument(stager: Any) -> None:
    """Drop the instance attribute ``_instrument`` set, so the class's own ``stage`` is found again."""
    vars(stager).pop("stage", None)


class PendingSave:
    """A save handed off by the training loop. ``resolved_at`` is the perf_counter() time it finished; ``marks``
    (DCP saves in this process) time its phases."""

    def __init__(self, future: Future | None = None, marks: SaveMarks | None = None):
        self.marks = marks
        self._future = future
        self.resolved_at: float | None = None if future is not None else time.perf_counter()
        if future is not None:
            future.add_done_callback(self._mark)

    def _mark(self, _: Future) -> None:
        if self.resolved_at is None:
            self.resolved_at = time.perf_counter()

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def wait(self) -> float:
        """Block until stored (re-raising the save's error) and return when that happened."""
        if self._future is not None:
            self._future.result()
            self._mark(self._future)
        assert self.resolved_at is not None
        return self.resolved_at


class Method:
    name = ""
    async_type: str | None = None  # 'thread' | 'process' for dcp.async_save
    uses_threads = False  # whether --thread-count applies
    loads_in_place = False  # loads into the state's own tensors (scrambled first)

    def save(self, state: ShardedState, storage: Storage, path: str, opts: SaveOptions) -> PendingSave:
        raise NotImplementedError

    def load(self, state: ShardedState, storage: Storage, path: str) -> Mapping[str, torch.Tensor]:
        raise NotImplementedError

    def staging(self, device: torch.device) -> str | None:
        """What an async save's block time copies the state into (the CSV's ``async_staging``); None: no copy."""
        return None

    def prepare(self, state: ShardedState) -> None:
        """Untimed set-up that a trainer pays once per job for this state, not per checkpoint (runner.run_case
        calls it after the warm-up)."""

    def finish_case(self) -> None:
        """Free what prepare() or the saves kept for this case (runner.run_case calls it when the case ends)."""


class TorchSave(Method):
    """One file per rank: torch.save of the rank's local tensors, torch.load(weights_only=True) to read them
    (Megatron's ``torch`` checkpoint format with the distributed optimizer works this way)."""

    name = "torch_save"

    @staticmethod
    def _file(path: str, rank: int) -> str:
        return f"{path}/rank_{rank:05d}.pt"

    def save(self, state, storage, path, opts):
        with _rank_file(storage, path, self._file(path, state.rank), "wb", opts.sync_files) as fh:
            torch.save(state.tensors, fh)
        return PendingSave()

    def load(self, state, storage, path):
        with _rank_file(storage, path, self._file(path, state.rank), "rb") as fh:
            return torch.load(fh, map_location=state.device, weights_only=True)


@contextlib.contextmanager
def _rank_file(storage: Storage, path: str, target: str, mode: str, sync: bool = False, buffering: int = -1):
    """A rank's one file in a checkpoint folder, opened for ``mode``: a plain file where the storage is local (the
    folder made first; flushed and fsynced before closing when ``sync``), else through the storage's fsspec file
    system (an upload completes when the file closes)."""
    local = storage.local_path(target)
    if local is not None:
        if "w" in mode:
            os.makedirs(os.path.dirname(local), exist_ok=True)
        with open(local, mode, buffering=buffering) as fh:
            yield fh
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        return
    fs, _ = storage.filesystem()
    if "w" in mode:
        fs.makedirs(path, exist_ok=True)
    with fs.open(target, mode) as fh:
        yield fh


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    """A tensor's bytes as they lie in memory (a host copy first for device tensors, as any writer needs)."""
    flat = t.detach().contiguous().view(-1).view(torch.uint8)
    return memoryview(flat.cpu().numpy())  # type: ignore[arg-type]  # numpy arrays are buffers


class Raw(Method):
    """The storage's own speed, the yardstick for every other method: each rank's same bytes as one plain file,
    written sequentially (then fsync with --sync-files) and read back sequentially, with no checkpoint format or
    planning. Through the same fsspec path for object storage. Loads are verified like every method's.

    A load reads into the state's own tensors, in place, as dcp.load does: reading into a new 256 MiB buffer
    took 0.151 s from the page cache against 0.034 s into memory already in use (the new pages' first touch),
    so a raw load with a buffer of its own read as slower than dcp's, 156-163 % of raw (docs/ckpt.md)."""

    name = "raw"
    loads_in_place = True

    @staticmethod
    def _file(path: str, rank: int) -> str:
        return f"{path}/rank_{rank:05d}.bin"

    def save(self, state, storage, path, opts):
        with _rank_file(storage, path, self._file(path, state.rank), "wb", opts.sync_files, buffering=0) as fh:
            for t in state.tensors.values():
                fh.write(_tensor_bytes(t))
        return PendingSave()

    def load(self, state, storage, path):
        target = self._file(path, state.rank)
        total = sum(t.numel() * t.element_size() for t in state.tensors.values())
        got = 0
        with _rank_file(storage, path, target, "rb", buffering=0) as fh:
            for t in state.tensors.values():
                flat = t.detach().view(-1).view(torch.uint8)  # the tensor's own bytes (contiguous, ShardedState)
                if flat.device.type == "cpu":
                    n = _read_into(fh, memoryview(flat.numpy()))
                else:  # a device tensor: through a host copy, as every reader of a file needs
                    host = torch.empty(flat.numel(), dtype=torch.uint8)
                    n = _read_into(fh, memoryview(host.numpy()))
                    flat.copy_(host)
                got += n
                if n < flat.numel():
                    break
            longer = got == total and bool(fh.read(1))  # more bytes than the state has: not this state's file
        if got != total or longer:
            held = f"more than {total}" if longer else str(got)
            raise RuntimeError(f"rank {state.rank}: {target} holds {held} bytes, expected {total}")
        return state.tensors


def _read_into(fh: Any, view: memoryview) -> int:
    """Fill ``view`` from a file object, sequentially; the number of bytes read (short if the file is)."""
    got = 0
    while got < len(view):
        n = fh.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _pins(device: torch.device) -> bool:
    """Whether staging can use pinned host memory for this device (it needs CUDA/ROCm)."""
    return device.type == "cuda" and torch.cuda.is_available()


class ReusableStager:
    """An ``async_stager`` for dcp.async_save that copies the state into host buffers allocated on its first
    staging and reused by every later one (DCP's StateDictStager, pinned on GPUs, the copy non-blocking then
    synchronized), until ``close``.

    Why not DCP's DefaultStager: in torch 2.11 its ``stage`` closes its StateDictStager after every staging,
    which frees the cached buffers and empties the stager's deep-copy table, so the second ``stage`` of the
    same stager fails with ``KeyError: <class 'type'>`` (docs/ckpt.md, "Methods"). Reusing one stager is what
    a trainer does; this class does it on every torch that has StateDictStager."""

    # async_save calls the deprecated synchronize_staging when this is true; stage() below is synchronous
    _synchronize_after_execute = False
    should_synchronize_after_execute = False

    def __init__(self, device: torch.device, pin_memory: bool) -> None:
        from torch.distributed.checkpoint._state_dict_stager import StateDictStager

        self.device, self.pinned = device, pin_memory
        self._stager: Any = StateDictStager(pin_memory=pin_memory)

    @staticmethod
    def available() -> bool:
        try:
            from torch.distributed.checkpoint._state_dict_stager import StateDictStager  # noqa: F401
        except ImportError:
            return False
        return True

    def stage(self, state_dict: Any) -> Any:
        """A host copy of ``state_dict`` (DTensors stay DTensors) in this stager's buffers."""
        staged = self._stager.stage(state_dict, non_blocking=self.pinned)
        if self.pinned:
            torch.cuda.synchronize(self.device)  # the non-blocking device-to-host copies are done
        return staged

    def synchronize_staging(self) -> None:
        """Nothing to wait for: ``stage`` returns when the copy is done."""

    def close(self) -> None:
        """Free the host buffers (unpinned by the stager's finalizers)."""
        self._stager.close()


class Dcp(Method):
    """torch.distributed.checkpoint.save/load of DTensor shards (FSDP2's layout); FileSystemWriter for paths,
    FsspecWriter for URLs."""

    name = "dcp"
    uses_threads = True
    loads_in_place = True

    @staticmethod
    def writer(storage: Storage, path: str, opts: SaveOptions):
        if storage.is_url:
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

            return FsspecWriter(
                path,
                single_file_per_rank=opts.single_file_per_rank,
                sync_files=opts.sync_files,
                thread_count=opts.thread_count,
                **storage.fs_options,
            )
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(
            path,
            single_file_per_rank=opts.single_file_per_rank,
            sync_files=opts.sync_files,
            thread_count=opts.thread_count,
        )

    @staticmethod
    def reader(storage: Storage, path: str):
        if storage.is_url:
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

            return FsspecReader(path, **storage.fs_options)
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(path)

    def save(self, state, storage, path, opts):
        import torch.distributed.checkpoint as dcp

        writer, marks = self.writer(storage, path, opts), SaveMarks()
        _instrument(writer, marks)
        dcp.save(state.dcp_state_dict(), storage_writer=writer)
        return PendingSave(marks=marks)

    def load(self, state, storage, path):
        import torch.distributed.checkpoint as dcp

        dcp.load(state.dcp_state_dict(), storage_reader=self.reader(storage, path))
        return state.tensors


class DcpAsync(Dcp):
    """dcp.async_save: returns once the state is staged to host memory; the write finishes in the background
    (a thread, or with ``process`` a daemon process per rank that DCP starts on first use)."""

    name = "dcp_async"
    async_type = "thread"
    _stager: Any = None
    _stager_state: ShardedState | None = None  # the state the stager's pinned buffers were made for

    def staging(self, device: torch.device) -> str | None:
        if self.async_type == "thread" and _pins(device) and ReusableStager.available():
            return "pinned host memory"
        return "host memory (pageable)"

    def _make_stager(self, device: torch.device) -> Any:
        """Thread mode stages through opbench's ReusableStager on every device, pinned where pinned memory exists
        (CUDA/ROCm: the device-to-host copy then runs at DMA speed, as trainers that checkpoint asynchronously
        configure it), pageable elsewhere, so a CPU run goes through the very code a GPU run does. None (DCP's own
        staging) in process mode or where torch has no StateDictStager."""
        if self.async_type != "thread" or not ReusableStager.available():
            return None
        return ReusableStager(device, pin_memory=_pins(device))

    def _stager_for_state(self, state: ShardedState) -> Any:
        """One stager per state, so its host buffers are allocated (and pinned) once, by ``prepare``, untimed, and
        reused by the case's saves, as a trainer's would be; a new state (the warm-up's tiny one included) gets a
        new one."""
        if self._stager_state is not state:
            self.close_stager()
            self._stager, self._stager_state = self._make_stager(state.device), state
        return self._stager

    def prepare(self, state: ShardedState) -> None:
        """Stage the state once into its host buffers: allocating (and on a GPU pinning) memory for the whole
        state takes far longer than the copy, and a trainer pays it on its first checkpoint only."""
        stager = self._stager_for_state(state)
        if stager is not None:
            stager.stage(state.dcp_state_dict())

    def finish_case(self) -> None:
        """The staged copy lives only while this method's case runs: later cases (raw, torch_save loads, process
        mode's staging) make host copies of their own, and the memory check counts one at a time."""
        self.close_stager()

    def close_stager(self) -> None:
        stager, self._stager, self._stager_state = self._stager, None, None
        if stager is not None:
            stager.close()

    def checkpointer_type(self):
        from torch.distributed.checkpoint import state_dict_saver

        kind = getattr(state_dict_saver, "AsyncCheckpointerType", None)
        member = getattr(kind, self.async_type.upper(), None) if kind is not None else None
        if member is None:
            raise Unsupported(
                f"this torch ({torch.__version__}) has no dcp.async_save async_checkpointer_type={self.async_type}"
            )
        return member

    def save(self, state, storage, path, opts):
        import torch.distributed.checkpoint as dcp

        stager = self._stager_for_state(state)
        writer = self.writer(storage, path, opts)
        if stager is not None and hasattr(writer, "per_thread_copy_ahead"):
            # the state it writes is in host memory already: what FileSystemWriter.stage sets when DCP stages (its
            # copy-ahead loader would otherwise wait on CUDA streams from the writer thread)
            writer.per_thread_copy_ahead = 0
        marks = None
        if self.async_type == "thread":  # process mode writes in a daemon: its writer is pickled, not wrapped
            marks = SaveMarks()
            # without a stager of ours DCP stages through the writer (FileSystemWriter is a BlockingAsyncStager)
            _instrument(writer, marks, stager if stager is not None else writer, state.device)
        try:
            response = dcp.async_save(
                state.dcp_state_dict(),
                storage_writer=writer,
                async_checkpointer_type=self.checkpointer_type(),
                **({"async_stager": stager} if stager is not None else {}),
            )
        finally:
            if stager is not None:  # staged by now: async_save stages in this thread before it returns
                _uninstrument(stager)
        # Newer torch may return AsyncSaveResponse(staging_completion, upload_completion).
        return PendingSave(getattr(response, "upload_completion", response), marks)


class DcpAsyncProcess(DcpAsync):
    """Process mode: DCP spawns one daemon per rank on the first save (a fresh Python that joins its own gloo
    group); the runner's untimed warm-up save pays that start-up."""

    name = "dcp_async_process"
    async_type = "process"


METHODS: dict[str, Method] = {m.name: m for m in (Raw(), TorchSave(), Dcp(), DcpAsync(), DcpAsyncProcess())}
if tuple(METHODS) != METHOD_NAMES:  # the CLI lists schema.METHOD_NAMES without importing this module
    raise RuntimeError(f"ckpt methods {tuple(METHODS)} differ from schema.METHOD_NAMES {METHOD_NAMES}")


def get_method(name: str) -> Method:
    from opbench.core.errors import UsageError

    try:
        return METHODS[name]
    except KeyError:
        raise UsageError(f"unknown method '{name}' (choose from {', '.join(METHODS)})", field="--methods") from None


def close_stagers() -> None:
    """Free every async method's pinned stagers (and the states they hold)."""
    for method in METHODS.values():
        if isinstance(method, DcpAsync):
            method.close_stager()


def stop_async_daemon(timeout: float = 60.0) -> None:
    """Stop DCP's checkpoint daemon (process mode) before the process group goes away, and free the pinned
    staging buffers. Every rank asks its own daemon at about the same time, since the daemons leave their gloo
    group together. Private torch state, so any surprise here is ignored."""
    try:
        close_stagers()
    except Exception:  # noqa: BLE001
        pass
    try:
        from torch.distributed.checkpoint import _async_process_executor as ape

        proc = getattr(ape, "_CHECKPOINT_PROCESS", None)
        if proc is None:
            return
        ape._CHECKPOINT_PROCESS = None
        worker = proc._save_process
        if worker.is_alive():
            proc._send(ape._CheckpointSaveProcessControlOpts.TERMINATE)
            worker.join(timeout)
        if worker.is_alive():
            worker.terminate()
            worker.join(5)
    except Exception:  # noqa: BLE001
        pass
