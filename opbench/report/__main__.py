"""``python -m opbench.report RESULTS_DIR [--report-dir-path OUT_DIR]`` / ``opbench report``: report.md + PNG plots from the
opbench CSVs in a results folder (searched recursively); ``--compare OTHER_DIR`` adds this / other ratios."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from opbench.core import cli
from opbench.core.errors import run_cli


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("opbench report", __doc__)
    p.add_argument(
        "results_dir", metavar="RESULTS_DIR", type=cli.path_text, help="folder with opbench CSVs (and their .meta.json)"
    )
    p.add_argument(
        "--report-dir-path",
        "--out",
        dest="out",
        type=cli.path_text,
        default=None,
        metavar="DIR",
        help="where report.md and the PNGs go (default: RESULTS_DIR/report)",
    )
    p.add_argument(
        "--compare",
        type=cli.path_text,
        default=None,
        metavar="OTHER_RESULTS_DIR",
        help="a second results folder (e.g. before an upgrade): tables gain <metric>_other and "
        "<metric>_ratio = this / other",
    )
    cli.add_top_arg(p, 40)
    p.add_argument("--no-plots", action="store_true", help="write only report.md")
    return p


def _same_folder(a: str, b: str) -> bool:
    """Whether two paths name one folder (through links and spellings); False when either cannot be read."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .build import build_report  # pandas: only once the arguments are known good
    from .discover import IMPLAUSIBLE
    from .inert import one_line  # names and reasons from the folder: one line each, credentials masked

    out = args.out if args.out is not None else f"{args.results_dir.rstrip('/')}/report"
    if args.compare is not None and _same_folder(args.results_dir, args.compare):
        print(
            f"warning: --compare {one_line(args.compare)} is RESULTS_DIR itself: every ratio is 1 and nothing can "
            "regress (compare with another run's folder)",
            file=sys.stderr,
        )
    report = build_report(args.results_dir, out, compare=args.compare, top=args.top, plots=not args.no_plots)
    found = report.found
    rows = sum(len(s.ok) for s in report.sections)
    aside = sum(d.why == IMPLAUSIBLE for f in found.files for d in f.dropped) if found else 0
    shown = f"{rows} ok rows" + (f", {aside} set aside as implausible" if aside else "")
    print(f"read {len(found.files)} CSV(s) ({shown})" if found else "", end="")
    if found and found.skipped:
        print(f", skipped {len(found.skipped)}: " + ", ".join(one_line(rel) for rel, _ in found.skipped), end="")
    print(f"\nwrote {one_line(report.path)} with {len(report.plots)} plot(s)")
    for rel, why in found.damaged if found else []:
        print(f"warning: {one_line(rel)}: {one_line(why)}", file=sys.stderr)
    for empty in [f.rel for f in found.files if f.frame.empty and not f.dropped] if found else []:
        print(f"warning: {one_line(empty)}: no rows (a run that stopped before its first row?)", file=sys.stderr)
    for note in report.notes:
        print(f"note: {one_line(note)}", file=sys.stderr)
    if report.missing:
        print(
            f"plots not made ({len(report.missing)}): "
            + "; ".join(f"{k}: {one_line(v)}" for k, v in report.missing.items()),
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.report"))
