"""Which operators the profiled steps spend their time and memory in, from the trace.

An operator's *self* time is its duration minus the durations of the operators directly
nested in it on the same thread, so self times never count an instant twice on one
thread. Its *allocated* bytes are the bytes allocated while it was the innermost open
operator. Only operators count (``cpu_op`` events, and GPU ``kernel`` events on CUDA);
user annotations (the profiler's step spans, ``Optimizer.step``, ``enumerate(DataLoader)``,
``record_function`` blocks) neither appear nor act as parents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from swift_nb.analysis.trace.tables import Trace, cat_in, derived, load_trace, per_value
from swift_nb.core import trace_names as tn
from swift_nb.record import Run

SORT_COLUMNS = {"self_time": "self_time_s", "memory": "alloc_bytes"}
COLUMNS = ["name", "calls", "self_time_s", "total_time_s", "self_pct", "alloc_bytes", "input_shapes"]


def top_operators(
    run: Run | None,
    by: str = "self_time",
    n: int | None = 15,
    trace: Trace | None = None,
    nesting: Nesting | None = None,
    skip_steps: set[int] | frozenset[int] = frozenset(),
) -> pd.DataFrame:
    """The ``n`` heaviest operators of the profiled steps (all of them when ``n`` is None).

    One row per operator name: ``calls``; ``self_time_s`` (seconds with no nested
    operator running on its thread) and ``total_time_s`` (summed call durations), both
    summed over calls; ``self_pct``, its share of all operators' summed self time (host
    operators and GPU kernels together); ``alloc_bytes``, bytes allocated on any device
    while it was the innermost operator; ``input_shapes``, its most common input shapes
    (JSON text, empty for kernels); ``compiled``, only when the steps ran torch.compile's
    code: whether the row is that code (a compiled region such as ``CompiledFunction``, an
    Inductor kernel, or an operator nested in one; an operator met both ways has a row for
    each). ``by`` is ``"self_time"`` or ``"memory"``
    (``alloc_bytes``), largest first. ``trace``: the run's trace when the caller holds
    it (``run`` is then not read); ``nesting``: ``op_nesting`` of its events, likewise;
    ``skip_steps``: steps left out (those that compiled: ``compiling_steps``), unless they
    are every profiled step.
    """
    if by not in SORT_COLUMNS:
        raise ValueError(f"by must be one of {', '.join(map(repr, SORT_COLUMNS))}; got {by!r}")
    if trace is None:
        if run is None:
            raise ValueError("top_operators needs a run or its trace")
        trace = load_trace(run)
    skip = frozenset(skip_steps)
    key = f"operators/{by}/{id(trace.memory)}/{id(trace.steps)}/{sorted(skip)}"
    held = trace
    out = derived(
        trace.events,
        key,
        lambda: _operators(held, by, nesting if nesting is not None else op_nesting(held.events), skip),
    ).copy()
    return out if n is None else out.head(n).reset_index(drop=True)


def _operators(trace: Trace, by: str, nesting: Nesting, skip: frozenset[int] = frozenset()) -> pd.DataFrame:
    ops = nesting.ops
    if ops.empty:
        return pd.DataFrame(columns=COLUMNS)
    thread, idx, parent, self_us = nesting.thread, nesting.order, nesting.parent, nesting.self_us

    start, dur = ops["ts_us"].to_numpy(float), ops["dur_us"].to_numpy(float)

    alloc = np.zeros(len(ops))
    is_cpu = (ops["cat"].to_numpy() == "cpu_op")[idx]
    owner = _allocation_owners(
        trace, thread[idx], start[idx], start[idx] + dur[idx], parent, is_cpu, ops["tid"].to_numpy()[idx]
    )
    if owner is not None:
        pos, nbytes = owner
        alloc[idx] = np.bincount(pos, weights=nbytes, minlength=len(idx))

    compiled = _compiled(ops, idx, parent)
    step = ops["step"].to_numpy()
    keep = ~np.isin(step, list(skip)) if skip else np.ones(len(ops), bool)
    if skip and keep.any() and not keep.all():
        ops, self_us, dur, alloc, compiled = (
            ops[keep].reset_index(drop=True),
            self_us[keep],
            dur[keep],
            alloc[keep],
            compiled[keep],
        )
    if compiled.any():
        # one row per (name, compiled): an operator that runs both inside compiled code and
        # eagerly shows each part apart
        codes, keys = pd.factorize(pd.Series(list(zip(ops["name"], compiled, strict=True))))
        names = pd.Index([k[0] for k in keys])
        flags: dict[str, np.ndarray] = {"compiled": np.array([bool(k[1]) for k in keys])}
    else:
        codes, names = pd.factorize(ops["name"])
        flags = {}
    self_total = np.bincount(codes, weights=self_us, minlength=len(names))
    out = pd.DataFrame(
        {
            "name": names,
            **flags,
            "calls": np.bincount(codes, minlength=len(names)),
            "self_time_s": self_total / 1e6,
            "total_time_s": np.bincount(codes, weights=dur, minlength=len(names)) / 1e6,
            "self_pct": 100.0 * self_total / self_total.sum() if self_total.sum() > 0 else 0.0,
            "alloc_bytes": np.rint(np.bincount(codes, weights=alloc, minlength=len(names))).astype(np.int64),
            "input_shapes": _common_shapes(codes, ops["input_dims"], len(names)),
        }
    )
    return _sorted(out, SORT_COLUMNS[by])


def _compiled(ops: pd.DataFrame, order: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Per op, whether it is torch.compile's code: a compiled region, a generated kernel or
    dynamo's runtime by its name (``trace_names.is_compiled``), an op nested in a compiled
    region on its thread, or a kernel launched by one (same external id)."""
    marker = per_value(ops["name"], lambda n: tn.is_compiled(str(n)))  # once per distinct name
    if not marker.any():
        return marker
    in_order = marker[order]
    has_parent = parent >= 0
    up = np.clip(parent, 0, None)
    while True:  # inherit the parent's flag; as many rounds as the nesting is deep
        nested = in_order | (has_parent & in_order[up])
        if (nested == in_order).all():
            break
        in_order = nested
    out = marker.copy()
    out[order] = in_order
    kernel = cat_in(ops, "kernel")
    if kernel.any():
        launched = ops.loc[out & ~kernel, "ext_id"].dropna()
        out |= kernel & ops["ext_id"].isin(launched).to_numpy()
    return out


def compiling_steps(run: Run) -> set[int]:
    """The steps that spent time compiling (steps.csv's ``compile_s``): torch.compile's
    tracing and code generation, apart from what a steady step runs."""
    steps = run.steps
    if "compile_s" not in steps or not len(steps):
        return set()
    compile_s = pd.to_numeric(steps["compile_s"], errors="coerce").fillna(0.0)
    return set(pd.to_numeric(steps.loc[compile_s > 0, "step"], errors="coerce").dropna().astype(int))


def compiled_share(table: pd.DataFrame) -> tuple[float, float] | None:
    """(compiled self seconds, all self seconds) of a ``top_operators`` table over every
    operator (``n=None``); None when nothing in it is compiled code."""
    if "compiled" not in table or not table["compiled"].any():
        return None
    self_s = pd.to_numeric(table["self_time_s"], errors="coerce").fillna(0.0)
    return float(self_s[table["compiled"].astype(bool)].sum()), float(self_s.sum())


def by_memory(table: pd.DataFrame) -> pd.DataFrame:
    """A ``top_operators`` table re-sorted as ``by="memory"`` would sort it."""
    return _sorted(table, SORT_COLUMNS["memory"])


def _sorted(table: pd.DataFrame, key: str) -> pd.DataFrame:
    others = [c for c in ("self_time_s", "alloc_bytes") if c != key]
    return table.sort_values([key, *others, "name"], ascending=[False, False, True], ignore_index=True)


#: the events' columns ``Nesting.ops`` keeps: what the operators table reads of them (the
#: others would copy most of a large trace's table for nothing)
NESTING_COLUMNS = ["name", "cat", "ts_us", "dur_us", "pid", "tid", "step", "input_dims", "ext_id"]


@dataclass(frozen=True)
class Nesting:
    """The profiled steps' operator events and how they nest, derived once per events
    table (``op_nesting``; the operators table and the advisor both read it).

    ops: the operator events of the profiled steps (``cpu_op`` events in a step, and the
    kernels they launched; their ``NESTING_COLUMNS``), numbered 0..n-1; events_index: each one's index in the events
    table; thread: a number per (pid, tid); order: the positions of the events with a
    duration, by (thread, start, longest first); parent: in that order, each one's
    innermost enclosing event on its thread (-1: none); self_us: each op's self time (µs),
    its duration less its direct children's.
    """

    ops: pd.DataFrame
    events_index: pd.Index
    thread: np.ndarray
    order: np.ndarray
    parent: np.ndarray
    self_us: np.ndarray

    def self_times_us(self) -> pd.Series:
        """``self_us`` indexed by the events' index."""
        return pd.Series(self.self_us.copy(), index=self.events_index, dtype=float)


def op_self_times_us(events: pd.DataFrame, nesting: Nesting | None = None) -> pd.Series:
    """Self time (µs) of each operator event of the profiled steps: its duration minus
    its direct children's on the same thread (index: the events' index). ``nesting``:
    ``op_nesting(events)`` when the caller holds it."""
    return (nesting if nesting is not None else op_nesting(events)).self_times_us()


def op_nesting(events: pd.DataFrame) -> Nesting:
    """The profiled steps' operators and their nesting (``Nesting``), computed once per
    events table."""
    return derived(events, "self_times", lambda: _op_nesting(events))


def _op_nesting(events: pd.DataFrame) -> Nesting:
    profiled = _profiled_ops(events)
    ops = profiled.reset_index(drop=True)
    if ops.empty:
        none = np.empty(0, dtype=np.int64)
        return Nesting(ops, profiled.index, none, none, none, np.empty(0))
    thread, order, parent, self_us = _self_times(ops)
    return Nesting(ops, profiled.index, thread, order, parent, self_us)


def _self_times(ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(thread id per op, nesting order, parent in that order, self µs per op)."""
    thread = ops.groupby(["pid", "tid"], sort=False, dropna=False).ngroup().to_numpy()
    start, dur = ops["ts_us"].to_numpy(float), ops["dur_us"].to_numpy(float)
    # Zero-length events hold no time and no other event; leaving them out of the nesting
    # keeps "an end comes before a start at the same instant" true for every event.
    nested = np.flatnonzero(dur > 0)
    order, parent = _nesting(thread[nested], start[nested], dur[nested])
    idx = nested[order]
    child_us = np.bincount(parent[parent >= 0], weights=dur[idx][parent >= 0], minlength=len(idx))
    self_us = np.zeros(len(ops))
    # Clipped: events that overlap without nesting (rare, rounding) must not go negative.
    self_us[idx] = np.clip(dur[idx] - child_us, 0.0, None)
    return thread, idx, parent, self_us


def _profiled_ops(events: pd.DataFrame) -> pd.DataFrame:
    """Operator events of the profiled steps (the events' index kept). A kernel runs after
    the host op that launched it, possibly past the last step's end, so a kernel also
    counts when its launching op (same external id) is in a profiled step."""
    cat = events["cat"]
    cpu = (cat == "cpu_op") & (events["step"] >= 0)
    kernel = cat == "kernel"
    launched = events["ext_id"].isin(events.loc[cpu, "ext_id"].dropna())
    keep = cpu | (kernel & ((events["step"] >= 0) | launched))
    return events.loc[keep, NESTING_COLUMNS]


def _nesting(thread: np.ndarray, start: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort events by (thread, start, longest first) and find, in that order, the position
    of each event's innermost enclosing event on its thread (-1 for none).

    Depth at an event's start is the number of its thread's events open then (a running
    count over every start and end in time order); the parent is the latest event that
    started earlier at one level up. Vectorised: no Python loop over events.
    """
    n = len(start)
    order = np.lexsort((-dur, start, thread))
    th, st = thread[order], start[order]
    en = st + dur[order]
    pos = np.arange(n)
    both_pos = np.concatenate([pos, pos])
    is_start = np.concatenate([np.ones(n, bool), np.zeros(n, bool)])
    # At one instant an end sorts before a start, so back-to-back siblings do not nest;
    # among equal starts, the longer event (earlier in `order`) opens first.
    seq = np.lexsort((both_pos, is_start, np.concatenate([st, en]), np.concatenate([th, th])))
    opens = is_start[seq]
    depth = np.empty(n, np.int64)
    depth[seq[opens]] = np.cumsum(np.where(opens, 1, -1))[opens] - 1

    keys = np.sort(depth * n + pos)
    found = np.searchsorted(keys, (depth - 1) * n + pos) - 1
    cand = keys[np.clip(found, 0, None)]
    parent = np.where((depth > 0) & (found >= 0) & (cand // n == depth - 1), cand % n, -1)
    # Guard against traces whose events overlap without nesting.
    p = np.clip(parent, 0, None)
    ok = (parent >= 0) & (th[p] == th) & (st[p] <= st) & (st < en[p])
    return order, np.where(ok, parent, -1)


def _allocation_owners(
    trace: Trace,
    thread: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    parent: np.ndarray,
    is_cpu: np.ndarray,
    tid: np.ndarray,
) -> tuple[np.ndarray, np.ndarray] | None:
    """(position of the owning event, bytes) for each allocation in the profiled steps.

    Memory events carry no thread, so an allocation goes to the innermost host operator
    holding its timestamp on the training thread; failing that, on another thread (on
    CUDA the backward pass runs on autograd's device threads while the training thread
    waits). Events are in `_nesting` order, so each thread is one contiguous block.
    """
    mem = trace.memory
    mem = mem[(mem["bytes"] > 0) & (mem["step"] >= 0)]
    if mem.empty or not is_cpu.any():
        return None
    ts, nbytes = mem["ts_us"].to_numpy(float), mem["bytes"].to_numpy(float)
    owner = np.full(len(ts), -1)
    cpu_threads = pd.Series(thread[is_cpu]).value_counts()
    main_tid = trace.steps["tid"].iloc[0] if len(trace.steps) else None
    main = set(thread[is_cpu & (tid == main_tid)]) if main_tid is not None else set()
    ranked = sorted(cpu_threads.index, key=lambda t: (t not in main, -cpu_threads[t]))
    bounds = np.searchsorted(thread, [(t, t + 1) for t in ranked])
    for lo, hi in bounds:
        todo = np.flatnonzero(owner < 0)
        if not len(todo):
            break
        owner[todo] = _innermost(start, end, parent, lo, hi, ts[todo])
    got = owner >= 0
    return owner[got], nbytes[got]


def _innermost(start, end, parent, lo: int, hi: int, ts: np.ndarray) -> np.ndarray:
    """Position of the innermost event in ``[lo, hi)`` (one thread, in start order) whose
    span holds each timestamp; -1 where none does. The latest event started by then holds
    it or one of its ancestors does, so walk up parents (at most the nesting depth)."""
    k = np.searchsorted(start[lo:hi], ts, side="right") - 1 + lo
    k = np.where(k >= lo, k, -1)
    outside = (k >= 0) & (ts > end[np.clip(k, 0, None)])
    while outside.any():
        k[outside] = parent[k[outside]]
        outside = (k >= 0) & (ts > end[np.clip(k, 0, None)])
    return k


def _common_shapes(codes: np.ndarray, dims: pd.Series, n_names: int) -> np.ndarray:
    """Each name's most common non-empty input dims (ties: the lexically first)."""
    shapes = np.full(n_names, "", dtype=object)
    has = (dims != "").to_numpy()
    if not has.any():
        return shapes
    counts = (
        pd.DataFrame({"code": codes[has], "dims": dims.to_numpy()[has]})
        .value_counts()
        .reset_index(name="count")
    )
    best = counts.sort_values(["count", "dims"], ascending=[False, True]).drop_duplicates("code")
    shapes[best["code"].to_numpy()] = best["dims"].to_numpy()
    return shapes
