"""swift_nb.trace_names: the trace's vocabulary (steps, collectives) and interval arithmetic,
on names and spans written by hand and on a real NCCL trace."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from swift_nb import trace_names as tn

# Real GPU traces (see their README); absent outside this project's workspace.
SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
NCCL_TRACE = SHARED_TRACES / "gpu_nccl_2ranks_rank0.json.gz"


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
    assert tn.collective_mask(names, cats).tolist() == [True, True, True, False, False]
    assert tn.compute_mask(names, cats).tolist() == [False, False, False, True, False]
    # the GPU-side copy of an NCCL annotation is no second collective span
    assert tn.collective_mask(["nccl:all_reduce"], ["gpu_user_annotation"]).tolist() == [False]
    assert tn.collective_mask([], []).shape == (0,)


def test_union_length_clip_subtract():
    u = tn.union([5, 0, 2, 20], [7, 3, 4, 25])
    assert u.tolist() == [[0, 4], [5, 7], [20, 25]]
    assert tn.length(u) == 11
    assert tn.union([], []).shape == (0, 2) and tn.length(np.empty((0, 2))) == 0.0
    assert tn.clip(u, 3, 22).tolist() == [[3, 4], [5, 7], [20, 22]]
    assert tn.clip(u, 8, 19).shape == (0, 2)
    hole = tn.union([1, 6, 21], [2, 21, 22])
    assert tn.subtract(u, hole).tolist() == [[0, 1], [2, 4], [5, 6], [22, 25]]
    assert tn.subtract(u, np.empty((0, 2))) is u
    assert tn.covered([[0, 6], [6, 100], [40, 50]], u).tolist() == [5, 6, 0]


def test_collective_and_exposed_time_per_step():
    steps = [[0, 100], [100, 200]]
    # two overlapping collectives in step 1 count once; one crosses into step 2
    collectives = [[10, 30], [20, 40], [90, 120]]
    compute = [[25, 35], [110, 200]]
    assert tn.collective_us(steps, collectives).tolist() == [40, 20]
    assert tn.exposed_comm_us(steps, collectives, compute).tolist() == [30, 10]
    assert tn.exposed_comm_us(steps, collectives, []).tolist() == [40, 20]  # CPU: nothing hides it
    assert tn.collective_us(steps, []).tolist() == [0, 0]
    assert tn.collective_us([], collectives).shape == (0,)


@pytest.mark.skipif(not NCCL_TRACE.exists(), reason="the shared GPU traces are not in this checkout")
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
