"""Per-class calibration of the projection from a profiled step (docs/step.md, "Calibration"; docs/project.md,
"Calibration"): ``opbench step --calibrate FILE`` writes ``{"factors": {"gemm": …, "attention": …, "memory": …}}``
(measured / projected time of each kernel class on the target), and ``opbench project --calibration FILE`` reads
them back into ``Assumptions``, where ``Rates`` multiplies each class's times by its own factor: every GEMM
(dense, grouped, measured MoE expert and router rows), every attention pass, every memory-bound operator. The
classes are the trace's: an unfused attention's batched GEMMs are GEMM kernels and its softmax memory-bound ones
in a trace, so they take those classes' factors. Torch-free."""

from __future__ import annotations

import json
import math

from opbench.core.errors import UsageError
from opbench.core.units import one_line

CLASSES = ("gemm", "attention", "memory")  # what a factor scales: Rates.scale(klass)
BOUNDS = (1e-6, 1e6)


def read_factors(path: str) -> dict[str, float]:
    """The factors of a calibration file, each class at most once and within BOUNDS; anything else is one line
    naming the file and the field."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read calibration: {one_line(exc)}", source=path, field="factors") from None
    factors = doc.get("factors") if isinstance(doc, dict) else None
    if not isinstance(factors, dict) or not factors:
        raise UsageError("no per-class factors (write it with opbench step --calibrate)", source=path, field="factors")
    out: dict[str, float] = {}
    for klass, factor in factors.items():
        ok = isinstance(factor, (int, float)) and not isinstance(factor, bool) and math.isfinite(factor)
        if klass not in CLASSES or not ok or not BOUNDS[0] <= factor <= BOUNDS[1]:
            raise UsageError(
                f"{one_line(str(klass))}: {one_line(repr(factor))} is no factor of {list(CLASSES)} in [1e-6, 1e6]",
                source=path,
                field="factors",
            )
        out[klass] = float(factor)
    return out
