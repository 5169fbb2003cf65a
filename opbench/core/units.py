"""One convention for sizes shown to people: powers of 1024 with IEC names (KiB, MiB, GiB), as nccl-tests
users read message sizes. CSVs keep raw bytes in columns whose names end in ``bytes``; only console tables
and the report turn them into text with this function."""

from __future__ import annotations

import math
import re


def human_bytes(value: object) -> str:
    """64 KiB, 1.5 GiB, 28 GiB; empty for a missing value (never a fake zero)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    size, units = float(value), ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]  # type: ignore[arg-type]
    step = min(int(math.log(abs(size), 1024)) if abs(size) >= 1 else 0, len(units) - 1)
    scaled = size / 1024**step
    if scaled == int(scaled) or abs(scaled) >= 100:  # 3 significant digits would turn 1002 into "1e+03"
        return f"{scaled:.0f} {units[step]}"
    return f"{scaled:.3g} {units[step]}"


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def one_line(text: object) -> str:
    """``text`` with control characters (newlines, escapes) made visible as '?', so a name taken from a config or
    a log cannot end a ``# comment`` line of printed commands or start a new one."""
    return _CONTROL.sub("?", str(text))
