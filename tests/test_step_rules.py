"""The attribution rules on kernel names as real traces of both vendors print them (Kineto's kernel "name": the
demangled signature, cut here where it runs on), and on ATen operator names."""

from __future__ import annotations

import pytest

from opbench.steptrace import rules

KERNELS = [
    # cuBLAS / cuBLASLt (H100), nvjet (cuBLAS 12.8+ on Hopper/Blackwell), cutlass
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
        "gemm",
    ),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT", "gemm"),
    ("sm80_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize160x128x32_stage4_warpsize2x2x1_tensor16x8x16_kernel", "gemm"),
    (
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_nn_align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_nn_align8::Params)",
        "gemm",
    ),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "gemm"),
    (
        "void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, false>(cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, __nv_bfloat16*, float const*, float const*, __nv_bfloat16 const*, float*, void*, long, float*, int*)",
        "gemm",
    ),
    ("triton_tem_fused_mm_0", "gemm"),
    # hipBLASLt / Tensile, rocBLAS, CK GEMM (MI300X)
    (
        "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0_EPS0_GRVWA8_GRVWB8_GSU0_GSUAMB_GLS0_ISA942_IU1_K1_LBSPPA128_LBSPPB128_LBSPPM0_LPA16_LPB16_LPM0_LRVW8_LWPMn1_MIAV1_MIWT8_8_MO40_NTn1_NTA0_NTB0_NTC0_NTD4_NEPBS16_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_SPO0_SRVW0_SSO0_SVW8_SK3_SKXCCM8_TLDS1_ULSGRO0_USL1_UIOFGRO0_USFGRO0_VSn1_VWA8_VWB8_WSGRA0_WSGRB0_WS64_WG32_8_1",
        "gemm",
    ),
    ("Cijk_Ailk_Bljk_SB_MT64x64x16_SN_1LDSB0_APM1_ABV0_ACED0_AF0EM1_AF1EM1_AMAS3_ASE_ASGT_ASAE01_ASCE01_ASEM1", "gemm"),
    (
        "void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemm_xdl_cshuffle_v3<ck::tensor_layout::gemm::RowMajor, ck::tensor_layout::gemm::ColumnMajor>, true, 2>(ck::GridwiseGemm_xdl_cshuffle_v3::Argument)",
        "gemm",
    ),
    (
        "void rocblas_gemm_batched_general_kernel<float, 64, 4, 16>(int, int, int, float const*, float const* const*)",
        "gemm",
    ),
    # attention: FA2, FA3, cuDNN SDPA, PyTorch's mem-efficient, CK tile FMHA, aiter
    (
        "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, true, false, false, false, false, true, false>(flash::Flash_fwd_params)",
        "attention",
    ),
    (
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<pytorch_flash::Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t>, true, true, false, false, false, false, false, false>(pytorch_flash::Flash_bwd_params)",
        "attention",
    ),
    (
        "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cutlass::bfloat16_t, float, cutlass::arch::Sm90, true> > > >(flash::FlashAttnFwdSm90::Params)",
        "attention",
    ),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_6_64x128x128_4x1x1_kernel0_0", "attention"),
    (
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
        "attention",
    ),
    (
        "void kernel_func<ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVSAsync<ck_tile::BlockFmhaPipelineProblem<ck_tile::bf16_t> > > >(ck_tile::FmhaFwdKernel::Kargs)",
        "attention",
    ),
    ("_ZN5aiter43fmha_bwd_hd128_bf16_causal_a16_rtne_recompileE", "attention"),
    # memory-bound: ATen elementwise and reductions, triton pointwise, norms, copies
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)",
        "memory",
    ),
    (
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4>)",
        "memory",
    ),
    ("triton_poi_fused__to_copy_add_mul_rsqrt_0", "memory"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1", "memory"),
    (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)",
        "memory",
    ),
    (
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 3, 64, 64>(at::native::(anonymous namespace)::OpaqueType<2u>*, at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 64, 64>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)",
        "memory",
    ),
    ("__amd_rocclr_copyBuffer", "memory"),
    # the optimizer's fused kernels (the foreach ones are memory-bound unless Optimizer.step launched them)
    (
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, double, bool*, float*>",
        "optimizer",
    ),
    (
        "void multi_tensor_apply_kernel<TensorListMetadata<2>, ScaleFunctor<float, float>, float>(long, int volatile*, TensorListMetadata<2>, ScaleFunctor<float, float>, float)",
        "memory",
    ),
    # collectives: NCCL 2.19+ (ncclDevKernel), NCCL before and RCCL (ncclKernel)
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "comm"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "comm"),
    ("void ncclKernel_ReduceScatter_RING_LL_Sum_bf16(ncclDevComm*, unsigned long, ncclWork*)", "comm"),
    ("some_custom_kernel_xyz", "other"),
]


@pytest.mark.parametrize("name,klass", KERNELS, ids=[n[:40] for n, _ in KERNELS])
def test_kernel_names(name, klass):
    assert rules.kernel_class(name) == klass


def test_collective_kinds_and_directions():
    kinds = {
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "all_gather",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL": "reduce_scatter",
        "ncclKernel_AllReduce_RING_LL_Sum_float": "all_reduce",
        "ncclDevKernel_SendRecv": "send_recv",
        "_reduce_scatter_base": "reduce_scatter",
        "allgather_into_tensor_coalesced": "all_gather",
        "all_to_allv": "all_to_all",
        "allreduce": "all_reduce",
        "broadcast": "broadcast",
        "barrier": "other",
    }
    for name, kind in kinds.items():
        assert rules.collective_kind(name) == kind, name
    assert rules.direction("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma") == "bwd"
    assert rules.direction("void flash::flash_fwd_kernel<>") == "fwd"
    assert rules.direction("void kernel_func<ck_tile::FmhaBwdDQDKDVKernel<>>") == "bwd"
    assert rules.attention_backend("cutlass::device_kernel<flash::FlashAttnFwdSm90<>>") == "fa3"
    assert rules.attention_backend("kernel_func<ck_tile::FmhaFwdKernel>") == "ck"


def test_operator_names():
    assert rules.op_class("aten::addmm") == "gemm"
    assert rules.op_class("aten::_grouped_mm") == "gemm"
    assert rules.op_class("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == "attention"
    assert rules.op_class("aten::_fused_adamw_") == "optimizer"
    assert rules.op_class("record_param_comms") == "comm"
    assert rules.op_class("c10d::allreduce_") == "comm"
    assert rules.op_class("aten::add_") == "memory"
    for view in ("aten::view", "aten::t", "aten::transpose", "aten::empty", "aten::reshape", "aten::resolve_conj"):
        assert rules.op_class(view) is None, view
    assert rules.op_class("autograd::engine::evaluate_function: MmBackward0") is None


def test_gemm_shapes_from_input_dims():
    assert rules.gemm_shape("aten::mm", [[4096, 1024], [1024, 2816]]) == (4096, 2816, 1024, 1)
    assert rules.gemm_shape("aten::addmm", [[2816], [4096, 1024], [1024, 2816], [], []]) == (4096, 2816, 1024, 1)
    assert rules.gemm_shape("aten::bmm", [[8, 128, 64], [8, 64, 256]]) == (128, 256, 64, 8)
    assert rules.gemm_shape("aten::linear", [[2, 2048, 1024], [2816, 1024], []]) == (4096, 2816, 1024, 1)
    assert rules.gemm_shape("aten::_grouped_mm", [[1024, 384], [8, 384, 256], [8]]) == (128, 256, 384, 8)
    assert rules.gemm_shape("aten::mm", [[], []]) is None
    assert rules.gemm_shape("aten::mm", "junk") is None  # type: ignore[arg-type]
    assert rules.dtype_name("c10::BFloat16") == "bf16" and rules.dtype_name("float") == "fp32"
