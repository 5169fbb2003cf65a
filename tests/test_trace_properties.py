"""Property tests: the log parser never raises, and what it reads back is what was written."""

from __future__ import annotations

from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth_trace import LineStyle, call_line

from opbench.trace import parse as trace_parse
from opbench.trace.parse import LogParser

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(SETTINGS, max_examples=50)  # the slow-to-generate ones (keeps this file well under a minute)
OPS = [
    "AllReduce",
    "AllGather",
    "ReduceScatter",
    "Broadcast",
    "Reduce",
    "Send",
    "Recv",
    "AlltoAll",
    "Gather",
    "Scatter",
    "AllToAllPivot",
]
PREFIXES = [
    "",
    "[0] ",
    " 3: ",
    "[1,0]<stdout>:",
    "(RayTrainWorker pid=1, ip=10.0.0.2) ",
    "2024-05-01T12:00:00Z ",
    "[2025-01-02 03:04:05] ",
]
hosts = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=20).filter(
    lambda h: h[0].isalpha()
)
hexptr = st.integers(min_value=1, max_value=2**48).map(lambda v: f"0x{v:x}")


@st.composite
def calls(draw):
    style = LineStyle(
        prefix=draw(st.sampled_from(PREFIXES)),
        nccl_ts=draw(st.sampled_from([None, "[2025-06-07 08:09:10] "])),
        rccl_us=draw(st.sampled_from([None, "1712345678.123456"])),
        rccl_acc=draw(st.sampled_from([None, "(nil)", "0x7f0011223344"])),
        rccl_task=draw(st.one_of(st.none(), st.tuples(st.integers(0, 99), st.integers(0, 4095)))),
    )
    kw = dict(
        op=draw(st.sampled_from(OPS)),
        opcount=draw(st.integers(0, 2**40)),
        count=draw(st.integers(0, 2**40)),
        datatype=draw(st.integers(0, 11)),
        redop=draw(st.integers(0, 9)),
        root=draw(st.integers(-1, 4095)),
        host=draw(hosts),
        pid=draw(st.integers(1, 2**22)),
        tid=draw(st.integers(1, 2**22)),
        device=draw(st.integers(0, 15)),
        comm=draw(hexptr),
        nranks=draw(st.integers(1, 65536)),
        stream=draw(st.one_of(hexptr, st.just("(nil)"))),
    )
    return kw, style


@SETTINGS
@given(st.binary(max_size=4000))
def test_arbitrary_bytes_never_raise(data):
    p = LogParser()
    recs = p.parse_bytes(data)
    s = p.stats
    assert s.lines == data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    assert 0 <= s.call_lines <= s.lines and s.calls == len(recs) >= s.call_lines and s.skipped >= 0


@FEW
@given(
    st.lists(
        st.one_of(
            st.text(max_size=80),
            st.sampled_from(
                ["opCount ", "NCCL INFO ", "count 12 ", ": ", "\n", "[nranks=8] stream 0x1", "Init COMPLETE", "comm "]
            ),
        ),
        max_size=60,
    ),
    calls(),
)
def test_text_with_call_fragments_never_raises(pieces, call):
    kw, style = call
    line = call_line(**kw, style=style)
    cut = len(line) // 2
    text = "".join(pieces) + line[:cut] + "\n" + "".join(reversed(pieces)) + line[cut:]
    p = LogParser()
    p.parse_bytes(text.encode("utf-8", "surrogatepass"))
    assert p.stats.lines >= 1


@SETTINGS
@given(calls(), st.sampled_from(["", "training step 3 loss 2.0\n"]))
def test_round_trip(call, noise):
    kw, style = call
    [r] = LogParser().parse_bytes((noise + call_line(**kw, style=style) + "\n").encode())
    assert (r.op, r.opcount, r.count, r.datatype, r.op_enum, r.root, r.comm, r.nranks, r.stream) == (
        kw["op"],
        kw["opcount"],
        kw["count"],
        kw["datatype"],
        kw["redop"],
        kw["root"],
        kw["comm"],
        kw["nranks"],
        kw["stream"],
    )
    assert (r.host, r.pid, r.tid, r.device) == (kw["host"], kw["pid"], kw["tid"], kw["device"])
    assert (r.task, r.globalrank) == (style.rccl_task or (None, None))
    assert r.acc == style.rccl_acc


@FEW
@given(st.lists(calls(), min_size=1, max_size=30), st.integers(min_value=16, max_value=700))
def test_block_size_does_not_matter(many, block):
    text = "".join(call_line(**kw, style=style) + "\nnoise\n" for kw, style in many).encode()
    expected = LogParser().parse_bytes(text)
    with mock.patch.object(trace_parse, "BLOCK", block), mock.patch.object(trace_parse, "MAX_LINE", 4096):
        p = LogParser()
        got = p.parse_bytes(text)
    assert got == expected and len(got) == len(many) and p.stats.lines == 2 * len(many)


@st.composite
def job_logs(draw):
    """Lines of a few ranks: collectives, grouped Send/Recv, PP pairs, noise and torn lines, in any order."""
    nranks = draw(st.integers(2, 4))
    lines = []
    for _ in range(draw(st.integers(1, 12))):
        me = draw(st.integers(0, nranks - 1))
        style = LineStyle(prefix=draw(st.sampled_from(PREFIXES)), rccl_us=draw(st.sampled_from([None, "1.5"])))
        kw = dict(
            host=f"node{me % 2}", pid=100 + me, tid=200 + me, device=me, comm=f"0xc{me}", nranks=nranks, style=style
        )
        kind = draw(st.sampled_from(["coll", "a2a", "pp", "noise", "torn", "torn_p2p", "glued", "odd", "cut"]))
        oc = draw(st.integers(0, 5))
        if kind == "coll":
            lines.append(
                call_line(
                    draw(st.sampled_from(["AllReduce", "AllGather", "ReduceScatter"])),
                    oc,
                    draw(st.sampled_from([8, 1024])),
                    draw(st.sampled_from([7, 9])),
                    **kw,
                )
            )
        elif kind == "a2a":
            for peer in range(nranks):
                lines += [call_line("Send", oc, 64, 9, root=peer, **kw), call_line("Recv", oc, 64, 9, root=peer, **kw)]
        elif kind == "pp":
            lines.append(call_line(draw(st.sampled_from(["Send", "Recv"])), oc, 32, 9, root=(me + 1) % nranks, **kw))
        elif kind == "noise":
            lines.append(draw(st.text(alphabet="abc 0123:[]", max_size=30)))
        elif kind == "torn":
            line = call_line("AllReduce", oc, 8, 7, **kw)
            lines.append(line[: draw(st.integers(10, len(line) - 5))] + call_line("AllGather", oc, 16, 9, **kw))
        elif kind == "torn_p2p":  # a torn line inside an all-to-all group
            for peer in range(nranks):
                send = call_line("Send", oc, 64, 9, root=peer, **kw)
                if peer == 0:
                    send = call_line("Recv", oc, 64, 9, root=1, **kw)[: draw(st.integers(10, 120))] + send
                lines += [send, call_line("Recv", oc, 64, 9, root=peer, **kw)]
        elif kind == "glued":  # two complete calls on one line
            lines.append(call_line("AllReduce", oc, 8, 7, **kw) + call_line("Send", oc, 32, 9, root=0, **kw))
        elif kind == "odd":  # one call that only _FULL reads (the op glued to a tag, no NCCL prefix)
            lines.append("x:" + call_line("Broadcast", oc, 4, 9, **kw).split("NCCL INFO ", 1)[1])
        else:  # a truncated call
            line = call_line("ReduceScatter", oc, 8, 7, **kw)
            lines.append(line[: draw(st.integers(10, len(line) - 5))])
    return "\n".join(lines) + "\n"


@FEW
@given(job_logs(), st.booleans(), st.sampled_from([64, 300, 1 << 20]))
def test_fast_tally_equals_record_path(text, raw_p2p, block):
    """analyze() counts at regex speed; the same log through CallRecords must give the same tables, whatever
    the read block (groups and torn lines across block edges)."""
    import os
    import tempfile

    from opbench.trace.analyze import analyze, iter_records
    from opbench.trace.summary import TraceSummary

    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as fh:
        fh.write(text)
    try:
        with mock.patch.object(trace_parse, "BLOCK", block):
            fast, parser = analyze([fh.name], raw_p2p=raw_p2p)
            slow = TraceSummary().extend(iter_records(LogParser(), [fh.name], raw_p2p=raw_p2p))
        slow.repair_hosts()
    finally:
        os.remove(fh.name)
    assert fast.summary_rows() == slow.summary_rows()
    assert fast.per_rank_rows([]) == slow.per_rank_rows([])
    assert fast.total_calls <= parser.stats.calls  # grouped Send/Recv lines fold into one AlltoAll
    assert fast.total_calls == parser.stats.calls or not raw_p2p
