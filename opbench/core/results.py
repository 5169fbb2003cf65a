"""The one results writer: CSV rows appended (and flushed) as they finish, plus a JSON sidecar of the environment.

A crash or Ctrl-C keeps every row already written. The sidecar sits beside the CSV as ``<stem>.meta.json`` and
always says which benchmark and schema version wrote the CSV. Importing this module does not import torch
(the log parsers and the report use it); ``environment`` imports it only when a device is named.
"""

from __future__ import annotations

import csv
import datetime as _dt
import errno
import json
import math
import os
import platform
import shlex
import socket
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import opbench

from . import clock, errors, outputs
from .errors import UsageError, describe_os_error
from .launch import launch_command
from .redact import redact, redact_text
from .schema import Schema
from .units import note, one_line

if TYPE_CHECKING:
    import torch


def environment(device: torch.device | None = None, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a reader of the CSV needs to trust it: versions, device, host, command line, UTC time. torch's
    versions are recorded when torch is loaded already (always, for the benchmarks that time something)."""
    meta: dict[str, Any] = {
        "opbench": opbench.__version__,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "command": launch_command(),
        "utc_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    torch_mod = sys.modules.get("torch")
    if torch_mod is not None:
        meta.update(
            torch=torch_mod.__version__,
            cuda=torch_mod.version.cuda,
            hip=getattr(torch_mod.version, "hip", None),
            cpu_threads=torch_mod.get_num_threads(),
        )
    if device is not None:
        from .device import device_info

        info = device_info(device)
        meta.update(device=str(device), device_kind=info.kind, device_name=info.name)
        if info.is_gpu and torch_mod is not None:
            meta["device_count"] = torch_mod.cuda.device_count()
    rank_command = shlex.join(getattr(sys, "orig_argv", sys.argv))
    if rank_command != meta["command"]:
        meta["rank_command"] = rank_command  # what this rank ran (under torchrun / srun)
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "NCCL_DEBUG"):
        if key in os.environ:
            meta[key.lower()] = os.environ[key]
    if clock.on_cpu_time():
        meta["clock"] = "cpu"  # CPU-side times are the process's CPU time (OPBENCH_CLOCK=cpu)
    if extra:
        meta.update(extra)
    return meta


def format_value(value: Any) -> Any:
    """Floats to 6 significant digits, None to an empty cell (never a fake zero), bools as True/False, strings with
    credentials masked (core.redact)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return redact_text(value)  # commands, options and errors in cells never carry a credential
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.6g}"
    return value


sidecar_path = outputs.sidecar_of  # <stem>.meta.json beside the CSV


class CsvReport:
    """Append-only CSV whose header is a benchmark's schema; keys outside it are an error (catches typos).

    Opening one follows the rule of ``core.outputs``: this process holds the CSV's writer lock until ``close``
    (another run writing it stops at once, named), and an earlier CSV with measured rows is moved aside to
    ``earlier/<time>/`` (``earlier="keep"``, the default), replaced (``"overwrite"``) or added to
    (``"append"``; ``append=True`` says the same)."""

    def __init__(
        self,
        path: str | os.PathLike,
        schema: Schema,
        meta: Mapping[str, Any] | None = None,
        append: bool = False,
        *,
        earlier: str | None = None,
    ):
        self.path = Path(path)
        self.schema = schema
        self.columns = list(schema.columns)
        self.moved_to: Path | None = None  # where the earlier CSV at this path went, if it was moved aside
        policy = earlier or (outputs.APPEND if append else outputs.KEEP)
        regular = self._regular = not outputs.is_stream(self.path)  # /dev/stdout, a pipe: no lock, nothing kept
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot write report: {describe_os_error(exc)}", source=str(path)) from None
        self._locked = regular
        if regular:
            outputs.hold(self.path)
        try:
            fresh, self.moved_to = outputs.prepare(self.path, policy) if regular else (True, None)
            if not fresh:
                self._check_header()
            # A stream is appended to: "w" on /dev/stdout would empty the file the shell sent stdout to.
            mode = "w" if fresh and regular else "a"
            self._fh = open(self.path, mode, newline="", encoding="utf-8")
        except OSError as exc:
            self._unlock()
            raise UsageError(f"cannot write report: {describe_os_error(exc)}", source=str(path)) from None
        except BaseException:
            self._unlock()
            raise
        if self.moved_to is not None:
            print(
                note(
                    f"the earlier {one_line(self.path.name)} is kept as {one_line(self.moved_to)} "
                    "(--overwrite replaces earlier results, --append adds to them)"
                ),
                file=sys.stderr,
            )
        self._writer = csv.DictWriter(self._fh, fieldnames=self.columns, extrasaction="raise")
        self._good = 0  # file offset after the last complete row: a failed write is cut back to it
        if fresh:
            self._guarded(self._writer.writeheader)
        else:
            self._good = self._fh.seek(0, os.SEEK_END)
        self.rows: list[dict[str, Any]] = []
        errors.writing(self)  # a Ctrl-C from now on names this CSV and its rows (core.errors.run_cli)
        self.write_meta(meta or {})

    def _check_header(self) -> None:
        """--append adds rows under the header that is there: it must be this schema's, or rows would land under
        other columns."""
        header = outputs.header_of(self.path)
        if header != self.columns:
            raise UsageError(
                f"--append: the CSV there has other columns ({self.schema.benchmark} schema v{self.schema.version} "
                "writes different ones; an older opbench or another tool?); give --overwrite or another folder",
                source=str(self.path),
            )

    def _unlock(self) -> None:
        if self._locked:
            self._locked = False
            outputs.release(self.path)

    def _guarded(self, write: Any, *args: Any) -> None:
        """Write, flush and fsync one row; on any OS error (disk full, /dev/full, a vanished mount) cut the file
        back to the last complete row, so no reader sees half a row, and stop with one line (exit 2)."""
        try:
            write(*args)
            self._fh.flush()
            try:
                os.fsync(self._fh.fileno())
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):  # /dev/null, pipes: nothing to sync
                    raise
            if self._regular:  # a pipe has no offset to cut back to
                self._good = self._fh.tell()
        except OSError as exc:
            self._abandon()
            raise UsageError(f"cannot write report: {describe_os_error(exc)}", source=str(self.path)) from None

    def _abandon(self) -> None:
        """Drop what Python still buffers (it would be written at close) and cut the file to its last whole row."""
        try:
            if self._regular:  # never cut the file behind /dev/stdout
                os.ftruncate(self._fh.fileno(), self._good)
        except OSError:
            pass
        try:
            os.close(self._fh.fileno())
        except OSError:
            pass
        try:
            self._fh.close()  # the descriptor is gone: the buffered remainder cannot reach the file
        except (OSError, ValueError):
            pass
        self._unlock()

    def write_meta(self, meta: Mapping[str, Any]) -> None:
        """(Re)write the sidecar; ``benchmark`` and ``schema_version`` always come from the schema."""
        if not self._regular:
            return  # /dev/stdout, a pipe: no file to put a sidecar beside
        text = json.dumps(redact({**meta, **self.schema.sidecar()}), indent=2, default=str) + "\n"
        outputs.write_file(sidecar_path(self.path), text.encode("utf-8"))

    def append(self, row: Mapping[str, Any]) -> None:
        unknown = set(row) - set(self.columns)
        if unknown:
            raise KeyError(f"row has columns outside the contract: {sorted(unknown)}")
        self._guarded(self._writer.writerow, {c: format_value(row.get(c)) for c in self.columns})
        self.rows.append(dict(row))

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.append(row)

    def close(self) -> None:
        errors.done_writing(self)  # not after Ctrl-C or SIGTERM: the interrupt's message names this CSV
        try:
            if not self._fh.closed:
                try:
                    self._fh.close()
                except OSError as exc:
                    raise UsageError(f"cannot write report: {describe_os_error(exc)}", source=str(self.path)) from None
        finally:
            self._unlock()

    def __enter__(self) -> CsvReport:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            errors.stopped_writing(self)  # Ctrl-C, SIGTERM: its message names this CSV (core.errors.run_cli)
        self.close()


class NullReport:
    """What ranks other than 0 write to: nothing. The one rank-0 writer is ``Ranks.open_report``."""

    path = None
    rows: list[dict[str, Any]] = []

    def append(self, row: Mapping[str, Any]) -> None:
        pass

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        pass

    def write_meta(self, meta: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> NullReport:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def summary_table(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    floatfmt: str = ".4g",
    max_rows: int | None = None,
    schema: Schema | None = None,
) -> str:
    """Console table (tabulate); empty cells stay empty. With the benchmark's schema, each header carries its
    column's unit as the schema states it (``fwd_time [s]``), so the console reads as the CSV does."""
    from tabulate import tabulate

    shown = rows if max_rows is None else rows[:max_rows]
    body = [[("" if r.get(c) is None else r.get(c)) for c in columns] for r in shown]
    headers = [header_with_unit(c, schema) for c in columns] if schema is not None else list(columns)
    text = tabulate(body, headers=headers, floatfmt=floatfmt, disable_numparse=False)
    if max_rows is not None and len(rows) > max_rows:
        text += f"\n… {len(rows) - max_rows} more rows in the CSV"
    return text


def header_with_unit(column: str, schema: Schema) -> str:
    """``name [unit]`` for a column with a unit, the name alone where it already ends in it (``time_s``)."""
    unit = schema.unit(column)
    tokens = {unit.lower().replace("/", ""), unit.lower().replace("/", "_per_")}  # gbs, mib_per_s
    if not unit or any(column == t or column.endswith("_" + t) for t in tokens):
        return column
    return f"{column} [{unit}]"


def progress(iterable: Iterable[Any], total: int | None = None, desc: str = "", enabled: bool = True):
    """tqdm on stderr where ``core.progress`` would show a bar (a terminal, or OPBENCH_PROGRESS=bar). A loop that
    has rows to show should use ``core.progress.RowProgress`` instead: it also prints one line per row in a
    batch log."""
    from tqdm import tqdm

    from .progress import BAR, progress_mode

    show = progress_mode(enabled) == BAR
    return tqdm(iterable, total=total, desc=desc, disable=not show, leave=False, dynamic_ncols=True)
