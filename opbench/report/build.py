"""``build_report(results_dir, out_dir, compare=None, top=40)``: the whole report job (the CLI is ``__main__``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from opbench.core.errors import UsageError, describe_os_error
from opbench.core.outputs import write_file

from .discover import Discovery, discover, require_results
from .markdown import report_markdown
from .plots import Plot, plan_plots, render
from .regress import Regressions, find_regressions
from .tables import Section, build_sections


@dataclass
class Report:
    path: Path  # report.md
    sections: list[Section]
    plots: list[Plot]  # made
    missing: dict[str, str] = field(default_factory=dict)  # plot file → why not made
    found: Discovery | None = None
    regressions: Regressions | None = None  # --compare only
    notes: list[str] = field(default_factory=list)  # for the console: what drawing the plots warned of


def build_report(
    results_dir: str | Path,
    out_dir: str | Path,
    compare: str | Path | None = None,
    top: int | None = 40,
    plots: bool = True,
) -> Report:
    """Read every opbench CSV under results_dir (and compare's, if given) and write out_dir/report.md + PNGs."""
    found = require_results(discover(results_dir))
    other = require_results(discover(compare)) if compare is not None else None
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create output folder: {describe_os_error(exc)}", source=str(out_dir)) from None
    sections = build_sections(found, top=top, other=other)
    regressions = find_regressions(sections) if other is not None else None
    planned = plan_plots(sections)
    notes: list[str] = []
    made, missing = render(planned, out, notes) if plots else ([], {p.filename: "--no-plots" for p in planned})
    path = out / "report.md"
    write_file(path, report_markdown(found, sections, planned, missing, other, regressions, top).encode("utf-8"))
    return Report(path, sections, made, missing, found, regressions, notes)
