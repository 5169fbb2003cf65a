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

nccl-tests' ``-J FILE.json`` output (JSON_FILE_VERSION 3, written by ``src/util.cu``) is read too, recognised by
its first byte ``{``: the ``results`` list is read one result object at a time (``JsonResults``), so a file
with long ``-I`` iteration lists stays in bounded memory. ``-I 1`` per-iteration summaries (the text table's
``i_min i_max i_p99 i_cv%`` columns, the JSON's ``*_per_iter`` objects) go to the ``*_iter_*`` columns.

Streaming and bounds (docs/trace.md, "nccl-tests output"): a table's rows are held only until its ``Avg bus
bandwidth`` line, and never more than ``MAX_HELD_ROWS`` of them (beyond that they are written without
``avg_busbw``); the CLI writes rows in batches as they come and keeps only the rows it prints, and on Ctrl-C or
SIGTERM writes the rows still held (``take_held``, ``avg_busbw`` empty) before it stops. A size, count or root
out of the command line's bounds (``opbench.core.cli``) skips its row, counted in the summary; ``inf``, ``nan``
and overflowed values become empty cells named in ``note``, and so do measurements out of their bounds
(``MAX_TIME_US``, ``MAX_GBS``, ``MAX_CV_PCT``; a negative one, a ``#wrong`` that is no whole count).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import zlib
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from opbench.core import cli
from opbench.core.collectives import COLLECTIVES
from opbench.core.dtypes import DTYPES
from opbench.core.errors import UsageError, run_cli
from opbench.core.results import CsvReport, format_value
from opbench.core.units import counted, one_line

from .parse import MAX_TEXT_LINE, LineStats, bounded_lines, open_log
from .schema import NCCL_TESTS

CSV_NAME = "nccl_tests.csv"

# The command line's bounds (opbench.core.cli), applied to numbers read from an output file.
MAX_BYTES = int(cli.MAX_MIB) << 20  # 1 PiB, as --size-mib and friends
MAX_RANKS = cli.MAX_WORLD
MAX_DIGITS = 20  # a longer digit run is out of range whatever it says (and int() of 5000 digits would raise)
MAX_HELD_ROWS = 1024  # rows of one table held for its "Avg bus bandwidth" line; beyond, written without it
MAX_JSON_RESULT = 64 << 20  # one JSON result object (its -I iteration lists included) larger than this is skipped
# Bounds of the measured values (a value outside becomes an empty cell named in ``note``, as inf does):
MAX_TIME_US = 86_400e6  # one day: no collective (or one iteration of it) takes longer; beyond is garbage
MAX_GBS = 1e6  # GB/s (algbw, busbw, Avg bus bandwidth): no link is faster
MAX_CV_PCT = 1e6  # the -I cv% of n non-negative times is at most √n × 100 %: 1e6 % would need 10^8 iterations
TIME_BOUNDS = (0.0, MAX_TIME_US)
BW_BOUNDS = (0.0, MAX_GBS)
WRONG_BOUNDS = (0.0, float(MAX_BYTES))  # #wrong counts elements: a whole number within the count's bounds
ERROR_BOUNDS = (0.0, math.inf)  # v1/v2.0–2.12 "error" is a max |deviation|: any finite value >= 0
NOT_FINITE, OUT_OF_RANGE = "not finite", "out of range"  # the two kinds of cell a note names


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
# -I per-iteration summary: text column → CSV column suffix (the JSON's *_per_iter keys in _JSON_ITER)
_ITER_COLUMNS = {"i_min": "iter_min_us", "i_max": "iter_max_us", "i_p99": "iter_p99_us", "i_cv%": "iter_cv_pct"}


class OutOfRange(ValueError):
    """A number of an output file outside the command line's bounds: its row is skipped and counted."""

    def __init__(self, name: str, text: str) -> None:
        super().__init__(f"{name} {one_line(text)[:40]} is out of range")
        self.field = name


def bounded_int(text: str, name: str, low: int, high: int) -> int:
    """An ASCII integer within [low, high] (the CLI's bounds); else OutOfRange naming ``name``."""
    digits = text[1:] if text[:1] == "-" else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > MAX_DIGITS:
        raise OutOfRange(name, text)
    value = int(text)
    if not low <= value <= high:
        raise OutOfRange(name, text)
    return value


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
    """A table number; 'N/A' → None. ``allow_tail`` accepts '12.3[1,0]<stdout>:' glued launcher junk. ASCII
    only: float() would read other scripts' digits ('١٢' as 12)."""
    try:
        return float(tok) if tok.isascii() else None
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
    digits = tok[1:] if tok[:1] == "-" else tok
    return digits.isascii() and digits.isdigit()


def _is_uint(tok: str) -> bool:
    return tok.isascii() and tok.isdigit()


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
    values: list[float | None]  # parsed once: a float, or None for N/A


Notes = list[tuple[str, str]]  # (NOT_FINITE or OUT_OF_RANGE, "column=value") for each cell left empty


def finite_value(
    row: dict[str, Any],
    column: str,
    value: Any,
    notes: Notes,
    bounds: tuple[float, float] = (-math.inf, math.inf),
    whole: bool = False,
) -> None:
    """``row[column] = value`` when it is a finite number within ``bounds`` (and a whole one with ``whole``,
    stored as an int), or None; ``inf``, ``nan``, overflowed values (``1e999``) and values out of bounds (a
    negative time, a busbw of 1e30 GB/s) become an empty cell and a note, never a number a plot would draw."""
    if isinstance(value, str):
        raw, value = value, _num(value) if value.upper() != "N/A" else None
        if value is None and raw.upper() != "N/A":
            notes.append((NOT_FINITE, f"{column}={one_line(raw)[:20]}"))
    if isinstance(value, int) and not isinstance(value, bool):
        value = float(value) if abs(value) < 1e308 else math.inf
    if isinstance(value, float):
        if not math.isfinite(value):
            notes.append((NOT_FINITE, f"{column}={value}"))
            value = None
        elif not bounds[0] <= value <= bounds[1] or (whole and not value.is_integer()):
            notes.append((OUT_OF_RANGE, f"{column}={_shown(value)}"))
            value = None
        elif whole:
            value = int(value)
    row[column] = value


def _shown(value: float) -> str:
    """A number as a note names it: -7 (not -7.0), -25.81, -1e+30."""
    return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)


class Skipped:
    """Rows left out because a number was out of range: how many, and the first one's line and field."""

    def __init__(self) -> None:
        self.rows = 0
        self.first: str | None = None

    def add(self, where: str, exc: OutOfRange) -> None:
        self.rows += 1
        if self.first is None:
            self.first = f"{where}: {exc}"


def _new_row(collective: str | None, source: str) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(NCCL_TESTS.columns)  # a block that was not run stays empty, never 0
    row.update(collective=collective, source=source)
    return row


class OutputParser:
    """Line-driven state machine over one output file; ``rows()`` yields finished table rows."""

    def __init__(self, source: str) -> None:
        self.source = source
        m = _BINARY.search(Path(source).name)
        self.collective: str | None = collective_from_binary(m.group(1)) if m else None
        self.layout = Layout()
        self.labels: list[str] = []
        self.nranks = 0
        self.table: deque[dict[str, Any]] = deque()  # finished rows held for the Avg line (popped as yielded)
        self.pending: _Pending | None = None
        self.lines = 0
        self.dropped = 0  # rows whose values never completed
        self.skipped = Skipped()

    def rows(self, lines: Iterable[str]) -> Iterator[dict[str, Any]]:
        for line in lines:
            self.lines += 1
            yield from self._line(line.rstrip("\r\n"))
            if len(self.table) >= MAX_HELD_ROWS:  # a table without end (-N 0, a cut log): stream it
                yield from _release(self.table)
        yield from self._end_table(None)

    def take_held(self) -> list[dict[str, Any]]:
        """The finished rows held for their table's Avg line, handed over once: what the CLI writes when Ctrl-C or
        SIGTERM stops the input mid-table (``avg_busbw`` empty, unless the Avg line came and the interrupt fell
        while the table was being handed out). A row whose values are still coming is dropped."""
        self.pending = None
        held = list(self.table)
        self.table.clear()
        return held

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
        elif words[0] == "Rank" and len(words) > 1 and _is_uint(words[1]):
            self.nranks = min(self.nranks + 1, MAX_RANKS)
        elif low.strip().startswith("avg bus bandwidth"):
            after = text.split(":", 1)[-1].split() if ":" in text else []
            yield from self._end_table(_num(after[0]) if after else None)

    # -- rows ---------------------------------------------------------------------------------------
    @staticmethod
    def _row_start(tokens: list[str]) -> int | None:
        for s in range(min(4, max(0, len(tokens) - 2))):
            first = _strip_glued_prefix(tokens[s])
            if _is_uint(first) and _is_uint(tokens[s + 1]) and tokens[s + 2] in TYPE_NAMES:
                tokens[s] = first
                return s
        return None

    def _start_row(self, tokens: list[str], s: int, interrupted: bool) -> None:
        lay = self.layout
        row = _new_row(self.collective, self.source)
        try:
            row.update(
                size_bytes=bounded_int(tokens[s], "size", 0, MAX_BYTES),
                count=bounded_int(tokens[s + 1], "count", 0, MAX_BYTES),
                type=tokens[s + 2],
                nranks=self.nranks or None,
                wrong_kind=lay.wrong_kind,
            )
            i = s + 3
            for name in lay.lead[3:]:
                if i >= len(tokens):
                    break
                tok = tokens[i]
                if name == "redop" and not _is_num(tok):
                    row["redop"] = None if tok == "none" else one_line(tok)
                    i += 1
                elif name == "root" and _is_int(tok):
                    row["root"] = bounded_int(tok, "root", -1, MAX_RANKS)
                    i += 1
                elif name == "root" and i == len(tokens) - 1 and interrupted and _NUM_HEAD.match(tok):
                    row["root"] = bounded_int(_NUM_HEAD.match(tok).group(0), "root", -1, MAX_RANKS)  # type: ignore[union-attr]
                    i += 1
        except OutOfRange as exc:
            self.skipped.add(f"{self.source}:{self.lines}", exc)
            return
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
            try:
                if not tok.isascii():
                    raise ValueError(tok)  # float() would read other scripts' digits
                pend.values.append(float(tok))
            except ValueError:
                if tok.upper() == "N/A":
                    pend.values.append(None)
                elif j == len(tokens) - 1 and _num(tok, allow_tail=True) is not None:
                    pend.values.append(_num(tok, allow_tail=True))
                else:
                    break
            need -= 1
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
            t = vals.get("time")
            block = {
                "time": t * lay.time_scale if t is not None else None,
                "alg_bw": vals.get("algbw"),
                "bus_bw": vals.get("busbw"),
                "nwrong": vals.get("wrong"),
                **{_ITER_COLUMNS[k]: v for k, v in vals.items() if k in _ITER_COLUMNS},
            }
            fill_block(row, label, block, lay.wrong_kind == "#wrong")
        self.table.append(row)
        self.pending = None

    def _end_table(self, avg_busbw: float | None) -> Iterator[dict[str, Any]]:
        if self.pending is not None:
            self.dropped += 1
            self.pending = None
        yield from _release(self.table, avg_busbw)


def _release(table: deque[dict[str, Any]], avg_busbw: Any = None) -> Iterator[dict[str, Any]]:
    """The held rows of one table with its Avg bus bandwidth (None: without one), each popped as it is yielded:
    an interrupt between two rows leaves exactly the rows not yet handed out for ``take_held``."""
    notes: Notes = []
    avg: dict[str, Any] = {}
    finite_value(avg, "avg_busbw", avg_busbw, notes, BW_BOUNDS)
    if avg_busbw is not None:
        for row in table:  # all before the first yield: a row left held keeps the average
            row["avg_busbw"] = avg["avg_busbw"]
            add_notes(row, notes)
    while table:
        yield table.popleft()


def add_notes(row: dict[str, Any], notes: Notes) -> None:
    """Append to ``row['note']`` the cells left empty, by kind: ``not finite, left empty: oop_time_us=inf;
    out of range, left empty: oop_busbw_gbs=-1e+30``."""
    for kind in (NOT_FINITE, OUT_OF_RANGE):
        cells = [cell for k, cell in notes if k == kind]
        if cells:
            text = f"{kind}, left empty: " + ", ".join(cells)
            row["note"] = f"{row['note']}; {text}" if row.get("note") else text


# One result block (out-of-place or in-place) as nccl-tests' JSON writes it (src/util.cu
# writeBenchmarkLineBody / writePerIterReport); the text parser builds the same dict from its columns.
_JSON_ITER = {"min_us": "iter_min_us", "max_us": "iter_max_us", "p99_us": "iter_p99_us", "cv_pct": "iter_cv_pct"}


def fill_block(row: dict[str, Any], label: str, block: dict[str, Any], whole_wrong: bool) -> None:
    """The ``label`` (oop/ip) columns of ``row`` from one block: time (µs), alg_bw, bus_bw, nwrong and the -I
    summary (iter_*); values may be numbers, table text or None; non-finite ones and ones out of bounds (times
    and bandwidths below 0 or beyond MAX_TIME_US / MAX_GBS, a #wrong that is no whole count) become empty cells
    named in ``note``."""
    notes: Notes = []
    finite_value(row, f"{label}_time_us", block.get("time", block.get("cpu_time")), notes, TIME_BOUNDS)
    finite_value(row, f"{label}_algbw_gbs", block.get("alg_bw"), notes, BW_BOUNDS)
    finite_value(row, f"{label}_busbw_gbs", block.get("bus_bw"), notes, BW_BOUNDS)
    if whole_wrong:
        finite_value(row, f"{label}_wrong", block.get("nwrong"), notes, WRONG_BOUNDS, whole=True)
    else:
        finite_value(row, f"{label}_wrong", block.get("nwrong"), notes, ERROR_BOUNDS)
    for suffix in _ITER_COLUMNS.values():
        if suffix in block:
            bounds = (0.0, MAX_CV_PCT) if suffix == "iter_cv_pct" else TIME_BOUNDS
            finite_value(row, f"{label}_{suffix}", block[suffix], notes, bounds)
    add_notes(row, notes)


def parse_lines(lines: Iterable[str], source: str = "<text>") -> list[dict[str, Any]]:
    """All rows of one output (tests and the report module use this)."""
    return list(OutputParser(source).rows(lines))


# -- nccl-tests -J JSON ---------------------------------------------------------------------------------------
# A token of the JSON text: a string (a key when a colon follows), a string cut by the end of the buffer, or a
# bracket. Numbers and literals between them need no look: only the nesting and the keys matter here.
_JSON_TOKEN = re.compile(rb'"((?:[^"\\]|\\.)*+)"(\s*+:)?|"(?:[^"\\]|\\.)*+\\?\Z|[{}\[\]]')
# nccl-tests writes doubles with printf("%lf"): inf and -inf come out bare, which is no JSON; quote them (and a
# bare nan) so they reach finite_value as text.
_BARE_CONSTANT = re.compile(rb"(?<=[:,\[])\s*+(-?(?:inf(?:inity)?|nan))(?=\s*+[,\]}])", re.IGNORECASE)
_JSON_TOP = (b"args", b"config", b"average_bus_bandwidth")  # top-level values read besides the results
JSON_CHUNK = 1 << 20


def json_values(fh: BinaryIO, stats: LineStats) -> Iterator[tuple[bytes, bytes]]:
    """(key, raw JSON text) of the top-level ``args``, ``config`` and ``average_bus_bandwidth`` values and of
    each item of ``results`` (key ``results``), in file order, from a stream of any size: memory is one value
    (at most MAX_JSON_RESULT; a larger one is skipped and counted in ``stats.long_lines``) plus one chunk."""
    read = getattr(fh, "read1", fh.read)
    buf, pos, depth, key, eof = b"", 0, 0, b"", False
    capture: tuple[int, int, bytes] | None = None  # (depth, start offset, key) of the value being collected
    in_results = False
    while not eof:
        try:
            chunk = read(JSON_CHUNK)
        except (EOFError, OSError, ValueError, zlib.error) as exc:
            stats.read_errors.append(f"{type(exc).__name__}: {exc}")
            chunk = b""
        eof = not chunk
        buf += chunk
        stats.lines += chunk.count(b"\n")
        for m in _JSON_TOKEN.finditer(buf, pos):
            tok = m.group(0)
            if tok[:1] == b'"':
                if m.end() == len(buf) and not eof:
                    break  # a string (or a key's colon) may go on in the next chunk
                if m.group(2) and depth == 1:
                    key = m.group(1)
            elif tok in b"{[":
                depth += 1
                if capture is None and (
                    (depth == 2 and key in _JSON_TOP) or (depth == 3 and in_results and tok == b"{")
                ):
                    capture = (depth, m.start(), b"results" if in_results else key)
                in_results = in_results or (depth == 2 and tok == b"[" and key == b"results")
            else:
                if capture is not None and depth == capture[0]:
                    yield capture[2], buf[capture[1] : m.end()]
                    capture = None
                depth -= 1
                in_results = in_results and depth >= 2
            pos = m.end()
        else:
            pos = len(buf)
        keep = capture[1] if capture is not None else pos
        if capture is not None and pos - keep > MAX_JSON_RESULT:  # too big to be a result: skip it
            stats.long_lines += 1
            capture, keep = None, pos
        buf, pos = buf[keep:], pos - keep
        if capture is not None:
            capture = (capture[0], 0, capture[2])


class JsonResults:
    """Rows of one nccl-tests ``-J`` file (src/util.cu: version, args, env, config{…, devices}, results[{size,
    count, type, redop, root, out_of_place{time|cpu_time, alg_bw, bus_bw, nwrong}, out_of_place_per_iter{…},
    in_place…, actual_iterations, experiment_name}], out_of_bounds, average_bus_bandwidth{bandwidth}, …)."""

    def __init__(self, source: str) -> None:
        self.source = source
        m = _BINARY.search(Path(source).name)
        self.collective: str | None = collective_from_binary(m.group(1)) if m else None
        self.nranks: int | None = None
        self.table: deque[dict[str, Any]] = deque()  # finished rows held for average_bus_bandwidth
        self.skipped = Skipped()
        self.malformed = 0  # values that were no JSON
        self.results = 0

    def rows(self, fh: BinaryIO, stats: LineStats) -> Iterator[dict[str, Any]]:
        for key, raw in json_values(fh, stats):
            try:
                value = json.loads(_BARE_CONSTANT.sub(rb'"\1"', raw))
            except (ValueError, RecursionError):
                self.malformed += 1
                continue
            if key == b"results":
                self._result(value)
            elif key == b"args" and isinstance(value, list) and value and isinstance(value[0], str):
                m = _BINARY.search(value[0])
                self.collective = collective_from_binary(m.group(1)) if m else self.collective
            elif key == b"config" and isinstance(value, dict):
                self.nranks = self._nranks(value)
            elif key == b"average_bus_bandwidth" and isinstance(value, dict):
                yield from _release(self.table, _json_number(value.get("bandwidth")))
            if len(self.table) >= MAX_HELD_ROWS:
                yield from _release(self.table)
        yield from _release(self.table)

    def take_held(self) -> list[dict[str, Any]]:
        """As ``OutputParser.take_held``: the rows held for ``average_bus_bandwidth``, handed over once."""
        held = list(self.table)
        self.table.clear()
        return held

    @staticmethod
    def _nranks(config: dict[str, Any]) -> int | None:
        """One ``devices`` entry per process, each process running nthreads × ngpus ranks."""
        try:
            per_proc = bounded_int(str(config.get("nthreads", 1)), "nthreads", 1, MAX_RANKS) * bounded_int(
                str(config.get("ngpus", 1)), "ngpus", 1, MAX_RANKS
            )
        except OutOfRange:
            return None
        devices = config.get("devices")
        n = per_proc * len(devices) if isinstance(devices, list) and devices else None
        return n if n is not None and n <= MAX_RANKS else None

    def _result(self, r: Any) -> None:
        self.results += 1
        if not isinstance(r, dict):
            self.malformed += 1
            return
        row = _new_row(self.collective, self.source)
        try:
            row.update(
                size_bytes=bounded_int(str(r.get("size")), "size", 0, MAX_BYTES),
                count=bounded_int(str(r.get("count")), "count", 0, MAX_BYTES),
                type=one_line(r.get("type") or "") or None,
                root=bounded_int(str(r.get("root", "")).strip(), "root", -1, MAX_RANKS) if "root" in r else None,
                nranks=self.nranks,
                wrong_kind="#wrong",
            )
        except OutOfRange as exc:
            self.skipped.add(f"{self.source}: result {self.results}", exc)
            return
        redop = r.get("redop")
        row["redop"] = None if not isinstance(redop, str) or redop.strip() in ("", "none") else one_line(redop.strip())
        for label, name in (("oop", "out_of_place"), ("ip", "in_place")):
            block = r.get(name)
            if not isinstance(block, dict):
                continue  # null: not run (trace replay runs in-place only)
            per_iter = r.get(f"{name}_per_iter")
            if isinstance(per_iter, dict):
                block = {**block, **{col: per_iter[k] for k, col in _JSON_ITER.items() if k in per_iter}}
            fill_block(row, label, {k: _json_number(v) for k, v in block.items()}, True)
        self.table.append(row)


def _json_number(value: Any) -> Any:
    """A JSON value as fill_block takes it: numbers as floats, "nan"/"inf" text as text, anything else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) if abs(value) < 1e308 or isinstance(value, float) else float("inf")
    return one_line(value)[:40] if isinstance(value, str) else None


def is_json(fh: BinaryIO) -> bool:
    """nccl-tests' JSON starts with '{'; its text output never does."""
    peek = getattr(fh, "peek", None)
    return bool(peek and peek(64).lstrip()[:1] == b"{")


@dataclass
class FileResult:
    """What reading one file gave besides its rows."""

    stats: LineStats = field(default_factory=LineStats)
    skipped: Skipped = field(default_factory=Skipped)
    malformed: int = 0
    json: bool = False
    reader: OutputParser | JsonResults | None = None  # its rows held for an Avg line: take_held() on Ctrl-C


def iter_file_rows(path: str, result: FileResult | None = None) -> Iterator[dict[str, Any]]:
    """Rows of one file ('-' = stdin, .gz by magic bytes; nccl-tests text or -J JSON), streamed: text is read by
    ``bounded_lines`` (linear time, bounded memory; over-long lines and a damaged .gz are counted in
    ``result.stats``, earlier rows kept), JSON by ``json_values``."""
    result = result if result is not None else FileResult()
    with open_log(path) as fh:
        if is_json(fh):
            result.json = True
            reader = JsonResults(path)
            result.skipped, result.reader = reader.skipped, reader
            yield from reader.rows(fh, result.stats)
            result.malformed = reader.malformed
            return
        parser = OutputParser(path)
        result.skipped, result.reader = parser.skipped, parser
        text = (raw.decode("utf-8", "replace") for raw in bounded_lines(fh, result.stats))
        yield from parser.rows(text)


class BatchedReport(CsvReport):
    """A CsvReport that keeps no rows in memory and writes them in batches (one flush and fsync per batch, at
    most ``BATCH_ROWS`` rows or ``BATCH_SECONDS`` apart): a 1 GiB output holds millions of rows."""

    BATCH_ROWS = 2000
    BATCH_SECONDS = 1.0

    def __init__(self, path: str, meta: dict[str, Any], earlier: str | None = None) -> None:
        super().__init__(path, NCCL_TESTS, meta=meta, earlier=earlier)
        self._batch: list[list[Any]] = []
        self._texts: dict[str, Any] = {}
        self._last = time.monotonic()
        self.written = 0

    def append(self, row: Mapping[str, Any]) -> None:
        self._batch.append([self._format(row.get(c)) for c in self.columns])
        if len(self._batch) >= self.BATCH_ROWS or time.monotonic() - self._last >= self.BATCH_SECONDS:
            self.flush()

    def _format(self, value: Any) -> Any:
        """format_value, remembered for the few texts that repeat in every row (collective, type, source):
        redacting a text costs far more than parsing its row."""
        if not isinstance(value, str):
            return format_value(value)
        done = self._texts.get(value)
        if done is None:
            if len(self._texts) >= 4096:
                self._texts.clear()
            done = self._texts[value] = format_value(value)
        return done

    def flush(self) -> None:
        if self._batch:
            self._guarded(self._writer.writer.writerows, self._batch)  # rows as lists, in schema order
            self.written += len(self._batch)
            self._batch = []
        self._last = time.monotonic()

    def close(self) -> None:
        if not self._fh.closed:
            self.flush()
        super().close()


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
    cli.add_earlier_args(p)
    return p


MAX_SHOWN = 10_000  # rows kept for the console table when --max-rows 0 asks for all (the CSV has every row)


def main(argv: Sequence[str] | None = None) -> int:
    from opbench.core.results import environment, summary_table

    from .analyze import check_paths

    args = build_parser().parse_args(argv)
    args.csv = cli.output_csv(args, CSV_NAME)
    paths = check_paths(args.outputs)
    meta = environment(None, {"outputs": paths})
    report = BatchedReport(args.csv, meta, cli.earlier_policy(args)) if args.csv else None
    keep = MAX_SHOWN if args.top is None else min(args.top, MAX_SHOWN)
    shown: list[dict[str, Any]] = []
    total = 0
    damaged = False
    try:
        for path in paths:
            result = FileResult()
            rows_before = total
            try:
                for row in iter_file_rows(path, result):
                    total += 1
                    if len(shown) < keep:
                        shown.append(row)
                    if report is not None:
                        report.append(row)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM (core.errors.Terminated) on a live stream
                if report is not None and result.reader is not None:
                    for row in result.reader.take_held():  # finished, only waiting for the Avg line
                        report.append(row)
                raise
            damaged |= _file_warnings(path, result, total - rows_before)
    finally:
        if report is not None:
            report.close()
    if not total:
        print(f"opbench nccl-tests: {', '.join(paths)}: no nccl-tests/rccl-tests result rows found", file=sys.stderr)
        return 1
    columns = [
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
    if any(r.get("oop_iter_p99_us") is not None or r.get("ip_iter_p99_us") is not None for r in shown):
        columns[8:8] = ["oop_iter_p99_us", "ip_iter_p99_us"]
    print(summary_table(shown, columns, max_rows=args.top))
    if total > len(shown):
        print(f"… {total - len(shown)} more rows in the CSV")
    if report is not None:
        print(f"wrote {one_line(args.csv)} ({counted(report.written, 'row')})")
    return 1 if damaged else 0  # rows kept, but the file was not read to its end


def _file_warnings(path: str, result: FileResult, rows: int) -> bool:
    """Print what reading ``path`` skipped or could not read; True when it was not read to its end. A file whose
    every row was out of range is a usage error naming its first bad line and field (exit 2)."""
    stats, skipped = result.stats, result.skipped
    name = one_line(path)
    if skipped.rows and not rows:
        raise UsageError(f"every result row is out of range; the first: {skipped.first}", source=name)
    if skipped.rows:
        print(
            f"warning: {name}: skipped {skipped.rows} row(s) with numbers out of range (first: {skipped.first})",
            file=sys.stderr,
        )
    if stats.long_lines:
        what = (
            f"JSON value(s) larger than {MAX_JSON_RESULT >> 20} MiB"
            if result.json
            else (f"line(s) longer than {MAX_TEXT_LINE >> 10} KiB (not nccl-tests output)")
        )
        print(f"warning: {name}: skipped {stats.long_lines} {what}", file=sys.stderr)
    if result.malformed:
        print(f"warning: {name}: skipped {result.malformed} JSON value(s) that could not be read", file=sys.stderr)
    for err in stats.read_errors:
        where = "" if result.json else f" after {stats.lines} line(s)"
        print(
            f"warning: {name}: stopped reading{where}: {err}; the rows before the damage are kept",
            file=sys.stderr,
        )
    return bool(stats.read_errors)


if __name__ == "__main__":
    sys.exit(run_cli(main, prog="python -m opbench.trace.nccl_tests"))
