"""User-facing errors: the only place that turns bad input into one line on stderr and exit code 2."""

from __future__ import annotations

import os
import sys
from typing import Callable, Sequence

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad input from the user (file, field, flag). Printed as one line, exit code 2, never a traceback."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        where = ": ".join(p for p in (source, f"field '{field}'" if field else None) if p)
        super().__init__(f"{where}: {message}" if where else message)


def run_cli(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None, prog: str = "opbench") -> int:
    """Run a module's ``main`` and map user errors and Ctrl-C to exit codes without tracebacks."""
    try:
        return int(main(argv) or 0)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; rows finished so far are in the report", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `opbench … | head`: the reader went away; not an error worth a traceback.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
