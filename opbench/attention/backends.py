"""Attention backends: one table, one ``build`` function each.

``build(shape, device, dtype)`` returns a ``Prepared`` callable ``fn(*inputs) -> out`` for that case (mask and
scale baked in, tensors in the backend's ``layout``), or raises ``Unsupported`` with the reason. Adding a
backend is one build function and one line in ``BACKENDS``. Softmax backends compute
softmax(q·kᵀ / sqrt(head_dim_qk)) · v on (q, k, v) with causal masks aligned bottom-right and narrowed by the
shape's kind (see reference.py); the linear backends compute gated DeltaNet on (q, k, v, g, β), the indexer
backend DeepSeek-V3.2's index scores on (q, k, w), the mamba2 backends Mamba-2's scan on (x, Δ, A, B, C, D)
(operators.py).
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from opbench.core.sweep import Unsupported
from opbench.models.layout import FULL, SLIDING

from .operators import (
    chunked_gated_delta_rule,
    chunked_kda,
    chunked_ssd,
    compressed_attention_op,
    hyper_connection,
    indexer_scores,
)
from .reference import eager_attention, visible_mask
from .schema import BACKEND_NAMES
from .shapes import AttentionShape

AttnFn = Callable[..., torch.Tensor]

BSHD = "bshd"  # flash-attn: (batch, seq, heads, dim)
BHSD = "bhsd"  # SDPA / eager: (batch, heads, seq, dim)


@dataclass(frozen=True)
class Prepared:
    fn: AttnFn
    note: str = ""  # what the row should say about how it ran (padding, TF32, …)
    untimed_reason: str | None = None  # set when results can be checked but timing would be meaningless
    # Applied to the inputs (in the backend's layout) before the timed region: a kernel without GQA gets K and V
    # with every query head's copy, as the models that call it build them. None: inputs as they are.
    adapt_inputs: Callable[[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]] | None = None
    # What the row should say once the inputs are known (the kernel torch's default SDPA dispatch picks); "" if
    # nothing.
    describe: Callable[[tuple[torch.Tensor, ...]], str] | None = None


def expand_kv_heads(layout: str, groups: int) -> Callable[[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]]:
    """(q, k, v) -> (q, k', v') with each K/V head repeated ``groups`` times next to itself (query head h reads
    K/V head h // groups, the GQA convention of every model opbench knows); differentiable, so gradients checked
    against the reference still reach the original K/V heads."""
    head_dim = 2 if layout == BSHD else 1

    def adapt(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        q, k, v, *rest = inputs
        return (q, k.repeat_interleave(groups, dim=head_dim), v.repeat_interleave(groups, dim=head_dim), *rest)

    return adapt


@dataclass(frozen=True)
class Backend:
    name: str
    layout: str
    build: Callable[[AttentionShape, torch.device, str], Prepared]
    description: str


def _scale(shape: AttentionShape) -> float:
    return shape.head_dim_qk**-0.5


# --- math: eager matmul + softmax -------------------------------------------------------------------------


MASKED_NOTE = "dense kernel under a {kind} mask: every score is computed, fwd_flops counts the visible ones"


def _build_math(shape: AttentionShape, device: torch.device, dtype: str) -> Prepared:
    fn = partial(eager_attention, causal=shape.causal, scale=_scale(shape), kind=shape.attn_kind, window=shape.window)
    return Prepared(fn, MASKED_NOTE.format(kind=shape.attn_kind) if shape.attn_kind != FULL else "")


# --- torch SDPA, default dispatch or one kernel ------------------------------------------------------------

SDPA_KERNELS = {
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_math": "MATH",
}
CPU_SDPA_KERNELS = ("FLASH_ATTENTION", "MATH")  # the only SDPA kernels torch implements for CPU tensors
# SDPA kernels that refuse K/V with fewer heads than Q ("both fused kernels require query, key and value to have
# the same num_heads"): opbench expands K/V first, outside the timed region (docs/attention.md "GQA").
KV_EXPANDED_KERNELS = {"EFFICIENT_ATTENTION"}
KV_EXPANDED_NOTE = (
    "K/V heads expanded {kv}->{q} before timing (this kernel has no GQA; models repeat K/V for it); "
    "the expansion's time and memory are not in the row"
)


def sdpa_mask_kwargs(shape: AttentionShape, device: torch.device | None = None) -> dict[str, Any]:
    """SDPA's ``is_causal`` aligns top-left; flash-attn (and our convention) bottom-right. They coincide for
    seqlen_q == seqlen_kv; otherwise pass torch's lower-right CausalBias, which uses the flash/efficient
    kernels' own bottom-right mode where they can run and a materialised boolean mask elsewhere. Windowed kinds
    pass their boolean mask (SDPA has no window argument)."""
    if not shape.causal:
        return {}
    if shape.attn_kind != FULL:
        mask = visible_mask(shape.seqlen_q, shape.seqlen_kv, device, kind=shape.attn_kind, window=shape.window)
        return {"attn_mask": mask}
    if shape.seqlen_q == shape.seqlen_kv:
        return {"is_causal": True}
    from torch.nn.attention.bias import causal_lower_right

    return {"attn_mask": causal_lower_right(shape.seqlen_q, shape.seqlen_kv)}


def _sdpa_unavailable(kernel: str, exc: BaseException, call: Callable[[], Any]) -> Unsupported:
    """Turn torch's 'no kernel' error into an Unsupported carrying torch's own reasons (emitted as warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with contextlib.suppress(RuntimeError):
            call()
    reasons = [str(w.message).split(" (Triggered internally")[0] for w in caught]
    reasons = [r for r in dict.fromkeys(reasons) if "not used because" not in r] or [str(exc).split("\n")[0]]
    return Unsupported(f"torch SDPA {kernel} kernel cannot run this case: {'; '.join(reasons)}"[:400])


def _build_sdpa(kernel: str | None, shape: AttentionShape, device: torch.device, dtype: str) -> Prepared:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if kernel and device.type == "cpu" and kernel not in CPU_SDPA_KERNELS:
        raise Unsupported(
            f"torch has no CPU implementation of the SDPA {kernel} kernel (CPU offers {' and '.join(CPU_SDPA_KERNELS)})"
        )
    if kernel == "CUDNN_ATTENTION" and getattr(torch.version, "hip", None):
        raise Unsupported("cuDNN attention does not exist on ROCm")
    kwargs = sdpa_mask_kwargs(shape, device)
    notes = [MASKED_NOTE.format(kind=shape.attn_kind)] if shape.attn_kind != FULL else []
    adapt = None
    if shape.num_head_kv != shape.num_head_q and kernel in KV_EXPANDED_KERNELS:
        adapt = expand_kv_heads(BHSD, shape.num_head_q // shape.num_head_kv)
        notes.append(KV_EXPANDED_NOTE.format(kv=shape.num_head_kv, q=shape.num_head_q))
    elif shape.num_head_kv != shape.num_head_q:
        kwargs["enable_gqa"] = True  # native GQA (torch ≥ 2.5): KV heads are not repeated in memory
    kwargs["scale"] = _scale(shape)
    chosen = getattr(SDPBackend, kernel) if kernel else None

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = sdpa_kernel(chosen) if chosen is not None else contextlib.nullcontext()
        try:
            with ctx:
                return F.scaled_dot_product_attention(q, k, v, **kwargs)
        except RuntimeError as exc:
            if "No available kernel" in str(exc) or "No viable backend" in str(exc):

                def retry() -> None:
                    with sdpa_kernel(chosen) if chosen is not None else contextlib.nullcontext():
                        F.scaled_dot_product_attention(q, k, v, **kwargs)

                raise _sdpa_unavailable(kernel or "default", exc, retry) from None
            raise
        except TypeError as exc:
            if "enable_gqa" in str(exc):
                raise Unsupported("this torch's SDPA has no enable_gqa (needs torch ≥ 2.5)") from None
            raise

    # The default dispatch's choice, in the row; a CausalBias (``variant``) dispatches itself: torch's selector
    # would not say what it runs
    default = chosen is None and not hasattr(kwargs.get("attn_mask"), "variant")
    describe = partial(sdpa_choice, kwargs) if default else None
    return Prepared(fn, "; ".join(notes), adapt_inputs=adapt, describe=describe)


def sdpa_choice(kwargs: dict[str, Any], inputs: tuple[torch.Tensor, ...]) -> str:
    """Which kernel torch's default SDPA dispatch runs on these inputs (cuDNN first on Hopper with cuDNN > 9.15 in
    recent torch, flash or efficient otherwise), from torch's own selector; "" where torch has none to ask."""
    from torch.nn.attention import SDPBackend

    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:
        return ""
    try:
        picked = SDPBackend(choose(*inputs[:3], **kwargs)).name
    except (RuntimeError, TypeError, ValueError):
        return ""
    return f"torch's dispatch runs SDPA {picked}"


# --- flash-attn (FlashAttention-2, or FlashAttention-3's interface when installed) ------------------------


def flash_attn_adapter(flash_attn_func: Callable[..., Any], shape: AttentionShape, pad_v: bool) -> Prepared:
    """Wrap a function with flash_attn_func's signature ``(q, k, v, dropout_p, softmax_scale, causal, …)``
    taking (batch, seq, heads, dim) tensors. flash-attn handles GQA (fewer KV heads) and bottom-right causal
    itself. ``pad_v``: FlashAttention-2 wants v's head dim equal to q/k's, so MLA's v (128) is zero-padded to
    192 and the output sliced back (exact; the padding copy is part of the timed call, as in training code)."""
    d_qk, d_v = shape.head_dim_qk, shape.head_dim_v
    scale = _scale(shape)
    pad = d_qk - d_v if pad_v and d_v != d_qk else 0
    if pad < 0:
        raise Unsupported(f"head_dim_v {d_v} > head_dim_qk {d_qk}: cannot pad v for flash-attn 2")
    if shape.attn_kind not in (FULL, SLIDING):
        raise Unsupported(f"flash-attn has no {shape.attn_kind} mask (sliding windows and full causal only)")
    # window_size=(left, right): keys i − left … i + right; a sliding window of W keys is (W − 1, 0)
    window = {"window_size": (shape.window - 1, 0)} if shape.attn_kind == SLIDING else {}

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if pad:
            v = F.pad(v, (0, pad))
        res = flash_attn_func(q, k, v, softmax_scale=scale, causal=shape.causal, **window)
        out = res[0] if isinstance(res, tuple) else res  # FA3 builds return (out, lse)
        return out[..., :d_v] if pad else out

    note = f"v zero-padded {d_v}->{d_qk} (flash-attn 2 needs equal head dims)" if pad else ""
    return Prepared(fn, note)


# Where each FlashAttention generation's flash_attn_func lives, and the compute capabilities it is built for (None:
# any GPU the package was built for, ROCm's CK/Triton builds included): FA3 is the hopper/ build's module, FA4 the
# flash-attn-4 wheel (CuTe DSL, Hopper and Blackwell), which installs flash_attn.cute only.
FLASH_ATTN_MODULES = (
    ("flash_attn_interface", "fa3", (9,)),
    ("flash_attn.cute", "fa4", (9, 10)),
    ("flash_attn", "fa2", None),
)


def load_flash_attn(device: torch.device) -> tuple[Callable[..., Any], str]:
    """(flash_attn_func, 'fa3'|'fa4'|'fa2'): the newest generation installed that runs on this GPU."""
    hip = bool(getattr(torch.version, "hip", None))
    major = torch.cuda.get_device_capability(device)[0] if device.type == "cuda" and not hip else None
    missing = []
    for module, flavour, majors in FLASH_ATTN_MODULES:
        if majors is not None and major not in majors:
            continue
        try:
            return importlib.import_module(module).flash_attn_func, flavour
        except ImportError as exc:
            missing.append(f"{module}: {exc.msg}")
        except AttributeError:
            missing.append(f"{module} has no flash_attn_func")
    raise Unsupported(
        f"flash_attn is not installed ({'; '.join(missing)}); pip install flash-attn, or flash-attn-4 on Hopper/"
        "Blackwell (on ROCm: flash-attn's CK or Triton build)"
    )


def _build_flash_attn(shape: AttentionShape, device: torch.device, dtype: str) -> Prepared:
    if device.type != "cuda":
        raise Unsupported("flash-attn runs on CUDA/ROCm GPUs only")
    if dtype not in ("fp16", "bf16"):
        raise Unsupported(f"flash-attn takes fp16/bf16, not {dtype}")
    if max(shape.head_dim_qk, shape.head_dim_v) > 256:
        raise Unsupported(f"flash-attn supports head dims up to 256, got {shape.head_dim_qk}/{shape.head_dim_v}")
    func, flavour = load_flash_attn(device)
    prepared = flash_attn_adapter(func, shape, pad_v=flavour == "fa2")
    return Prepared(prepared.fn, "; ".join(filter(None, [flavour, prepared.note])))


# --- triton: opbench's own kernel ---------------------------------------------------------------------------


def _build_triton(shape: AttentionShape, device: torch.device, dtype: str) -> Prepared:
    from .triton_attention import interpreter_enabled, triton_attention

    try:
        import triton  # noqa: F401
    except ImportError:
        raise Unsupported("triton is not installed (pip install triton)") from None
    if shape.attn_kind not in (FULL, SLIDING):
        raise Unsupported(
            f"opbench's Triton kernel has no {shape.attn_kind} mask (sliding windows and full causal only)"
        )
    window = shape.window if shape.attn_kind == SLIDING else 0
    fn = partial(triton_attention, causal=shape.causal, softmax_scale=_scale(shape), window=window)
    if device.type == "cpu":
        if not interpreter_enabled():
            raise Unsupported(
                "triton kernels need a GPU; on CPU run with TRITON_INTERPRET=1 to check correctness (never timed)"
            )
        return Prepared(
            fn,
            "TRITON_INTERPRET=1",
            untimed_reason="triton interpreter on CPU: checked against "
            "the reference, not timed (numpy emulation says nothing about kernel speed)",
        )
    return Prepared(fn, "fp32: tl.dot at its default precision, TF32 on NVIDIA" if dtype == "fp32" else "")


# --- gated DeltaNet (linear attention) and the DSA indexer ---------------------------------------------------


def _build_gdn_torch(shape: AttentionShape, device: torch.device, dtype: str) -> Prepared:
    fn = partial(chunked_gated_delta_rule, chunk=shape.window)
    return Prepared(fn, f"chunkwise gated delta rule in torch ops, chunk {shape.window}, fp32 accumulation")


def _build_gdn_fla(shape: AttentionShape, device: torch.device, dtype: str) -> Prepared:
    """flash-linear-attention's chunk kernel (Triton), as transformers' Qwen3-Next calls it: q/k heads repeated to
    the value heads, L2 norm inside the kernel. Not run on a GPU yet."""
    if device.type != "cuda":
        raise Unsupported("flash-linear-attention's kernels run on CUDA/ROCm GPUs only")
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as exc:
        raise Unsupported(
            f"flash-linear-attention is not installed ({exc.msg}); pip install flash-linear-attention"
        ) from None
    rep = shape.num_head_q // shape.num_head_kv

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        if rep > 1:
            q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
        out = chunk_gated_delta_rule(q, k, v, g, beta, scale=shape.head_dim_qk**-0.5, use_qk_l2norm_in_kernel=True)
        return out[0] if isinstance(out, tuple) else out

    return Prepared(fn, "fla chunk_gated_delta_rule")


def _build_indexer_torch(shape: AttentionShape, device: torch.device, dtype: str) -> Prepared:
    pooled = f" over keys pooled {shape.compress}:1 (DeepSeek-V4)" if shape.compress else ""
    return Prepared(
        partial(indexer_scores, top_k=shape.window, compress=shape.compress or 1, seqlen_kv=shape.seqlen_kv),
        f"scores in torch ops (8 index heads at a time) + top-{shape.window} keys per query{pooled}",
    )


# --- DeepSeek-V4: compressed attention (csa, hca) and hyper-connections (hc) ----------------------------------


def _build_v4_torch(shape: AttentionShape, device: torch.device, dtype: str) -> Prepared:
    """The compressor's pooling and the attention over the window's raw keys and the pooled keys, in torch ops
    (operators.compressed_attention_op): every score is computed and masked, 8 heads at a time. DeepSeek's own
    kernels (FlashMLA's sparse attention, TileLang's) are built for CUDA SM90/SM100 from source and are not
    installable here; this is the check and the CPU baseline, not the fast path."""
    topk = shape.topk if shape.attn_kind == "csa" else 0
    fn = partial(compressed_attention_op, window=shape.window, rate=shape.compress, topk=topk)
    picked = f", top-{topk} pooled keys by a fixed stand-in score" if topk else ""
    return Prepared(fn, f"dense scores under the window + pooled-key mask, torch ops{picked}")


def _build_hc_torch(shape: AttentionShape, device: torch.device, dtype: str) -> Prepared:
    """One hyper-connection site in torch ops (operators.hyper_connection): memory-bound elementwise work and n×n
    Sinkhorn steps, a dozen small kernels per iteration unfused (Megatron-Core fuses them with torch.compile or
    its cuTile kernels); timed as the unfused eager sequence transformers runs."""
    return Prepared(partial(hyper_connection, iters=shape.window), f"eager torch ops, {shape.window} Sinkhorn steps")


# --- Mamba-2's chunked scan (SSD) ----------------------------------------------------------------------------


def _build_mamba2_torch(shape: AttentionShape, device: torch.device, dtype: str) -> Prepared:
    fn = partial(chunked_ssd, chunk=shape.window)
    return Prepared(fn, f"chunked SSD in torch ops, chunk {shape.window}, fp32 accumulation")


def _build_mamba2_ssm(shape: AttentionShape, device: torch.device, dtype: str) -> Prepared:
    """mamba_ssm's fused Triton SSD (``mamba_chunk_scan_combined``), as Megatron-Core's MambaMixer and
    transformers' NemotronH (through the Hub kernel) call it: Δ already positive, D as the skip, no gate. Not run
    on a GPU yet."""
    if device.type != "cuda":
        raise Unsupported("mamba_ssm's Triton SSD kernels run on CUDA/ROCm GPUs only")
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except ImportError as exc:
        raise Unsupported(f"mamba_ssm is not installed ({exc.msg}); pip install mamba-ssm") from None

    def fn(*inputs: torch.Tensor) -> torch.Tensor:  # (x, Δ, A, B, C, D)
        x, dt, a, b, c, d = inputs
        out: torch.Tensor = mamba_chunk_scan_combined(x, dt, a, b, c, chunk_size=shape.window, D=d)
        return out

    return Prepared(fn, "mamba_ssm mamba_chunk_scan_combined")


# --- Kimi Delta Attention (KDA) --------------------------------------------------------------------------------


def _build_kda_torch(shape: AttentionShape, device: torch.device, dtype: str) -> Prepared:
    fn = partial(chunked_kda, chunk=shape.window)
    return Prepared(fn, f"chunkwise KDA in torch ops, chunk {shape.window}, fp32 accumulation")


def _build_kda_fla(shape: AttentionShape, device: torch.device, dtype: str) -> Prepared:
    """flash-linear-attention's chunk KDA kernel (``fla.ops.kda.chunk_kda``, Triton; fla ≥ 0.4), as transformers'
    Kimi Linear calls it from the Hub: per-channel log-decay g, L2 norm of q and k inside the kernel, scale
    d_k^−½; its chunk is the kernel's own 64 (the kda kind's). Not run on a GPU yet. On the CPU it cannot run:
    its kernels are autotuned, which needs a GPU driver, and Triton's interpreter (TRITON_INTERPRET=1, autotuning
    cut to one config) fails inside them (fla 0.6.0, Triton 3.9: docs/models.md, "Kimi Linear")."""
    if device.type != "cuda":
        raise Unsupported("flash-linear-attention's KDA kernels run on CUDA/ROCm GPUs only")
    try:
        from fla.ops.kda import chunk_kda
    except ImportError as exc:
        raise Unsupported(
            f"flash-linear-attention is not installed ({exc.msg}); pip install flash-linear-attention"
        ) from None

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        out = chunk_kda(q, k, v, g, beta, scale=shape.head_dim_qk**-0.5, use_qk_l2norm_in_kernel=True)
        return out[0] if isinstance(out, tuple) else out

    return Prepared(fn, "fla chunk_kda")


BACKENDS: dict[str, Backend] = {
    "math": Backend("math", BHSD, _build_math, "eager matmul + softmax (materialises the scores)"),
    "sdpa": Backend("sdpa", BHSD, partial(_build_sdpa, None), "torch SDPA, torch picks the kernel"),
    **{
        name: Backend(name, BHSD, partial(_build_sdpa, kernel), f"torch SDPA forced to {kernel} via sdpa_kernel")
        for name, kernel in SDPA_KERNELS.items()
    },
    "flash_attn": Backend("flash_attn", BSHD, _build_flash_attn, "flash_attn_func (FA3 interface on Hopper)"),
    "triton": Backend("triton", BSHD, _build_triton, "opbench's fused Triton kernel (fwd + bwd)"),
    "gdn_torch": Backend("gdn_torch", BSHD, _build_gdn_torch, "gated DeltaNet, chunkwise, torch ops (linear kind)"),
    "gdn_fla": Backend("gdn_fla", BSHD, _build_gdn_fla, "gated DeltaNet, flash-linear-attention kernel (linear kind)"),
    "indexer_torch": Backend("indexer_torch", BSHD, _build_indexer_torch, "DSA lightning indexer, torch ops"),
    "mamba2_torch": Backend("mamba2_torch", BSHD, _build_mamba2_torch, "Mamba-2 chunked scan (SSD), torch ops"),
    "mamba2_ssm": Backend("mamba2_ssm", BSHD, _build_mamba2_ssm, "Mamba-2 SSD, mamba_ssm's Triton kernel"),
    "kda_torch": Backend("kda_torch", BSHD, _build_kda_torch, "Kimi Delta Attention, chunkwise, torch ops"),
    "kda_fla": Backend("kda_fla", BSHD, _build_kda_fla, "Kimi Delta Attention, flash-linear-attention's kernel"),
    "v4_torch": Backend("v4_torch", BSHD, _build_v4_torch, "DeepSeek-V4 csa/hca: compressor + attention, torch ops"),
    "hc_torch": Backend("hc_torch", BSHD, _build_hc_torch, "DeepSeek-V4 hyper-connection site, torch ops"),
}
if tuple(BACKENDS) != BACKEND_NAMES:  # the CLI lists schema.BACKEND_NAMES without importing this module
    raise RuntimeError(f"attention backends {tuple(BACKENDS)} differ from schema.BACKEND_NAMES {BACKEND_NAMES}")


def to_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """bshd (how inputs are generated) → a backend's layout, contiguous in that layout."""
    return t if layout == BSHD else t.transpose(1, 2).contiguous()


def from_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A backend's output → bshd, for comparison with the reference."""
    return t if layout == BSHD else t.transpose(1, 2)
