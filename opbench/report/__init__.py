"""``opbench report``: turn a results folder of opbench CSVs into report.md with tables and PNG plots.

``build_report`` (in ``build``, loaded on first use so ``opbench report --help`` does not import pandas) is the
whole job; ``__main__`` is its CLI.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_report"]


def __getattr__(name: str) -> Any:
    if name in ("build_report", "Report"):
        from . import build

        return getattr(build, name)
    raise AttributeError(name)
