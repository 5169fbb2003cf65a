"""One convention for sizes shown to people: powers of 1024 with IEC names (KiB, MiB, GiB), as nccl-tests
users read message sizes. CSVs keep raw bytes in columns whose names end in ``bytes``; only console tables
and the report turn them into text with this function. Also: text made one line, and counts with their noun."""

from __future__ import annotations

import math
import re


def human_bytes(value: object) -> str:
    """64 KiB, 1.5 GiB, 28 GiB; empty for a missing value (never a fake zero). Whatever a hand-edited CSV holds
    comes back as short text, never an exception: ``inf``/``-inf`` for an infinite size, the text itself (cut
    short) for something that is not a number, and 3 significant digits with an exponent for a size beyond PiB
    (1e300 B is ``8.88e+284 PiB``, not 285 digits)."""
    if value is None or type(value).__name__ == "NAType":  # pandas.NA, without importing pandas here
        return ""
    try:
        size = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an integer beyond any float (only Python ints are): no digits, which could be thousands
        return "-1e308+ B" if value < 0 else "1e308+ B"  # type: ignore[operator]
    except (TypeError, ValueError):
        return _short(value)
    if math.isnan(size):
        return ""
    if math.isinf(size):
        return "inf" if size > 0 else "-inf"
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    step = min(int(math.log(abs(size), 1024)) if abs(size) >= 1 else 0, len(units) - 1)
    scaled = size / 1024**step
    if abs(scaled) >= 1e6:  # beyond 1 EiB (only in a hand-made CSV): an exponent, never hundreds of digits
        return f"{scaled:.3g} {units[step]}"
    if scaled == int(scaled) or abs(scaled) >= 100:  # 3 significant digits would turn 1002 into "1e+03"
        return f"{scaled:.0f} {units[step]}"
    return f"{scaled:.3g} {units[step]}"


MAX_SHOWN = 40  # characters of a non-number shown where a size belongs


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def one_line(text: object) -> str:
    """``text`` with control characters (newlines, escapes) made visible as '?', so a name taken from a config or
    a log cannot end a ``# comment`` line of printed commands or start a new one."""
    return _CONTROL.sub("?", str(text))


CONSOLE_WIDTH = 120  # characters of a console line of prose (docs/conventions.md, "Console lines")


def wrapped(text: object, indent: str = "  ", width: int = CONSOLE_WIDTH) -> str:
    """Prose for the console in lines of at most ``width`` characters, each continuation line starting with
    ``indent`` (``"#   "`` under a ``# note:``), each of the text's own lines wrapped on its own. Words are never
    split: a path longer than a line stays whole on a line of its own."""
    import textwrap

    return "\n".join(
        textwrap.fill(
            part,
            width=width,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,  # --max-spread, Qwen3-8B: a flag or a name stays one word
        )
        if part.strip()
        else part
        for part in str(text).split("\n")
    )


def note(text: object, lead: str = "note: ", indent: str = "  ") -> str:
    """A console note, ``note: <text>``, wrapped at CONSOLE_WIDTH (``wrapped``)."""
    return wrapped(f"{lead}{text}", indent=indent)


def counted(n: int, noun: str) -> str:
    """'1 row', '15 rows': a count with its noun, singular for one."""
    return f"{n} {noun}" + ("" if n == 1 else "s")
