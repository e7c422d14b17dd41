"""swift_nb.analysis.scores on a hand-built step: which allocations are [.., T, T] tensors
of an eager attention under the advisor's test (``touches_scores``) and the forecast's
stricter one (``makes_scores``), and what each summary makes of them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from swift_nb.analysis.scores import (
    ScoreTimeline,
    eager_attention,
    makes_scores,
    score_allocations,
    score_like,
    score_memory,
    score_shapes,
    score_sizes,
    touches_scores,
)
from swift_nb.analysis.trace.tables import Trace
from swift_nb.core import trace_names as tn

SCORES = (2, 2, 4, 4)  # [B, H, T, T], float32: 256 bytes


def _op(name: str, start: float, end: float, dims: str) -> dict:
    return {"name": name, "cat": "cpu_op", "step": 0, "ts_us": start, "end_us": end, "input_dims": dims}


@pytest.fixture
def trace() -> Trace:
    """One step of an eager attention on B=2, H=2, T=4: q·kᵀ makes the scores (A), softmax
    the probabilities (B) and a [T, T] boolean mask (M), probabilities · v a [2, 2, 4, 2]
    output (C) of a score tensor's size; backward begins at 50 µs."""
    events = pd.DataFrame(
        [
            _op("aten::matmul", 0, 5, "[[2, 2, 4, 8], [2, 2, 8, 4]]"),
            _op("aten::softmax", 10, 20, "[[2, 2, 4, 4], [], []]"),
            _op("aten::_softmax", 11, 19, "[[2, 2, 4, 4], [], []]"),
            _op("aten::matmul", 22, 28, "[[2, 2, 4, 4], [2, 2, 4, 2]]"),
            _op(f"{tn.AUTOGRAD_PREFIX}: SoftmaxBackward0", 50, 55, ""),
        ]
    )
    memory = pd.DataFrame(
        [
            (3, 256, "A"),
            (12, 256, "B"),
            (14, 16, "M"),
            (25, 128, "C"),
            (40, -256, "A"),
            (60, -128, "C"),
            (70, -256, "B"),
            (71, -16, "M"),
        ],
        columns=["ts_us", "bytes", "addr"],
    ).assign(step=0, device_type=0)
    steps = pd.DataFrame({"step": [0], "start_us": [0.0], "end_us": [100.0], "dur_us": [100.0]})
    return Trace(events=events, memory=memory, steps=steps)


def test_score_shapes_sizes_and_the_eager_attention(trace):
    assert score_shapes(trace.events) == {SCORES}
    # a [.., T, T] over any of the leading dims, at 1, 2, 4 or 8 bytes an element
    assert score_sizes({SCORES}) == {n * e for n in (16, 32, 64) for e in (1, 2, 4, 8)}
    # softmax wraps _softmax: one attention a step
    assert eager_attention(trace.events, 1) == (4, [2, 2, 4, 4], 1)
    assert eager_attention(trace.events.iloc[0:1], 1) == (0, [], 0)


def test_score_like_takes_views_and_masks_not_any_square_tail():
    shapes = {SCORES}
    for d in ([2, 2, 4, 4], [4, 4, 4], [4, 4], [2, 1, 4, 4], [2, 1, 1, 4]):
        assert score_like(d, shapes), d
    assert not score_like([2, 4, 4], shapes)  # an MLP's [B, T, 4·d] with 4·d = T
    assert not score_like([2, 2, 4, 2], shapes)


def test_the_advisors_test_is_looser_than_the_forecasts():
    shapes, seqs = {SCORES}, {4}
    q_k = ["[[2, 2, 4, 8], [2, 2, 8, 4]]"]
    probs_v = ["[[2, 2, 4, 4], [2, 2, 4, 2]]"]
    mlp = ["[[2, 4, 4]]"]
    assert touches_scores(q_k, seqs) and makes_scores(q_k, shapes)
    for dims in (probs_v, mlp):  # works on a [.., T, T] tensor, makes none
        assert touches_scores(dims, seqs) and not makes_scores(dims, shapes)
    # the forecast asks the innermost op with tensor inputs only
    assert not makes_scores([*probs_v, *q_k], shapes)
    assert makes_scores(["[]", *q_k], shapes)


def test_allocations_pair_each_free_with_its_allocation(trace):
    ops = trace.events[trace.events["cat"] == "cpu_op"]
    loose = score_allocations(trace.memory, ops, {SCORES}, strict=False)
    strict = score_allocations(trace.memory, ops, {SCORES}, strict=True)
    assert loose.tolist() == [0, 1, 2, 3, 0, 3, 1, 2]
    assert strict.tolist() == [0, 1, 2, -1, 0, -1, 1, 2]  # C, probabilities · v, is no score


def test_score_memory_counts_what_touches_scores(trace):
    found = score_memory(trace, trace.events)
    assert found is not None
    # at the peak (after C): A, B, M and C, all made before backward
    assert (found.at_peak_bytes, found.kept, found.temporaries) == (656.0, 4, 0)
    assert found.saved_bytes == 656.0
    assert score_memory(Trace(trace.events, trace.memory.iloc[0:0], trace.steps), trace.events) is None


def test_score_timeline_splits_what_makes_scores_by_category_and_batch(trace):
    timeline = ScoreTimeline(trace, trace.events, device_type=0, batch=2)
    # B kept for backward (per sample), M kept (a batch-free [T, T] mask), A freed before
    # backward (other, per sample); C is not one
    assert timeline.at_peak(0) == [256.0, 16.0, 256.0, 0.0]
    alive = timeline.alive(0, np.array([0.0, 12.0, 45.0, 80.0]))
    assert alive.tolist() == [[0, 0, 0, 0], [256, 0, 256, 0], [256, 16, 0, 0], [0, 0, 0, 0]]
    assert ScoreTimeline(trace, trace.events, device_type=1, batch=2).at_peak(0) == [0.0] * 4
