"""Collective benchmark: size rules, groups, launch detection, check values, and the CLI in one process."""

from __future__ import annotations

import csv
import sys
import types

import pytest
import torch

from opbench.comm.__main__ import main
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
    for inplace in op.variants:
        ctxs = [Ctx(None, (0, 1, 2), r, 40, dtype, torch.device("cpu")) for r in range(3)]
        bufs = [op.alloc(ctx, inplace) for ctx in ctxs]
        for ctx, b in zip(ctxs, bufs):
            fill_for_check(op, ctx, b)
        _simulate(name, ctxs, bufs)
        assert [count_wrong(op, ctx, b) for ctx, b in zip(ctxs, bufs)] == [0, 0, 0], (name, inplace)
        one = bufs[1].recv[5:6]
        one.copy_((one.float() + 1).to(dtype))
        assert count_wrong(op, ctxs[1], bufs[1]) == 1


# -- the CLI in this process (a one-rank world) ----------------------------------------------------------------
def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_one_rank_run_writes_contract_columns(tmp_path, capsys):
    rc = main(
        [
            "-b",
            "1K",
            "-e",
            "4K",
            "-f",
            "4",
            "--collectives",
            "all_reduce,all_gather,send_recv",
            "-n",
            "2",
            "-w",
            "1",
            "--trials",
            "2",
            "--check",
            "--report-dir-path",
            str(tmp_path),
        ]
    )
    assert rc == 0
    rows = _rows(tmp_path / "all_gather_benchmark.csv")
    contract = [
        "collective",
        "backend",
        "world_size",
        "nnodes",
        "dtype",
        "size_bytes",
        "count",
        "inplace",
        "time_us",
        "time_us_max",
        "algbw_gbs",
        "busbw_gbs",
        "wrong",
        "source",
    ]
    assert all(c in rows[0] for c in contract)
    assert [(r["size_bytes"], r["count"], r["inplace"]) for r in rows] == [
        ("1024", "256", "False"),
        ("1024", "256", "True"),
        ("4096", "1024", "False"),
        ("4096", "1024", "True"),
    ]
    assert all(
        r["backend"] == "gloo"
        and r["world_size"] == "1"
        and r["dtype"] == "fp32"
        and r["wrong"] == "0"
        and float(r["time_us"]) > 0
        and r["status"] == "ok"
        for r in rows
    )
    assert (tmp_path / "all_gather_benchmark.meta.json").exists()
    # one rank cannot send to itself over gloo: a row that says so, not a silent zero
    sr = _rows(tmp_path / "send_recv_benchmark.csv")
    assert {r["status"] for r in sr} == {"unsupported"} and all(r["time_us"] == "" for r in sr)
    out = capsys.readouterr().out
    assert "# Avg bus bandwidth" in out and "#wrong" in out


def test_sizes_from_trace_uses_trace_sizes_interface(tmp_path, monkeypatch):
    """--sizes-from-trace against the trace_sizes(paths) -> [TraceSize] interface, with a fake parser module."""
    log = tmp_path / "nccl.log"
    log.write_text("not parsed by the fake\n")
    seen = {}

    def trace_sizes(paths):
        seen["paths"] = paths
        return [TraceSize("all_reduce", 300, 7, 1, "sum", 12), TraceSize("broadcast", 64, 9, 1, None, 2)]

    monkeypatch.setitem(sys.modules, "opbench.trace.analyze", types.SimpleNamespace(trace_sizes=trace_sizes))
    rc = main(
        [
            "--sizes-from-trace",
            str(log),
            "-n",
            "2",
            "-w",
            "0",
            "--trials",
            "1",
            "--check",
            "--report-dir-path",
            str(tmp_path),
        ]
    )
    assert rc == 0 and seen["paths"] == [str(log)]
    (ar,) = _rows(tmp_path / "all_reduce_benchmark.csv")
    assert (ar["count"], ar["size_bytes"], ar["dtype"], ar["wrong"]) == ("300", "1200", "fp32", "0")
    assert ar["source"] == "trace:nccl.log nranks=1 calls=12"
    (bc,) = _rows(tmp_path / "broadcast_benchmark.csv")
    assert (bc["count"], bc["dtype"]) == ("64", "bf16")


def test_sizes_from_a_real_nccl_log(tmp_path):
    """The real parser end to end: two AllGather lines (two ranks of one call) and a bf16 AllReduce."""
    log = tmp_path / "rank0.log"
    log.write_text(
        "gpu1:77:88 [0] NCCL INFO AllGather: opCount 3 sendbuff 0x1 recvbuff 0x2 count 96 datatype 7 op 0 root 0 "
        "comm 0xa [nranks=1] stream 0xb\n"
        "[0] gpu1:77:88 [0] NCCL INFO AllGather: opCount 4 sendbuff 0x1 recvbuff 0x2 count 96 datatype 7 op 0 "
        "root 0 comm 0xa [nranks=1] stream 0xb\n"
        "gpu1:77:88 [0] NCCL INFO AllReduce: opCount 5 sendbuff 0x1 recvbuff 0x2 count 500 datatype 9 op 0 root 0 "
        "comm 0xa [nranks=1] stream 0xb\n"
    )
    assert (
        main(
            [
                "--sizes-from-trace",
                str(log),
                "-n",
                "2",
                "-w",
                "0",
                "--trials",
                "1",
                "--check",
                "--report-dir-path",
                str(tmp_path),
            ]
        )
        == 0
    )
    (ag,) = _rows(tmp_path / "all_gather_benchmark.csv")[:1]
    assert (ag["count"], ag["size_bytes"], ag["source"]) == ("96", "384", "trace:rank0.log nranks=1 calls=2")
    (ar,) = _rows(tmp_path / "all_reduce_benchmark.csv")
    assert (ar["count"], ar["dtype"], ar["size_bytes"], ar["wrong"]) == ("500", "bf16", "1000", "0")


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
