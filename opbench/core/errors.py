"""User-facing errors: the only place that turns bad input into one line on stderr and exit code 2."""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, Protocol

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports it


def describe_os_error(exc: BaseException) -> str:
    """One readable line for the storage failures users hit: disk full, no permission, missing file or bucket."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"disk full: {exc.strerror}" + (f" ({exc.filename})" if exc.filename else "")
    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:  # the name itself is in the source already
        return "name too long (a part of a path may have 255 bytes, the whole path 4096)"
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc}"
    if isinstance(exc, FileNotFoundError):
        return f"not found: {exc}"
    if isinstance(exc, (FileExistsError, NotADirectoryError)) and exc.filename:
        return f"{exc.filename} is not a folder"  # mkdir on a file (or /dev/full): "File exists" would mislead
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is so every ``finally`` and Ctrl-C cleanup runs."""


_terminating = False
_interrupted = False


def _terminated(signum: int, frame: object) -> None:
    global _terminating
    _terminating = True
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated()


def _interrupt(signum: int, frame: object) -> None:
    """Ctrl-C, as Python's own handler does it (KeyboardInterrupt where the process is), remembered: library code
    may catch it (DCP turns it into a CheckpointException, torch.save's writer into a RuntimeError)."""
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt()


def raise_if_terminated() -> None:
    """Re-raise a SIGTERM or Ctrl-C that library code swallowed: raised inside a C++ callback (torch.save's
    writer) or a DCP rank, the exception comes back as a RuntimeError or a CheckpointException. Failure handlers
    call this before turning an error into a row, so an interrupt is never a failed case."""
    if _terminating:
        raise Terminated()
    if _interrupted:
        raise KeyboardInterrupt()


class Writing(Protocol):
    """What the Ctrl-C message needs of an open CSV (core.results.CsvReport): where it is, and its rows (a
    report that keeps none in memory counts them in ``written``, as trace's BatchedReport does)."""

    path: Any
    rows: list[Any]


# The CSVs this run was writing when it was stopped: core.results.CsvReport adds itself when it opens and takes
# itself out when it closes, unless it closes on the way out of Ctrl-C or SIGTERM (``writing``, ``done_writing``,
# ``stopped_writing``). Kept here, not in results, so this module imports no output layer (results imports it).
_WRITING: list[Writing] = []
_STOPPED: list[Writing] = []  # closed by an interrupt: stays named


def writing(report: Writing) -> None:
    """A CSV is open: a Ctrl-C or SIGTERM from now on names it."""
    _WRITING.append(report)


def stopped_writing(report: Writing) -> None:
    """A CSV closes because of Ctrl-C or SIGTERM (a KeyboardInterrupt leaving its ``with``): keep naming it."""
    _STOPPED.append(report)


def done_writing(report: Writing) -> None:
    """A CSV is closed; one closed on the way out of an interrupt stays, for ``run_cli``'s message."""
    if not (_interrupted or _terminating or any(r is report for r in _STOPPED)):
        _WRITING[:] = [r for r in _WRITING if r is not report]


def _rows_in(report: Writing) -> int:
    written = getattr(report, "written", None)
    return written if isinstance(written, int) else len(report.rows)


def where_rows_are() -> str | None:
    """The end of the Ctrl-C / SIGTERM message: the rows this run wrote and the CSVs they are in, as they were
    when it was stopped (docs/conventions.md, "Progress"); None on a rank other than 0 of a job, which writes no
    CSV: rank 0 says where the rows are, once."""
    from .redact import redact_text
    from .units import counted, one_line

    def shown(path: Any) -> str:
        return one_line(redact_text(str(path)))

    open_now = [r for i, r in enumerate(_WRITING) if all(r is not o for o in _WRITING[:i])]  # each once
    if not open_now:
        env = os.environ  # torchrun's variables, else srun's (core.dist reads them the same way)
        rank, world = env.get("RANK", env.get("SLURM_PROCID", "0")), env.get("WORLD_SIZE", env.get("SLURM_NTASKS", "1"))
        return None if rank != "0" and world != "1" else "; no CSV was being written"
    if len(open_now) == 1:
        report = open_now[0]
        n = _rows_in(report)
        if n == 0:
            return f"; no row had finished ({shown(report.path)} has none)"
        verb = "is" if n == 1 else "are"
        return f"; the {counted(n, 'row')} finished so far {verb} in {shown(report.path)}"
    return "; the rows finished so far are in " + ", ".join(
        f"{shown(r.path)} ({counted(_rows_in(r), 'row')})" for r in open_now
    )


class UsageError(Exception):
    """Bad input from the user (file, field, flag). Printed as one line, exit code 2, never a traceback."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        where = ": ".join(p for p in (source, f"field '{field}'" if field else None) if p)
        super().__init__(f"{where}: {message}" if where else message)


def run_cli(
    main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None, prog: str = "opbench"
) -> int:
    """Run a module's ``main`` and map user errors and Ctrl-C to exit codes without tracebacks. SIGTERM (Slurm's
    scancel and time limit, torchrun stopping its workers) is handled as Ctrl-C is: cleanup runs, rows are kept."""
    try:
        signal.signal(signal.SIGTERM, _terminated)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when the caller ignores Ctrl-C
            signal.signal(signal.SIGINT, _interrupt)
    except ValueError:  # not the main thread (a test calling main in a worker thread): leave the signals alone
        pass
    _WRITING.clear()  # this run's CSVs only (a test runs several in one process)
    _STOPPED.clear()
    try:
        return int(main(argv) or 0)
    except UsageError as exc:
        from .redact import redact_text
        from .units import one_line

        # One line whatever a name in it holds (a newline from a config or a flag), credentials masked.
        print(f"{prog}: error: {one_line(redact_text(str(exc)))}", file=sys.stderr)
        return EXIT_USAGE
    except Terminated:
        said = where_rows_are()
        if said is not None:
            print(f"{prog}: terminated (SIGTERM){said}", file=sys.stderr)
        # Every finally has run (rows closed, data removed). Leave without the interpreter's shutdown: library
        # threads still running (a checkpoint writer, a communicator) can abort the process while it tears down.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_TERMINATED)
    except KeyboardInterrupt:
        said = where_rows_are()
        if said is not None:
            print(f"{prog}: interrupted{said}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `opbench … | head`: the reader went away; not an error worth a traceback.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
