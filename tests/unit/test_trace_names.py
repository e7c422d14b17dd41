"""swift_nb.core.trace_names: the trace's vocabulary (steps, collectives) and interval arithmetic,
on names and spans written by hand and on a real NCCL trace."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from swift_nb.core import intervals
from swift_nb.core import trace_names as tn

# A real GPU trace (see tests/data/gpu/README.md).
NCCL_TRACE = Path(__file__).parents[1] / "data" / "gpu" / "gpu_nccl_2ranks_rank0.json.gz"


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("ProfilerStep#0", 0),
        ("ProfilerStep#12", 12),
        (tn.STEP_PREFIX + "7", 7),
        ("ProfilerStep#", None),
        ("ProfilerStep#3 ", None),
        ("ProfilerStep#x", None),
        ("aten::mm", None),
        ("", None),
    ],
)
def test_step_of(name, step):
    assert tn.step_of(name) == step


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        # NCCL kernels, as NCCL ≥ 2.19 and older versions name them (with or without signature)
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "all_reduce"),
        ("ncclKernel_AllGather_RING_LL_Sum_int8_t", "all_gather"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"),
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "broadcast"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "send_recv"),
        # the ops the training thread issues
        ("c10d::allreduce_", "all_reduce"),
        ("c10d::allreduce_coalesced_", "all_reduce"),
        ("c10d::_allgather_base_", "all_gather"),
        ("c10d::allgather_into_tensor_coalesced_", "all_gather"),
        ("c10d::_reduce_scatter_base_", "reduce_scatter"),
        ("c10d::reduce_scatter_tensor_coalesced_", "reduce_scatter"),
        ("c10d::broadcast_", "broadcast"),
        ("c10d::alltoall_base_", "all_to_all"),
        ("c10d::send", "send_recv"),
        ("c10d::recv_", "send_recv"),
        ("c10d::barrier", "barrier"),
        # the backends' own annotations
        ("gloo:all_reduce", "all_reduce"),
        ("gloo:broadcast", "broadcast"),
        ("nccl:all_reduce", "all_reduce"),
        ("nccl:_all_gather_base", "all_gather"),
        ("nccl:all_to_all", "all_to_all"),
        # not collectives, or no kind
        ("record_param_comms", None),
        ("c10d::unknown_op_", None),
        ("aten::all", None),
        ("ProfilerStep#1", None),
        ("ampere_sgemm_128x64_nn", None),
    ],
)
def test_collective_kind(name, kind):
    assert tn.collective_kind(name) == kind


def test_masks_tell_collectives_from_compute():
    names = [
        "c10d::allreduce_",
        "gloo:all_reduce",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        "sgemm",
        "aten::mm",
    ]
    cats = ["cpu_op", "user_annotation", "kernel", "kernel", "cpu_op"]
    named = np.array([tn.is_collective(n) for n in names])
    assert named.tolist() == [True, True, True, False, False]
    assert tn.collective_mask(named, cats).tolist() == [True, True, True, False, False]
    assert tn.compute_mask(named, cats).tolist() == [False, False, False, True, False]
    # the GPU-side copy of an NCCL annotation is no second collective span
    assert tn.collective_mask(np.array([True]), ["gpu_user_annotation"]).tolist() == [False]
    assert tn.collective_mask(np.array([], dtype=bool), []).shape == (0,)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        # names from the real traces in tests/data/gpu
        ("ampere_sgemm_128x64_nn", "gemm"),
        ("volta_sgemm_64x32_sliced1x4_tn", "gemm"),
        (
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(cutlass_80_…::Params)",
            "gemm",
        ),
        (
            "void gemmk1_kernel<float, 256, 5, false, false, false, false, cublasGemvTensorStridedBatched<…>",
            "gemm",
        ),
        (
            "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>",
            "gemm",
        ),
        (
            "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16",
            "convolution",
        ),
        ("cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1", "convolution"),
        ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(…)", "convolution"),
        (
            "void cask_cudnn_infer::computeOffsetsKernel<false, false>(cask_cudnn_infer::ComputeOffsetsParams)",
            "convolution",
        ),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
        (
            "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
            "communication",
        ),
        ("Memcpy HtoD (Pinned -> Device)", "memcpy"),
        ("Memcpy DtoD (Device -> Device)", "memcpy"),
        ("Memset (Device)", "memset"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, …>",
            "elementwise/reduction",
        ),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<…>",
            "elementwise/reduction",
        ),
        ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(…)", "elementwise/reduction"),
        (
            "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true, false>(…)",
            "elementwise/reduction",
        ),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<…>", "elementwise/reduction"),
        (
            "void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*, int*)",
            "elementwise/reduction",
        ),
        (
            "void split_embedding_codegen_forward_unweighted_kernel<c10::Half, c10::Half, float, …>",
            "embedding",
        ),
        ("void permute_pooled_embs_kernel<float>(float const*, long const*, …)", "embedding"),
        ("void compute_cuda_kernel<long>(long*, long*, long*, long, long)", "other"),
        # names of newer stacks
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute", "gemm"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "gemm"),
        (
            "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 64, 64, 4>>",
            "attention",
        ),
        (
            "fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<…>::Params)",
            "attention",
        ),
    ],
)
def test_kernel_kind(name, kind):
    assert tn.kernel_kind(name) == kind and kind in tn.KERNEL_KIND_NAMES


@pytest.mark.parametrize(
    ("name", "compute"),
    [
        ("ampere_sgemm_128x64_nn", True),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", False),
        ("ncclDevKernel_AllGather_RING_LL", False),
        ("Memcpy HtoD (Pinned -> Device)", False),
        ("Memset (Device)", False),
        ("void cudaStreamSync_helper()", False),  # HTA's rule: a name with "Sync" is not compute
    ],
)
def test_compute_follows_hta(name, compute):
    assert tn.is_compute(name) is compute


def test_intervals_agree_with_a_plain_loop():
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = rng.integers(0, 60, (rng.integers(0, 9), 2)).astype(float)
        b = rng.integers(0, 60, (rng.integers(0, 9), 2)).astype(float)
        a, b = np.sort(a, axis=1), np.sort(b, axis=1)
        ua, ub = intervals.union(a[:, 0], a[:, 1]), intervals.union(b[:, 0], b[:, 1])
        # on a grid of half-unit cells, a point is in a union iff some interval holds it
        grid = np.arange(0, 60, 0.5) + 0.25
        in_a = ((grid[:, None] >= a[:, 0]) & (grid[:, None] < a[:, 1])).any(axis=1)
        in_b = ((grid[:, None] >= b[:, 0]) & (grid[:, None] < b[:, 1])).any(axis=1)
        assert intervals.length(ua) == in_a.sum() / 2
        assert intervals.length(intervals.subtract(ua, ub)) == (in_a & ~in_b).sum() / 2
        assert intervals.length(intervals.intersect(ua, ub)) == (in_a & in_b).sum() / 2
        spans = np.sort(rng.integers(0, 60, (4, 2)), axis=1)
        inside = (grid[None, :] >= spans[:, :1]) & (grid[None, :] < spans[:, 1:])
        assert intervals.covered(spans, ua).tolist() == ((inside & in_a).sum(axis=1) / 2).tolist()
    assert intervals.intersect(np.empty((0, 2)), intervals.union([0], [1])).shape == (0, 2)


def test_union_length_clip_subtract():
    u = intervals.union([5, 0, 2, 20], [7, 3, 4, 25])
    assert u.tolist() == [[0, 4], [5, 7], [20, 25]]
    assert intervals.length(u) == 11
    assert intervals.union([], []).shape == (0, 2) and intervals.length(np.empty((0, 2))) == 0.0
    assert intervals.clip(u, 3, 22).tolist() == [[3, 4], [5, 7], [20, 22]]
    assert intervals.clip(u, 8, 19).shape == (0, 2)
    hole = intervals.union([1, 6, 21], [2, 21, 22])
    assert intervals.subtract(u, hole).tolist() == [[0, 1], [2, 4], [5, 6], [22, 25]]
    assert intervals.subtract(u, np.empty((0, 2))) is u
    assert intervals.covered([[0, 6], [6, 100], [40, 50]], u).tolist() == [5, 6, 0]


def test_collective_and_exposed_time_per_step():
    steps = [[0, 100], [100, 200]]
    # two overlapping collectives in step 1 count once; one crosses into step 2
    collectives = [[10, 30], [20, 40], [90, 120]]
    compute = [[25, 35], [110, 200]]
    assert intervals.collective_us(steps, collectives).tolist() == [40, 20]
    assert intervals.exposed_comm_us(steps, collectives, compute).tolist() == [30, 10]
    assert intervals.exposed_comm_us(steps, collectives, []).tolist() == [40, 20]  # CPU: nothing hides it
    assert intervals.collective_us(steps, []).tolist() == [0, 0]
    assert intervals.collective_us([], collectives).shape == (0,)


def test_kinds_of_a_real_nccl_trace():
    with gzip.open(NCCL_TRACE) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    by_cat = {
        cat: Counter(k for e in events if e.get("cat") == cat and (k := tn.collective_kind(e["name"])))
        for cat in ("cpu_op", "user_annotation", "kernel")
    }
    # every all-reduce and broadcast is seen issued, annotated and as a kernel on the GPU
    assert (
        by_cat["cpu_op"]
        == by_cat["user_annotation"]
        == by_cat["kernel"]
        == {"all_reduce": 15, "broadcast": 6}
    )
    kernels = [e["name"] for e in events if e.get("cat") == "kernel"]
    nccl = [n for n in kernels if tn.TRANSFER.match(n)]
    assert len(nccl) == 21 and all(tn.collective_kind(n) for n in nccl)
    steps = sorted(k for e in events if (k := tn.step_of(e["name"])) is not None)
    assert steps == [4, 5, 6]


@pytest.mark.parametrize(
    "name, compiled",
    [
        # as torch 2.13 names them in a CPU trace of a compiled MLP (inductor and aot_eager)
        ("Torch-Compiled Region: 0/0", True),
        ("CompiledFunction", True),
        ("CompiledFunctionBackward", True),
        ("autograd::engine::evaluate_function: CompiledFunctionBackward", True),
        ("## Call CompiledFxGraph fuhpizaumh5ya7ucqnnhrbpes5zqnzc227in6tfuma2s6ydatdku ##", True),
        ("TorchDynamo Cache Lookup", True),
        ("Pregraph bytecode", True),
        ("AOTDispatcher Runtime Wrapper Prologue", True),
        # Inductor's kernels: Triton on GPU, C++ with kernel profiling on CPU
        ("triton_poi_fused_gelu_0", True),
        ("triton_per_fused__log_softmax_1", True),
        ("graph_0_cpp_fused_relu_0", True),
        # eager operators, and a user's function that merely mentions compiling
        ("aten::mm", False),
        ("autograd::engine::evaluate_function: AddmmBackward0", False),
        ("CompiledFunctionality", False),
        ("ampere_sgemm_128x64_nn", False),
    ],
)
def test_compiled_code_by_name(name, compiled):
    assert tn.is_compiled(name) is compiled
