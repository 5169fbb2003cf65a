"""Differential property test of the two log readers (docs/trace.md, "Native reader"): on generated job logs and
byte-level mutations of them (whitespace and newlines inside fields, stray 'opCount ' tokens, torn lines, cut
lines), the native reader and the Python reader give equal tables, stats and Init records, whatever the read
block size and wherever ``--jobs`` cuts the log into pieces. The reference is the Python reader with its default
block, in one process: any other way of reading must equal it."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import tempfile
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from synth_trace import LineStyle, call_line, init_line

from opbench.trace import analyze as A
from opbench.trace import parse as trace_parse

NATIVE = A.native_reader()
# Bounded to seconds: each example reads its log 5-7 times
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

PREFIXES = ["", "[0] ", " 3: ", "[1,0]<stdout>:", "[2025-01-02 03:04:05] "]
# What the fuzzing round broke the readers with: whitespace other than a space, a newline inside a field, an
# 'opCount ' token where a field is, '=' after a pointer (the stream field), control bytes.
TOKENS = [b"\t", b"\v", b"\f", b"\r", b"\n", b" ", b"  ", b"opCount ", b"opCount", b"=", b"\x00", b"0x5=",
          b"NCCL INFO ", b" task 4 globalrank 2", b"Init COMPLETE", b"[nranks=8]", b"\xff"]  # fmt: skip


@st.composite
def job_lines(draw) -> list[str]:
    """Lines of a few ranks: collectives, grouped Send/Recv (all-to-all), PP pairs, Init lines, noise."""
    nranks = draw(st.integers(2, 4))
    lines: list[str] = []
    for _ in range(draw(st.integers(1, 10))):
        me = draw(st.integers(0, nranks - 1))
        style = LineStyle(
            prefix=draw(st.sampled_from(PREFIXES)),
            rccl_us=draw(st.sampled_from([None, "1.5"])),
            rccl_acc=draw(st.sampled_from([None, "(nil)"])),
            rccl_task=draw(st.sampled_from([None, (3, me)])),
        )
        kw = dict(host=f"node{me % 2}", pid=100 + me, tid=200 + me, device=me, comm=f"0xc{me}", nranks=nranks)
        oc = draw(st.integers(0, 3))
        kind = draw(st.sampled_from(["coll", "a2a", "pp", "init", "noise"]))
        if kind == "coll":
            op = draw(st.sampled_from(["AllReduce", "AllGather", "ReduceScatter", "Broadcast"]))
            lines.append(call_line(op, oc, draw(st.sampled_from([8, 1024])), 7, style=style, **kw))
        elif kind == "a2a":
            for peer in range(nranks):
                lines += [call_line(d, oc, 64, 9, root=peer, style=style, **kw) for d in ("Send", "Recv")]
        elif kind == "pp":
            op = draw(st.sampled_from(["Send", "Recv"]))
            lines.append(call_line(op, oc, 32, 9, root=(me + 1) % nranks, style=style, **kw))
        elif kind == "init":
            lines.append(init_line(me, nranks, host=kw["host"], pid=kw["pid"], comm=kw["comm"]))
        else:
            lines.append(draw(st.text(alphabet="ab 01:[]", max_size=20)))
    return lines


@st.composite
def mutated_logs(draw) -> bytes:
    data = bytearray(("\n".join(draw(job_lines())) + "\n").encode())
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["insert", "replace", "delete", "copy"]))
        if kind == "insert":
            data[at:at] = draw(st.sampled_from(TOKENS))
        elif kind == "replace" and at < len(data):
            data[at : at + 1] = draw(st.sampled_from(TOKENS))
        elif kind == "delete":
            data[at : at + draw(st.integers(1, 12))] = b""
        else:  # a torn line: a piece of the log glued in elsewhere
            start = draw(st.integers(0, len(data)))
            data[at:at] = data[start : start + draw(st.integers(1, 160))]
    return bytes(data)


def _read(path: str, reader: str, raw_p2p: bool, block: int | None = None, piece: int | None = None) -> tuple:
    with (
        mock.patch.dict(os.environ, {A.READER_ENV: reader}),
        mock.patch.object(trace_parse, "BLOCK", block or trace_parse.BLOCK),
    ):
        if piece is None:
            summary, parser = A.analyze([path], raw_p2p=raw_p2p)
        else:  # --jobs 2, pieces of ``piece`` bytes, the workers in threads of this process
            with (
                mock.patch.object(A, "SPLIT_MIN", 0),
                mock.patch.object(A, "PIECE", piece),
                mock.patch.object(concurrent.futures, "ProcessPoolExecutor", concurrent.futures.ThreadPoolExecutor),
            ):
                summary, parser = A.analyze([path], raw_p2p=raw_p2p, jobs=2)
    stats = parser.stats.as_dict()
    return summary.counts, summary.unknown_ops, summary.out_of_range, stats, parser.inits


# The fuzzing round's findings, each as one line after the documented header (one call line of the format, then
# the damage), with what a line holds by the one grammar (docs/conventions.md, "NCCL debug-log lines"):
# (log, calls, 'opCount ' fragments, the call's comm and globalrank)
CALL = (b"node:1:2 [0] NCCL INFO AllReduce: opCount 4 sendbuff 0x1 recvbuff 0x2 count 1 datatype 7 op 0 root 0 "
        b"comm 0x9 [nranks=4] stream 0x3")  # fmt: skip
FOUND = {
    # a newline inside a field ends the line: neither part is a call
    "newline_in_sendbuff": (CALL.replace(b"sendbuff 0x1", b"sendbuff 0x1\nx") + b"\n", 0, 1, None),
    "newline_in_comm": (CALL.replace(b"comm 0x9", b"comm 0x9\nab") + b"\n", 0, 1, None),
    # any byte but a space or a newline is part of a field: a tab or a form feed is read, never a crash
    "tab_in_comm": (CALL.replace(b"comm 0x9", b"comm 0x9\tab") + b"\n", 1, 0, ("0x9\tab", None)),
    "tab_in_send_comm": (
        CALL.replace(b"AllReduce", b"Send").replace(b"comm 0x9", b"comm 0x9\tab") + b"\n",
        1,
        0,
        ("0x9\tab", None),
    ),  # fmt: skip
    "formfeed_in_sendbuff": (b"opCount \n" + CALL.replace(b"0x1", b"0x1\x0c") + b"\n", 1, 1, ("0x9", None)),
    # the stream field is every byte to the next whitespace; a line with an 'opCount ' fragment before it does
    # not change how the call line reads
    "stream_with_equals": (
        b"opCount \n" + CALL.replace(b"stream 0x3", b"stream 0x5= task 4 globalrank 2") + b"\n",
        1,
        1,
        ("0x9", 2),
    ),  # fmt: skip
    # two 'opCount ' on a line (one is the stream field): torn; its call is read, the other is a fragment
    "stream_is_opCount": (CALL.replace(b"stream 0x3", b"stream opCount ") + b"\n", 1, 1, ("0x9", None)),
}


@pytest.mark.parametrize("reader", ["python", "native"])
@pytest.mark.parametrize("name", list(FOUND))
def test_what_the_fuzzing_round_found_reads_one_way(tmp_path, name, reader):
    if reader == "native" and NATIVE is None:
        pytest.skip("the native reader was not built (no C compiler)")
    data, calls, fragments, call = FOUND[name]
    path = tmp_path / "f.log"
    path.write_bytes(data)
    for raw_p2p in (False, True):
        counts, _, _, stats, _ = _read(str(path), reader, raw_p2p)
        assert (stats["calls"], stats["fragments"]) == (calls, fragments)
        assert [(k.comm, k.globalrank) for k in counts] == ([call] if call else [])


@pytest.mark.skipif(NATIVE is None, reason="the native reader was not built (no C compiler)")
@SETTINGS
@given(mutated_logs(), st.booleans(), st.integers(16, 400), st.integers(1, 600))
@example(FOUND["stream_is_opCount"][0] * 3, False, 16, 1).via("the fuzzing round")
@example(FOUND["stream_with_equals"][0] * 2 + CALL + b"\n", False, 40, 1).via("the fuzzing round")
def test_both_readers_agree_on_mutated_logs_at_any_block_and_piece(data, raw_p2p, block, piece):
    fd, path = tempfile.mkstemp(suffix=".log")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        want = _read(path, "python", raw_p2p)
        for reader in ("python", "native"):
            assert _read(path, reader, raw_p2p, block=block) == want, (reader, "block", block)
            assert _read(path, reader, raw_p2p, piece=piece) == want, (reader, "piece", piece)
        assert _read(path, "native", raw_p2p) == want
    finally:
        os.remove(path)


@pytest.mark.parametrize("reader", ["python", "native"])
def test_unknown_op_names_are_listed_in_one_order(tmp_path, reader):
    """Ops no NCCL release has, tied in count: most seen first, then by name, whichever reader met them first."""
    if reader == "native" and NATIVE is None:
        pytest.skip("the native reader was not built (no C compiler)")
    lines = [CALL.replace(b"AllReduce", op) for op in (b"Zeta", b"Alpha", b"Mid", b"Zeta", b"Alpha", b"Mid", b"Beta")]
    log = tmp_path / "u.log"
    log.write_bytes(b"\n".join(lines) + b"\n")
    r = subprocess.run(
        [sys.executable, "-m", "opbench", "trace", str(log), "--report-dir-path", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**os.environ, A.READER_ENV: reader},
    )
    warning = next(line for line in r.stderr.splitlines() if "no NCCL/RCCL op name" in line)
    assert warning.endswith("'Alpha' (2), 'Mid' (2), 'Zeta' (2), 'Beta' (1)"), warning
