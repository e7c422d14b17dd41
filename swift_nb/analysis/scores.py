"""The [.., T, T] tensors of an eager attention in a trace: the scores, probabilities and
masks a softmax over T×T makes, and their gradients.

Found in two steps. The shapes: every [.., T, T] input of a softmax (``score_shapes``), and
the bytes a tensor of such a shape takes over any of its leading dims (``score_sizes``).
Then the allocations (``score_allocations``): one of those sizes, made inside an op that
works on score tensors, paired with the event that frees it. Two tests of that op:
``touches_scores`` (any enclosing op takes a [.., T, T] tensor or multiplies into one: the
advisor's) and the stricter ``makes_scores`` (the innermost op with tensor inputs makes a
score-shaped tensor: the forecast's, which must not count a same-sized MLP tensor).

Two summaries: ``score_memory`` (what the scores hold at the median step's peak, and how
much lower the peak is without them: the advisor's attention rule) and ``ScoreTimeline``
(their bytes alive over each step, as activations or other, per sample or batch-free: the
forecast's measurement).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from swift_nb.analysis.trace.shapes import input_dims
from swift_nb.analysis.trace.tables import Trace
from swift_nb.core import trace_names as tn

SDPA = "aten::scaled_dot_product_attention"
SOFTMAX = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax")

Shape = tuple[int, ...]


def eager_attention(ops: pd.DataFrame, n_steps: int) -> tuple[int, list[int], int]:
    """(T, the shape, calls per step) of the largest softmax over a square [.., T, T] input:
    an explicit attention score matrix; (0, [], 0) when there is none."""
    best, shape, calls = 0, [], 0
    soft = ops[ops["name"].isin(SOFTMAX)]
    for dims_text in soft["input_dims"]:
        try:
            dims = json.loads(dims_text)[0] if dims_text else []
        except (ValueError, IndexError):
            continue
        if len(dims) >= 2 and dims[-1] == dims[-2] and dims[-1] > 1:
            calls += 1
            if dims[-1] > best:
                best, shape = int(dims[-1]), list(dims)
    # aten::softmax wraps aten::_softmax: count each attention once
    per_step = calls / n_steps
    if {"aten::softmax", "aten::_softmax"} <= set(soft["name"]):
        per_step /= 2
    return best, shape, round(per_step)


def score_shapes(ops: pd.DataFrame) -> set[Shape]:
    """The shapes of every [.., T, T] input of a softmax: the attention score matrices."""
    out = set()
    for dims_text in ops.loc[ops["name"].isin(SOFTMAX), "input_dims"]:
        dims = input_dims(dims_text)
        d = dims[0] if dims and isinstance(dims[0], list) else []
        if len(d) >= 2 and d[-1] == d[-2] and d[-1] > 1:
            out.add(tuple(int(x) for x in d))
    return out


def score_sizes(shapes: Iterable[Shape]) -> set[int]:
    """Bytes of a [.., T, T] tensor over any of the score shapes' leading dims (a [T, T]
    or [B, 1, T, T] mask, [B·H, T, T] scores …) at 1, 2, 4 or 8 bytes per element."""
    sizes: set[int] = set()
    for shape in shapes:
        lead, square = shape[:-2], shape[-1] * shape[-2]
        for mask in range(1 << len(lead)):
            n = square * math.prod(d for i, d in enumerate(lead) if mask >> i & 1)
            sizes.update(n * e for e in (1, 2, 4, 8))
    return sizes


def _tensor_shapes(text: str) -> list[list[int]]:
    """An op's input tensors of two dims or more: a tensor's shape is a list of ints (a
    TensorList input, as in cat, is a list of them)."""
    return [
        d
        for d in input_dims(text)
        if isinstance(d, list) and len(d) >= 2 and all(isinstance(x, int) for x in d)
    ]


def touches_scores(op_dims: Iterable[str], seqs: set[int]) -> bool:
    """Whether any of these ops (those enclosing an allocation, in any order) works on a
    [.., T, T] tensor with T among ``seqs``: takes one, or multiplies [.., T, k] by [.., k, T]."""
    for text in op_dims:
        shapes = _tensor_shapes(text)
        if any(d[-1] == d[-2] and d[-1] in seqs for d in shapes):
            return True
        if len(shapes) >= 2 and shapes[0][-2] in seqs and shapes[1][-1] == shapes[0][-2]:
            return True
    return False


def score_like(d: list[int], shapes: Iterable[Shape]) -> bool:
    """Whether a shape is one of the score shapes ``[B, H, T, T]``, its ``[B·H, T, T]`` view,
    or a mask that broadcasts to it (``[T, T]``, ``[B, 1, T, T]``, ``[B, 1, 1, T]``): not any
    tensor whose last two sides happen to be T (an MLP's ``[B, T, 4·d]`` when 4·d = T)."""
    lead = math.prod(d[:-2])
    for s in shapes:
        if d[-1] != s[-1] or d[-2] not in (1, s[-2]):
            continue
        if lead in (1, math.prod(s[:-2])):
            return True
        if len(d) == len(s) and all(a in (1, b) for a, b in zip(d[:-2], s[:-2], strict=True)):
            return True
    return False


def makes_scores(op_dims: Iterable[str], shapes: set[Shape]) -> bool:
    """Whether the innermost of the ops enclosing an allocation that has tensor inputs
    (``op_dims``: innermost first) makes a [.., T, T] tensor: it works on score-shaped
    tensors alone (softmax, its backward, scaling, masking, dropout), or multiplies
    [.., T, k] by [.., k, T] into a score shape. Stricter than ``touches_scores``, which
    asks whether any enclosing op touches a [.., T, T] tensor: there, the copies of q and k
    a matmul makes, a [.., T, T] × [.., T, d] product or an MLP's [B, T, 4·d] count when
    their size happens to be that of a score tensor."""
    for text in op_dims:
        found = _tensor_shapes(text)
        if not found:
            continue
        if any(d[-1] == d[-2] for d in found) and all(score_like(d, shapes) for d in found):
            return True
        if len(found) != 2:
            return False
        a, b = found
        product = [*a[:-1], b[-1]]
        return a[-1] == b[-2] and product[-1] == product[-2] and score_like(product, shapes) and len(a) > 2
    return False


def first_backward_us(trace: Trace) -> pd.Series:
    """When each step's backward began (µs on the trace clock), by step."""
    backward = trace.events[trace.events["name"].str.startswith(tn.AUTOGRAD_PREFIX)]
    return backward.groupby("step")["ts_us"].min()


def score_allocations(
    memory: pd.DataFrame, ops: pd.DataFrame, shapes: set[Shape], strict: bool
) -> np.ndarray:
    """For each event of one step's allocations on one device (``memory``, in time order;
    ``ops``: that step's ops), the position in ``memory`` of the allocation of the score
    tensor it allocates or frees, or -1 when it is not a score tensor's. An allocation is
    one when its size is among ``score_sizes(shapes)`` and the ops enclosing it pass
    ``makes_scores`` (``strict``) or ``touches_scores``; its free is the next event at its
    address."""
    sizes, seqs = score_sizes(shapes), {s[-1] for s in shapes}
    op_start, op_end = ops["ts_us"].to_numpy(), ops["end_us"].to_numpy()
    op_dims = ops["input_dims"].to_numpy()
    ts_us, nbytes, addrs = memory["ts_us"].to_numpy(), memory["bytes"].to_numpy(), memory["addr"].to_numpy()
    out = np.full(len(memory), -1)
    open_scores: dict[Any, int] = {}  # addr -> position of its allocation
    for i in np.flatnonzero(np.isin(np.abs(nbytes), list(sizes))).tolist():
        ts, addr = ts_us[i], addrs[i]
        if nbytes[i] > 0:
            enclosing = np.flatnonzero((op_start <= ts) & (op_end >= ts))
            innermost_first = op_dims[enclosing[np.argsort(-op_start[enclosing], kind="stable")]]
            made = makes_scores(innermost_first, shapes) if strict else touches_scores(innermost_first, seqs)
            if not made:
                continue
            open_scores[addr] = out[i] = i
        elif addr in open_scores:
            out[i] = open_scores.pop(addr)
    return out


@dataclass
class ScoreMemory:
    """The [.., T, T] tensors of an eager attention (scores, probabilities, masks and their
    gradients) in a recorded step's allocations: the median step, on the device where they
    matter most.

    at_peak_bytes: their bytes alive at the step's peak; kept: how many of those were
    allocated before backward began (saved for it), temporaries: how many during it;
    saved_bytes: how much lower the step's peak is without any of them (the peak of live
    bytes minus theirs, over the whole step: the peak can move elsewhere)."""

    at_peak_bytes: float
    kept: int
    temporaries: int
    saved_bytes: float


def score_memory(trace: Trace, ops: pd.DataFrame) -> ScoreMemory | None:
    """The [.., T, T] tensors of eager attention in the recorded steps' allocations, found
    by ``score_allocations`` with ``touches_scores`` (None without allocations or score
    shapes). The median step of the device where they matter most."""
    mem = trace.memory[trace.memory["step"] >= 0]
    shapes = score_shapes(ops)
    if mem.empty or not shapes:
        return None
    first_backward = first_backward_us(trace)
    per_step: dict[int, ScoreMemory] = {}
    for (step, _), m in mem.groupby(["step", "device_type"]):
        found = _step_score_memory(m, ops[ops["step"] == step], shapes, first_backward.get(step, np.inf))
        if found is None:
            continue
        if step not in per_step or found.saved_bytes > per_step[step].saved_bytes:
            per_step[int(step)] = found
    if not per_step:
        return None
    ranked = sorted(per_step.values(), key=lambda f: f.saved_bytes)
    return ranked[(len(ranked) - 1) // 2]


def _step_score_memory(
    m: pd.DataFrame, ops: pd.DataFrame, shapes: set[Shape], backward_us: float
) -> ScoreMemory | None:
    """One step's ``ScoreMemory`` on one device; None when it made no score tensor."""
    alloc = score_allocations(m, ops, shapes, strict=False)
    ts_us, nbytes = m["ts_us"].to_numpy(), m["bytes"].to_numpy()
    is_score = alloc >= 0
    if not is_score.any():
        return None
    scores = np.where(is_score, nbytes, 0.0)
    # per event: score tensors kept for backward / made in it, +1 allocated or -1 freed
    sign = np.where(nbytes > 0, 1, -1)
    before = ts_us[np.clip(alloc, 0, None)] < backward_us
    kept = np.where(is_score & before, sign, 0)
    temporaries = np.where(is_score & ~before, sign, 0)
    live, score_live = np.cumsum(nbytes), np.cumsum(scores)
    peak = int(np.argmax(live))
    return ScoreMemory(
        at_peak_bytes=float(score_live[peak]),
        kept=int(kept[: peak + 1].sum()),
        temporaries=int(temporaries[: peak + 1].sum()),
        saved_bytes=float(live[peak] - np.max(live - score_live)),
    )


class ScoreTimeline:
    """The [.., T, T] tensors of an eager attention in each recorded step's allocations on
    one device, by category and by whether they grow with the batch. An allocation is one
    when ``score_allocations`` finds it with ``makes_scores``; it is an activation when it
    was made before backward began and was still alive then, as the memory categories count
    it; batch-free when it is [T, T] alone (at batch 1 only a 1-byte one, a boolean mask,
    is told apart from a [1, 1, T, T] score).

    Columns of the byte arrays it gives: activations per sample, activations batch-free,
    other per sample, other batch-free."""

    def __init__(self, trace: Trace, ops: pd.DataFrame, device_type: int, batch: int) -> None:
        self.shapes = score_shapes(ops)
        seqs = {s[-1] for s in self.shapes}
        self.batch_free = (
            {t * t for t in seqs} if batch == 1 else {t * t * e for t in seqs for e in (1, 2, 4, 8)}
        )
        self.ops = ops
        self.memory = trace.memory[trace.memory["device_type"] == device_type]
        self.first_backward = first_backward_us(trace)
        self._cache: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}

    def _step(self, step: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(event times, score bytes alive after each event (n × 4), index of the step's peak)."""
        if step not in self._cache:
            m = self.memory[self.memory["step"] == step]
            ts_us = m["ts_us"].to_numpy(dtype=float)
            if not self.shapes or m.empty:
                self._cache[step] = (ts_us, np.zeros((len(m), 4)), 0)
            else:
                kinds = self._kinds(
                    m, self.ops[self.ops["step"] == step], float(self.first_backward.get(step, np.inf))
                )
                peak = int(np.argmax(np.cumsum(m["bytes"].to_numpy())))
                self._cache[step] = (ts_us, np.cumsum(kinds, axis=0), peak)
        return self._cache[step]

    def at_peak(self, step: int) -> list[float]:
        """Score bytes alive at the step's peak, one per column."""
        _, alive, peak = self._step(step)
        return alive[peak].tolist() if len(alive) else [0.0] * 4

    def alive(self, step: int, ts_us: np.ndarray) -> np.ndarray:
        """Score bytes alive at each of these times (µs on the trace clock), n × 4."""
        times, alive, _ = self._step(step)
        if not len(times):
            return np.zeros((len(ts_us), 4))
        i = np.searchsorted(times, ts_us + 0.5, side="right") - 1  # half a µs for the clock round trip
        return np.where((i >= 0)[:, None], alive[np.clip(i, 0, None)], 0.0)

    def _kinds(self, m: pd.DataFrame, ops: pd.DataFrame, backward_us: float) -> np.ndarray:
        """Per allocation event of one step: its bytes in the column of its kind (±)."""
        ts_us, nbytes, addrs = m["ts_us"].to_numpy(), m["bytes"].to_numpy(), m["addr"].to_numpy()
        freed_at: dict[int, float] = {}  # allocation index -> when it was freed
        open_allocs: dict[Any, int] = {}
        for i in range(len(m)):
            if nbytes[i] > 0:
                open_allocs[addrs[i]] = i
            elif addrs[i] in open_allocs:
                freed_at[open_allocs.pop(addrs[i])] = ts_us[i]
        kinds = np.zeros((len(m), 4))
        alloc = score_allocations(m, ops, self.shapes, strict=True)
        for i in np.flatnonzero(alloc >= 0).tolist():
            a = int(alloc[i])
            kept = ts_us[a] < backward_us and freed_at.get(a, np.inf) >= backward_us
            kinds[i, (0 if kept else 2) + (1 if nbytes[a] in self.batch_free else 0)] = nbytes[i]
        return kinds
