"""Kineto traces written from the documented schema with planted kernels whose right attribution is known: the
tests' truth for GPU traces (none is run here) and the large input of bench/step_vs_hta.py.

The layout is what ``torch.profiler`` writes on a GPU (libkineto's ``output_json.cpp``): CPU operators (``cpu_op``,
with ``External id``, ``Input Dims``, ``Input type``, ``Input Strides``), runtime launches (``cuda_runtime``, with
``correlation`` and the launching operator's ``External id``), kernels on GPU streams (``kernel``, with ``device``,
``stream``, ``correlation``, ``External id``), ``ProfilerStep#N`` spans, and ``record_param_comms`` with its
collective arguments. CUDA and ROCm differ in launch names (``cudaLaunchKernel`` / ``hipExtModuleLaunchKernel``),
the compute stream (7 / 0) and every library's kernel names. Each step is laid out on the GPU so that its
partition is known exactly (``Planted``). No torch import.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

NAMES: dict[str, dict[str, Any]] = {
    "cuda": {
        "launch": "cudaLaunchKernel",
        "stream": 7,
        "comm_stream": 20,
        "gemm": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
        "gemm_bwd": "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN",
        "attn_fwd": "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, true, false, false, false, false, false>(flash::Flash_fwd_params)",
        "attn_bwd": "void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t>, true, false, false, false, false, false, false>(flash::Flash_bwd_params)",
        "norm": "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",
        "act": "void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)",
        "allreduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "optimizer": "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, double, bool*, float*>(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, double, bool*, float*)",
    },
    "rocm": {
        "launch": "hipExtModuleLaunchKernel",
        "stream": 0,
        "comm_stream": 3,
        "gemm": "Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_DTVA0_DTVB0_EPS0_FSSC10_GRPM1_GRVWA8_GRVWB8_GSU1_GSUASB_GLS0_ISA942_IU1_K1_LBSPPA128_LBSPPB128_LBSPPM0_LPA16_LPB16_LPM0_LRVW8_LWPMn1_MIAV1_MIWT2_2_MO40_NTn1_NTA0_NTB0_NTC0_NTD0_NEPBS0_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_SPO0_SRVW0_SSO0_SVW4_SK0_SKXCCM0_TT4_64_TLDS1_ULSGRO0_USL1_UIOFGRO0_USFGROn1_VSn1_VWA4_VWB1_WSGRA0_WSGRB0_WS64_WG32_8_1_WGM8",
        "gemm_bwd": "Cijk_Ailk_Bjlk_BBS_BH_MT256x128x64_MI16x16x16x1_SN_LDSB1_GRVW8_ISA942",
        "attn_fwd": "void ck_tile::kentry<256, 1, ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVSAsync<ck_tile::BlockFmhaPipelineProblem<ck_tile::bf16_t, ck_tile::bf16_t> > > >(ck_tile::FmhaFwdKernel::Kargs)",
        "attn_bwd": "void kernel_func<ck_tile::FmhaBwdDQDKDVKernel<ck_tile::BlockFmhaBwdDQDKDVPipelineKRKTRVR<ck_tile::BlockFmhaBwdPipelineProblem<ck_tile::bf16_t> > > >(ck_tile::FmhaBwdDQDKDVKernel::Kargs)",
        "norm": "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",
        "act": "void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, at::native::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)",
        "allreduce": "ncclKernel_AllReduce_RING_LL_Sum_bf16(ncclWorkElem)",
        "optimizer": "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false> >(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>)",
    },
}

# planted durations (µs) of one layer's kernels, and the gap between kernels on the compute stream
GEMM_US, ATTN_FWD_US, ATTN_BWD_US, NORM_US, ACT_US, OPT_US, GAP_US = 100.0, 60.0, 150.0, 10.0, 15.0, 40.0, 2.0
ALLREDUCE_US = 80.0  # per layer, on the comm stream under the end of its backward and the next layer's GEMMs
T, H, F = 4096, 1024, 2816  # tokens, hidden, MLP width: the planted GEMMs' shapes


@dataclass
class Planted:
    """What a planted step holds, per step (µs): the partition the attribution must find."""

    partition: dict[str, float] = field(default_factory=dict)
    gemms: set[tuple[str, int, int, int]] = field(default_factory=set)  # (pass, m, n, k)
    comm_busy: float = 0.0
    comm_exposed: float = 0.0
    step_us: float = 0.0


class _Writer:
    def __init__(self, fh: IO[str], vendor: str, rank: int):
        self.fh, self.v, self.rank = fh, NAMES[vendor], rank
        self.first = True
        self.ext = 0
        self.corr = 0

    def event(self, ev: dict[str, Any]) -> None:
        self.fh.write(("" if self.first else ",\n") + json.dumps(ev, separators=(",", ":")))
        self.first = False

    def op(self, name: str, ts: float, dur: float, tid: int = 1, args: dict[str, Any] | None = None) -> int:
        self.ext += 1
        self.event({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
                    "args": {"External id": self.ext, **(args or {})}})  # fmt: skip
        return self.ext

    def annotation(self, name: str, ts: float, dur: float, tid: int = 1) -> None:
        self.ext += 1
        self.event({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
                    "args": {"External id": self.ext}})  # fmt: skip

    def kernel(self, key: str, ext: int, cpu_ts: float, gpu_ts: float, dur: float, stream: int | None = None) -> None:
        self.corr += 1
        self.event({"ph": "X", "cat": "cuda_runtime", "name": self.v["launch"], "pid": 1, "tid": 1, "ts": cpu_ts,
                    "dur": 1.0, "args": {"External id": ext, "correlation": self.corr, "cbid": 211}})  # fmt: skip
        self.event({"ph": "X", "cat": "kernel", "name": self.v[key], "pid": 0, "tid": stream or self.v["stream"],
                    "ts": gpu_ts, "dur": dur, "args": {"External id": ext, "correlation": self.corr, "device": 0,
                    "stream": stream if stream is not None else self.v["stream"], "grid": [132, 1, 1]}})  # fmt: skip


def _matmul(w: _Writer, cpu: float, gpu: float, shape: tuple[int, int, int], backward: bool, key: str) -> None:
    """aten::mm of C[m,n] = A[m,k]·B[k,n] and its kernel; in backward, wgrad's A is a transposed view."""
    m, n, k = shape
    strides = [[1, m], [n, 1]] if backward and key == "wgrad" else [[k, 1], [n, 1]]
    ext = w.op("aten::mm", cpu, 5.0, args={"Input Dims": [[m, k], [k, n]], "Input type": ["c10::BFloat16"] * 2,
                                        "Input Strides": strides})  # fmt: skip
    w.kernel("gemm_bwd" if backward else "gemm", ext, cpu + 1, gpu, GEMM_US)


def write(path: str, vendor: str = "cuda", steps: int = 2, layers: int = 2, rank: int = 0, world: int = 1,
          slow_us: float = 0.0, wait_us: float = 0.0) -> Planted:  # fmt: skip
    """Write a trace of ``steps`` steps of ``layers`` layers; ``slow_us`` lengthens every GEMM of this rank (a
    straggler), ``wait_us`` the last all-reduce of each step (a rank waiting for one). Returns the planted partition
    of one step. ``.gz`` in the name writes it gzipped."""
    opener: Any = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as fh:
        fh.write('{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "planted"}], ')
        fh.write(f'"distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {world}}}, "traceEvents": [\n')
        w = _Writer(fh, vendor, rank)
        planted = Planted()
        for _ in _steps(w, steps, layers, planted, slow_us, wait_us):
            pass
        fh.write('\n], "traceName": "planted", "displayTimeUnit": "ms"}\n')
    return planted


def _steps(w: _Writer, steps: int, layers: int, planted: Planted, slow_us: float, wait_us: float) -> Iterator[int]:
    gemm_us = GEMM_US + slow_us
    clock = 1_000_000.0
    for s in range(steps):
        part: dict[str, float] = {}
        start = clock
        gpu = clock + 10.0  # the GPU starts 10 µs into the step: idle
        cpu = clock + 1.0
        shapes = [(T, F, H), (T, H, F)]  # up (T, F, H) and down (T, H, F) per layer, (m, n, k)

        def k(key: str, ext: int, dur: float, klass: str) -> None:
            nonlocal gpu, cpu
            w.kernel(key, ext, cpu, gpu, dur)
            part[klass] = part.get(klass, 0.0) + dur
            gpu += dur + GAP_US
            cpu += 8.0

        for _layer in range(layers):
            ext = w.op("aten::layer_norm", cpu, 5.0)
            k("norm", ext, NORM_US, "memory")
            ext = w.op("aten::_flash_attention_forward", cpu, 5.0)
            k("attn_fwd", ext, ATTN_FWD_US, "attention")
            for m, n, kk in shapes:
                ext = w.op("aten::mm", cpu, 5.0, args={"Input Dims": [[m, kk], [kk, n]], "Input type": ["c10::BFloat16"] * 2,
                                                    "Input Strides": [[kk, 1], [1, kk]]})  # fmt: skip
                w.kernel("gemm", ext, cpu + 1, gpu, gemm_us)
                part["gemm"] = part.get("gemm", 0.0) + gemm_us
                gpu += gemm_us + GAP_US
                cpu += 8.0
                planted.gemms.add(("fwd", m, n, kk))
            ext = w.op("aten::silu", cpu, 5.0)
            k("act", ext, ACT_US, "memory")
        comm_busy = comm_exposed = 0.0
        for layer in range(layers):
            w.annotation("autograd::engine::evaluate_function: MmBackward0", cpu, 47.0, tid=2)  # the layer's 6 ops
            w.op("MmBackward0", cpu + 1, 45.0, tid=2)
            for m, n, kk in shapes:
                for pass_, mnk in (("dgrad", (m, kk, n)), ("wgrad", (n, kk, m))):
                    a, b, c = mnk
                    strides = [[1, a], [b, 1]] if pass_ == "wgrad" else [[c, 1], [b, 1]]
                    ext = w.op("aten::mm", cpu + 2, 5.0, tid=2, args={"Input Dims": [[a, c], [c, b]],
                               "Input type": ["c10::BFloat16"] * 2, "Input Strides": strides})  # fmt: skip
                    w.kernel("gemm_bwd", ext, cpu + 3, gpu, gemm_us)
                    part["gemm"] = part.get("gemm", 0.0) + gemm_us
                    gpu += gemm_us + GAP_US
                    cpu += 8.0
                    planted.gemms.add((pass_, a, b, c))
            ext = w.op("aten::_flash_attention_backward", cpu, 5.0, tid=2)
            w.kernel("attn_bwd", ext, cpu + 1, gpu, ATTN_BWD_US)
            part["attention"] = part.get("attention", 0.0) + ATTN_BWD_US
            gpu += ATTN_BWD_US + GAP_US
            cpu += 8.0
            # the layer's gradient all-reduce: from the end of this layer's backward into the next one's, or past
            # the last one's end, exposed
            ar_start = gpu - GAP_US - 50.0 if layer < layers - 1 else gpu
            w.op("c10d::allreduce_", cpu, 5.0, tid=2)
            ext = w.op("record_param_comms", cpu, 4.0, tid=2, args={"Collective name": "allreduce", "In msg nelems": H * F,
                       "Out msg nelems": H * F, "dtype": "BFloat16", "Process Group Name": "0",
                       "Process Group Ranks": "[0, 1]", "Group size": 2})  # fmt: skip
            last = layer == layers - 1
            ar_us = ALLREDUCE_US + (wait_us if last else 0.0)
            w.kernel("allreduce", ext, cpu + 1, ar_start, ar_us, stream=w.v["comm_stream"])
            cpu += 8.0
            comm_busy += ar_us
            if last:
                gpu = ar_start + ar_us + GAP_US
                comm_exposed += ar_us
            else:
                # compute continues under it: the next layer's kernels; exposed = what no compute covers
                overlap_end = ar_start + ALLREDUCE_US
                covered = _covered_after(ar_start, overlap_end, gpu, layers, gemm_us)
                comm_exposed += ALLREDUCE_US - covered
        w.annotation("Optimizer.step#AdamW.step", cpu, 30.0)
        ext = w.op("aten::_fused_adamw_", cpu + 1, 20.0)
        w.kernel("optimizer", ext, cpu + 2, gpu, OPT_US)
        part["optimizer"] = OPT_US
        gpu += OPT_US
        end = gpu + 20.0  # 20 µs of idle after the last kernel
        clock = end
        w.annotation(f"ProfilerStep#{s}", start, end - start)
        part["comm:all_reduce"] = comm_exposed
        busy = sum(part.values())
        part["idle"] = (end - start) - busy
        planted.partition = part
        planted.comm_busy, planted.comm_exposed, planted.step_us = comm_busy, comm_exposed, end - start
        yield s


def _covered_after(start: float, end: float, gpu_now: float, layers: int, gemm_us: float) -> float:
    """How much of [start, end) the compute stream's kernels cover: the planted layout puts the all-reduce 50 µs
    before the layer's last kernel ends, then a 2 µs gap, then the next layer's GEMMs back to back (2 µs gaps)."""
    covered = min(end, start + 50.0) - start  # under the last attention backward
    t = gpu_now  # the next layer's first kernel starts here
    while t < end:
        covered += max(0.0, min(end, t + gemm_us) - max(start, t))
        t += gemm_us + GAP_US
    return covered


# ---- pipeline stages: one trace per stage, p2p sends/receives between neighbours, a known bubble ----------------

P2P = {
    "cuda": ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "batch_isend_irecv", "batch_isend_irecv"),
    "rocm": ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "send", "recv"),
}  # kernel, record_param_comms' "Collective name" of the sender, of the receiver
PP_FWD_US, PP_BWD_US, PP_P2P_US, PP_LEAD_US, PP_TAIL_US = 100, 200, 10, 10, 20  # integers: the truth samples 1 µs
PP_GAP_US = 3  # the launch gap before each compute kernel: idle in the middle of a step, not bubble


def pipeline_schedule(stages: int, microbatches: int, t0: int) -> tuple[list[list[tuple[str, int, int]]], int]:
    """GPipe's fill-drain schedule (all forwards, then all backwards; Megatron-LM's 1F1B has the same bubble,
    (p − 1)/m of the ideal step) of ``stages`` stages: per stage its kernels (``fwd``/``bwd``/``optimizer``/
    ``send``/``recv``, start, end) in µs, and the step's end. A p2p pair starts on each side when that side posts
    it and both end ``PP_P2P_US`` after the later post; the receiver computes only once it ended."""
    free = [t0 + PP_LEAD_US] * stages
    out: list[list[tuple[str, int, int]]] = [[] for _ in range(stages)]

    def p2p(src: int, dst: int, posted: int) -> int:
        done = max(posted, free[dst]) + PP_P2P_US
        out[src].append(("send", posted, done))
        out[dst].append(("recv", free[dst], done))
        return done

    ends = [[0] * microbatches for _ in range(stages)]
    for i in range(microbatches):
        for s in range(stages):
            start = (free[s] if s == 0 else p2p(s - 1, s, ends[s - 1][i])) + PP_GAP_US
            out[s].append(("fwd", start, start + PP_FWD_US))
            ends[s][i] = free[s] = start + PP_FWD_US
    for i in range(microbatches):
        for s in reversed(range(stages)):
            start = (free[s] if s == stages - 1 else p2p(s + 1, s, ends[s + 1][i])) + PP_GAP_US
            out[s].append(("bwd", start, start + PP_BWD_US))
            ends[s][i] = free[s] = start + PP_BWD_US
    for s in range(stages):
        out[s].append(("optimizer", free[s], free[s] + int(OPT_US)))
        free[s] += int(OPT_US)
    return out, max(free) + PP_TAIL_US


def pipeline_truth(kernels: list[tuple[str, int, int]], t0: int, end: int) -> Planted:
    """The partition of one stage's step by the definition of docs/step.md, counted microsecond by microsecond
    (independent of the sweep it checks): compute, else a p2p running (bubble), else idle — idle before the
    first compute or after the last one being bubble too."""
    klass = {"fwd": "gemm", "bwd": "gemm", "optimizer": "optimizer"}
    compute = [(klass[k], a, b) for k, a, b in kernels if k in klass]
    p2p = [(a, b) for k, a, b in kernels if k in ("send", "recv")]
    first, last = min(a for _, a, _ in compute), max(b for _, _, b in compute)
    planted = Planted(step_us=float(end - t0))
    part: dict[str, float] = {}
    for t in range(t0, end):
        mid = t + 0.5
        running = [c for c, a, b in compute if a <= mid < b]
        comm = any(a <= mid < b for a, b in p2p)
        planted.comm_busy += comm
        if running:
            label = running[0]
        elif comm:
            label, planted.comm_exposed = "bubble", planted.comm_exposed + 1
        else:
            label = "bubble" if p2p and (mid < first or mid >= last) else "idle"
        part[label] = part.get(label, 0.0) + 1.0
    planted.partition = part
    return planted


def write_pipeline(path: str, stage: int, stages: int, vendor: str = "cuda", microbatches: int = 4,
                   steps: int = 2) -> Planted:  # fmt: skip
    """The trace of pipeline stage ``stage`` (its rank) of ``stages``: ``steps`` steps of ``pipeline_schedule``,
    forward GEMMs on the compute stream, p2p kernels on two comm streams (receives, sends) launched by
    ``record_param_comms``. Returns one step's truth (``pipeline_truth``)."""
    opener: Any = gzip.open if path.endswith(".gz") else open
    kernel, send_name, recv_name = P2P[vendor]
    truth = Planted()
    with opener(path, "wt", encoding="utf-8") as fh:
        fh.write('{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "planted"}], ')
        fh.write(f'"distributedInfo": {{"backend": "nccl", "rank": {stage}, "world_size": {stages}}}, ')
        fh.write('"traceEvents": [\n')
        w = _Writer(fh, vendor, stage)
        w.v = {**w.v, "p2p": kernel}
        t0 = 1_000_000
        for s in range(steps):
            plan, end = pipeline_schedule(stages, microbatches, t0)
            mine = sorted(plan[stage], key=lambda k: k[1])
            group = str(list(range(stages)))  # the pipeline group
            for j, (what, a, b) in enumerate(mine):
                cpu = float(t0 + 1 + 4 * j)  # the CPU launches everything early: the GPU waits on data, not on it
                if what in ("send", "recv"):
                    ext = w.op("record_param_comms", cpu, 3.0, args={
                        "Collective name": send_name if what == "send" else recv_name, "In msg nelems": T * H,
                        "dtype": "BFloat16", "Process Group Ranks": group})  # fmt: skip
                    w.kernel("p2p", ext, cpu + 1, float(a), float(b - a), stream=w.v["comm_stream"] + (what == "send"))
                else:
                    op = "aten::_fused_adamw_" if what == "optimizer" else "aten::mm"
                    ext = w.op(op, cpu, 3.0)
                    w.kernel({"fwd": "gemm", "bwd": "gemm_bwd", "optimizer": "optimizer"}[what], ext, cpu + 1,
                             float(a), float(b - a))  # fmt: skip
            w.annotation(f"ProfilerStep#{s}", float(t0), float(end - t0))
            truth = pipeline_truth(plan[stage], t0, end)
            t0 = end
        fh.write('\n], "traceName": "planted pipeline", "displayTimeUnit": "ms"}\n')
    return truth
