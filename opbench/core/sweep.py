"""The sweep loop shared by every benchmark: run each item, write its row as soon as it exists, and turn a
failure (OOM, unsupported dtype/backend, kernel error) into a row with ``status`` and ``error`` instead of
stopping the sweep or writing a silent zero."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from .errors import describe_os_error, raise_if_terminated
from .progress import Field, RowProgress, Workload
from .results import CsvReport, NullReport, summary_table

T = TypeVar("T")

STATUS_OK = "ok"
STATUS_UNSUPPORTED = "unsupported"
STATUS_OOM = "oom"
STATUS_ERROR = "error"
STATUS_PLANNED = "planned"


class Unsupported(Exception):
    """A backend cannot run this item on this device/dtype; the message says why."""


def classify_failure(exc: BaseException) -> tuple[str, str]:
    """(status, one-line message) for an exception raised while measuring one item."""
    if isinstance(exc, Unsupported):
        status = STATUS_UNSUPPORTED
    elif isinstance(exc, MemoryError) or _is_torch_oom(exc) or _says_oom(str(exc)):
        status = STATUS_OOM
    else:
        status = STATUS_ERROR
    if isinstance(exc, OSError) and status == STATUS_ERROR:
        return status, describe_os_error(exc)[:500]
    msg = " ".join(str(exc).split()) or type(exc).__name__
    if status == STATUS_ERROR:
        msg = f"{type(exc).__name__}: {msg}"
    return status, msg[:500]


def _says_oom(text: str) -> bool:
    """GPU allocators say "out of memory"; torch's CPU allocator says "can't allocate memory" (ENOMEM)."""
    low = text.lower()
    return any(s in low for s in ("out of memory", "can't allocate memory", "cannot allocate memory"))


def _is_torch_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")  # no torch loaded: the exception cannot be torch's
    return torch is not None and isinstance(exc, torch.OutOfMemoryError)


def release_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        try:
            torch.cuda.empty_cache()
        except RuntimeError:
            pass  # an allocator a failed CUDA-graph capture left inconsistent: the row's own error says enough


def run_sweep(
    items: Sequence[T] | Iterable[T],
    measure_one: Callable[[T], Mapping[str, Any]],
    failed_row: Callable[[T, str, str], Mapping[str, Any]],
    report: CsvReport,
    desc: str = "",
    total: int | None = None,
    dry_run: bool = False,
    fields: Sequence[Field] = (),
    table: Sequence[str] = (),
    workload: Workload | None = None,
) -> list[dict[str, Any]]:
    """Measure each item and append its row; returns the rows in order. Progress shows as ``core.progress``
    says (a bar on a terminal, else one line of ``fields`` per finished row). On Ctrl-C or SIGTERM the rows
    finished so far are printed (``table`` columns) and the interrupt propagates, every finished row on disk.
    ``dry_run`` writes every item as a ``planned`` row and measures nothing. ``workload``: each item's work, so the
    bar's time left weighs rows by it (core.progress.Workload; without one, rows count alike)."""
    rows: list[dict[str, Any]] = []
    if dry_run:
        rows = [dict(failed_row(item, STATUS_PLANNED, "")) for item in items]
        report.extend(rows)
        return rows
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    # One rank tells the log: ranks other than 0 write to a NullReport (core.dist.Ranks.open_report).
    with RowProgress(total, desc, fields, enabled=not isinstance(report, NullReport), workload=workload) as shown:
        try:
            for item in items:
                row = _measured_row(item, measure_one, failed_row)
                report.append(row)
                rows.append(row)
                shown.done(row)
        except KeyboardInterrupt:
            if not isinstance(report, NullReport):  # rank 0 says it, once (the others' counts may lag behind)
                print_finished(rows, table, report, total)
            raise
    return rows


def _measured_row(
    item: T, measure_one: Callable[[T], Mapping[str, Any]], failed_row: Callable[[T, str, str], Mapping[str, Any]]
) -> dict[str, Any]:
    try:
        return dict(measure_one(item))
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row, the sweep goes on
        raise_if_terminated()
        status, message = classify_failure(exc)
        if status != STATUS_UNSUPPORTED:  # gc takes ~0.4 s; only a real failure may have left memory behind
            release_memory()
        return dict(failed_row(item, status, message))


def print_finished(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[str], report: CsvReport, total: int | None
) -> None:
    """What an interrupted sweep had finished, on stdout: the rows as a table, and where the CSV is."""
    of = f" of {total}" if total is not None else ""
    lines = [f"\ninterrupted after {len(rows)}{of} rows"]
    if rows and columns:
        lines += ["rows finished:", summary_table(rows, columns, schema=getattr(report, "schema", None))]
    if getattr(report, "path", None):
        lines.append(f"they are in {report.path}")
    try:
        print("\n".join(lines), flush=True)
    except (OSError, ValueError):
        pass
