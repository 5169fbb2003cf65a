"""opbench project, issue 44: NVLink domains larger than a node, parts' rates from measured figures, a fixed cost
per kernel and unfused attention timed as unfused. Torch-free; every projection here runs in well under a second."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opbench.core.peaks import nvlink_domain_of
from opbench.models import load_model_configs, select_models
from opbench.models.architectures import decoder_layers
from opbench.models.layout import MAMBA2
from opbench.project.plan import Plan, problems
from opbench.project.rates import Assumptions, Rates
from opbench.project.workload import EP_COMM, layer_work


@pytest.fixture(scope="module")
def dsv3():
    (cfg,) = select_models(load_model_configs(), "DeepSeek_V3")
    return cfg


def _a2a(cfg, plan: Plan, rates: Rates):
    moe = next(lay for lay in decoder_layers(cfg) if lay.moe)
    return next(i.timed for i in layer_work(cfg, moe, plan, rates).fwd if i.category == EP_COMM)


def test_an_ep64_all_to_all_inside_a_gb200_nvl72_domain_runs_at_nvlink_rate(dsv3):
    """DeepSeek-V3's EP64 (etp 1: 64 neighbouring ranks) on GB200 nodes of 4: in a 72-GPU NVLink domain the
    all-to-all stays on NVLink 5 (900 GB/s a direction), so its time drops by the link ratio over the 50 GB/s NIC;
    on H100 nodes of 8 (domain = node) it crosses nodes as before, with or without the flag saying 8."""
    assert nvlink_domain_of("NVIDIA GB200") == 72 and nvlink_domain_of("GB300") == 72
    assert nvlink_domain_of("H100") is None and nvlink_domain_of("B200") is None
    a = Assumptions()
    # 64 GPUs of one rack: ranks fill NVLink domains in order (plan.domain_shares), so an EP64 group stays inside a
    # 72-GPU domain only when the world does (at 256 GPUs the block of ranks 64..127 straddles racks 0 and 1: below)
    plan = Plan(world=64, seqlen=4096, global_batch=1024, tp=2, ep=64, etp=1, pp=1, gpus_per_node=4)
    gb200 = Rates([], "GB200", "bf16", a, 4)
    across, inside = (_a2a(dsv3, p, gb200) for p in (plan, replace(plan, nvlink_domain=72)))
    assert plan.spans_nodes(64, 1) and not replace(plan, nvlink_domain=72).spans_nodes(64, 1)
    assert "network" in across.note and "NVLink 5" in inside.note
    # across: a rank's 60 of 64 shares through its NIC (4 on its node); inside: 63 of 64 over NVLink
    size = (across.seconds - a.latency_us_inter * 1e-6) * gb200.nic_gbs * a.link_efficiency * 1e9 * 64 / 60
    assert gb200.nic_gbs == 50.0 and Rates([], "GB300", "bf16", a, 4).nic_gbs == 100.0  # ConnectX-7 / -8
    nvlink = a.latency_us_intra * 1e-6 + size * 63 / 64 / (900 * a.link_efficiency * 1e9)
    assert inside.seconds == pytest.approx(nvlink, rel=1e-9)
    assert across.seconds / inside.seconds > 900 / 50 * 0.9
    # H100 (domain = node of 8): unchanged by saying so
    h100 = Rates([], "H100", "bf16", a, 8)
    base = replace(plan, gpus_per_node=8)
    assert _a2a(dsv3, base, h100).seconds == _a2a(dsv3, replace(base, nvlink_domain=8), h100).seconds
    # a group wider than the domain still crosses it: EP64 at etp 2 spans 128 GPUs. Consecutive ranks in racks of
    # 72 (0..71, 72..143, 144..215, 216..255): the group of ranks 128, 130, …, 254 has only 8 in rack 1 (128..142),
    # the thinnest share of any group, and its NICs the bottleneck (was 36 = 72/2 when groups were packed per rack)
    big = replace(plan, world=256, pp=4)
    wide = replace(big, nvlink_domain=72, etp=2)
    assert wide.spans_nodes(64, 2) and wide.node_share(64, 2) == 8
    rack = replace(big, nvlink_domain=72)  # EP64 at 256 GPUs: ranks 64..127 straddle racks 0 and 1 (64..71 in 0)
    assert rack.spans_nodes(64, 1) and rack.node_share(64, 1) == 8
    assert not rack.spans_nodes(8, 1) and rack.node_share(8, 1) == 8  # 8 divides 72: every EP8 group inside a rack


def test_the_cli_defaults_gb200_to_its_nvl72_domain_and_the_search_says_the_domain(capsys):
    """--device GB200 says its 72-GPU domain in a note; --nvlink-domain overrides; a projection on the rack is
    faster than on nodes of 4 (EP32 over 8 nodes); --search prints the domain; a bad domain is one line."""
    from opbench.core.errors import run_cli
    from opbench.project.__main__ import main

    flags = [
        "--model", "Qwen3_30B_A3B", "--world-size", "64", "--gpus-per-node", "4", "--ep", "32", "--seqlen", "4096",
        "--global-batch", "256", "--device", "GB200",
    ]  # fmt: skip

    def step(*extra: str) -> tuple[float, str]:
        assert run_cli(main, [*flags, *extra], prog="opbench project") == 0
        out = capsys.readouterr()
        return float(out.out.split("step ", 1)[1].split(" s", 1)[0]), out.err

    (rack, said), (nodes, quiet) = step(), step("--nvlink-domain", "4")
    assert "72-GPU NVLink domain" in said and "NVLink domain" not in quiet
    assert rack < nodes
    small = ["--model", "Qwen3_0.6B", "--world-size", "16", "--gpus-per-node", "4", "--seqlen", "4096"]
    assert run_cli(main, [*small, "--global-batch", "16", "--device", "GB200", "--search", "--top", "1"]) == 0
    assert "NVLink domain 72 GPUs" in capsys.readouterr().out
    assert run_cli(main, [*flags, "--nvlink-domain", "0"], prog="opbench project") == 2
    err = capsys.readouterr().err
    assert "--nvlink-domain" in err and "Traceback" not in err
    # a domain is whole nodes or an even part of one: 5 GPUs in nodes of 4 has no placement
    assert run_cli(main, [*flags, "--nvlink-domain", "5"], prog="opbench project") == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "field '--nvlink-domain'" in err and "nodes of 4" in err


def test_a_gb200_node_is_its_tray_of_4_unless_told(capsys, tmp_path):
    """GB200's node is an NVL72 compute tray of 4 GPUs: 36 GPUs (9 trays) project without --gpus-per-node, also
    when the part is named only by --results' rows, and a 5-GPU domain is refused as nodes of 4; on H100 nodes of 8
    the same 36 GPUs are refused, and --gpus-per-node still overrides the part's default."""
    import json

    from opbench.core.errors import run_cli
    from opbench.core.peaks import node_gpus_of
    from opbench.project.__main__ import main

    assert node_gpus_of("NVIDIA GB200") == node_gpus_of("GB300") == 4
    assert node_gpus_of("H100") == node_gpus_of("MI355X") == node_gpus_of(None) == 8
    flags = ["--model", "Qwen3_0.6B", "--world-size", "36", "--tp", "4", "--seqlen", "4096", "--global-batch", "36"]
    assert run_cli(main, [*flags, "--device", "GB200"], prog="opbench project") == 0
    assert "step " in capsys.readouterr().out
    assert run_cli(main, [*flags, "--device", "GB200", "--nvlink-domain", "5"], prog="opbench project") == 2
    assert "nodes of 4" in capsys.readouterr().err
    for device, extra in (("H100", []), ("GB200", ["--gpus-per-node", "8"])):
        assert run_cli(main, [*flags, "--device", device, *extra], prog="opbench project") == 2
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert "field '--world-size'" in err and "nodes of 8" in err
    for name, rc in (("NVIDIA GB200", 0), ("NVIDIA H100 80GB HBM3", 2)):  # the part from the rows' sidecar
        folder = tmp_path / name.split()[1]
        folder.mkdir()
        (folder / "benchmark_gemm_x.csv").write_text(
            "model,layer,pass,m,n,k,dtype,backend,time_s,status\nx,qkv,fwd,4096,4096,4096,bf16,torch,1e-04,ok\n"
        )
        (folder / "benchmark_gemm_x.meta.json").write_text(json.dumps({"benchmark": "gemm", "device_name": name}))
        assert run_cli(main, [*flags, "--results", str(folder)], prog="opbench project") == rc
        out = capsys.readouterr()
        assert ("step " in out.out) if rc == 0 else ("nodes of 8" in out.err and "Traceback" not in out.err)


def test_the_flex_dispatcher_fills_whole_domains(dsv3):
    plan = Plan(world=256, seqlen=4096, global_batch=1024, tp=2, ep=64, etp=1, pp=4, gpus_per_node=4)
    flex = replace(plan, dispatcher="flex")
    assert not [p for p in problems(dsv3, flex) if p[0] == "--ep"]  # 64 fills 16 nodes of 4
    odd = problems(dsv3, replace(flex, nvlink_domain=48))  # 64 neither fits in 48 nor fills whole 48s
    assert any(flag == "--ep" and "NVLink domains" in why for flag, why in odd)
    # ranks fill domains in order: in racks of 72, EP64 groups straddle racks (64..127), EP128 fills none, EP8 fits
    for ep, refused in ((64, True), (128, True), (8, False)):
        found = problems(dsv3, replace(flex, ep=ep, nvlink_domain=72))
        assert any(flag == "--ep" and "NVLink domains of 72" in why for flag, why in found) == refused, ep
    assert not [p for p in problems(dsv3, replace(flex, world=64, pp=1, nvlink_domain=72)) if p[0] == "--ep"]


def test_a_kernel_has_a_fixed_cost_by_vendor_measured_from_tiny_rows_or_given():
    """Every kernel a roofline times gets a fixed cost on top: 3.8 µs on an NVIDIA part (NVIDIA's CUDA Graphs post) and on an
    AMD one (no AMD figure published: NVIDIA's, said to be an estimate), none on a CPU; tiny GEMM and copy rows in
    --results measure it (the mean of the fastest of each), --kernel-us gives it."""
    import pandas as pd

    from opbench.project.rates import ESTIMATED, MEASURED

    h100, mi300x, cpu = (Rates([], d, "bf16", Assumptions(), 8) for d in ("H100", "MI300X", "cpu"))
    assert h100.kernel_cost().seconds == pytest.approx(3.8e-6) and h100.kernel_cost().source == ESTIMATED
    assert "amd" in mi300x.kernel_cost().note and cpu.kernel_cost().seconds == 0
    assert Rates([], "H100", "bf16", Assumptions(kernel_us=7.0), 8).kernel_cost().seconds == pytest.approx(7e-6)
    # a tiny GEMM takes its fixed cost beside its nanoseconds of math; a large one is its math
    zero = Rates([], "H100", "bf16", Assumptions(kernel_us=0), 8)
    for m in (16, 8192):
        assert h100.gemm_time(m, m, m).seconds - zero.gemm_time(m, m, m).seconds == pytest.approx(3.8e-6)
    assert "fixed" in h100.gemm_time(16, 16, 16).note
    measured = Rates([], "H100", "bf16", Assumptions(), 8)
    measured.gemm = pd.DataFrame(
        {"m": [64, 8192], "n": [64, 8192], "k": [64, 8192], "groups": [1, 1], "time_s": [5e-6, 2e-3], "file": "g"}
    )
    measured.memory_rows = pd.DataFrame(
        {"kernel": ["copy", "copy", "triad"], "size_bytes": [4096, 1 << 30, 4096], "gbs": [1.0, 3000.0, 0.1],
         "file": "m"}
    )  # fmt: skip
    cost = measured.kernel_cost()  # the 64³ GEMM (5 µs) and the 4 KiB copy (4.1 µs); not the triad, not 1 GiB
    assert cost.source == MEASURED and cost.seconds == pytest.approx((5e-6 + 4096 / 1e9) / 2)
    assert "64x64x64" in cost.note and "4096 B copy" in cost.note


def test_the_fixed_cost_slows_a_small_model_and_leaves_a_large_one():
    """Qwen3-0.6B (hidden 1024, the DeepSeek-V3 proxy's width) at 1,024 tokens a micro-batch: hundreds of kernels
    of a few µs each a layer, so the fixed cost adds a visible share; Llama-3.1-70B's kernels are milliseconds:
    under 1 %."""
    from opbench.project.step import Projector

    (llama,) = select_models(load_model_configs(), "Llama3.1_70B")
    (qwen,) = select_models(load_model_configs(), "Qwen3_0.6B")
    ratios = []
    for cfg, plan in (
        (llama, Plan(world=64, seqlen=8192, global_batch=64, tp=8)),
        (qwen, Plan(world=8, seqlen=1024, global_batch=8)),
    ):
        zero, default = (
            Projector(cfg, Rates([], "H100", "bf16", Assumptions(kernel_us=k, host_us_per_op=0.0), 8))
            .project(plan)
            .step_s  # the GPU's work alone (test_project_host.py: the host's)
            for k in (0.0, None)
        )
        ratios.append(default / zero)
    assert ratios[0] < 1.01 and ratios[1] > 1.05, ratios


def test_unfused_attention_is_timed_as_its_batched_gemms_and_softmax_passes():
    """--attention-backend unfused: forward Q·Kᵀ and P·V over b·h/tp batches of the whole s × s matrix at the GEMM
    rate plus the softmax's read and write of every score (2e) at the memory rate; backward four batched GEMMs and
    3e a score; dropout 2e + 1 more each way. Slower than flash at 8k tokens; the memory-only model it replaces
    gave the same time for both."""
    from opbench.attention.shapes import operator_shape
    from opbench.project.workload import ATTENTION, unfused_scores_bytes

    (cfg,) = select_models(load_model_configs(), "Llama3.1_8B")
    lay = decoder_layers(cfg)[0]
    rates = Rates([], "H100", "bf16", Assumptions(), 8)
    plan = Plan(world=8, seqlen=8192, global_batch=8, tp=2, attention_backend="unfused")
    shape = operator_shape(cfg, lay.attention[0], plan.seqlen, plan.tp, plan.cp)
    b, s, d = 16, 8192, 128  # 32 heads / tp 2, one sequence
    scores = b * s * s
    assert unfused_scores_bytes(plan, scores, "fwd") == 4 * scores
    assert unfused_scores_bytes(replace(plan, attention_dropout=0.1), scores, "bwd") == (6 + 5) * scores
    fwd = next(i for i in layer_work(cfg, lay, plan, rates).fwd if i.category == ATTENTION)
    expect = rates.gemm_time(s, s, d, b).seconds + rates.gemm_time(s, d, s, b).seconds
    expect += rates.memory_time(4 * scores, kernels=1).seconds  # each with its fixed cost
    assert fwd.timed.seconds == pytest.approx(expect) and "unfused" in fwd.name
    flash = next(i for i in layer_work(cfg, lay, replace(plan, attention_backend="auto"), rates).fwd
                 if i.category == ATTENTION)  # fmt: skip
    assert fwd.timed.seconds > 2 * flash.timed.seconds
    assert shape.num_head_q == b
    dropped = next(
        i for i in layer_work(cfg, lay, replace(plan, attention_dropout=0.1), rates).bwd if i.category == ATTENTION
    )
    plain = next(i for i in layer_work(cfg, lay, plan, rates).bwd if i.category == ATTENTION)
    extra = 5 * scores / rates.memory_bandwidth().seconds + rates.kernel_cost().seconds  # one kernel more
    assert dropped.timed.seconds - plain.timed.seconds == pytest.approx(extra)


def test_the_search_ranks_a_racks_layouts_on_their_nvlink_times():
    """Qwen3-0.6B on 16 GB200 in nodes of 4: in one 72-GPU domain TP 8 is tried (it stays inside the domain) and
    the data-parallel reductions run on NVLink, so the best layouts differ from those on nodes of 4 (domain =
    node), and the best step is no slower."""
    from opbench.project.search import search
    from opbench.project.step import Projector

    (cfg,) = select_models(load_model_configs(), "Qwen3_0.6B")
    # the GPU's work alone: on Grace this model's step is its host's (test_project_host.py), the same on any layout
    projector = Projector(cfg, Rates([], "GB200", "bf16", Assumptions(host_us_per_op=0.0), 4))
    base = Plan(world=16, seqlen=4096, global_batch=16, gpus_per_node=4)
    found = {domain: search(cfg, replace(base, nvlink_domain=domain), projector, 5, True)[0] for domain in (None, 72)}
    labels = {domain: [r.plan.label() for r in best] for domain, best in found.items()}
    assert labels[None] != labels[72]
    assert found[72][0].step_s <= found[None][0].step_s
    from opbench.project.plan import layouts

    widest = {domain: max(p.tp for p in layouts(cfg, replace(base, nvlink_domain=domain))) for domain in (None, 72)}
    assert widest == {None: 4, 72: 8}


def test_a_part_without_a_measured_matmul_of_its_own_says_its_rates_are_datasheet_estimates():
    """H100 NVL and MI350X take a sibling's measured matmul share: the note says so; H100 SXM and GB200 have their
    own measured figure (no such note), and neither does a run whose efficiencies are given."""
    notes = {
        d: Rates([], d, "bf16", Assumptions(), 8).efficiency_note(fp8=False, attention=True)
        for d in ("H100 NVL", "MI350X", "H100", "GB200")
    }
    assert "datasheet estimates (H100 SXM's" in str(notes["H100 NVL"])
    assert "datasheet estimates (MI355X's" in str(notes["MI350X"])
    assert "datasheet" not in str(notes["H100"]) and "datasheet" not in str(notes["GB200"])
    given = Rates([], "H100 NVL", "bf16", Assumptions(gemm_efficiency=0.7, attention_efficiency=0.4), 8)
    assert given.efficiency_note(fp8=False, attention=True) is None


def test_blackwell_ultra_parts_take_datasheet_peaks_and_gb300_its_own_training_factor():
    """B300/GB300 (and not the Blackwell lines before them, whose patterns they contain): their dense peaks and
    matmul shares are their siblings' (datasheet estimates, the note says so); GB300's training factor is the 25.11
    recipe's 1,933 model TFLOP/s over GB200's 1,622 on the same peak, B300's B200's; 800 Gb/s NICs, NVLink 5, and
    the memory the device reports (docs/project.md, "Parts")."""
    from opbench.cluster.links import intra_link
    from opbench.core.peaks import host_cpu, lookup_peak, node_gpus_of
    from opbench.project.__main__ import _device_memory_gib

    gb300, gb200, b300, b200 = (lookup_peak(d) for d in ("NVIDIA GB300", "NVIDIA GB200", "NVIDIA B300", "B200"))
    assert gb300 is not None and gb200 is not None and b300 is not None and b200 is not None
    assert (gb300.fp8_tflops, gb300.bf16_tflops, b300.fp8_tflops, b300.bf16_tflops) == (5000, 2500, 4500, 2250)
    assert gb300.matmul_of == "GB200" and b300.matmul_of == "B200" and gb200.matmul_of is None
    assert gb300.training / gb200.training == pytest.approx(1933 / 1622, rel=1e-3)
    assert b300.training == b200.training
    for d, gib in (("GB300", 279), ("B300", 270), ("GB200", 185), ("B200", 178)):
        assert _device_memory_gib(d) == gib
    assert intra_link("B300") is not None and intra_link("GB300") == intra_link("B200")
    assert (host_cpu("GB300"), host_cpu("B300"), node_gpus_of("GB300"), node_gpus_of("B300")) == (
        "grace", "x86", 4, 8)  # fmt: skip
    a = Assumptions()
    nics = {d: Rates([], d, "bf16", a, 8).nic_gbs for d in ("H100", "B200", "GB200", "B300", "GB300")}
    assert nics == {"H100": 50.0, "B200": 50.0, "GB200": 50.0, "B300": 100.0, "GB300": 100.0}
    assert Rates([], "GB300", "bf16", Assumptions(nic_gbs=25.0), 4).nic_gbs == 25.0
    note = Rates([], "GB300", "fp8", a, 4).efficiency_note(fp8=True, attention=True)
    assert "datasheet estimates (GB200's" in str(note)
    # the same FP8 GEMM: GB300 faster than GB200 by the training factors alone (same peak, same matmul share)
    t = {d: Rates([], d, "fp8", a, 4).gemm_time(8192, 8192, 8192).seconds for d in ("GB200", "GB300")}
    assert t["GB200"] / t["GB300"] == pytest.approx(1933 / 1622, rel=0.02)


def test_mxfp8_runs_on_the_parts_with_mx_tensor_cores_only(tmp_path):
    """MXFP8 is Blackwell's and CDNA 4's (core.peaks.MX_PARTS): projected there, refused in one line elsewhere by
    every entry point (opbench project, opbench step --project); its GEMMs need dimensions in 32-element blocks;
    the sidecar records the NIC rate the projection used (docs/project.md, "FP8", "Parts")."""
    import json

    from opbench.core.errors import UsageError
    from opbench.core.peaks import has_mxfp8
    from opbench.project.__main__ import main
    from opbench.project.plan import check_part, fp8_gemm
    from opbench.steptrace import compare

    mx = ("B200", "NVIDIA GB200", "B300", "NVIDIA GB300", "MI355X", "AMD Instinct MI350X")
    assert all(has_mxfp8(d) for d in mx)
    assert not any(has_mxfp8(d) for d in ("H100", "H200", "GH200", "MI300X", "MI325X", "A100", None))
    plan = Plan(world=8, seqlen=4096, global_batch=8, fp8="te", fp8_recipe="mxfp8")
    check_part(plan, "GB300")
    check_part(replace(plan, fp8_recipe="tensorwise"), "H100")
    with pytest.raises(UsageError, match="MXFP8 runs on Blackwell"):
        check_part(plan, "H100")
    flags = "--model Llama3.1_8B --world-size 8 --global-batch 8 --seqlen 4096 --fp8 te --fp8-recipe mxfp8"
    with pytest.raises(UsageError, match="MXFP8 runs on Blackwell"):
        compare.projected_items(flags + " --device H100")
    assert compare.projected_items(flags + " --device B200")[0]["step"] > 0
    assert fp8_gemm(plan, "qkv", 64, 4096) and not fp8_gemm(plan, "qkv", 48, 4096)  # 48: 16-aligned, not 32
    assert fp8_gemm(replace(plan, fp8_recipe="delayed"), "qkv", 48, 4096)
    out = tmp_path / "out"
    assert main([*flags.split(), "--device", "GB300", "--report-dir-path", str(out)]) in (0, None)
    meta = json.loads((out / "project.meta.json").read_text())
    assert meta["assumptions"]["nic_gbs"] == 100.0


def test_a_group_on_xgmis_mesh_reaches_only_its_own_links():
    """On MI300X's fully connected xGMI mesh (one 64 GB/s link per peer) a pipeline send between two GPUs runs on
    one link, a group of n ranks on its n − 1 links, the whole node on all seven; through NVSwitch (H100) every
    group reaches the whole (docs/project.md, "Rates")."""
    size = 32 << 20
    for device, per_link, whole in (("MI300X", 64.0, 448.0), ("H100", 450.0, 450.0)):
        rates = Rates([], device, "bf16", Assumptions(), 8)
        eff, lat = rates.a.link_efficiency, rates.a.latency_us_intra * 1e-6
        send = rates.collective_time("send_recv", size, 2, False)
        assert send.seconds == pytest.approx(lat + size / (min(per_link, whole) * eff * 1e9))
        for n in (2, 4, 8):
            got = rates.collective_time("all_gather", size, n, False)
            factor = (n - 1) / n
            assert got.seconds == pytest.approx(lat + size * factor / (min(whole, (n - 1) * per_link) * eff * 1e9))


def test_cpu_offloading_moves_the_first_layers_activations_to_the_host_over_its_link(capsys, tmp_path):
    """--cpu-offloading-num-layers N (Megatron's, docs/project.md "CPU offloading"): the first N layers' saved
    activations leave the GPU's peak, and each crosses the host link out and back, one copy at a time on
    Transformer Engine 2.9's windows (32 layers, 8 offloaded: due every 4 layers); a copy longer than the layers
    between its start and its deadline stalls the GPU, shown as exposed offload, in every micro-batch. PCIe on an
    H100, NVLink-C2C on a GB200, --host-link-gbs over both. Megatron's refusals (a pipeline, recomputation, every
    layer, a Mamba hybrid) are one line each."""
    import csv

    from opbench.core.errors import UsageError, run_cli
    from opbench.project import memory as mem
    from opbench.project.__main__ import main
    from opbench.project.step import Projector, te_offload_windows

    assert te_offload_windows(32, 8) == [3, 7, 11, 15, 19, 23, 27, 31]
    assert te_offload_windows(80, 40)[:3] == [1, 3, 5] and te_offload_windows(10, 3) == [3, 6, 9]  # remainder first
    (cfg,) = select_models(load_model_configs(), "Llama3.1_8B")
    base = Plan(world=8, seqlen=8192, global_batch=32, mbs=2, sharding="fsdp")  # two micro-batches a rank
    offload = replace(base, cpu_offload_layers=8)

    def projector(device: str = "H100", node: int = 8, **assumed) -> Projector:
        return Projector(cfg, Rates([], device, "bf16", Assumptions(**assumed), node))

    without, with_ = projector().project(base), projector().project(offload)
    lay = decoder_layers(cfg)[0]
    one = mem.layer_activation_bytes(cfg, lay, base)
    assert without.memory.activations - with_.memory.activations == 8 * one  # the layers are alike
    w = projector()._layer(lay, base)

    def expected(gbs: float) -> float:  # copy 0 beside layers 1-3, the others beside 4 layers; back: 4 each
        c = one / (gbs * 1e9 * 0.8)  # at --link-efficiency
        out = max(0.0, c - 3 * w.fwd_s) + 7 * max(0.0, c - 4 * w.fwd_s)
        return 2 * (out + 8 * max(0.0, c - 4 * w.bwd_s))

    slow = projector(host_link_gbs=4.0).project(offload)
    assert expected(4.0) > 0 and slow.exposed_comm_s["offload"] == pytest.approx(expected(4.0))
    assert slow.step_s == pytest.approx(without.step_s + expected(4.0))
    assert with_.exposed_comm_s.get("offload", 0.0) == pytest.approx(expected(64.0))  # PCIe Gen5 x16
    gb200 = projector("GB200", 4).project(replace(offload, gpus_per_node=4))
    assert expected(225.0) <= expected(64.0) and gb200.exposed_comm_s.get("offload", 0.0) <= expected(64.0)
    reasons = [problems(cfg, replace(offload, **change)) for change in ({"pp": 2}, {"recompute": "full"})]
    assert [r[0][0] for r in reasons] == ["--cpu-offloading-num-layers"] * 2
    assert "--pp 1" in reasons[0][0][1] and "--recompute none" in reasons[1][0][1]
    assert "not fewer than" in problems(cfg, replace(base, cpu_offload_layers=32))[0][1]
    mamba = replace(lay, attention=tuple(replace(op, kind=MAMBA2) for op in lay.attention))  # a Mamba-2 mixer
    assert "hybrid" in problems(cfg, offload, [mamba, *decoder_layers(cfg)[1:]])[0][1]
    with pytest.raises(UsageError, match="CPU target"):
        Projector(cfg, Rates([], "cpu", "bf16", Assumptions(), 1)).project(offload)
    flags = ["--model", "Llama3.1_8B", "--world-size", "8", "--seqlen", "8192", "--fsdp", "--device", "H100"]
    out_dir = tmp_path / "p"
    given = [*flags, "--cpu-offloading-num-layers", "8", "--host-link-gbs", "4", "--report-dir-path", str(out_dir)]
    assert run_cli(main, given, prog="opbench project") == 0
    out = capsys.readouterr().out
    assert "offload8" in out and "exposed offload" in out
    (row,) = csv.DictReader(open(next(out_dir.glob("project*.csv")), newline=""))
    assert float(row["offload_s"]) > 0
    assert run_cli(main, [*flags, "--cpu-offloading-num-layers", "8", "--pp", "2"], prog="opbench project") == 2
    err = capsys.readouterr().err
    assert "--cpu-offloading-num-layers" in err and len(err.strip().splitlines()) == 1
