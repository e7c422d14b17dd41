"""When each gradient of a measured step is ready, read from its trace: what decides how much
of a data-parallel job's communication the backward can hide.

Every trainable parameter's gradient is accumulated by one ``torch::autograd::AccumulateGrad``
op, recorded with the gradient's shape and element type; its end is the moment the gradient
is ready, the moment DDP's reducer marks it (and launches its bucket's all-reduce when it is
the bucket's last). Per recorded step (a profiler step span on the training thread), the
times are taken back from the step's end and as a share of the step (the profiler makes a
recorded step slower than an unrecorded one; shares carry over to the run's median step),
and the median over the recorded steps kept.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from swift_nb.analysis.comm import DTYPE_BYTES
from swift_nb.analysis.trace.tables import Trace
from swift_nb.core import trace_names as tn

ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"


@dataclass(frozen=True)
class Backward:
    """A step's gradients in the order they became ready.

    grads: one row per gradient: ``bytes`` (as stored), ``dtype_bytes`` (its element's
    size), ``ready_share`` (its ready moment as a share of the step, 0 at its start);
    backward_end_share: the last gradient's; optimizer_share: the part of the step inside
    ``Optimizer.step`` (after the backward); steps: the recorded steps it comes from."""

    grads: pd.DataFrame
    backward_end_share: float
    optimizer_share: float
    steps: int

    @property
    def grad_bytes(self) -> float:
        return float(self.grads["bytes"].sum())


def _numel(dims: str) -> float:
    try:
        shape = ast.literal_eval(dims)[0] if dims else None
    except (ValueError, SyntaxError, IndexError, TypeError):
        return math.nan
    if not isinstance(shape, list):
        return math.nan
    return float(np.prod(shape)) if shape else 1.0


def _element(types: str) -> float:
    try:
        first = ast.literal_eval(types)[0] if types else None
    except (ValueError, SyntaxError, IndexError, TypeError):
        return math.nan
    return float(DTYPE_BYTES.get(first, math.nan)) if isinstance(first, str) else math.nan


def micro_batches(shapes: list[str], elements: float, params: float | None) -> int:
    """How many backward passes a step accumulated its gradients over: k when the step
    accumulated k × the parameters the optimizers train (``params``, the run's count), and
    its gradients' shapes repeat k times in the same order; 1 otherwise (a model of
    identical layers repeats its shapes too: the count decides, not the shapes)."""
    if not params or elements <= params:
        return 1
    k = round(elements / params)
    n = len(shapes)
    if k < 2 or abs(elements - k * params) > 0.5 or n % k:
        return 1
    period = n // k
    return k if all(shapes[i] == shapes[i % period] for i in range(period, n)) else 1


def backward_of(trace: Trace, params: float | None = None) -> Backward | None:
    """The gradients of ``trace``'s recorded steps in their ready order, as the median
    recorded step has them; None when no recorded step accumulated a gradient with its
    shape recorded (a trace without shapes, a step with no backward). ``params``: the
    elements the optimizers train (the run's context), which tells accumulation."""
    ev = trace.events
    if trace.empty or ev.empty:
        return None
    rows = []
    for _, s in trace.steps.iterrows():
        start, end, dur = float(s["start_us"]), float(s["end_us"]), float(s["dur_us"])
        if dur <= 0:
            continue
        inside = ev[(ev["ts_us"] >= start) & (ev["end_us"] <= end)]
        acc = inside[inside["name"] == ACCUMULATE_GRAD].sort_values("end_us", kind="stable")
        if acc.empty:
            continue
        numel = acc["input_dims"].map(_numel)
        size = acc["input_types"].map(_element)
        if numel.isna().any() or size.isna().any():
            continue
        k = micro_batches(acc["input_dims"].tolist(), float(numel.sum()), params)
        if k > 1:  # only the last backward's gradients are reduced (no_sync on the others)
            acc, numel, size = (
                acc.iloc[-len(acc) // k :],
                numel.iloc[-len(acc) // k :],
                size.iloc[-len(acc) // k :],
            )
        # the optimizer's span ends after the profiler's step does (its post-hook ends the
        # step): the part inside the step of the one that starts in it
        near = ev[(ev["ts_us"] >= start) & (ev["ts_us"] < end)]
        opt = near[near["name"].str.match(tn.OPTIMIZER_STEP.pattern)]
        opt_us = float((np.minimum(opt["end_us"], end) - opt["ts_us"]).sum())
        rows.append(
            pd.DataFrame(
                {
                    "step": int(s["step"]),
                    "order": np.arange(len(acc)),
                    "bytes": (numel * size).to_numpy(),
                    "dtype_bytes": size.to_numpy(),
                    "ready_share": ((acc["end_us"] - start) / dur).to_numpy(),
                    "optimizer_share": opt_us / dur,
                }
            )
        )
    if not rows:
        return None
    # steps whose gradients differ in number (a first step that built its buckets, a
    # frozen layer thawed) are compared with their kin only: the most common count wins
    counts = pd.Series([len(r) for r in rows])
    common = int(counts.mode().iloc[0])
    same = pd.concat([r for r in rows if len(r) == common], ignore_index=True)
    grads = same.groupby("order", sort=True).agg(
        bytes=("bytes", "first"), dtype_bytes=("dtype_bytes", "first"), ready_share=("ready_share", "median")
    )
    grads = grads.reset_index(drop=True)
    return Backward(
        grads=grads,
        backward_end_share=float(grads["ready_share"].max()),
        optimizer_share=float(same.groupby("step")["optimizer_share"].first().median()),
        steps=int(same["step"].nunique()),
    )
