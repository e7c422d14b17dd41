"""The analyses as pure functions of a trace: a hand-written Chrome trace of two steps,
numbers checked exactly, no training and no profiler."""

from __future__ import annotations

import pandas as pd
import pytest

from swift_nb.analysis.breakdown import COLUMNS, trace_breakdown
from swift_nb.analysis.comm import collectives, comm_per_step, comm_shares
from swift_nb.analysis.ranks import per_rank
from swift_nb.analysis.trace.tables import parse_events
from swift_nb.record import Run

MAIN, GLOO, STREAM, NCCL_STREAM = 1, 2, 7, 8  # thread ids: training loop, gloo worker, GPU streams
T0 = 1_700_000_000.0  # µs on the trace's clock


def _x(name, start, dur, cat="cpu_op", tid=MAIN, args=None):
    """A complete event at ``start`` µs after T0."""
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "ts": T0 + start,
        "dur": dur,
        "pid": 1,
        "tid": tid,
        "args": args or {},
    }


ALLREDUCE_ARGS = {"Input Dims": [[[64, 64]], []], "Input type": ["TensorList", "Object"]}  # 64·64 fp32

EVENTS = [
    # step 1: CPU-style, gloo runs the all-reduce on its own thread
    _x("ProfilerStep#1", 0, 1000, cat="user_annotation"),
    _x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 100, cat="user_annotation"),
    _x("aten::linear", 100, 200),
    _x("aten::relu", 300, 100),
    _x("autograd::engine::evaluate_function: AddmmBackward0", 400, 300),
    _x("c10d::allreduce_", 700, 50, args=ALLREDUCE_ARGS),
    _x("gloo:all_reduce", 550, 300, cat="user_annotation", tid=GLOO),
    _x("Optimizer.step#SGD.step", 850, 100, cat="user_annotation"),
    _x("aten::item", 950, 20),
    # step 2: GPU-style; swift_nb's own bookkeeping opens it, a compute kernel overlaps the
    # first half of the NCCL kernel
    _x("ProfilerStep#2", 1000, 1000, cat="user_annotation"),
    _x("swift_nb#step_hook", 1000, 20, cat="user_annotation"),
    _x("aten::linear", 1020, 200),
    _x("ampere_sgemm_128x64_nn", 1100, 400, cat="kernel", tid=STREAM),
    _x("autograd::engine::evaluate_function: MmBackward0", 1220, 200),
    _x("c10d::allreduce_", 1420, 20, args=ALLREDUCE_ARGS),
    _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1300, 400, cat="kernel", tid=NCCL_STREAM),
    _x("Optimizer.step#SGD.step", 1800, 100, cat="user_annotation"),
    # outside every step
    _x("aten::empty", 2500, 10),
    {
        "ph": "i",
        "name": "[memory]",
        "ts": T0 + 120,
        "pid": 1,
        "tid": MAIN,
        "args": {"Bytes": 4096, "Device Type": 0},
    },
]


@pytest.fixture(scope="module")
def trace():
    return parse_events(EVENTS)


def test_parse_events(trace):
    steps = trace.steps
    assert steps["step"].tolist() == [1, 2]
    assert steps["start_us"].tolist() == [T0, T0 + 1000] and steps["dur_us"].tolist() == [1000, 1000]
    assert steps["tid"].tolist() == [MAIN, MAIN]
    ev = trace.events
    assert not ev["name"].str.startswith("ProfilerStep").any()  # the step spans are the steps table
    assert len(ev) == len(EVENTS) - 3  # less the two step spans and the memory event
    step_of = dict(
        zip(ev["name"] + "@" + ev["ts_us"].sub(T0).astype(int).astype(str), ev["step"], strict=True)
    )
    assert (
        step_of["gloo:all_reduce@550"] == 1 and step_of["ncclDevKernel_AllReduce_Sum_f32_RING_LL@1300"] == 2
    )
    assert step_of["aten::empty@2500"] == -1
    assert trace.memory[["bytes", "step"]].values.tolist() == [[4096, 1]]


def test_breakdown_per_step(trace):
    bd = trace_breakdown(trace)
    assert list(bd.columns) == COLUMNS
    us = {
        int(r["step"]): {k: round(v * 1e6, 6) for k, v in r.items() if k != "step"} for _, r in bd.iterrows()
    }
    # step 1: the training thread's issue of the all-reduce (50 µs), then gloo's transfer
    # where nothing else is traced (750..850 µs) make the 150 µs of communication
    assert us[1] == {
        "step_s": 1000,
        "data_s": 100,
        "forward_s": 300,
        "backward_s": 300,
        "optimizer_s": 100,
        "comm_s": 150,
        "h2d_s": 0,
        "other_s": 20,
        "untraced_s": 30,
    }
    # step 2: swift_nb's 20 µs are no part of the step; kernels are device work, not host time
    assert us[2] == {
        "step_s": 980,
        "data_s": 0,
        "forward_s": 200,
        "backward_s": 200,
        "optimizer_s": 100,
        "comm_s": 20,
        "h2d_s": 0,
        "other_s": 0,
        "untraced_s": 460,
    }


def test_collective_time_and_exposed_communication(trace):
    per_step = comm_per_step(trace)
    us = per_step.set_index("step")[["step_s", "collective_s", "exposed_comm_s"]].mul(1e6).round(6)
    # step 1: issue 700..750 inside gloo's 550..850: 300 µs, nothing hides it (no kernel);
    # step 2: the NCCL kernel 1300..1700 (the issue 1420..1440 inside it), the compute
    # kernel covers its first half
    assert us.to_dict("index") == {
        1: {"step_s": 1000, "collective_s": 300, "exposed_comm_s": 300},
        2: {"step_s": 1000, "collective_s": 400, "exposed_comm_s": 200},
    }
    collective, exposed = comm_shares(per_step)
    assert collective == pytest.approx(0.35, abs=1e-12) and exposed == pytest.approx(0.25, abs=1e-12)
    assert comm_shares(per_step.iloc[:0]) == (0.0, 0.0)


def test_collectives_per_kind(trace):
    (row,) = collectives(trace, world=2, rank=0).to_dict("records")
    assert row["kind"] == "all_reduce" and row["time_source"] == "transfer"  # 2 issued, 2 transfers
    assert row["calls_per_step"] == 1
    assert row["bytes_per_step"] == 64 * 64 * 4 and row["wire_bytes_per_step"] == 64 * 64 * 4  # 2·(P−1)/P = 1
    assert row["time_s_per_step"] == pytest.approx((300 + 400) / 2 / 1e6, abs=1e-12)
    assert row["optimizer_share"] == 0.0
    assert row["overlap_share"] == pytest.approx(200 / 700, abs=1e-12)


def test_per_rank_flags_a_straggler_and_reads_old_records():
    # a job record written before ranks.csv's collective columns were renamed
    ranks = pd.DataFrame(
        {
            "rank": [0, 1, 2],
            "status": ["ok"] * 3,
            "steps": [4] * 3,
            "step_time_median_s": [0.1] * 3,
            "peak_mem_bytes": [1e6] * 3,
            "comm_s_per_step": [0.05, 0.0, 0.05],
            "comm_share": [0.5, 0.0, 0.5],
        }
    )
    pr = per_rank(Run(id="job", ranks=ranks))
    assert pr["busy_s"].round(6).tolist() == [0.05, 0.1, 0.05]
    assert pr["straggler"].tolist() == [False, True, False]
    single = per_rank(Run(id="one", files={"trace": "trace.json.gz"}, summary={"steps": 3}))
    assert single[["rank", "steps", "collective_share", "straggler"]].values.tolist() == [[0, 3, 0.0, False]]
