"""Collective benchmark: size rules, groups, launch detection, check values, and the CLI in one process."""

from __future__ import annotations

import time

import pytest
import torch

from opbench.comm.__main__ import main
from opbench.comm.flags import REFUSED
from opbench.comm.ops import OPS, Buffers, Ctx, count_wrong, fill_for_check
from opbench.comm.sizes import (
    CommCase,
    CommGroups,
    actual_size,
    count_for,
    group_layout,
    model_cases,
    sweep_bytes,
    trace_cases,
)
from opbench.core.errors import UsageError, run_cli
from opbench.models import load_model_configs
from opbench.trace.analyze import TraceSize


# -- sizes --------------------------------------------------------------------------------------------------
def test_sweep_follows_nccl_tests_loop():
    assert sweep_bytes(8, 128, 1 << 20, 2) == [8, 16, 32, 64, 128]
    assert sweep_bytes(1000, 3500, 1000, 1) == [1000, 2000, 3000]  # additive -i when -f is 1
    assert sweep_bytes(32 << 20, 32 << 20, 1 << 20, 1) == [32 << 20]  # nccl-tests defaults: one size
    assert sweep_bytes(3, 100, 1, 10) == [3, 30]  # stops before passing -e


@pytest.mark.parametrize(
    "args, field",
    [
        ((8, 4, 1, 2), "--maxbytes"),
        ((0, 4, 1, 2), "--minbytes"),
        ((8, 64, 0, 1), "--stepbytes"),
        ((8, 64, 1, 0), "--stepfactor"),
    ],
)
def test_sweep_rejects_bad_bounds(args, field):
    with pytest.raises(UsageError, match=field):
        sweep_bytes(*args)


def test_counts_round_down_like_nccl_tests():
    # all_gather: size = count·n·elt with count per rank; 1000 B of fp32 on 3 ranks -> 83 per rank, 996 B printed
    case = CommCase("all_gather", 1000, "fp32", "t")
    assert count_for(case, 3) == 83 and actual_size(case, 3) == 996
    # all_reduce: count = size / elt, whatever n
    assert count_for(CommCase("all_reduce", 1000, "bf16", "t"), 3) == 500
    # all_to_all: count is per peer
    assert count_for(CommCase("all_to_all", 3072, "fp32", "t"), 3) == 256


def test_group_layout_tiles_the_world():
    assert group_layout(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert group_layout(8, 2, 4) == [[0, 4], [1, 5], [2, 6], [3, 7]]  # pipeline stages, world/pp apart
    assert group_layout(16, 2, 4) == [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15]]
    for size, stride in ((2, 1), (2, 2), (4, 2)):
        flat = sorted(r for g in group_layout(16, size, stride) for r in g)
        assert flat == list(range(16))
    with pytest.raises(UsageError):
        group_layout(6, 4)


def test_model_sizes_dense_and_moe():
    llama = load_model_configs(None, None)
    by = {m.name: m for m in llama}
    par = CommGroups.resolve(16, tp=8, ep=None, pp=2)
    cases = {
        c.collective: c
        for c in model_cases(
            by["Llama3.1_8B"],
            ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"],
            16,
            par,
            mbs=2,
            seqlen=4096,
            dtype="bf16",
        )
    }
    act = 2 * 4096 * 4096 * 2
    assert set(cases) == {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}  # dense: no all-to-all
    assert cases["all_reduce"].size_bytes == act and cases["all_reduce"].group_size == 8
    assert count_for(cases["all_gather"], 8) == 2 * 4096 * 4096 // 8  # per-rank shard
    assert (cases["send_recv"].group_size, cases["send_recv"].group_stride) == (2, 8)
    assert "Llama3.1_8B" in cases["all_reduce"].source and "tp=8" in cases["all_reduce"].source

    mixtral = by["Mixtral_8x7B"]
    par = CommGroups.resolve(64, tp=8, ep=8, pp=1)
    (a2a,) = model_cases(mixtral, ["all_to_all", "send_recv"], 64, par, mbs=1, seqlen=None, dtype="bf16")
    # a rank dispatches its own T/tp tokens (MoE under TP runs sequence-parallel), top_k copies each
    assert a2a.size_bytes == 1 * mixtral.seqlen // 8 * mixtral.num_experts_per_tok * mixtral.hidden_size * 2
    assert (a2a.group_size, a2a.group_stride) == (8, 8)  # EP ranks tp apart (Megatron order)
    assert "mbs·seq/tp·top_k·hidden=1·4096/8·2·4096 ep=8" in a2a.source
    no_tp = CommGroups.resolve(64, tp=1, ep=8, pp=1)
    (a2a,) = model_cases(mixtral, ["all_to_all"], 64, no_tp, mbs=1, seqlen=4096, dtype="bf16")
    assert a2a.size_bytes == 4096 * 2 * 4096 * 2 and (a2a.group_size, a2a.group_stride) == (8, 1)
    with pytest.raises(UsageError, match="do not split over tp=8"):
        model_cases(mixtral, ["all_to_all"], 64, par, mbs=1, seqlen=4100, dtype="bf16")
    assert model_cases(mixtral, ["all_reduce"], 64, par, mbs=1, seqlen=4100, dtype="bf16")  # no all-to-all asked
    with pytest.raises(UsageError, match="--tp"):
        CommGroups.resolve(6, tp=4, ep=None, pp=None)


def test_trace_cases_keep_per_rank_count():
    sizes = [
        TraceSize("all_gather", 1000, 9, 8, None, 16),
        TraceSize("reduce_scatter", 10, 7, 2, "sum", 4),
        TraceSize("reduce", 5, 7, 2, "sum", 2),
        TraceSize("all_reduce", 7, 7, 2, "premulsum", 2),
    ]
    cases, notes = trace_cases(sizes, ["all_gather", "reduce_scatter", "all_reduce"], 4, "trace:x.log")
    ar, ag, rs = cases  # collective order of the benchmark
    assert (ag.collective, ag.group_size, ag.dtype, count_for(ag, 4)) == ("all_gather", 4, "bf16", 1000)
    assert "nranks=8" in ag.source and "run on 4" in ag.source
    assert rs.group_size == 2 and count_for(rs, 2) == 10
    assert ar.redop == "sum" and "premulsum timed as sum" in ar.source
    assert any("reduce" in n for n in notes)


# -- check values: simulate each collective on 3 "ranks" with plain tensor ops -------------------------------------
def _simulate(name: str, ctxs: list[Ctx], bufs: list[Buffers]) -> None:
    n, c = len(ctxs), ctxs[0].count
    sends = [b.send.clone() for b in bufs]
    if name == "all_reduce":
        for b in bufs:
            b.recv.copy_(sum(sends))
    elif name == "all_gather":
        for b in bufs:
            b.recv.copy_(torch.cat(sends))
    elif name == "reduce_scatter":
        total = sum(sends)
        for r, b in enumerate(bufs):
            b.recv.copy_(total[r * c : (r + 1) * c])
    elif name == "all_to_all":
        for r, b in enumerate(bufs):
            b.recv.copy_(torch.cat([sends[q][r * c : (r + 1) * c] for q in range(n)]))
    elif name == "all_to_all_v":  # rank q's block for r starts after what q sends the ranks before r
        s = ctxs[0].splits
        assert s is not None
        for r, b in enumerate(bufs):
            b.recv.copy_(torch.cat([sends[q][sum(s[q][:r]) : sum(s[q][: r + 1])] for q in range(n)]))
    elif name == "send_recv":
        for r, b in enumerate(bufs):
            b.recv.copy_(sends[(r - 1) % n])
    elif name == "broadcast":
        for b in bufs:
            b.recv.copy_(sends[0])


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_check_values_are_exact_and_catch_one_bad_element(name, dtype):
    op = OPS[name]
    if dtype == torch.float8_e4m3fn and op.reduces:
        dtype = torch.bfloat16  # CPU torch has no fp8 add; the values themselves are fp8-exact
    splits = ((5, 0, 30), (7, 7, 7), (0, 13, 2)) if name == "all_to_all_v" else None  # empty blocks included
    for inplace in op.variants:
        ctxs = [Ctx(None, (0, 1, 2), r, 40, dtype, torch.device("cpu"), splits=splits) for r in range(3)]
        bufs = [op.alloc(ctx, inplace) for ctx in ctxs]
        for ctx, b in zip(ctxs, bufs):
            fill_for_check(op, ctx, b)
        _simulate(name, ctxs, bufs)
        assert [count_wrong(op, ctx, b) for ctx, b in zip(ctxs, bufs)] == [0, 0, 0], (name, inplace)
        one = bufs[1].recv[5:6]
        one.copy_((one.float() + 1).to(dtype))
        assert count_wrong(op, ctxs[1], bufs[1]) == 1


# -- the CLI in this process: one rank is refused; plans (--dry-run) need no ranks -------------------------------
def test_a_world_of_one_rank_is_refused_in_one_line(tmp_path, capsys):
    """A real one-rank gloo world (this process): nothing crosses a link, so nothing is timed or written — one line,
    exit 2 (NCCL on one GPU printed an in-place all_reduce at 0.06 µs, 17 million GB/s). The plan says the same."""
    out = tmp_path / "r"
    assert run_cli(main, ["-b", "1K", "-n", "2", "-w", "0", "--report-dir-path", str(out)], prog="opbench comm") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a world of 1 rank has no link to measure" in err[0] and "--nproc-per-node 2" in err[0]
    assert not out.exists()
    assert run_cli(main, ["--dry-run", "-b", "1K"], prog="opbench comm") == 2
    assert "a world of 1 rank has no link to measure" in capsys.readouterr().err


def _plan(capsys, *argv):
    assert run_cli(main, ["--dry-run", "--nproc-per-node", "2", *argv], prog="opbench comm") == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "name, ours, tests_name",
    [("float", "fp32", "float"), ("half", "fp16", "half"), ("bfloat16", "bf16", "bfloat16"), ("double", "fp64", "double"),
     ("f8e4m3", "fp8", "f8e4m3"), ("int8", "int8", "int8"), ("fp16", "fp16", "half")],
)  # fmt: skip
def test_dtype_takes_nccl_tests_type_names(capsys, name, ours, tests_name):
    """-d takes nccl-tests' type names beside opbench's: the plan runs that type and the line prints it back."""
    out = _plan(capsys, "-d", name, "-b", "1K", "--collectives", "all_gather")
    assert out.splitlines()[2].split()[:4] == ["all_gather", "1024", str(1024 // 2 // ELT[ours]), ours]
    assert f"./build/all_gather_perf -b 1024 -e 1024 -d {tests_name} -n 20 -w 5 -g 2" in out


ELT = {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8, "fp8": 1, "int8": 1}


def test_nccl_tests_flags_stay_in_the_generated_lines(capsys):
    """-z, -a, -m, -N, -c, -r and -T keep nccl-tests' spelling in the lines opbench prints, so the reference tool runs
    what opbench runs; nccl-tests' defaults are left out."""
    out = _plan(capsys, "-b", "1K", "--collectives", "all_reduce,broadcast", "-z", "3", "-a", "0", "-m", "4", "-N", "2",
                "-c", "2", "-r", "1", "-T", "60")  # fmt: skip
    assert (
        "./build/all_reduce_perf -b 1024 -e 1024 -d bfloat16 -o sum -n 20 -w 5 -g 2 -z 3 -a 0 -m 4 -N 2 -c 2 -T 60"
        in out
    )
    assert (
        "./build/broadcast_perf -b 1024 -e 1024 -d bfloat16 -n 20 -w 5 -g 2 -r 1 -z 3 -a 0 -m 4 -N 2 -c 2 -T 60" in out
    )
    plain = _plan(capsys, "-b", "1K", "--collectives", "all_reduce", "-z", "0", "-a", "1", "-m", "1", "-N", "1")
    assert plain.rstrip().endswith("./build/all_reduce_perf -b 1024 -e 1024 -d bfloat16 -o sum -n 20 -w 5 -g 2")


@pytest.mark.parametrize("short, long", list(REFUSED))
def test_nccl_tests_flags_not_offered_are_refused_by_name(capsys, short, long):
    for argv in ([short, "1"], [long, "1"], [short]):
        assert run_cli(main, [*argv, "--dry-run", "--nproc-per-node", "2"], prog="opbench comm") == 2
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert f"nccl-tests' {short} ({long}) is not offered: {REFUSED[(short, long)]}" in err


@pytest.mark.parametrize(
    "argv, needle",
    [(["-d", "all"], "'all' (nccl-tests: every type in turn) is not offered"), (["-d", "uint64"], "is not a type"),
     (["-o", "mulsum"], "not a torch.distributed ReduceOp"), (["-o", "all"], "every reduction in turn"),
     (["-z", "4"], "blocking modes are 0, 1, 2 and 3"), (["-a", "5"], "0 = rank 0, 1 = average"),
     (["-N", "0"], "run until killed"), (["-m", "0"], "calls aggregated per iteration"), (["-T", "0"], "no timeout")],
)  # fmt: skip
def test_nccl_tests_values_opbench_cannot_honour(capsys, argv, needle):
    assert run_cli(main, [*argv, "--dry-run", "--nproc-per-node", "2"], prog="opbench comm") == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert needle in err


def _nccl_log(path, nranks, *counts):
    path.write_text(
        "".join(
            f"gpu1:77:88 [0] NCCL INFO AllReduce: opCount {i} sendbuff 0x1 recvbuff 0x2 count {n} datatype 9 op 0 "
            f"root 0 comm 0xa [nranks={nranks}] stream 0xb\n"
            for i, n in enumerate(counts)
        )
    )
    return path


def test_sizes_from_trace_repeated_keeps_a_comma_in_a_file_name(tmp_path, capsys):
    """A log named a,b.log survives (an existing file is one log), the flag may be repeated, comma lists still work;
    a call logged on one rank is left out with a note (nothing crosses a link)."""
    comma = _nccl_log(tmp_path / "a,b.log", 2, 300)
    other = _nccl_log(tmp_path / "other.log", 2, 500)
    alone = _nccl_log(tmp_path / "alone.log", 1, 700)
    out = _plan(capsys, "--sizes-from-trace", str(comma), "--sizes-from-trace", f"{other},{alone}")
    planned = [line.split() for line in out.splitlines() if line.startswith("all_reduce ")]
    assert [p[2] for p in planned] == ["300", "500"] and all(p[3] == "bf16" for p in planned)
    assert "trace:a,b.log,other.log,alone.log nranks=2 calls=1" in out
    assert "# note: 1 case(s) on groups of 1 rank left out: one rank has no link to measure" in out


def test_a_trace_plan_keeps_each_calls_own_datatype(tmp_path, capsys):
    """A log with an fp32 and a bf16 AllReduce of count 1024: the plan and its nccl-tests lines say fp32/float for
    the first (4096 bytes) and bf16/bfloat16 for the second, as the real run times them."""
    log = tmp_path / "two.log"
    log.write_text(
        "".join(
            f"gpu1:77:88 [0] NCCL INFO AllReduce: opCount {i} sendbuff 0x1 recvbuff 0x2 count 1024 datatype {dt} "
            f"op 0 root 0 comm 0xa [nranks=2] stream 0xb\n"
            for i, dt in enumerate((7, 9))  # NCCL's float32, bfloat16
        )
    )
    out = _plan(capsys, "--sizes-from-trace", str(log))
    planned = sorted(tuple(line.split()[1:4]) for line in out.splitlines() if line.startswith("all_reduce "))
    assert planned == [("2048", "1024", "bf16"), ("4096", "1024", "fp32")]
    assert "-b 4096 -e 4096" in out and "-d float" in out and "-b 2048 -e 2048" in out and "-d bfloat16" in out


def test_printed_names_cannot_start_a_line(tmp_path, capsys):
    """A model name with a newline (from --model-name or a config) is printed with the newline made visible."""
    cfg = tmp_path / "config.json"
    cfg.write_text(
        '{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, '
        '"num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 100}'
    )
    named = ["--model-config-path", str(cfg), "--model-name", "m\ntouch /tmp/x", "--tp", "2"]
    out = _plan(capsys, *named, "--seqlen", "8")
    assert not [line for line in out.splitlines() if line.startswith("touch")]
    assert "m?touch /tmp/x: TP all-reduce" in out
    assert run_cli(main, ["--dry-run", "--nproc-per-node", "2", *named], prog="opbench comm") == 2  # no seqlen
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "model m?touch /tmp/x has no seqlen" in err


def test_timed_loop_follows_nccl_tests_blocking_and_aggregation():
    """-m N calls per iteration, time per call; -z 1 waits and barriers after every call (timed), -z 3 once per
    iteration with the barrier outside the timing, -z 0 never."""
    from opbench.comm.bench import timed_loop

    calls, barriers = [], []
    cpu = torch.device("cpu")

    def barrier():
        barriers.append(1)
        time.sleep(0.02)

    for blocking, per_call_barrier in ((0, 0), (1, 1), (2, 0)):
        calls.clear(), barriers.clear()
        t, _ = timed_loop(lambda: calls.append(1), 3, cpu, blocking, None, 0.0, 2, barrier)
        assert len(calls) == 6 and len(barriers) == 6 * per_call_barrier
        assert (t >= 0.02) == bool(per_call_barrier)  # the barrier is inside the timing for -z 1
    calls.clear(), barriers.clear()
    per_call: list[float] = []
    t, _ = timed_loop(lambda: calls.append(1), 3, cpu, 3, per_call, 0.0, 2, barrier)
    assert len(calls) == 6 and len(barriers) == 3 and len(per_call) == 3 and t < 0.01


def test_average_picks_the_ranks_time_as_nccl_tests_a():
    from opbench.comm.bench import combine_ranks

    per_trial = torch.tensor([[3.0, 1.0], [1.0, 5.0], [2.0, 3.0]])  # 3 ranks x 2 trials
    assert combine_ranks(per_trial, 0) == [3.0, 1.0]
    assert combine_ranks(per_trial, 1) == [2.0, 3.0]
    assert combine_ranks(per_trial, 2) == [1.0, 1.0]
    assert combine_ranks(per_trial, 3) == [3.0, 5.0]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--collectives", "all_reduce,bogus"], "--collectives"),
        (["-b", "8M", "-e", "1M"], "--maxbytes"),
        (["--model-config-path", "/no/such.json"], "/no/such.json"),
        (["--sizes-from-trace", "/no/such.log"], "/no/such.log"),
        (["--timeout", "0"], "--timeout"),
        (["--model", "Llama3.1_8B", "--tp", "3"], "3 does not divide the world size 1"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, needle, tmp_path, capsys):
    assert run_cli(main, [*argv, "--report-dir-path", str(tmp_path)], prog="opbench comm") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "Traceback" not in err[0]


def test_dry_run_plans_every_mbs_with_nccl_tests_lines(run):
    """Primus' scripts sweep micro-batch sizes: --mbs is a list, and --dry-run prints each planned case and its
    nccl-tests / rccl-tests line without launching ranks."""
    r = run(
        "opbench", "comm", "--dry-run", "--nproc-per-node", "8", "--model", "Llama3.1_8B", "--tp", "2", "--mbs", "1,2"
    )
    assert r.returncode == 0, r.stderr
    ar = [line for line in r.stdout.splitlines() if line.startswith("all_reduce ")]
    assert len(ar) == 2 and "mbs·seq·hidden=1·8192·4096" in ar[0] and "mbs·seq·hidden=2·8192·4096" in ar[1]
    assert ar[0].split()[1:3] == ["67108864", "33554432"] and ar[1].split()[1:3] == ["134217728", "67108864"]
    assert "./build/all_reduce_perf -b 67108864 -e 67108864 -d bfloat16 -o sum -n 20 -w 5 -g 2" in r.stdout
    assert "./build/all_reduce_perf -b 134217728 -e 134217728 -d bfloat16 -o sum -n 20 -w 5 -g 2" in r.stdout


def test_fp8_on_gloo_is_unsupported_not_an_error():
    """gloo has no fp8 type: every fp8 collective on a CPU is a row with status unsupported and the reason, as a
    backend without the kernel is elsewhere (it used to be status error, 'Invalid scalar type')."""
    from opbench.comm.bench import Bench, RunConfig
    from opbench.comm.sizes import CommCase
    from opbench.core import dist

    ranks = dist.Ranks.join(dist.single(), "cpu", 30)
    try:
        bench = Bench(RunConfig(iters=1, warmup=0, trials=1), ranks)
        for name in ("all_reduce", "all_gather"):
            row = bench.run_variant(CommCase(name, 1024, "fp8", "test"), OPS[name], False)
            assert row["status"] == "unsupported" and row["error"].endswith(
                "gloo has no fp8 type (NCCL/RCCL move fp8 on GPUs)"
            )
        row = bench.run_variant(CommCase("all_reduce", 1024, "bf16", "test"), OPS["all_reduce"], True)
        assert row["status"] == "ok"
    finally:
        ranks.stop()


# -- all_to_all_v: nccl-tests 2.19 alltoallv_perf sizes, splits from routing distributions ---------------------------
def test_alltoallv_size_is_the_busiest_ranks_traffic_as_nccl_tests_2_19():
    """alltoallv.cu (2.19): size = max over ranks of max(send, recv) (AlltoAllvComputeMaxCounts), algbw = size / time,
    busbw = algbw · (n−1)/n (AlltoAllvGetBw). Written out by hand here, not through the functions' own docstrings."""
    from opbench.core.collectives import COLLECTIVES, alltoallv_imbalance, alltoallv_size_elements

    s = [[1, 2, 0], [3, 4, 9], [0, 0, 1]]  # sends 3, 16, 1; receives 4, 6, 10
    assert alltoallv_size_elements(s) == 16 and alltoallv_imbalance(s) == pytest.approx(16 * 3 / 20)
    coll = COLLECTIVES["all_to_all_v"]
    assert (coll.binary, coll.nccl_op) == ("alltoallv_perf", "AlltoAllv")
    assert coll.busbw_gbs(16_000, 1e-6, 4) == pytest.approx(16_000 / 1e-6 / 1e9 * 3 / 4)


def test_zipf_and_balanced_splits_differ_as_stated():
    """balanced: every entry T·k/n·hidden; zipf: every rank sends T·k·hidden, the hot experts' owner (rank 0) gets
    the most and the receive totals never increase with rank; combine is dispatch's transpose; max-mean puts R times
    the mean on expert 0."""
    from opbench.comm.splits import SplitSpec
    from opbench.moe.routing import parse_routing

    def spec(text, direction="dispatch"):
        return SplitSpec(parse_routing(text), 64, 2, 8, 8, direction)

    assert spec("balanced").matrix(4) == [[256] * 4] * 4
    z = spec("zipf:1.2").matrix(4)
    sends, recvs = [sum(r) for r in z], [sum(col) for col in zip(*z)]
    assert sends == [64 * 2 * 8] * 4 and recvs == sorted(recvs, reverse=True) and recvs[0] > 2 * recvs[-1]
    assert sum(sends) == sum(recvs) == 4 * 4 * 256
    assert spec("zipf:1.2", "combine").matrix(4) == [list(col) for col in zip(*z)]
    copies, _ = spec("max-mean:2").expert_copies(4)
    assert copies[0] == 2 * 64 * 2 // 8 and sum(copies) == 128


def test_alltoallv_plan_sweep_and_model_dispatch_and_combine(capsys):
    """A -b size is what each rank dispatches; the printed size is the busiest rank's; a MoE model gives a dispatch
    and a combine case per routing; alltoallv_perf gets the matrix file it reads (bytes, row = sender)."""
    out = _plan(capsys, "-b", "64K", "-d", "fp32", "--collectives", "all_to_all_v", "--routing", "balanced,zipf:1.2",
                "--hidden", "64")  # fmt: skip
    bal, zipf = [line.split() for line in out.splitlines() if line.startswith("all_to_all_v")]
    assert bal[1:3] == ["65536", "8192"] and zipf[2] == "8192" and int(zipf[1]) > 65536
    assert f"NCCL_TESTS_ALLTOALLV_MATRIX_FILE=alltoallv_matrix_2.txt ./build/alltoallv_perf -b {zipf[1]}" in out
    model = _plan(capsys, "--model", "Mixtral_8x7B", "--seqlen", "16", "--collectives", "all_to_all_v", "-d", "fp32")
    cases = [line for line in model.splitlines() if line.startswith("all_to_all_v")]
    assert len(cases) == 2 and "EP dispatch" in cases[0] and "EP combine" in cases[1]
    assert cases[0].split()[1] == cases[1].split()[1] == str(16 // 2 * 2 * 4096 * 4)  # seq/tp·k·hidden·elt, balanced


@pytest.mark.parametrize(
    "content, needle",
    [("tokens\n3\nx\n", "field 'tokens': row 3"), ("[1, 2, 3]", "has 3 counts")],
)
def test_a_bad_histogram_is_one_line_naming_the_file_exit_2(tmp_path, capsys, content, needle):
    path = tmp_path / "hist.csv"
    path.write_text(content)
    argv = ["--dry-run", "--nproc-per-node", "2", "-b", "1M", "--collectives", "all_to_all_v"]
    assert run_cli(main, [*argv, "--routing", f"histogram:{path}"], prog="opbench comm") == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert str(path) in err and needle in err and "Traceback" not in err


def test_routing_precheck_follows_the_cases_that_use_it(tmp_path, capsys):
    """A histogram of the model's expert count runs with --model alone (the default sweep's 8 per rank is not
    asked); the same file with a sweep is refused naming the run's experts, not a model; max-mean states its E/k
    bound without a probe's token count."""
    path = tmp_path / "h8.txt"
    path.write_text("\n".join(["3"] * 8))  # Mixtral_8x7B: 8 experts
    argv = ["--collectives", "all_to_all_v", "--routing", f"histogram:{path}"]
    out = _plan(capsys, "--model", "Mixtral_8x7B", "--seqlen", "16", *argv)
    assert sum(line.startswith("all_to_all_v") for line in out.splitlines()) == 2
    base = ["--dry-run", "--nproc-per-node", "2", *argv]
    assert run_cli(main, [*base, "-b", "1M"], prog="opbench comm") == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "has 8 counts, the run has 16 experts" in err and "model" not in err
    mm = ["--dry-run", "--nproc-per-node", "2", "--collectives", "all_to_all_v", "--routing", "max-mean:100"]
    assert run_cli(main, mm, prog="opbench comm") == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "at most E/k = 16/2 = 8" in err and "tokens (" not in err and "1 tokens" not in err
