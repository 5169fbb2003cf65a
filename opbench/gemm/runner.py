"""Times one GEMM shape on one backend: operands in the pass's layout, cache-cold rotation, reference check."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import torch

from opbench.core.device import DeviceInfo, torch_dtype
from opbench.core.sweep import STATUS_OK, Unsupported
from opbench.core.timing import TimingConfig, measure, rotation_count, timing_note

from .backends import BACKENDS
from .shapes import GemmShape

REF_ROWS = 64  # rows of C checked against an fp64 reference (cheap even for lm_head)


@dataclass(frozen=True)
class GemmCase:
    shape: GemmShape
    backend: str
    dtype: str  # requested operand dtype

    @property
    def effective_dtype(self) -> str:
        """fp8 backends force fp8 operands whatever --dtype says."""
        return BACKENDS[self.backend].input_dtype or self.dtype


def make_operands(
    shape: GemmShape, dtype: str, device: torch.device, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A [G?,m,k] and B [G?,k,n] as views over storage in the pass's layout (transA: A stored [k,m], …)."""
    g = (shape.groups,) if shape.groups > 1 else ()
    a_store = (*g, shape.k, shape.m) if shape.trans_a else (*g, shape.m, shape.k)
    b_store = (*g, shape.n, shape.k) if shape.trans_b else (*g, shape.k, shape.n)
    work = torch.float32 if dtype == "fp8" else torch_dtype(dtype)
    # Drawn on the device (generator's device) in the working dtype: no multi-GB host copies for lm_head.
    # Scaled so C has unit-order entries in every dtype (fp16 would overflow on raw randn for large k).
    a = torch.randn(a_store, generator=generator, dtype=work, device=device)
    b = torch.randn(b_store, generator=generator, dtype=work, device=device).mul_(shape.k**-0.5)
    if dtype == "fp8":
        fp8 = torch_dtype("fp8")
        a, b = a.to(fp8), b.to(fp8)
    if shape.trans_a:
        a = a.transpose(-1, -2)
    if shape.trans_b:
        b = b.transpose(-1, -2)
    return a, b


def max_rel_err(
    c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, generator: torch.Generator, block_elems: int = 1 << 23
) -> float:
    """max |C − C_ref| / max |C_ref| over up to REF_ROWS sampled rows of C.

    The reference runs on the same device in fp64 (CPU) or fp32 (GPU, TF32 off by torch's default), block by
    block of B (at most ``block_elems`` elements, 64 MiB in fp64, along K as well as N), so no operand is ever
    copied whole: lm_head's dgrad has K = the vocabulary and a whole-B copy would be 1.2 GB."""
    ref_dtype = torch.float64 if a.device.type == "cpu" else torch.float32
    m, k, n = a.shape[-2], b.shape[-2], b.shape[-1]
    rows = torch.randperm(m, generator=generator)[: min(m, REF_ROWS)].sort().values.to(a.device)
    a_rows = a.index_select(-2, rows)
    c_rows = c.index_select(-2, rows)
    col_chunk = max(1, min(n, block_elems // max(1, min(k, 4096))))
    k_chunk = max(1, block_elems // col_chunk)
    worst = scale = 0.0
    for j in range(0, n, col_chunk):
        ref = None
        for i in range(0, k, k_chunk):
            part = torch.matmul(
                a_rows[..., i : i + k_chunk].to(ref_dtype), b[..., i : i + k_chunk, j : j + col_chunk].to(ref_dtype)
            )
            ref = part if ref is None else ref.add_(part)
        assert ref is not None
        worst = max(worst, (c_rows[..., j : j + col_chunk].to(ref_dtype) - ref).abs().max().item())
        scale = max(scale, ref.abs().max().item())
    return worst / scale if scale > 0 else worst


def run_case(case: GemmCase, info: DeviceInfo, timing: TimingConfig, cold: bool = True) -> dict[str, Any]:
    """Measure one (shape, backend); raises Unsupported / RuntimeError for the sweep to turn into a row."""
    backend = BACKENDS[case.backend]
    shape = case.shape
    dtype = case.effective_dtype
    if backend.grouped_only and shape.groups == 1:
        raise Unsupported("not a grouped GEMM (groups=1); the torch backend times it")
    gen = torch.Generator().manual_seed(
        zlib.crc32(f"{shape.layer}/{shape.pass_}/{shape.m}/{shape.n}/{shape.k}".encode())
    )
    per_set = shape.bytes_moved(dtype)
    n_sets = rotation_count(per_set, info.device) if cold else 1
    dev_gen = torch.Generator(device=info.device).manual_seed(gen.initial_seed())
    operands = [make_operands(shape, dtype, info.device, dev_gen) for _ in range(n_sets)]
    fns_impls = [backend.build(a, b, dtype) for a, b in operands]
    impl = fns_impls[0][1]
    fns = [fi[0] for fi in fns_impls]

    # Correctness once per shape, before timing.
    c = fns[0]()
    a0, b0 = operands[0]
    if dtype == "fp8":
        a0, b0 = a0.float(), b0.float()
    err = max_rel_err(c, a0, b0, gen)

    state = {"i": 0}

    def rotate() -> None:
        state["i"] = (state["i"] + 1) % n_sets

    if n_sets == 1:
        stats = measure(fns[0], info.device, timing)
    else:
        stats = measure(lambda: fns[state["i"]](), info.device, timing, before=rotate)
    tflops = shape.flops / stats.median / 1e12
    peak = info.peak_tflops(dtype)
    return {
        **shape.as_row(),
        "dtype": dtype,
        "backend": case.backend,
        "impl": impl + (f", {n_sets} rotating operand sets" if n_sets > 1 else ""),
        "time_s": stats.median,
        "time_min_s": stats.min,
        "time_p10_s": stats.p10,
        "time_p90_s": stats.p90,
        "time_max_s": stats.max,
        "time_std_s": stats.std,
        "time_iqr_rel": stats.iqr_rel,
        "iters": stats.iters,
        "tflops": tflops,
        "bandwidth_gbs": per_set / stats.median / 1e9,
        "pct_of_peak": 100.0 * tflops / peak if peak else None,
        "max_rel_err": err,
        "status": STATUS_OK,
        "error": None,
        "note": timing_note(stats),
    }
