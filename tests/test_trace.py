"""NCCL/RCCL COLL log parser: every line variant of docs/conventions.md ("NCCL debug-log lines"), torn lines, garbage,
gz/stdin, summary CSV."""

from __future__ import annotations

import csv
import gzip
import io
import subprocess
import sys

import pytest
from synth_trace import LineStyle, call_line, init_line

from opbench.core.dtypes import BY_ENUM as NCCL_DTYPES
from opbench.core.errors import run_cli
from opbench.trace import analyze as trace
from opbench.trace import parse as trace_parse
from opbench.trace.__main__ import main as trace_main
from opbench.trace.analyze import trace_sizes
from opbench.trace.parse import LogParser

# The layer count a real Llama-3-70B trace at 8 ranks shows (docs/conventions.md, "FSDP collective sizes").
LAYER = 106956800


@pytest.fixture
def cli(capsys):
    """Run ``opbench trace`` in-process (a subprocess costs seconds of torch import per call)."""

    def call(*argv: str):
        rc = run_cli(trace_main, list(argv), prog="opbench trace")
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(argv, rc, out, err)

    return call


def parse(text: str | bytes) -> tuple[list[trace_parse.CallRecord], trace_parse.ParseStats]:
    p = LogParser()
    data = text.encode() if isinstance(text, str) else text
    return p.parse_bytes(data), p.stats


def test_reference_line_all_fields():
    line = (
        "node07:52341:52980 [3] NCCL INFO AllGather: opCount c97 sendbuff 0x7f2a3c000000 recvbuff 0x7f2a10000000 "
        f"count {LAYER} datatype 9 op 0 root 0 comm 0x55f1e8d0a2b0 [nranks=8] stream 0x55f1e8a91c40"
    )
    [rec], stats = parse(line + "\n")
    assert (rec.op, rec.opcount, rec.count, rec.datatype, rec.dtype) == ("AllGather", 0xC97, LAYER, 9, "bf16")
    assert (rec.host, rec.pid, rec.tid, rec.device) == ("node07", 52341, 52980, 3)
    assert (rec.comm, rec.nranks, rec.stream) == ("0x55f1e8d0a2b0", 8, "0x55f1e8a91c40")
    assert rec.collective == "all_gather" and rec.redop is None and rec.bytes == LAYER * 2
    assert (rec.task, rec.globalrank, rec.acc) == (None, None, None)
    assert stats.lines == 1 and stats.calls == 1 and stats.skipped == 0


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "[0] ",
        " 0: ",
        "[1,0]<stdout>:",
        "(RayTrainWorker pid=8812, ip=10.1.2.3) ",
        "2024-05-01T12:00:00.123456Z ",
        "2024-05-01 12:00:00,123 INFO ",
        "worker-3  | ",
        "[pod/train-0/main] ",
    ],
)
@pytest.mark.parametrize("era", ["nccl", "nccl226_ts", "rccl_old_us", "rccl218_task", "rccl227_acc", "rccl227_nil"])
def test_prefix_and_era_variants(prefix, era):
    style = {
        "nccl": LineStyle(),
        "nccl226_ts": LineStyle(nccl_ts="[2025-03-04 05:06:07] "),
        "rccl_old_us": LineStyle(rccl_us="1712345678.901234"),
        "rccl218_task": LineStyle(rccl_task=(2, 13)),
        "rccl227_acc": LineStyle(rccl_acc="0x7f00aa000000", rccl_task=(0, 5)),
        "rccl227_nil": LineStyle(rccl_acc="(nil)", rccl_task=(1, 6)),
    }[era]
    style.prefix = prefix
    line = call_line(
        "ReduceScatter", 0x1F, 4096, 7, redop=4, host="mi300x-12", pid=77, tid=78, device=5, nranks=16, style=style
    )
    recs, stats = parse(f"unrelated output\n{line}\n")
    assert len(recs) == 1, line
    r = recs[0]
    assert (r.op, r.opcount, r.count, r.datatype, r.redop, r.nranks) == ("ReduceScatter", 0x1F, 4096, 7, "avg", 16)
    assert (r.host, r.pid, r.tid, r.device) == ("mi300x-12", 77, 78, 5)
    if style.rccl_task:
        assert (r.task, r.globalrank) == style.rccl_task
    if style.rccl_acc:
        assert r.acc == style.rccl_acc
    assert stats.skipped == 1 and stats.fragments == 0


@pytest.mark.parametrize(
    "op,collective",
    [
        ("AllReduce", "all_reduce"),
        ("AllGather", "all_gather"),
        ("ReduceScatter", "reduce_scatter"),
        ("Broadcast", "broadcast"),
        ("Reduce", "reduce"),
        ("Send", "send_recv"),
        ("Recv", "send_recv"),
        ("AlltoAll", "all_to_all"),
        ("AllToAllPivot", "all_to_all"),
        ("Gather", None),
        ("Scatter", None),
    ],
)
def test_op_names(op, collective):
    [r], _ = parse(call_line(op, 1, 100, 7, root=3))
    assert r.op == op and r.collective == collective
    if op in ("Send", "Recv"):
        assert r.peer == 3 and r.root_rank is None
    elif op in ("Broadcast", "Reduce", "Gather", "Scatter"):
        assert r.root_rank == 3 and r.peer is None


@pytest.mark.parametrize("enum", sorted(NCCL_DTYPES))
def test_every_datatype(enum):
    [r], _ = parse(call_line("AllReduce", 1, 10, enum))
    assert r.dtype == NCCL_DTYPES[enum].name and r.bytes == 10 * NCCL_DTYPES[enum].size


@pytest.mark.parametrize(
    "op_enum,name", [(0, "sum"), (1, "prod"), (2, "max"), (3, "min"), (4, "avg"), (5, "premulsum"), (9, "premulsum")]
)
def test_redops(op_enum, name):
    [r], _ = parse(call_line("AllReduce", 1, 10, 7, redop=op_enum))
    assert r.redop == name


def test_unknown_datatype_has_no_fake_bytes():
    [r], _ = parse(call_line("AllReduce", 1, 10, 42))
    assert r.dtype == "dtype42" and r.bytes is None


def test_torn_line_recovers_complete_call_and_its_host(tmp_path):
    a = call_line("AllGather", 5, LAYER, 9, host="dgx-a", pid=1, tid=2, device=0)
    b = call_line("AllGather", 5, LAYER, 9, host="dgx-b", pid=3, tid=4, device=1)
    clean_b = call_line("AllReduce", 6, 8, 7, host="dgx-b", pid=3, tid=4, device=1)
    torn = a[:60] + b  # rank 0's line interrupted by rank 1's complete line
    recs, stats = parse("\n".join([clean_b, torn, a[60:]]) + "\n")
    assert [r.op for r in recs] == ["AllReduce", "AllGather"]
    got = recs[1]
    assert got.torn and not recs[0].torn
    assert (got.pid, got.tid, got.device, got.count) == (3, 4, 1, LAYER) and got.host.endswith("dgx-b")
    assert stats.fragments == 1  # the interrupted call
    assert stats.skipped == 1  # the tail of the interrupted line
    assert stats.call_lines == 2
    log = tmp_path / "torn.log"
    log.write_text("\n".join([torn, a[60:], clean_b]) + "\n")  # the clean line comes later: still repaired
    summary, _ = trace.analyze([str(log)])
    assert {(r["host"], r["op"]) for r in summary.per_rank_rows([])} == {("dgx-b", "AllGather"), ("dgx-b", "AllReduce")}


def test_two_complete_calls_on_one_line_and_a_call_without_prefix():
    a = call_line("AllReduce", 1, 8, 7, host="h1", pid=1, tid=1, device=0)
    b = call_line("AllReduce", 1, 8, 7, host="h1", pid=2, tid=2, device=1)
    bare = call_line("Broadcast", 2, 64, 0, root=1).split("NCCL INFO ", 1)[1]
    recs, stats = parse(f"{a}{b}\n{bare}\n")
    assert [(r.pid, r.device) for r in recs[:2]] == [(1, 0), (2, 1)]
    assert recs[2].op == "Broadcast" and recs[2].host is None and recs[2].pid is None
    assert stats.calls == 3 and stats.call_lines == 2


def test_binary_garbage_and_truncated_lines_are_skipped_not_fatal():
    good = call_line("AllReduce", 1, 8, 7).encode()
    junk = bytes(b for b in range(256) if b != 10)
    data = b"\x00\xff\xfe\x80garbage\n" + good[:50] + b"\n" + good + b"\n" + junk + b"\n" + good[:-30]
    recs, stats = parse(data)
    assert len(recs) == 1
    assert stats.lines == 5 and stats.call_lines == 1 and stats.skipped == 4
    assert stats.fragments == 2  # both truncated calls ('…opCount ' and '…[n') are counted


def test_overlong_garbage_line_keeps_memory_bounded(monkeypatch):
    monkeypatch.setattr(trace_parse, "MAX_LINE", 1000)
    monkeypatch.setattr(trace_parse, "BLOCK", 256)
    good = call_line("AllReduce", 1, 8, 7).encode()
    data = b"x" * 5000 + b"\n" + good + b"\n" + b"y" * 3000
    recs, stats = parse(data)
    assert len(recs) == 1 and stats.cut_lines >= 2


def test_block_boundaries_do_not_change_results(monkeypatch):
    lines = [
        call_line(
            "AllGather", i, 1000 + i, 9, device=i % 8, pid=100 + i % 8, tid=i, style=LineStyle(prefix=f"[{i % 8}] ")
        )
        for i in range(200)
    ]
    text = ("\n".join(lines) + "\n").encode()
    expected, _ = parse(text)
    monkeypatch.setattr(trace_parse, "BLOCK", 97)
    got, stats = parse(text)
    assert got == expected and len(got) == 200 and stats.lines == 200


def test_gzip_and_plain_files_give_the_same_sizes(tmp_path):
    text = "\n".join(call_line("AllGather", i, LAYER, 9, device=d, pid=10 + d) for i in range(3) for d in range(8))
    plain = tmp_path / "job.log"
    plain.write_text(text + "\n")
    gz = tmp_path / "job.log.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert trace_sizes([str(plain)]) == trace_sizes([str(gz)])
    [size] = trace_sizes([str(gz)])
    assert (size.collective, size.count, size.dtype_enum, size.nranks, size.redop, size.calls) == (
        "all_gather",
        LAYER,
        9,
        8,
        None,
        24,
    )


def test_truncated_gzip_keeps_what_was_read(tmp_path):
    text = "\n".join(call_line("AllReduce", i, 8, 7) for i in range(2000)) + "\n"
    gz = tmp_path / "cut.log.gz"
    gz.write_bytes(gzip.compress(text.encode())[:-200])
    p = LogParser()
    recs = list(p.calls(str(gz)))
    assert 0 < len(recs) < 2000 and p.stats.read_errors


# -- all-to-all from grouped Send/Recv ---------------------------------------------------------------------
def _p2p_group(nranks: int, me: int, opcount: int, counts: list[int], include_self: bool = True) -> list[str]:
    lines = []
    for peer in range(nranks):
        if peer == me and not include_self:
            continue
        for op in ("Send", "Recv"):
            lines.append(
                call_line(
                    op, opcount, counts[peer], 9, root=peer, pid=100 + me, device=me, comm=f"0xc{me}", nranks=nranks
                )
            )
    return lines


def test_grouped_send_recv_becomes_alltoall(tmp_path):
    lines = []
    for oc in (7, 8):  # two all_to_all_single calls, 4 ranks, interleaved by rank
        groups = [_p2p_group(4, me, oc, [1024] * 4) for me in range(4)]
        for i in range(len(groups[0])):
            lines += [g[i] for g in groups]
    lines += _p2p_group(4, 0, 9, [10, 20, 30, 40])  # uneven: MoE dispatch
    lines += _p2p_group(4, 1, 10, [5] * 4, include_self=False)  # nranks>=3 without self
    lines += [
        call_line("Send", 11, 99, 9, root=1, pid=100, device=0, comm="0xc0", nranks=4),  # PP pair
        call_line("Recv", 11, 99, 9, root=3, pid=100, device=0, comm="0xc0", nranks=4),
    ]
    log = tmp_path / "a2a.log"
    log.write_text("\n".join(lines) + "\n")
    sizes = {(s.collective, s.count): s.calls for s in trace_sizes([str(log)])}
    assert sizes[("all_to_all", 1024)] == 8  # 2 calls x 4 ranks
    assert sizes[("all_to_all", 25)] == 1  # AlltoAllv: ceil(100 / 4)
    assert sizes[("all_to_all", 5)] == 1
    assert sizes[("send_recv", 99)] == 2


def test_raw_p2p_keeps_send_recv(tmp_path, cli):
    log = tmp_path / "a2a.log"
    log.write_text("\n".join(_p2p_group(2, 0, 1, [64, 64])) + "\n")
    out = tmp_path / "s.csv"
    res = cli(str(log), "--raw-p2p", "--csv", str(out))
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(out.open()))
    assert sorted((r["op"], r["calls"]) for r in rows) == [("Recv", "2"), ("Send", "2")]
    assert all(r["nccl_tests_bytes"] == "128" for r in rows)  # sendrecv -b = count x elt


# -- CLI: summary CSV, commands, breakdowns ------------------------------------------------------------------
def _job_log(tmp_path, rccl: bool = False):
    lines = []
    for d in range(8):
        lines.append(init_line(d, 8, pid=500 + d, device=d, comm=f"0xa{d}"))
    for oc in range(3):
        for d in range(8):
            st = LineStyle(prefix=f"[{d}] ", rccl_task=(0, d) if rccl else None)
            kw = dict(pid=500 + d, device=d, comm=f"0xa{d}", style=st)
            lines.append(call_line("AllGather", 3 * oc, LAYER, 9, **kw))
            lines.append(call_line("ReduceScatter", 3 * oc + 1, LAYER, 7, redop=4, **kw))
            lines.append(call_line("AllReduce", 3 * oc + 2, 1, 7, redop=2, **kw))
            lines.append(f"[{d}] iteration {oc} loss 2.1")
    log = tmp_path / ("rccl.log" if rccl else "job.log")
    log.write_text("\n".join(lines) + "\n")
    return log


def test_summary_csv_contract(tmp_path, cli):
    log = _job_log(tmp_path)
    out = tmp_path / "sizes.csv"
    res = cli(str(log), "--csv", str(out), "--per-rank", "--per-comm")
    assert res.returncode == 0, res.stderr
    rows = {r["op"]: r for r in csv.DictReader(out.open())}
    for col in ("op", "count", "datatype", "dtype", "redop", "nranks", "calls", "bytes", "nccl_tests_bytes"):
        assert col in rows["AllGather"]
    ag, rs, ar = rows["AllGather"], rows["ReduceScatter"], rows["AllReduce"]
    assert (ag["count"], ag["datatype"], ag["dtype"], ag["redop"], ag["nranks"], ag["calls"]) == (
        str(LAYER),
        "9",
        "bf16",
        "",
        "8",
        "24",
    )
    assert int(ag["bytes"]) == LAYER * 2 and int(ag["nccl_tests_bytes"]) == LAYER * 2 * 8
    assert int(rs["bytes"]) == LAYER * 4 and int(rs["nccl_tests_bytes"]) == LAYER * 4 * 8 and rs["redop"] == "avg"
    assert int(ar["nccl_tests_bytes"]) == 4 and ar["redop"] == "max"
    # console: top ops by total bytes, ReduceScatter (fp32) first
    table = res.stdout.split("top operations by total bytes")[1]
    assert table.index("ReduceScatter") < table.index("AllGather") < table.index("AllReduce")
    per_rank = list(csv.DictReader((tmp_path / "sizes_per_rank.csv").open()))
    assert sorted({r["rank"] for r in per_rank}) == [str(i) for i in range(8)]  # from Init COMPLETE
    assert {r["calls"] for r in per_rank} == {"3"}
    [comm] = list(csv.DictReader((tmp_path / "sizes_per_comm.csv").open()))
    assert (comm["commid"], comm["ranks_logged"], comm["calls"]) == ("0x7c1f3e5a9b2d4c61", "8", "72")


def test_top_limits_the_console_tables_and_zero_shows_all(tmp_path, cli):
    log = str(_job_log(tmp_path))
    one = cli(log, "--top", "1", "--per-rank")
    assert one.returncode == 0, one.stderr
    assert "… 2 more sizes (see --csv)" in one.stdout
    every = cli(log, "--top", "0", "--per-rank", "--per-comm")  # 0 = all, in the breakdown tables too
    assert every.returncode == 0, every.stderr
    assert "more sizes" not in every.stdout and "more rows" not in every.stdout
    per_rank = every.stdout.split("per rank:")[1].split("per communicator:")[0]
    assert sum(line.split()[0].isdigit() for line in per_rank.splitlines() if line.strip()) == 24  # 8 ranks x 3 ops


def test_commands_nccl_and_rccl(tmp_path, cli):
    res = cli(str(_job_log(tmp_path)), "--commands")
    assert res.returncode == 0, res.stderr
    cmds = [line for line in res.stdout.splitlines() if line.startswith("./build/")]
    assert f"./build/all_gather_perf -b {LAYER * 2 * 8} -e {LAYER * 2 * 8} -d bfloat16 -n 20 -w 5 -g 8" in cmds
    assert any(
        c.startswith(f"./build/reduce_scatter_perf -b {LAYER * 4 * 8} ") and "-d float -o avg" in c for c in cmds
    )
    assert any(c.startswith("./build/all_reduce_perf -b 4 ") and "-o max" in c for c in cmds)
    res = cli(str(_job_log(tmp_path, rccl=True)), "--commands", "--gpus-per-node", "4")
    cmds = [line for line in res.stdout.splitlines() if "_perf" in line and not line.startswith("#")]
    assert "rccl-tests commands" in res.stdout
    assert all(c.startswith("mpirun -np 8 -H node0:4,node1:4 ") and c.endswith("-g 1") for c in cmds), cmds


def test_fp8_rccl_name_and_premulsum_flag(tmp_path, cli):
    log = tmp_path / "fp8.log"
    log.write_text(call_line("AllReduce", 1, 1024, 10, redop=5, style=LineStyle(rccl_task=(0, 0))) + "\n")
    res = cli(str(log), "--commands")
    assert "-d fp8_e4m3 -o mulsum" in res.stdout, res.stdout


def test_stdin_input(run, tmp_path):
    text = call_line("AllReduce", 1, 256, 7) + "\n"
    res = subprocess.run(
        [sys.executable, "-m", "opbench.trace", "-"], input=text, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0 and "AllReduce" in res.stdout, res.stderr


def test_missing_file_is_usage_error(run, tmp_path):
    res = run("opbench.trace", str(tmp_path / "nope.log"))
    assert res.returncode == 2
    assert "nope.log" in res.stderr and "Traceback" not in res.stderr
    res = run("opbench", "trace", str(tmp_path))  # a directory, via the opbench dispatcher
    assert res.returncode == 2 and "directory" in res.stderr


def test_log_without_calls_exits_1(cli, tmp_path):
    log = tmp_path / "empty.log"
    log.write_text("hello\nNCCL INFO Bootstrap : Using eth0\n")
    res = cli(str(log))
    assert res.returncode == 1 and "NCCL_DEBUG_SUBSYS=COLL" in res.stderr
    assert res.stderr.startswith(f"opbench trace: {log}: no NCCL calls found")  # which tool, which file


def test_replay_dry_run_builds_torchrun_command(cli, tmp_path, monkeypatch):
    log = _job_log(tmp_path)
    res = cli(str(log), "--replay", "--dry-run", "--replay-arg=--quick")
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("replay: "))
    assert line == f"replay: torchrun --standalone --nproc-per-node=8 -m opbench.comm --sizes-from-trace {log} --quick"
    fake_stdin = io.TextIOWrapper(io.BytesIO(("x\n" + call_line("AllReduce", 1, 8, 7) + "\n").encode()))
    monkeypatch.setattr(sys, "stdin", fake_stdin)
    res = cli("-", "--replay")
    assert res.returncode == 2 and "stdin" in res.stderr


def test_compare_fsdp_matches_reference_llama3_70b_layer_count(cli, tmp_path):
    """A real Llama-3-70B NCCL trace at 8 ranks shows layer count 106956800 (docs/conventions.md, "FSDP
    collective sizes"). Two steps of a log with that layer count (and a root count the model does not predict)
    against the FSDP2 model."""
    import itertools

    from synth_trace import fsdp_job_lines

    per_step = 8 * (1 + 80 + 160 + 2)
    lines = itertools.islice(
        fsdp_job_lines(nranks=8, layers=80, layer_count=LAYER, root_count=131334144, torn_every=0, noise_every=0),
        2 * per_step,
    )
    log = tmp_path / "llama70b.log"
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "s.csv"
    res = cli(str(log), "--compare-fsdp", "Llama3.1_70B", "--csv", str(out))
    assert res.returncode == 1, res.stderr  # a check: the root's units do not match
    assert "FSDP check: 2 of 162 predicted units do not match the log (exit 1)" in res.stdout
    assert "param bf16, reduce bf16" in res.stdout  # FSDP2's default: reduce in the param dtype, with avg
    assert "the log covers 2 step(s); 160 of 162 predicted AllGather/ReduceScatter units matched" in res.stdout
    assert "0 logged but not matching, 2 not in the log" in res.stdout
    rows = list(csv.DictReader((tmp_path / "s_fsdp.csv").open()))
    layers = [r for r in rows if r["unit"].startswith("layers.")]
    assert len(layers) == 160 and all(r["matched"] == "True" and r["count"] == str(LAYER) for r in layers)
    assert {r["steps_in_log"] for r in layers} == {"2"}
    assert {(r["collective"], r["expected_log_calls"], r["log_calls"]) for r in layers} == {
        ("all_gather", "2560", "2560"),  # 80 layers × 2 per step (forward, backward) × 2 steps × 8 ranks
        ("reduce_scatter", "1280", "1280"),
    }
    assert [r["matched"] for r in rows if r["unit"] == "root"] == ["False", "False"]
    assert "log sizes the model does not predict (2)" in res.stdout


def test_compare_fsdp_partial_step_does_not_match(cli, tmp_path):
    """96 log lines (a sliver of one step) have the right sizes but not the right number of calls: nothing of
    the layers matches, and the console says how much of a step the log holds."""
    import itertools

    from synth_trace import fsdp_job_lines

    log = tmp_path / "part.log"
    lines = fsdp_job_lines(nranks=8, layers=80, layer_count=LAYER, torn_every=0, noise_every=0)
    log.write_text("\n".join(itertools.islice(lines, 96)) + "\n")
    res = cli(str(log), "--compare-fsdp", "Llama3.1_70B")
    assert res.returncode == 1, res.stderr  # not this model's step: the check fails
    assert "the log covers 0.069 of a step; 1 of 162 predicted AllGather/ReduceScatter units matched" in res.stdout
    assert "1280 log lines expected for 1 step(s) × 8 ranks, 88 logged" in res.stdout


def test_compare_fsdp_checks_dtype_and_reduction_too(cli, tmp_path):
    """A job that reduces in fp32 (torchtitan sets MixedPrecisionPolicy.reduce_dtype) matches on counts only,
    and is told which flag says so; with that flag, every layer matches."""
    import itertools

    from synth_trace import fsdp_job_lines

    lines = fsdp_job_lines(nranks=8, layers=80, layer_count=LAYER, torn_every=0, noise_every=0, reduce=(7, 4))
    log = tmp_path / "titan.log"
    log.write_text("\n".join(itertools.islice(lines, 8 * (1 + 80 + 160 + 2))) + "\n")
    out = tmp_path / "s.csv"
    res = cli(str(log), "--compare-fsdp", "Llama3.1_70B", "--csv", str(out))
    assert res.returncode == 1, res.stderr
    assert "81 of 162 predicted AllGather/ReduceScatter units matched" in res.stdout
    assert "81 logged but not matching, 0 not in the log" in res.stdout
    assert "model bf16/avg, log fp32/avg" in res.stdout and "--reduce-dtype fp32" in res.stdout
    rs = [r for r in csv.DictReader((tmp_path / "s_fsdp.csv").open()) if r["collective"] == "reduce_scatter"]
    assert {(r["dtype"], r["redop"], r["log_dtype"], r["log_redop"], r["matched"]) for r in rs} == {
        ("bf16", "avg", "fp32", "avg", "False")
    }
    titan = cli(str(log), "--compare-fsdp", "Llama3.1_70B", "--reduce-dtype", "fp32")
    assert "162 of 162 predicted AllGather/ReduceScatter units matched" in titan.stdout
    assert titan.returncode == 0 and "FSDP check" not in titan.stdout


def test_compare_fsdp_unknown_model_is_usage_error(cli, tmp_path):
    res = cli(str(_job_log(tmp_path)), "--compare-fsdp", "NoSuchModel")
    assert res.returncode == 2 and "NoSuchModel" in res.stderr


@pytest.mark.slow
def test_replay_runs_the_torchrun_comm_benchmark(tmp_path):
    """--replay for real: torchrun with 2 gloo ranks times the logged sizes via opbench.comm."""
    lines = []
    for oc in range(2):
        for d in range(2):
            kw = dict(pid=100 + d, device=d, comm=f"0xa{d}", nranks=2)
            lines += [call_line("AllGather", oc, 4096, 7, **kw), call_line("AllReduce", oc, 1024, 7, **kw)]
    log = tmp_path / "job.log"
    log.write_text("\n".join(lines) + "\n")
    rep = tmp_path / "rep"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "opbench.trace",
            str(log),
            "--replay",
            f"--replay-arg=--report-dir-path={rep}",
            "--replay-arg=--iters=2",
            "--replay-arg=--trials=1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    ag = list(csv.DictReader((rep / "all_gather_benchmark.csv").open()))
    ar = list(csv.DictReader((rep / "all_reduce_benchmark.csv").open()))
    assert ag and ar
    # the logged per-rank counts come back as nccl-tests sizes: AllGather 4096 fp32 x 2 ranks, AllReduce 1024 fp32
    assert {int(r["size_bytes"]) for r in ag} == {4096 * 4 * 2} and {int(r["size_bytes"]) for r in ar} == {4096}


def test_human_bytes_keeps_three_digit_values_readable():
    from opbench.core.units import human_bytes

    # 262669312 fp32 elements: the root ReduceScatter of Llama-3-70B at 8 ranks (was printed "1e+03 MiB")
    assert human_bytes(262669312 * 4) == "1002 MiB"
    assert [human_bytes(v) for v in (1536, 1 << 30, 213913600, 0, None)] == ["1.5 KiB", "1 GiB", "204 MiB", "0 B", ""]


def test_only_known_op_names_count_and_a_damaged_gzip_exits_1(tmp_path, cli):
    """A line torn inside its op name ('duceScatter') or with damaged bytes ('ReduceSc7tter') is no call; a .gz
    whose stream breaks keeps what came before, says so, and exits 1."""
    good = [call_line("ReduceScatter", i, 4096, 7, device=d, pid=10 + d) for i in range(3) for d in range(2)]
    bad = [
        call_line("ReduceScatter", 9, 77, 7).replace("ReduceScatter", name)
        for name in ("duceScatter", "ReduceSc7tter", "r")
    ]
    log = tmp_path / "job.log"
    log.write_text("\n".join([*good, *bad]) + "\n")
    out = tmp_path / "sum.csv"
    res = cli(str(log), "--csv", str(out))
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(out.open()))
    assert {(r["op"], r["count"]) for r in rows} == {("ReduceScatter", "4096")}
    assert "3 call line(s) with no NCCL/RCCL op name skipped" in res.stderr and "'duceScatter' (1)" in res.stderr

    text = "\n".join(call_line("AllReduce", i, 8, 7) for i in range(4000)) + "\n"
    data = bytearray(gzip.compress(text.encode()))
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)  # damaged mid-stream
    gz = tmp_path / "bad.log.gz"
    gz.write_bytes(bytes(data))
    res = cli(str(gz), "--csv", str(out))
    assert res.returncode == 1 and "stopped reading early" in res.stderr and "Traceback" not in res.stderr
    assert out.exists() and sum(int(r["calls"]) for r in csv.DictReader(out.open())) < 4000


# -- issue 25: bounded numbers, replay ranks, names in printed output, --jobs ------------------------------------
def test_out_of_range_numbers_are_skipped_and_counted_or_exit_2_when_every_call_is(cli, tmp_path):
    """A 400-digit count (an OverflowError in the byte formatter before) and a 5000-digit one (int() refuses it)
    are skipped calls counted in the summary; a log with nothing but such calls is one line naming file:line
    and field, exit 2."""
    good = call_line("AllReduce", 1, 1024, 7)
    bad = [
        call_line("AllReduce", 2, int("9" * 400), 7),
        call_line("AllGather", 3, 8, 7).replace("8 datatype", "9" * 5000 + " datatype"),
    ]
    huge_ranks = call_line("AllReduce", 4, 8, 7, nranks=99999999)
    log = tmp_path / "mixed.log"
    log.write_text("\n".join([good, *bad, huge_ranks, good]) + "\n")
    res = cli(str(log), "--csv", str(tmp_path / "s.csv"))
    assert res.returncode == 0, res.stderr
    assert "3 call(s) skipped" in res.stderr and "count (2)" in res.stderr and "nranks (1)" in res.stderr
    assert "Traceback" not in res.stderr
    [row] = list(csv.DictReader((tmp_path / "s.csv").open()))
    assert (row["op"], row["count"], row["calls"]) == ("AllReduce", "1024", "2")

    only_bad = tmp_path / "bad.log"
    only_bad.write_text("some output\n" + bad[0] + "\n")
    res = cli(str(only_bad))
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert f"{only_bad}:2: field 'count'" in res.stderr and "out of range" in res.stderr


def test_replay_never_launches_more_ranks_than_asked(cli, tmp_path):
    """A log claiming 99999999 ranks (within the bounds: 4 Mi is the most) or 3 Mi: the replay uses
    --nproc-per-node, else the log's nranks capped at --gpus-per-node, and says so."""
    log = tmp_path / "big.log"
    log.write_text("\n".join(call_line("AllReduce", i, 1024, 7, nranks=3_000_000) for i in range(3)) + "\n")
    res = cli(str(log), "--replay", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "--nproc-per-node=8 " in res.stdout and "3,000,000 ranks; replaying with 8" in res.stdout
    res = cli(str(log), "--replay", "--dry-run", "--nproc-per-node", "2", "--gpus-per-node", "4")
    assert "--nproc-per-node=2 " in res.stdout and "3000000" not in res.stdout.split("replay: ")[1]


def test_replay_of_a_log_with_a_comma_in_its_name_prints_a_command_that_works(cli, tmp_path):
    """The printed command gives --sizes-from-trace once per log; opbench comm's own parser reads it back to the
    very files, and the credentials in --replay-arg are masked."""
    import shlex

    from opbench.comm.__main__ import build_parser as comm_parser

    one = tmp_path / "a,b.log"
    two = tmp_path / "c d.log"
    for log in (one, two):
        log.write_text("\n".join(call_line("AllReduce", i, 1024, 7, nranks=2) for i in range(2)) + "\n")
    res = cli(str(one), str(two), "--replay", "--dry-run", "--replay-arg=--token=hunter2")
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("replay: "))
    assert "hunter2" not in line
    argv = shlex.split(line.removeprefix("replay: "))
    assert argv[:5] == ["torchrun", "--standalone", "--nproc-per-node=2", "-m", "opbench.comm"]
    comm_args, _ = comm_parser().parse_known_args(argv[5:])
    assert comm_args.sizes_from_trace == [str(one), str(two)]
    assert [s.count for s in trace_sizes(comm_args.sizes_from_trace)] == [1024]


def test_names_from_a_log_reach_the_console_without_control_characters(cli, tmp_path):
    log = tmp_path / "esc.log"
    lines = [call_line("AllReduce", i, 1024, 7, host="evil\x1bhost", comm="0x1\x1b]0;x\x07") for i in range(2)]
    log.write_text("\n".join(lines) + "\n")
    res = cli(str(log), "--per-rank", "--per-comm")
    assert res.returncode == 0, res.stderr
    assert "evil?host" in res.stdout and "\x1b" not in res.stdout and "\x07" not in res.stdout


def test_jobs_2_gives_what_jobs_1_gives(cli, tmp_path, monkeypatch):
    """A mixed job log (all-to-alls as grouped Send/Recv, torn lines, four formats) cut into 64 KiB pieces read
    by 2 processes: every table is the same as one process's; and the CLI's CSVs for two logs are identical."""
    from synth_trace import write_log

    log = tmp_path / "mixed.log"
    write_log(str(log), 3_000_000, job="mixed")
    monkeypatch.setenv(trace.READER_ENV, "python")  # the Python workers (test_trace_native.py: the native ones)
    monkeypatch.setattr(trace, "SPLIT_MIN", 0)
    monkeypatch.setattr(trace, "PIECE", 64 << 10)
    assert len(list(trace.split_pieces([str(log)], 2))) > 40
    one, p1 = trace.analyze([str(log)])
    two, p2 = trace.analyze([str(log)], jobs=2)
    assert two.summary_rows() == one.summary_rows()
    assert two.per_rank_rows(p2.inits) == one.per_rank_rows(p1.inits)
    assert two.per_comm_rows(p2.inits) == one.per_comm_rows(p1.inits)
    assert p2.stats.as_dict() == p1.stats.as_dict() and p1.stats.calls > 10_000
    assert any(r["note"] for r in one.summary_rows())  # all-to-alls were grouped across piece boundaries

    small = _job_log(tmp_path)
    for jobs in ("1", "2"):
        assert cli(str(log), str(small), "--jobs", jobs, "--csv", str(tmp_path / f"j{jobs}.csv")).returncode == 0
    assert (tmp_path / "j1.csv").read_text() == (tmp_path / "j2.csv").read_text()


def test_a_wrong_compare_fsdp_model_is_one_line_before_the_log_is_read(tmp_path, capsys):
    """--compare-fsdp Foo: the error names the flag the user typed, and comes before any parse or CSV."""
    log = tmp_path / "big.log"
    log.write_text("x\n")
    csv_path = tmp_path / "out" / "sizes.csv"
    code = run_cli(trace_main, [str(log), "--compare-fsdp", "Foo", "--csv", str(csv_path)], prog="opbench trace")
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "field '--compare-fsdp': neither a file nor a built-in model: unknown model 'Foo'" in err
    assert not csv_path.parent.exists()
