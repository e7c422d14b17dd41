"""top_operators: self time, allocation attribution, calls and shapes, on a real GPT run and
on a hand-built trace whose answers are known exactly."""

from __future__ import annotations

import json

import pytest
from support.demo_run import ACTIVE, BATCH, D_MODEL, N_LAYER, SEQ

from swift_nb.analysis.operators import COLUMNS, top_operators
from swift_nb.analysis.trace.tables import load_trace, parse_events
from swift_nb.record import Run

# Sizes chosen distinct so a shape names its source: hidden 96, seq 24, batch 3 (72 rows).
MATMULS = {"aten::mm", "aten::addmm", "aten::bmm"}


@pytest.fixture(scope="module")
def gpt(demo_gpt):
    return demo_gpt, load_trace(demo_gpt)


def _flat(dims_text: str) -> list[int]:
    def walk(x):
        if isinstance(x, list):
            for y in x:
                yield from walk(y)
        else:
            yield x

    return list(walk(json.loads(dims_text))) if dims_text else []


def test_self_times_fit_in_the_profiled_steps(gpt):
    run, trace = gpt
    ops = top_operators(run, n=None, trace=trace)
    assert list(ops.columns) == COLUMNS
    span_s = trace.steps["dur_us"].sum() / 1e6
    # CPU training runs every op on one thread, so self times cannot overlap.
    assert 0 < ops["self_time_s"].sum() <= span_s
    assert (ops["self_time_s"] <= ops["total_time_s"] + 1e-12).all()
    assert ops["self_pct"].sum() == pytest.approx(100.0)
    assert ops["name"].is_unique
    annotations = ops["name"].str.match(r"ProfilerStep#|Optimizer\.|enumerate\(DataLoader\)")
    assert not annotations.any(), ops.loc[annotations, "name"].tolist()
    # A parent op's self time excludes its children: aten::linear only dispatches.
    linear = ops.set_index("name").loc["aten::linear"]
    assert linear["self_time_s"] < 0.5 * linear["total_time_s"]


def test_ordered_by_self_time_and_matmuls_carry_the_hidden_size(gpt):
    """Which operator leads a model this small is the machine's noise (a loaded CI machine
    put aten::copy_ first): the order is by self time, and every matmul row carries the
    hidden size in its shapes."""
    run, trace = gpt
    top = top_operators(run, by="self_time", n=None, trace=trace)
    assert (top["self_time_s"].diff().dropna() <= 0).all()
    assert len(top_operators(run, by="self_time", n=5, trace=trace)) == 5
    matmuls = top[top["name"].isin(MATMULS)]
    assert len(matmuls), top["name"].tolist()
    for dims in matmuls["input_shapes"]:
        assert D_MODEL in _flat(dims), dims


def test_calls_count_each_layer_in_each_profiled_step(gpt):
    run, trace = gpt
    ops = top_operators(run, n=None, trace=trace).set_index("name")
    # Two LayerNorms per block plus the final one, once per forward.
    assert ops.loc["aten::layer_norm", "calls"] == (2 * N_LAYER + 1) * ACTIVE
    assert json.loads(ops.loc["aten::layer_norm", "input_shapes"])[0] == [BATCH, SEQ, D_MODEL]
    assert ops.loc["aten::embedding", "calls"] == 2 * ACTIVE  # token and position embeddings


def test_memory_ranking_attributes_allocations_to_the_allocating_op(gpt):
    run, trace = gpt
    by_mem = top_operators(run, by="memory", n=None, trace=trace)
    assert by_mem["alloc_bytes"].iloc[0] > 0
    assert (by_mem["alloc_bytes"].diff().dropna() <= 0).all()
    mem = trace.memory[(trace.memory["bytes"] > 0) & (trace.memory["step"] >= 0)]
    allocated = int(mem["bytes"].sum())
    # Nearly every allocation happens inside some op; none is counted twice.
    assert 0.9 * allocated <= by_mem["alloc_bytes"].sum() <= allocated
    # Wrappers that only dispatch allocate nothing themselves.
    assert by_mem.set_index("name").loc["aten::linear", "alloc_bytes"] == 0

    # aten::empty is a leaf: it owns exactly the allocations inside its calls.
    ev = trace.events
    empties = ev[(ev["name"] == "aten::empty") & (ev["step"] >= 0)]
    inside = sum(
        int(mem.loc[mem["ts_us"].between(s, e), "bytes"].sum())
        for s, e in zip(empties["ts_us"], empties["end_us"], strict=True)
    )
    assert inside > 0
    assert by_mem.set_index("name").loc["aten::empty", "alloc_bytes"] == inside


def test_n_and_by_shape_the_answer(gpt):
    run, trace = gpt
    full = top_operators(run, n=None, trace=trace)
    top = top_operators(run, n=4, trace=trace)
    assert top.equals(full.head(4))
    with pytest.raises(ValueError, match=r"'self_time', 'memory'.*got 'time'"):
        top_operators(run, by="time", trace=trace)


def _x(name, ts, dur, tid=1, pid=1, cat="cpu_op", dims=None, ext=None):
    args = {}
    if dims is not None:
        args["Input Dims"] = dims
    if ext is not None:
        args["External id"] = ext
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": BASE + ts,
        "dur": dur,
        "args": args,
    }


def _mem(ts, nbytes):
    return {
        "ph": "i",
        "name": "[memory]",
        "pid": 1,
        "tid": 1,
        "ts": BASE + ts,
        "args": {"Bytes": nbytes, "Device Type": 0},
    }


BASE = 5366140248039.952  # a real trace's clock: microseconds with nanosecond decimals

HAND_BUILT = [
    _x("ProfilerStep#1", 0, 200, cat="user_annotation"),
    _x("Optimizer.step#SGD.step", 95, 35, cat="user_annotation"),  # overlaps ops, never a parent
    _x("aten::linear", 0, 100, dims=[[3, 5], [4, 5], [4]]),
    _x("aten::addmm", 10, 30),
    _x("aten::empty", 15, 10),
    _x("aten::mm", 50, 40, dims=[[2, 3], [3, 4]], ext=4),
    _x("aten::add", 100, 10),  # starts as aten::linear ends: a sibling, not a child
    _x("aten::mm", 112, 8, dims=[[4, 5], [5, 6]]),
    _x("aten::mm", 120, 5, dims=[[2, 3], [3, 4]]),
    _x("aten::copy_", 20, 40, tid=2),  # another thread: overlaps, does not nest
    _x("aten::zero_", 150, 22, tid=2),
    _x("gemm_kernel", 30, 50, pid=0, tid=7, cat="kernel", ext=4),
    _x("gemm_kernel", 210, 10, pid=0, tid=7, cat="kernel", ext=4),  # past the step, launched in it
    _x("aten::late", 300, 10),  # outside the profiled step
    _mem(20, 1000),  # inside linear > addmm > empty: empty's
    _mem(30, -1000),  # frees are not allocations
    _mem(45, 200),  # addmm has ended, mm not begun: linear's
    _mem(55, 30),
    _mem(105, 7),
    _mem(160, 5),  # nothing open on the training thread: the other thread's op
    _mem(190, 3),  # nothing open anywhere: nobody's
    _mem(305, 11),  # outside the profiled step
]


def test_hand_built_trace_gives_exact_self_times_and_owners():
    ops = top_operators(Run(id="hand"), n=None, trace=parse_events(HAND_BUILT)).set_index("name")
    expected_self_us = {
        "gemm_kernel": 60,
        "aten::mm": 40 + 8 + 5,
        "aten::copy_": 40,
        "aten::linear": 100 - 30 - 40,
        "aten::zero_": 22,
        "aten::addmm": 30 - 10,
        "aten::empty": 10,
        "aten::add": 10,
    }
    assert ops["self_time_s"].mul(1e6).round(3).to_dict() == expected_self_us
    assert list(ops.index) == list(expected_self_us)  # largest self time first; ties: more bytes first
    assert ops.loc["aten::mm", "calls"] == 3
    assert ops.loc["aten::mm", "total_time_s"] * 1e6 == pytest.approx(53)
    assert ops.loc["aten::linear", "total_time_s"] * 1e6 == pytest.approx(100)
    assert ops.loc["gemm_kernel", "self_pct"] == pytest.approx(100 * 60 / 245)
    assert ops["alloc_bytes"].to_dict() == {
        "gemm_kernel": 0,
        "aten::mm": 30,
        "aten::copy_": 0,
        "aten::linear": 200,
        "aten::zero_": 5,
        "aten::addmm": 0,
        "aten::empty": 1000,
        "aten::add": 7,
    }
    assert json.loads(ops.loc["aten::mm", "input_shapes"]) == [[2, 3], [3, 4]]
    assert ops.loc["gemm_kernel", "input_shapes"] == ""

    by_mem = top_operators(Run(id="hand"), by="memory", n=2, trace=parse_events(HAND_BUILT))
    assert by_mem["name"].tolist() == ["aten::empty", "aten::linear"]


def test_no_trace_gives_an_empty_table():
    ops = top_operators(Run(id="bare"))
    assert ops.empty
    assert list(ops.columns) == COLUMNS
