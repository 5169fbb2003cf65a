"""Reading small input files (model configs, thresholds) the user names: only a regular file, and at most a
bound, so /dev/zero cannot fill memory and a FIFO cannot hang the run (docs/conventions.md, "Bad input").
Torch-free."""

from __future__ import annotations

import json
import os
import stat
import sys
from typing import Any

from .errors import UsageError


def read_small_text(path: str | os.PathLike, max_bytes: int, what: str, field: str | None = None) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes``; anything else is one UsageError naming the file
    (and ``field``). ``what`` names what the file should be ("a JSON file")."""
    source = str(path)
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(source)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(
                f"is not a regular file (a device, pipe or socket); give {what}", source=source, field=field
            )
        if info.st_size > max_bytes:
            raise UsageError(
                f"is {info.st_size / (1 << 20):.0f} MiB; {what} of at most {max_bytes >> 20} MiB is read",
                source=source,
                field=field,
            )
        with open(path, encoding="utf-8") as fh:
            return fh.read(max_bytes + 1)[:max_bytes]
    except FileNotFoundError:
        raise UsageError("file not found", source=source, field=field) from None
    except IsADirectoryError:
        raise UsageError(f"is a directory, expected {what}", source=source, field=field) from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"is not UTF-8 text ({exc.reason} at byte {exc.start})", source=source, field=field) from None
    except OSError as exc:
        raise UsageError(f"cannot read: {exc.strerror or exc}", source=source, field=field) from None


def parse_json(text: str, source: str | None = None, field: str | None = None) -> Any:
    """``text`` parsed as JSON; malformed text (with its line and column), nesting too deep for the parser, and an
    integer of more digits than Python converts (``sys.get_int_max_str_digits``) are each one UsageError naming
    ``source`` / ``field``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", source=source, field=field
        ) from None
    except RecursionError:
        raise UsageError("JSON nested too deeply", source=source, field=field) from None
    except ValueError:  # the one other ValueError json.loads raises: int() refusing a number that long
        raise UsageError(
            f"holds a number of more than {sys.get_int_max_str_digits():,} digits", source=source, field=field
        ) from None
