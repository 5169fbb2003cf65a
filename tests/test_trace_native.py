"""The native reader (opbench/trace/_scan.c) against the Python reader it stands in for: the same tables, stats
and Init records on the same logs, and, line by line, a call read natively only where LINE reads the same call."""

from __future__ import annotations

import gc
import itertools
import os
import random
import shutil
import subprocess
import sys
import tracemalloc
import weakref

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


# -- a second "opCount " in a call's own tokens (reliability round 4, F3c) ---------------------------------------
# The stream token "opCount" before a space: LINE's first alternative matches the call (its look-ahead starts after
# the stream token), but the line holds two "opCount ": the Python reader counts a fragment, so the engine must
# leave the line to it. The same for every token of the call that could end in "opCount".
F3C = (
    "node:1:2 [0] NCCL INFO AllReduce: opCount 4 sendbuff 0x1 recvbuff 0x2 count 1 datatype 7 op 0 root 0 "
    "comm 0x9 [nranks=4] stream opCount "
)


def _opcount_in_token_lines() -> list[str]:
    out = [F3C]
    for op, root in (("AllReduce", 0), ("Send", 1)):
        line = call_line(op, 0x5, 8, 7, root=root, nranks=2, style=LineStyle(rccl_acc="0x7", rccl_task=(1, 2)))
        for token in ("0x7f3a40000000", "0x7f3a50000000", "acc 0x7", "0x55d0c0a1b2c0", "0x55d0c0d3e4f0"):
            out.append(line.replace(token, token + "opCount", 1))
            out.append(line.replace(token, "opCount", 1) if token != "acc 0x7" else line.replace(token, "acc opCount"))
        plain = call_line(op, 0x5, 8, 7, root=root, nranks=2)
        out.append(plain.replace("stream 0x55d0c0d3e4f0", "stream opCount "))
        out.append(plain.replace("stream 0x55d0c0d3e4f0", "stream opCount"))  # no space after: one "opCount "
    return out


@needs_native
def test_a_second_opcount_in_a_token_leaves_the_line_to_the_python_reader():
    assert NATIVE is not None
    for line in _opcount_in_token_lines():
        data = ("\n" + line).encode()
        engine = NATIVE.Engine(lambda w: 0, lambda r: (0, 2, 7, 1), lambda *a: None)
        calls, stop, _ = engine.scan(data, 0)
        if data.count(b"opCount ") > 1:
            assert (calls, stop) == (0, 0), line
        else:
            assert (calls, stop) == (1, -1), line


@needs_native
def test_both_readers_agree_on_opcount_in_a_token(tmp_path, monkeypatch):
    """... the F3c line alone (tables and ParseStats), and every variant in the middle of a job."""
    alone = tmp_path / "f3c.log"
    alone.write_text(F3C + "\n")
    job = tmp_path / "job.log"
    rng = random.Random(5)
    lines = list(itertools.islice(mixed_job_lines(nranks=8, layers=1, seed=2), 3000))
    for line in _opcount_in_token_lines():
        lines.insert(rng.randrange(len(lines)), line)
    job.write_text("\n".join(lines) + "\n")
    for log in (alone, job):
        for raw_p2p in (False, True):
            assert _read(log, "native", raw_p2p, monkeypatch) == _read(log, "python", raw_p2p, monkeypatch), log.name


# -- the C boundary: every Python-level call ends in a Python exception or a result, never a signal ---------------
_PRELUDE = """
from opbench.trace._scan import Engine
CB = (lambda w: 0, lambda r: (0, 8, 7, 1), lambda *a: None)
LINE = (b"\\nnode:1:2 [0] NCCL INFO Send: opCount 1 sendbuff 0x1 recvbuff 0x2 count 8 datatype 7 op 0 root 1 comm 0x9"
        b" [nranks=2] stream 0x3")
KEY = (b"node:1:2 [0]", b"Send", b"1", b"", b"8", b"datatype 7 op 0 root 1 comm 0x9 [nranks=8]", b"", b"")
e = None
"""
# (code, the exception it must end with, or None: it must run to its end)
_HOSTILE = {
    "scan before __init__": ("Engine.__new__(Engine).scan(b'\\n', 0)", "RuntimeError"),
    "counts before __init__": ("Engine.__new__(Engine).counts()", "RuntimeError"),
    "finish before __init__": ("Engine.__new__(Engine).finish()", "RuntimeError"),
    "feed_keys before __init__": ("Engine.__new__(Engine).feed_keys([])", "RuntimeError"),
    "feed_record before __init__": ("Engine.__new__(Engine).feed_record(1, 2, b'1', 0, True, None)", "RuntimeError"),
    "piece_end before __init__": ("Engine.__new__(Engine).piece_end()", "RuntimeError"),
    "__init__ twice": ("e = Engine(*CB); e.scan(LINE, 0); e.__init__(*CB)", "RuntimeError"),
    "negative pos": ("Engine(*CB).scan(b'\\nab', -1)", "ValueError"),
    "pos past the end": ("Engine(*CB).scan(b'\\nab', 4)", "ValueError"),
    "pos not at a newline": ("Engine(*CB).scan(b'\\nab', 1)", "ValueError"),
    "pos at the end": ("assert Engine(*CB).scan(b'\\nab', 3) == (0, -1, 0)", None),
    "a bytearray block": ("Engine(*CB).scan(bytearray(b'\\nab'), 0)", "TypeError"),
    "nranks 2**61": (
        "e = Engine(*CB)\nfor p in range(3): e.feed_record(1, 2**61, b'1', p, True, None)\ne.finish()",
        None,
    ),
    "an empty opCount and fields": (
        "e = Engine(*CB)\nfor p in (0, 0, 1): e.feed_record(1, 2, b'', p, True, None)\ne.finish()",
        None,
    ),
    "nranks 2**62 + 1": ("Engine(*CB).feed_record(1, 2**62 + 1, b'1', 0, True, None)", "ValueError"),
    "peer -2**63": ("Engine(*CB).feed_record(1, 2, b'1', -(2**63), True, None)", "ValueError"),
    "nranks 2**64": ("Engine(*CB).feed_record(1, 2**64, b'1', 0, True, None)", "OverflowError"),
    "proc_of calls scan": (
        "e = Engine(lambda w: e.scan(b'\\n', 0), lambda r: (0, 2, 7, 1), lambda *a: None); e.scan(LINE, 0)",
        "RuntimeError",
    ),
    "rest_of calls __init__": (
        "e = Engine(lambda w: 0, lambda r: e.__init__(*CB), lambda *a: None); e.scan(LINE, 0)",
        "RuntimeError",
    ),
    "emit calls finish": (
        "e = Engine(lambda w: 0, lambda r: (0, 1, 7, 0), lambda *a: e.finish())\n"
        "e.feed_record(1, 1, b'1', 0, True, None); e.feed_record(1, 1, b'1', 0, False, None)",
        "RuntimeError",
    ),
    "proc_of calls feed_keys, caught; the engine goes on": (
        "def proc_of(w):\n"
        "    try:\n        e.feed_keys([KEY])\n    except RuntimeError:\n        return 0\n"
        "e = Engine(proc_of, lambda r: (0, 2, 7, 1), lambda *a: None)\n"
        "assert e.scan(LINE, 0) == (1, -1, 1); e.finish(); assert len(e.counts()[0]) == 1",
        None,
    ),
    "rest_of returns junk, then the engine goes on": (
        "e = Engine(lambda w: 0, lambda r: 'x', lambda *a: None)\n"
        "try:\n    e.scan(LINE, 0)\nexcept TypeError:\n    pass\nassert e.counts() == ([], [])",
        None,
    ),
    "rest_of returns peer -2**63": (
        "Engine(lambda w: 0, lambda r: (0, 2, 7, -(2**63)), lambda *a: None).scan(LINE, 0)",
        "ValueError",
    ),
    "proc_of returns 2**63 - 1 ids": (
        "e = Engine(lambda w: 2**63 - 1, lambda r: (2**63 - 1, 2, 7, 1), lambda *a: None); e.scan(LINE, 0); e.finish()",
        None,
    ),
    "proc_of empties the key list being fed": (
        "keys = [KEY] * 5\n"
        "e = Engine(lambda w: keys.clear() or 0, lambda r: (0, 8, 7, 1), lambda *a: None)\n"
        "e.feed_keys(keys); e.finish(); assert e.counts()[0][0][1] == 5",
        None,
    ),
    "a LineKey with an empty count": ("Engine(*CB).feed_keys([KEY[:4] + (b'',) + KEY[5:]])", "ValueError"),
    "a LineKey of 7": ("Engine(*CB).feed_keys([KEY[:7]])", "TypeError"),
    "piece_end hands its lists over": (
        "e = Engine(*CB, piece=True); e.scan(LINE, 0); head, tail, settled = e.piece_end(); first = list(head)\n"
        "head.append(1); settled.append(2); e.scan(LINE, 0)\n"
        "assert e.piece_end() == (first, [], []) and len(first) == 1",
        None,
    ),
}


@needs_native
def test_hostile_calls_end_in_a_python_exception_never_a_signal():
    """Each in a subprocess of its own (all at once): a crash there is a negative return code here."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", _PRELUDE + code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name, (code, _) in _HOSTILE.items()
    }
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        raises = _HOSTILE[name][1]
        assert proc.returncode >= 0, f"{name}: killed by signal {-proc.returncode}\n{err}"
        if raises is None:
            assert proc.returncode == 0, f"{name}:\n{err}"
        else:
            last = err.strip().splitlines()[-1] if err.strip() else ""
            assert proc.returncode == 1 and last.startswith(raises + ":"), f"{name}: {proc.returncode}\n{err}"


# -- memory: what a read leaves, and per stream -------------------------------------------------------------------
def _traced(fn) -> int:
    """Bytes fn() leaves allocated (tracemalloc sees PyMem_Malloc: the engine's tables and groups)."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    fn()
    return tracemalloc.get_traced_memory()[0] - before


@needs_native
def test_a_stream_costs_little_and_an_ended_group_gives_its_buffers_back():
    """20000 streams (one communicator each, as /work/.../many_streams makes them): an open group of one line
    holds its stream a few hundred bytes, an ended one under 128 (docs/trace.md, "Native reader"; before: 2 KB
    each, kept)."""
    assert NATIVE is not None
    n, engine = 20_000, []
    tracemalloc.start()
    try:
        made = _traced(lambda: engine.append(NATIVE.Engine(lambda w: 0, lambda r: (0, 8, 7, 1), lambda *a: None)))

        def feed() -> None:
            for sid in range(n):
                engine[0].feed_record(sid << 32, 8, b"%x" % sid, 1, True, None)

        opened = _traced(feed)
        ended = opened + _traced(engine[0].finish)
        left = made + ended + _traced(engine.clear)
    finally:
        tracemalloc.stop()
    assert opened / n < 600 and ended / n < 128, (opened / n, ended / n)
    assert left < 4096, left


@needs_native
def test_many_communicators_read_in_bounded_memory():
    """The many-streams log through scan: every line a new stream, its group open to the end."""
    assert NATIVE is not None
    n = 20_000
    text = b"".join(
        b"\nnode01:4242:4300 [0] NCCL INFO Send: opCount %x sendbuff 0x7f3a40000000 recvbuff 0x7f3a50000000 count"
        b" 1024 datatype 7 op 0 root 1 comm 0x%012x [nranks=8] stream 0x55d0c0d3e4f0" % (i, i)
        for i in range(n)
    )
    comms: dict[bytes, int] = {}
    engine = NATIVE.Engine(lambda w: 1 << 32, lambda r: (comms.setdefault(r, len(comms)), 8, 7, 1), lambda *a: None)
    tracemalloc.start()
    try:
        held = _traced(lambda: engine.scan(text, 0))  # the comms dict (~100 B a stream) included
    finally:
        tracemalloc.stop()
    assert held / n < 1600, held / n  # before: 2.7 KB a stream


# -- the garbage collector sees the engine's references --------------------------------------------------------
@needs_native
def test_analyze_leaves_no_tally_or_engine_behind(tmp_path, monkeypatch):
    """Each _Tally and its Engine form a cycle (the engine holds the tally's bound methods): the collector frees
    them (before: every analyze() kept its whole state)."""
    log = tmp_path / "job.log"
    _write_log(log, hostile=True)
    refs: list[weakref.ref] = []
    init = A._Tally.__init__

    def tracked(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        refs.extend([weakref.ref(self), weakref.ref(self.native)])

    monkeypatch.setattr(A._Tally, "__init__", tracked)
    monkeypatch.setenv(A.READER_ENV, "native")
    for _ in range(3):
        A.analyze([str(log)])
    gc.collect()
    assert len(refs) == 6 and [r() for r in refs] == [None] * 6


@needs_native
@pytest.mark.parametrize("piece", [False, True], ids=["open group", "piece head"])
def test_a_cycle_through_a_record_the_engine_holds_is_collected(piece):
    """A CallRecord in an open group (or piece mode's head) that refers back to the engine."""
    assert NATIVE is not None

    class Record:
        engine: object = None

    engine = NATIVE.Engine(lambda w: 0, lambda r: (0, 8, 7, 1), lambda *a: None, piece=piece)
    rec = Record()
    rec.engine = engine
    engine.feed_record(1, 8, b"1", 0, True, rec)
    ref = weakref.ref(engine)
    del engine, rec
    gc.collect()
    assert ref() is None
