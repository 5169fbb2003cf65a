"""Parse nccl-tests / rccl-tests output into the opbench CSV contract (``opbench nccl-tests OUT… --csv FILE``).

Every table era of nccl-tests' ``src/common.cu`` / ``util.cu`` (read in the public repository's history) and
rccl-tests is read from its own column header, so new columns do not break it:

* v1 (NCCL 1):   ``bytes N type op | time algbw busbw res`` ×2, time in **ms** (converted to µs here);
* v2.0–v2.12:    per-collective headers ``size count type [redop] [root] | time algbw busbw error`` ×2
  (``error`` is the max deviation, not a count: the CSV's ``wrong_kind`` says ``error``);
* v2.13+:        one table ``size count type redop root | time algbw busbw #wrong`` ×2; ``cputime`` replaces
  ``time`` with ``-C``; gathers print a blank (2.13) or ``none`` redop and root ``-1``;
* 2025+:         optional per-iteration columns ``i_min i_max i_p99 i_cv%`` per block, a trailing timestamp,
  ``# Collective test starting: <binary>`` and ``unalign:`` in the parameter line;
* rccl-tests:    same table, and an in-place-only variant (one block) when out-of-place is off.

``#wrong`` may be ``N/A`` (no ``-c``): an empty cell, never a zero. Lines may carry launcher prefixes
(``[0] ``, `` 0: ``, ``[1,0]<stdout>:``), and NCCL INFO lines are interleaved — when NCCL logs while a row is
being printed, the row is split across lines (``…  -1host:12:34 [0] NCCL INFO …`` then the values later);
the parser cuts NCCL text off and stitches the row back together.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opbench.core import cli
from opbench.core.collectives import COLLECTIVES
from opbench.core.dtypes import DTYPES
from opbench.core.errors import run_cli

from .parse import MAX_TEXT_LINE, LineStats, bounded_lines, open_log
from .schema import NCCL_TESTS

CSV_NAME = "nccl_tests.csv"


# -d names across eras (NCCL 1 names, nccl-tests and rccl-tests fp8 spellings)
TYPE_NAMES = frozenset(
    {d.nccl_tests for d in DTYPES.values()}
    | {d.rccl_tests for d in DTYPES.values()}
    | {"char", "int", "half", "float", "double", "int64", "uint64", "bfloat16"}
)
_BINARY_TO_COLLECTIVE = {c.binary: name for name, c in COLLECTIVES.items()}
_BINARY = re.compile(r"\b([a-z][a-z0-9_]*?)_perf\b")
# Start of an interleaved NCCL/RCCL debug line ("[ts] host:pid:tid [dev]"): everything from there on is not table.
_NCCL_PREFIX = re.compile(r"(?:\[\d{4}-\d\d-\d\d[ T][\d:.]+\] )?[A-Za-z][\w.\-]*:\d+:\d+ \[-?\d+\]")
_NUM_HEAD = re.compile(r"^-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_HEADER_ALIASES = {
    "bytes": "size",
    "n": "count",
    "op": "redop",
    "res": "wrong",
    "error": "wrong",
    "#wrong": "wrong",
    "cputime": "time",
}
_BLOCK_FIELDS = ("time", "algbw", "busbw", "wrong", "i_min", "i_max", "i_p99", "i_cv%")


@dataclass
class Layout:
    """Column layout of one table, from its header line."""

    lead: list[str] = field(default_factory=lambda: ["size", "count", "type", "redop", "root"])
    block_fields: list[str] = field(default_factory=lambda: ["time", "algbw", "busbw", "wrong"])
    blocks: list[str] = field(default_factory=lambda: ["oop", "ip"])
    time_scale: float = 1.0  # v1 printed milliseconds
    wrong_kind: str = "#wrong"

    @property
    def n_values(self) -> int:
        return len(self.blocks) * len(self.block_fields)

    @classmethod
    def from_header(cls, names: list[str], labels: list[str]) -> Layout:
        v1 = names[0] == "bytes"
        norm = [_HEADER_ALIASES.get(n.lower(), n.lower()) for n in names]
        first = norm.index("time")
        lead, rest = norm[:first], [n for n in norm[first:] if n in _BLOCK_FIELDS]
        starts = [i for i, n in enumerate(rest) if n == "time"]
        block_fields = rest[: starts[1]] if len(starts) > 1 else rest
        blocks = labels if len(labels) == len(starts) else (["oop", "ip"] if len(starts) == 2 else ["ip"] * len(starts))
        raw_wrong = next((n.lower() for n in names if n.lower() in ("#wrong", "error", "res")), "#wrong")
        return cls(
            lead, block_fields, blocks[:2], 1000.0 if v1 else 1.0, "#wrong" if raw_wrong == "#wrong" else "error"
        )


def _num(tok: str, allow_tail: bool = False) -> float | None:
    """A table number; 'N/A' → None. ``allow_tail`` accepts '12.3[1,0]<stdout>:' glued launcher junk."""
    try:
        return float(tok)
    except ValueError:
        pass
    if allow_tail:
        m = _NUM_HEAD.match(tok)
        if m:
            return float(m.group(0))
    return None


def _is_num(tok: str) -> bool:
    return tok.upper() == "N/A" or _num(tok) is not None


def _is_int(tok: str) -> bool:
    return tok.lstrip("-").isdigit()


def _strip_glued_prefix(tok: str) -> str:
    """'[1,0]<stdout>:1048576' → '1048576' (mpirun --tag-output glues its tag to wide numbers)."""
    for sep in (":", ">", "]"):
        if sep in tok:
            tok = tok.rsplit(sep, 1)[-1]
    return tok


def collective_from_binary(binary: str) -> str:
    return _BINARY_TO_COLLECTIVE.get(binary + "_perf", binary)


@dataclass
class _Pending:
    row: dict[str, Any]
    values: list[str]


class OutputParser:
    """Line-driven state machine over one output file; ``rows()`` yields finished table rows."""

    def __init__(self, source: str) -> None:
        self.source = source
        m = _BINARY.search(Path(source).name)
        self.collective: str | None = collective_from_binary(m.group(1)) if m else None
        self.layout = Layout()
        self.labels: list[str] = []
        self.nranks = 0
        self.table: list[dict[str, Any]] = []
        self.pending: _Pending | None = None
        self.lines = 0
        self.dropped = 0  # rows whose values never completed

    def rows(self, lines: Iterable[str]) -> Iterator[dict[str, Any]]:
        for line in lines:
            self.lines += 1
            yield from self._line(line.rstrip("\r\n"))
        yield from self._end_table(None)

    # -- one line -----------------------------------------------------------------------------------
    def _line(self, line: str) -> Iterator[dict[str, Any]]:
        cut = _NCCL_PREFIX.search(line)
        interrupted = cut is not None
        data = line[: cut.start()] if cut else line
        if "#" in data:
            before, _, after = data.partition("#")
            if self._row_start(before.split()) is None:
                yield from self._comment(after)
                return
            data = before  # a row with a trailing "# note"
        tokens = data.split()
        if not tokens:
            return
        start = self._row_start(tokens)
        if start is None:
            if self.pending is not None:
                self._continue(tokens)
            else:
                m = _BINARY.search(data)  # e.g. "+ mpirun -np 8 ./build/all_reduce_perf -b 8 …"
                if m:
                    self.collective = collective_from_binary(m.group(1))
            return
        if self.pending is not None:
            self.dropped += 1
            self.pending = None
        self._start_row(tokens, start, interrupted)

    def _comment(self, text: str) -> Iterator[dict[str, Any]]:
        m = _BINARY.search(text)  # "# Collective test starting: all_reduce_perf"
        if m:
            self.collective = collective_from_binary(m.group(1))
        words = text.split()
        if not words:
            return
        low = text.lower()
        if words[0] in ("size", "bytes") and any(w.lower() in ("time", "cputime") for w in words):
            yield from self._end_table(None)
            self.layout = Layout.from_header(words, self.labels)
        elif "out-of-place" in low or ("in-place" in low and "size" not in low):
            self.labels = ["oop" if w == "out-of-place" else "ip" for w in re.findall(r"out-of-place|in-place", low)]
        elif words[0].startswith("nThread"):
            self.nranks = 0
        elif words[0] == "Rank" and len(words) > 1 and words[1].isdigit():
            self.nranks += 1
        elif low.strip().startswith("avg bus bandwidth"):
            after = text.split(":", 1)[-1].split() if ":" in text else []
            yield from self._end_table(_num(after[0]) if after else None)

    # -- rows ---------------------------------------------------------------------------------------
    @staticmethod
    def _row_start(tokens: list[str]) -> int | None:
        for s in range(min(4, max(0, len(tokens) - 2))):
            first = _strip_glued_prefix(tokens[s])
            if first.isdigit() and tokens[s + 1].isdigit() and tokens[s + 2] in TYPE_NAMES:
                tokens[s] = first
                return s
        return None

    def _start_row(self, tokens: list[str], s: int, interrupted: bool) -> None:
        lay = self.layout
        row: dict[str, Any] = dict.fromkeys(NCCL_TESTS.columns)  # a block that was not run stays empty, never 0
        row.update(
            collective=self.collective,
            size_bytes=int(tokens[s]),
            count=int(tokens[s + 1]),
            type=tokens[s + 2],
            nranks=self.nranks or None,
            wrong_kind=lay.wrong_kind,
            source=self.source,
        )
        i = s + 3
        for name in lay.lead[3:]:
            if i >= len(tokens):
                break
            tok = tokens[i]
            if name == "redop" and not _is_num(tok):
                row["redop"] = None if tok == "none" else tok
                i += 1
            elif name == "root" and _is_int(tok):
                row["root"] = int(tok)
                i += 1
            elif name == "root" and i == len(tokens) - 1 and interrupted and _num(tok, allow_tail=True) is not None:
                row["root"] = int(_num(tok, allow_tail=True))  # type: ignore[arg-type]
                i += 1
        self.pending = _Pending(row, [])
        self._take_values(tokens[i:], interrupted)

    def _continue(self, tokens: list[str]) -> None:
        """Values of a row that NCCL lines interrupted, on a later line (after any launcher prefix)."""
        k = 0
        while k < min(2, len(tokens)) and not _is_num(tokens[k]) and any(c in tokens[k] for c in "[]<>:()"):
            k += 1  # launcher prefix tokens
        if k < len(tokens) and _is_num(tokens[k]):
            self._take_values(tokens[k:], interrupted=True)

    def _take_values(self, tokens: list[str], interrupted: bool) -> None:
        pend = self.pending
        assert pend is not None
        need = self.layout.n_values - len(pend.values)
        for j, tok in enumerate(tokens):
            if need <= 0:
                break
            if _is_num(tok):
                pend.values.append(tok)
                need -= 1
            elif j == len(tokens) - 1 and _num(tok, allow_tail=True) is not None:
                pend.values.append(_NUM_HEAD.match(tok).group(0))  # type: ignore[union-attr]
                need -= 1
            else:
                break
        if need <= 0:
            self._finish_row(self.layout.blocks)
        elif not interrupted:
            per = len(self.layout.block_fields)
            if len(pend.values) == per and len(self.layout.blocks) == 2:
                self._finish_row(["ip"])  # out-of-place not run (trace replay): in-place only
            else:
                self.dropped += 1
                self.pending = None

    def _finish_row(self, blocks: list[str]) -> None:
        pend = self.pending
        assert pend is not None
        lay = self.layout
        row = pend.row
        per = len(lay.block_fields)
        for b, label in enumerate(blocks):
            vals = dict(zip(lay.block_fields, pend.values[b * per : (b + 1) * per]))
            t = _num(vals.get("time", "N/A"))
            row[f"{label}_time_us"] = t * lay.time_scale if t is not None else None
            row[f"{label}_algbw_gbs"] = _num(vals.get("algbw", "N/A"))
            row[f"{label}_busbw_gbs"] = _num(vals.get("busbw", "N/A"))
            wrong = _num(vals.get("wrong", "N/A"))
            row[f"{label}_wrong"] = (
                int(wrong)
                if wrong is not None and lay.wrong_kind == "#wrong" and math.isfinite(wrong) and wrong.is_integer()
                else wrong
            )
        self.table.append(row)
        self.pending = None

    def _end_table(self, avg_busbw: float | None) -> Iterator[dict[str, Any]]:
        if self.pending is not None:
            self.dropped += 1
            self.pending = None
        for row in self.table:
            row["avg_busbw"] = avg_busbw
            yield row
        self.table = []


def parse_lines(lines: Iterable[str], source: str = "<text>") -> list[dict[str, Any]]:
    """All rows of one output (tests and the report module use this)."""
    return list(OutputParser(source).rows(lines))


def iter_file_rows(path: str, stats: LineStats | None = None) -> Iterator[dict[str, Any]]:
    """Rows of one file ('-' = stdin, .gz by magic bytes), decoded leniently, read by ``bounded_lines`` (linear
    time, bounded memory; over-long lines and a damaged .gz are counted in ``stats``, earlier rows kept)."""
    stats = stats if stats is not None else LineStats()
    with open_log(path) as fh:
        text = (raw.decode("utf-8", "replace") for raw in bounded_lines(fh, stats))
        yield from OutputParser(path).rows(text)


# -- command line ---------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("opbench nccl-tests", "Parse nccl-tests / rccl-tests output (all table eras) into one CSV.")
    p.add_argument("outputs", nargs="+", metavar="OUT", help="output files (plain or .gz); '-' reads stdin")
    cli.add_output_args(
        p,
        dir_help=f"write DIR/{CSV_NAME}",
        csv_help="write all rows here (default: no CSV); columns: " + ", ".join(NCCL_TESTS.columns),
        csv_aliases=("--csv",),
    )
    cli.add_top_arg(p, 40, "--max-rows")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from opbench.core.results import CsvReport, environment, summary_table

    from .analyze import check_paths

    args = build_parser().parse_args(argv)
    args.csv = cli.output_csv(args, CSV_NAME)
    paths = check_paths(args.outputs)
    meta = environment(None, {"outputs": paths})
    report = CsvReport(args.csv, NCCL_TESTS, meta=meta) if args.csv else None
    rows: list[dict[str, Any]] = []
    damaged = False
    try:
        for path in paths:
            stats = LineStats()
            for row in iter_file_rows(path, stats):
                rows.append(row)
                if report is not None:
                    report.append(row)
            if stats.long_lines:
                print(
                    f"warning: {path}: skipped {stats.long_lines} line(s) longer than {MAX_TEXT_LINE >> 10} KiB "
                    "(not nccl-tests output)",
                    file=sys.stderr,
                )
            for err in stats.read_errors:
                damaged = True
                print(
                    f"warning: {path}: stopped reading after {stats.lines} line(s): {err}; the rows before the "
                    "damage are kept",
                    file=sys.stderr,
                )
    finally:
        if report is not None:
            report.close()
    if not rows:
        print(f"opbench nccl-tests: {', '.join(paths)}: no nccl-tests/rccl-tests result rows found", file=sys.stderr)
        return 1
    shown = [
        "collective",
        "size_bytes",
        "type",
        "redop",
        "oop_time_us",
        "oop_busbw_gbs",
        "ip_time_us",
        "ip_busbw_gbs",
        "oop_wrong",
        "avg_busbw",
    ]
    print(summary_table(rows, shown, max_rows=args.top))
    if args.csv:
        print(f"wrote {args.csv} ({len(rows)} rows)")
    return 1 if damaged else 0  # rows kept, but the file was not read to its end


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.trace.nccl_tests"))
