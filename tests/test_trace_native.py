"""The native reader (opbench/trace/_scan.c) against the Python reader it stands in for: the same tables, stats
and Init records on the same logs, and, line by line, a call read natively only where LINE reads the same call."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import subprocess
import sys

import pytest
from synth_trace import LineStyle, call_line, init_line, mixed_job_lines

from opbench.trace import analyze as A
from opbench.trace.parse import LINE

NATIVE = A.native_reader()
needs_native = pytest.mark.skipif(NATIVE is None, reason="the native reader was not built (no C compiler)")

STYLES = [
    LineStyle(),
    LineStyle(prefix="[3] "),
    LineStyle(prefix=" 3: ", nccl_ts="[2025-03-01 10:00:00] "),
    LineStyle(prefix="[1,3]<stdout>:", rccl_us="1234.567"),
    LineStyle(rccl_acc="0x7f00aa", rccl_task=(7, 3)),
    LineStyle(rccl_acc="(nil)", rccl_task=(-1, -2)),
]


def test_the_native_reader_is_built_where_a_c_compiler_is():
    """CI installs with a compiler: a build that failed there (setup.py's extension is optional) shows here."""
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler on this machine")
    assert NATIVE is not None


def _hostile_lines() -> list[str]:
    """Lines around the edges of LINE's grammar, each in the middle of regular traffic."""
    base = call_line("AllReduce", 0x1F, 4096, 7, nranks=4, root=0)
    send = call_line("Send", 0x20, 64, 7, root=1, nranks=2)
    return [
        init_line(0, 4),
        "NCCL INFO AllReduce: opCount 5 sendbuff 0x1 recvbuff 0x2 count 8 datatype 7 op 0 root 0 comm 0x9 [nranks=2] stream 0x3",
        "\t" + base,  # a tab before the header: LINE's prefix tokens are space-separated
        "pre\tfix " + base,
        base + "\r",  # CRLF
        base + " trailing junk",
        base.replace("count 4096", "count " + "9" * 400),
        base.replace("[nranks=4]", "[nranks=99999999999]"),
        base.replace("root 0", "root -3"),
        base + " " + send,  # two calls in one line: torn
        base[: len(base) // 2],  # a truncated call
        base.replace("opCount 1f", "opCount "),
        base.replace("[0] NCCL", "[-1] NCCL"),
        base.replace("[0] NCCL", "[0] 12.5 NCCL"),
        base.replace("[0] NCCL", "[0]  NCCL"),
        base.replace("AllReduce:", "9AllReduce:"),
        base.replace("sendbuff 0x", "sendbuff  0x"),
        base.replace("stream 0x", "stream\t0x"),
        send.replace("Send:", "Sendx:"),
        send,
        send.replace("Send:", "Recv:"),
        "x" * 300_000,  # longer than a block
        "",
        "garbage opCount 7 and more",
        init_line(1, 4, prefix="[1] ") + " opCount 3",
    ]


def _write_log(path, hostile: bool) -> None:
    rng = random.Random(7)
    lines = list(itertools.islice(mixed_job_lines(nranks=8, layers=2, seed=3, torn_every=97), 20_000))
    if hostile:
        for line in _hostile_lines():
            lines.insert(rng.randrange(len(lines)), line)
    path.write_text("\n".join(lines) + "\n")


def _read(path, reader: str, raw_p2p: bool, monkeypatch, jobs: int = 1) -> tuple:
    monkeypatch.setenv(A.READER_ENV, reader)
    summary, parser = A.analyze([str(path)], raw_p2p=raw_p2p, jobs=jobs)
    assert summary.reader == reader
    return (summary.counts, summary.unknown_ops, summary.out_of_range, parser.stats.as_dict(), parser.inits)


@needs_native
@pytest.mark.parametrize("hostile", [False, True], ids=["job", "hostile"])
def test_both_readers_give_the_same_tables(tmp_path, monkeypatch, hostile):
    """... in one process, and with --jobs 2 on pieces of 16 KiB: the native engine's piece mode hands the
    parent the same head, tail and settled streams as the Python reader's workers."""
    log = tmp_path / "job.log"
    _write_log(log, hostile)
    monkeypatch.setattr(A, "SPLIT_MIN", 0)
    monkeypatch.setattr(A, "PIECE", 16 << 10)
    assert len(list(A.split_pieces([str(log)], 2))) > 50
    for raw_p2p in (False, True):
        native = _read(log, "native", raw_p2p, monkeypatch)
        python = _read(log, "python", raw_p2p, monkeypatch)
        assert native == python
        assert _read(log, "native", raw_p2p, monkeypatch, jobs=2) == python
        counts, _, _, stats, _ = native
        assert stats["calls"] > 1000 and stats["fragments"] > 0 and sum(counts.values()) > 100
    if hostile:
        assert python[2]  # the 400-digit count and the huge nranks were met, skipped and counted


def _mutations(rng: random.Random, line: str, n: int) -> list[str]:
    alphabet = " \t\r:[]-.0123456789abcfxNCIOSRvy=()"
    out = []
    for _ in range(n):
        chars = list(line)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(chars))
            kind = rng.random()
            if kind < 0.4:
                del chars[i]
            elif kind < 0.7:
                chars.insert(i, rng.choice(alphabet))
            else:
                chars[i] = rng.choice(alphabet)
        out.append("".join(chars))
    return out


@needs_native
def test_a_line_is_read_natively_only_where_LINE_reads_the_same_call():
    """Mutated call lines of every format variant: where the engine reads a line, LINE reads it as one call with
    the same fields; where it leaves a line to the Python reader, the results cannot differ."""
    assert NATIVE is not None
    rng = random.Random(11)
    read = left = 0
    for style in STYLES:
        for op in ("AllGather", "Send", "Recv"):
            line = call_line(op, 0xC97, 1069568, 9, root=3, nranks=8, style=style)
            for text in [line, *_mutations(rng, line, 400)]:
                data = ("\n" + text).encode()
                engine = NATIVE.Engine(lambda w: 0, lambda r: (0, 8, 9, 3), lambda *a: None, group_p2p=False)
                calls, stop, newlines = engine.scan(data, 0)
                found = LINE.findall(data)
                if b"opCount " not in data:  # no call to read, nothing left over
                    assert (calls, stop) == (0, -1) and all(f[7] for f in found), text
                elif stop < 0 and calls == 1:
                    read += 1
                    assert len(found) == 1 and not found[0][7], text
                    who, p2p, _, op_, count, rest, grank, _ = found[0]
                    assert engine.counts()[0] == [((who, b"", b"", p2p or op_, count, rest, grank, b""), 1)], text
                else:
                    left += 1
                    assert calls == 0 and stop == 0, text
                    one_call = len(found) == 1 and not found[0][7] and data.count(b"opCount ") == 1
                    assert not one_call, f"LINE reads a line the engine leaves: {text!r}"
                assert newlines == (1 if stop < 0 else 0)
    assert read > 300 and left > 1000


def test_a_bad_reader_choice_is_one_line(tmp_path):
    log = tmp_path / "a.log"
    log.write_text(call_line("AllReduce", 1, 8, 7) + "\n")
    res = subprocess.run(
        [sys.executable, "-m", "opbench.trace", str(log), "--csv", str(tmp_path / "a.csv")],
        capture_output=True,
        text=True,
        env={**os.environ, A.READER_ENV: "fast"},
    )
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and A.READER_ENV in res.stderr and "python" in res.stderr
