"""What happens to a results CSV that is already there, and who may write one now.

The rule (docs/conventions.md, "Earlier results"): no measured row is lost unless the user asks.

* A run whose CSV exists with measured rows moves it (and its ``.meta.json`` sidecar and ``.errors.log``) to
  ``<folder>/earlier/<UTC time>/`` first and says so on stderr: that folder is a results folder of its own
  (``opbench report DIR/earlier/<time>``, ``report --compare``). ``--overwrite`` replaces it instead,
  ``--append`` adds rows to it (its header must be this schema's).
* A dry run writes its planned rows to ``<stem>.plan.csv``, never over a measured CSV.
* While a run writes a CSV it holds an advisory lock (``fcntl.flock``) on ``<csv>.lock``, which says who holds
  it; a second run that wants the same CSV stops at once with one line naming the first, so two runs never
  interleave or replace each other's rows.

Torch-free.
"""

from __future__ import annotations

import csv
import datetime as _dt
import errno
import fcntl
import json
import os
import socket
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError, describe_os_error
from .redact import redact_text
from .units import note

KEEP, OVERWRITE, APPEND = "keep", "overwrite", "append"  # what a run does to an earlier CSV at its path
EARLIER_DIR = "earlier"
PLAN_SUFFIX = ".plan.csv"  # core.cli.PLAN_SUFFIX: one value
LOCK_SUFFIX = ".lock"
PLANNED = "planned"  # core.sweep.STATUS_PLANNED (sweep imports this package's results module, not the reverse)


STREAM_DIRS = ("/dev/", "/proc/")


def is_stream(csv_path: str | os.PathLike) -> bool:
    """Whether an output path is a stream rather than a results file: a path in /dev or /proc (/dev/stdout,
    /dev/fd/1, /proc/self/fd/1, whatever file the shell pointed them at), a link that leads there, or anything
    that exists and is not a regular file (a FIFO). A stream gets the rows only: no lock, no sidecar, nothing
    moved aside (moving /dev/stdout would move the link, not the user's file)."""
    path = os.path.abspath(csv_path)
    for _ in range(40):  # the kernel's own limit on links followed
        if path.startswith(STREAM_DIRS):
            return True
        try:
            if not os.path.islink(path):
                return os.path.exists(path) and not os.path.isfile(path)
            path = os.path.abspath(os.path.join(os.path.dirname(path), os.readlink(path)))
        except OSError:
            return False
    return False


def plan_path(csv_path: str | os.PathLike) -> Path:
    """Where a dry run's planned rows go: ``<stem>.plan.csv`` beside the CSV a real run would write."""
    path = Path(csv_path)
    if path.name.endswith(PLAN_SUFFIX):
        return path
    return beside(path, PLAN_SUFFIX)


def beside(csv_path: Path, suffix: str) -> Path:
    """The file named ``suffix`` that belongs to the CSV at ``csv_path``: ``x.csv`` -> ``x<suffix>``; a name not
    ending in ``.csv`` keeps all of it (``llama3.1`` -> ``llama3.1<suffix>``, not ``llama3<suffix>``, which
    ``llama3.2`` would share). ``x`` and ``x.csv`` would share one: ``refuse_reserved`` refuses ``x`` then."""
    name = csv_path.name
    return csv_path.with_name((name[: -len(".csv")] if name.endswith(".csv") else name) + suffix)


def sidecar_of(csv_path: Path) -> Path:
    return beside(csv_path, ".meta.json")


COMPANION_SUFFIXES = (".meta.json", ".errors.log")  # files of one run beside its CSV: kept aside with it


def companions_of(csv_path: Path) -> list[Path]:
    """The sidecar and the errors log (ckpt's tracebacks) that belong to the CSV at ``csv_path``."""
    return [beside(csv_path, suffix) for suffix in COMPANION_SUFFIXES]


def kept_aside(rel_path: str) -> str | None:
    """Why a CSV found in a results folder is not this run's results, or None when it is: an earlier run's file
    kept under ``earlier/``, or a dry run's plan. For ``opbench report``, which lists such files as skipped."""
    parts = Path(rel_path).parts
    if EARLIER_DIR in parts[:-1]:
        return "an earlier run's results, kept when a later run wrote the folder (report that folder on its own)"
    if parts and parts[-1].endswith(PLAN_SUFFIX):
        return "a dry run's plan (planned rows, nothing measured)"
    return None


def holds_measurements(csv_path: Path) -> bool:
    """True when the CSV has a data row that is not a plan (``status`` other than ``planned``, or no status
    column). Reads up to the first such row; an unreadable file counts as measured (kept, never destroyed)."""
    try:
        with open(csv_path, newline="", encoding="utf-8", errors="replace") as fh:
            reader = csv.DictReader(fh)
            for row in reader:
                if not any(row.values()):
                    continue
                if row.get("status") != PLANNED:
                    return True
    except (OSError, csv.Error):
        return True
    return False


def header_of(csv_path: Path) -> list[str] | None:
    try:
        with open(csv_path, newline="", encoding="utf-8", errors="replace") as fh:
            return next(csv.reader(fh), None)
    except (OSError, csv.Error):
        return None


_RUN_STAMP: str | None = None


def run_stamp() -> str:
    """This run's UTC start as a folder name (20261124T162839Z): every CSV one run moves aside goes together."""
    global _RUN_STAMP
    if _RUN_STAMP is None:
        _RUN_STAMP = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return _RUN_STAMP


def keep_earlier(csv_path: Path) -> Path:
    """Move an earlier CSV and its sidecar to ``<folder>/earlier/<run stamp>/``; returns the CSV's new path."""
    folder = csv_path.parent / EARLIER_DIR / run_stamp()
    target = folder / csv_path.name
    n = 1
    while target.exists():  # the same second, the same name (a folder copied in): never replace
        n += 1
        target = csv_path.parent / EARLIER_DIR / f"{run_stamp()}-{n}" / csv_path.name
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(csv_path, target)
        for side, moved in zip(companions_of(csv_path), companions_of(target)):
            if side.is_file():
                os.replace(side, moved)
    except OSError as exc:
        raise UsageError(
            f"cannot keep the earlier results aside ({describe_os_error(exc)}); give --overwrite to replace "
            "them or --append to add to them",
            source=str(csv_path),
        ) from None
    return target


def write_file(path: str | os.PathLike, data: bytes) -> None:
    """Write a whole file (a sidecar, report.md, a plot) as a new file moved into place: a FIFO at that name is
    not opened (it would block until someone reads it), a link there is replaced rather than written through
    (it would overwrite what it points at), and a failed write (disk full) leaves what was there. Raises
    UsageError naming the path."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise UsageError("cannot write: is a folder", source=str(path))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        try:
            with open(tmp, "xb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise UsageError(f"cannot write: {describe_os_error(exc)}", source=str(path)) from None


# -- the writer's lock ---------------------------------------------------------------------------------------


def lock_path(csv_path: Path) -> Path:
    return csv_path.with_name(csv_path.name + LOCK_SUFFIX)


@dataclass
class _Held:
    fd: int
    count: int


_HELD: dict[Path, _Held] = {}  # locks this process holds, so one run may open its own CSV again
_WRITTEN: set[Path] = set()  # CSVs this process has written: opened again, they are rewritten, not moved aside
_warned_no_lock = False


def _key(csv_path: Path) -> Path:
    """The file itself, whatever the path says: a symlink to a CSV another run writes is that CSV (one lock)."""
    return Path(os.path.realpath(csv_path))


def _holder(path: Path) -> str:
    """Who holds a lock, from what it wrote into the lock file."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return (
            f"pid {info.get('pid')} on {info.get('host')} since {info.get('since')}: "
            f"{redact_text(str(info.get('command', '?')))}"
        )
    except (OSError, ValueError, AttributeError):
        return "a process that has not said who it is yet"


def _acquire(csv_path: Path) -> int | None:
    """Lock ``<csv>.lock`` (created if missing); None where the file system has no flock (the run goes on,
    unguarded, with one note). The lock file may be removed by its holder when it ends: retry on a file that
    was replaced under us."""
    global _warned_no_lock
    path = lock_path(csv_path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write report: {describe_os_error(exc)}", source=str(csv_path)) from None
    for _ in range(20):
        try:
            # Never through a link: the holder's label would be written over whatever it points at (the CSV).
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            why = "is a link, not opbench's lock file (remove it)" if exc.errno == errno.ELOOP else None
            raise UsageError(f"cannot lock the report: {why or describe_os_error(exc)}", source=str(path)) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device put there: not a lock file
            os.close(fd)
            raise UsageError("cannot lock the report: is not a plain file (remove it)", source=str(path))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            from .launch import launch_command

            raise UsageError(
                f"another opbench run is writing this file ({_holder(path)}); wait for it to end, or give "
                f"another --report-dir-path (this run: {redact_text(launch_command())})",
                source=str(csv_path),
            ) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                if not _warned_no_lock:
                    _warned_no_lock = True
                    print(
                        note(
                            f"{csv_path.parent} does not support file locks (flock): two runs writing one folder "
                            "at once are not guarded"
                        ),
                        file=sys.stderr,
                    )
                return None
            raise UsageError(f"cannot lock the report: {describe_os_error(exc)}", source=str(path)) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder removed the file between our open and our lock: lock the new one
    raise UsageError("the lock file keeps being replaced; is another run starting and ending?", source=str(path))


def _describe_self(fd: int) -> None:
    from .launch import launch_command

    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": redact_text(launch_command()),
    }
    data = (json.dumps(info) + "\n").encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    except OSError:
        pass  # the lock holds without its label; a second run then says "has not said who it is"


_INPUTS: set[tuple[int, int]] = set()  # (device, inode) of the files this process reads (``protect``)


def protect(paths: list[str]) -> None:
    """Mark files this run reads (logs, nccl-tests outputs): ``hold`` refuses to write a CSV over one of them,
    which would move the input aside, or with --overwrite empty it, before it is read."""
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        _INPUTS.add((st.st_dev, st.st_ino))


def refuse_input(csv_path: str | os.PathLike) -> None:
    try:
        st = os.stat(csv_path)
    except OSError:
        return
    if (st.st_dev, st.st_ino) in _INPUTS:
        raise UsageError(
            "is a file this run reads: the CSV would replace its own input; give another --report-csv-path",
            source=str(csv_path),
        )


RESERVED_SUFFIXES = (*COMPANION_SUFFIXES, LOCK_SUFFIX)  # names of the files opbench keeps beside a CSV


def refuse_reserved(csv_path: str | os.PathLike) -> None:
    """A CSV named like the files kept beside another CSV (``x.meta.json``, ``x.errors.log``, ``x.csv.lock``)
    would write its rows over that CSV's sidecar, or over a lock that its holder removes when it ends; a CSV
    named ``x`` beside an ``x.csv`` would share its sidecar ``x.meta.json``."""
    path = Path(csv_path)
    for suffix in RESERVED_SUFFIXES:
        if path.name.endswith(suffix):
            raise UsageError(
                f"a name ending in {suffix} is one opbench gives the files beside a CSV (sidecar, errors log, "
                "lock); give a --report-csv-path ending in .csv",
                source=str(csv_path),
            )
    twin = path.with_name(path.name + ".csv")
    if not path.name.endswith(".csv") and twin.is_file():
        raise UsageError(
            f"{twin.name} beside it has the same sidecar ({sidecar_of(twin).name}); give a --report-csv-path "
            "ending in .csv",
            source=str(csv_path),
        )


def hold(csv_path: str | os.PathLike) -> None:
    """Take (or take again) this process's writer lock on a CSV; raises UsageError naming the holder when
    another process has it, or when the CSV would replace a file this run reads (``protect``) or a file kept
    beside another CSV (``refuse_reserved``)."""
    if is_stream(csv_path):
        return  # /dev/stdout, a pipe: nothing to guard
    refuse_reserved(csv_path)
    refuse_input(csv_path)
    key = _key(Path(csv_path))
    held = _HELD.get(key)
    if held is not None:
        held.count += 1
        return
    fd = _acquire(key)
    if fd is not None:
        _describe_self(fd)
    _HELD[key] = _Held(-1 if fd is None else fd, 1)


def release(csv_path: str | os.PathLike) -> None:
    """Give one hold back; the last one removes the lock file and unlocks."""
    if is_stream(csv_path):
        return
    key = _key(Path(csv_path))
    held = _HELD.get(key)
    if held is None:
        return
    held.count -= 1
    if held.count > 0:
        return
    del _HELD[key]
    if held.fd >= 0:
        try:
            os.unlink(lock_path(key))  # before unlocking: a waiting opener sees a new file and retries
        except OSError:
            pass
        os.close(held.fd)


@contextmanager
def claimed(*csv_paths: str | os.PathLike) -> Iterator[None]:
    """Hold the writer locks of every CSV a run will write, from its start to its end: a second run into the
    same files stops at once, not after the first of them is done. Two of them that are one file (two models
    whose names give one file name, a link) are refused: the second would replace the first's rows."""
    seen: set[Path] = set()
    for path in csv_paths:
        key = _key(Path(path))
        if key in seen and not is_stream(path):
            raise UsageError(
                "two of this run's outputs are this one file (one name given twice, or two names that give one "
                "file name): the second would replace the first's rows; give them different names",
                source=str(path),
            )
        seen.add(key)
    taken: list[str | os.PathLike] = []
    try:
        for path in csv_paths:
            hold(path)
            taken.append(path)
        yield
    finally:
        for path in reversed(taken):
            release(path)


def prepare(csv_path: Path, earlier: str) -> tuple[bool, Path | None]:
    """Decide, under the lock, how the CSV is opened: (fresh, where the earlier one went). Fresh means write a
    new file with a header; not fresh means append to the one there."""
    key = _key(csv_path)
    again = key in _WRITTEN
    _WRITTEN.add(key)
    exists = csv_path.is_file() and csv_path.stat().st_size > 0
    if not exists:
        return True, None
    if earlier == APPEND:
        return False, None
    if earlier == OVERWRITE and not again:
        stale = beside(csv_path, ".errors.log")  # the replaced rows' tracebacks: they would describe nothing
        if stale.is_file():
            stale.unlink()
    if earlier == OVERWRITE or again or not holds_measurements(csv_path):
        return True, None
    return True, keep_earlier(csv_path)
