"""Where each profiled step's time goes, from the trace.

Every instant of a step is given to one category, highest priority first:
data loading (``enumerate(DataLoader)``), optimizer (``Optimizer.step``/``zero_grad``),
communication on the training thread (c10d, gloo, NCCL, FSDP collectives), host-device
copies (CUDA memcpy calls), backward (autograd engine, any thread), forward (other ops on
the training thread before the step's first backward op), other (ops after it), and
communication running on other threads while the training thread does nothing traced.
What no event covers is ``untraced_s``: Python between ops, waiting, sleeping. swift_nb's
own work inside a step (events named ``trace_names.OWN_PREFIX`` + …) is left out of the
step, as it is of ``steps.csv``'s durations. So the parts add up to ``step_s`` exactly.
The event names of each part are in ``swift_nb.core.trace_names``.

``comm_s`` is the host's share of the step given to communication by that partition; it is
neither the collective time nor the exposed communication (``swift_nb.analysis.comm``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pandas as pd

from swift_nb.analysis.trace.tables import Trace, cat_in, derived, load_trace, per_name, step_rows
from swift_nb.core import intervals
from swift_nb.core import trace_names as tn
from swift_nb.record import Run

PARTS = ["data_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "h2d_s", "other_s", "untraced_s"]
COLUMNS = ["step", "step_s", *PARTS]


def step_breakdown(run: Run, trace: Trace | None = None) -> pd.DataFrame:
    """``trace_breakdown`` of the run's trace (``trace``, when the caller holds it)."""
    return trace_breakdown(trace if trace is not None else load_trace(run))


def trace_breakdown(trace: Trace) -> pd.DataFrame:
    """One row per profiled step: ``step``, ``step_s`` (the profiler's step span less
    swift_nb's own work in it) and the seconds of each part (``data_s`` … ``untraced_s``;
    they sum to ``step_s``)."""
    key = f"breakdown/{id(trace.steps)}"
    return derived(trace.events, key, lambda: _trace_breakdown(trace)).copy()


def _trace_breakdown(trace: Trace) -> pd.DataFrame:
    ev = trace.events
    kinds = {
        "data": tn.DATA,
        "opt": tn.OPTIMIZER,
        "comm": tn.COMMUNICATION,
        "copy": tn.COPY,
        "bwd": tn.BACKWARD,
        "own": tn.OWN,
    }
    flags = pd.DataFrame({k: per_name(trace, _found_by(rx)) for k, rx in kinds.items()})
    flags["host"] = ~cat_in(ev, *tn.DEVICE_CATEGORIES)
    rows = []
    of_step, none = step_rows(ev), np.empty(0, dtype=np.int64)
    for step, start, end, tid in trace.steps[["step", "start_us", "end_us", "tid"]].itertuples(index=False):
        at = of_step.get(int(step), none)
        rows.append(_one_step(ev.take(at), flags.take(at), start, end, tid, step))
    return pd.DataFrame(rows, columns=COLUMNS)


def _found_by(rx: re.Pattern[str]) -> Callable[[str], bool]:
    """``per_name``'s predicate: whether ``rx`` is found in a name."""
    return lambda n: rx.search(n) is not None


def _one_step(ev: pd.DataFrame, flags: pd.DataFrame, start: float, end: float, tid, step: int) -> dict:
    main = (ev["tid"] == tid).to_numpy()
    is_data, is_opt, is_comm, is_copy, is_bwd, is_own, host = (
        flags[k].to_numpy(dtype=bool) for k in ("data", "opt", "comm", "copy", "bwd", "own", "host")
    )
    plain = main & host & ~(is_data | is_opt | is_comm | is_copy | is_bwd | is_own)
    first_bwd = ev.loc[is_bwd & host, "ts_us"].min() if (is_bwd & host).any() else np.inf
    ts, te = ev["ts_us"].to_numpy(), ev["end_us"].to_numpy()

    def sel(mask):
        return intervals.clip(intervals.union(ts[mask], te[mask]), start, end)

    own = sel(is_own)
    ordered = [
        ("own", own),
        ("data_s", sel(is_data & host)),
        ("optimizer_s", sel(is_opt & main)),
        ("comm_s", sel(is_comm & main & host)),
        ("h2d_s", sel(is_copy & host)),
        ("backward_s", sel(is_bwd & host)),
        ("forward_s", sel(plain & (ts < first_bwd))),
        ("other_s", sel(plain & (ts >= first_bwd))),
        ("comm_bg", sel(is_comm & ~main & host)),
    ]
    row = dict.fromkeys(PARTS, 0.0)
    covered = np.empty((0, 2))
    for name, part in ordered:
        exclusive = intervals.subtract(part, covered)
        if name != "own":
            row["comm_s" if name == "comm_bg" else name] += intervals.length(exclusive) / 1e6
        covered = intervals.union(
            np.concatenate([covered[:, 0], part[:, 0]]), np.concatenate([covered[:, 1], part[:, 1]])
        )
    span = (end - start - intervals.length(own)) / 1e6
    row["untraced_s"] = max(0.0, span - (intervals.length(covered) - intervals.length(own)) / 1e6)
    return {"step": step, "step_s": span, **row}


def device_busy(run: Run, trace: Trace | None = None) -> pd.DataFrame:
    """CUDA only: per profiled step and device stream, seconds with a kernel, copy or
    memset running (``busy_s``), idle seconds and ``busy_pct``. Empty on CPU runs."""
    trace = trace if trace is not None else load_trace(run)
    ev = trace.events
    dev = ev[cat_in(ev, *tn.DEVICE_WORK)].sort_values("ts_us", kind="stable")
    ts = dev["ts_us"].to_numpy()
    longest = float((dev["end_us"] - dev["ts_us"]).max()) if len(dev) else 0.0
    rows = []
    for step, start, end in trace.steps[["step", "start_us", "end_us"]].itertuples(index=False):
        # the work starting before the step's end and no longer ago than the longest one
        near = dev.iloc[np.searchsorted(ts, start - longest) : np.searchsorted(ts, end)]
        in_step = near[(near["ts_us"] < end) & (near["end_us"] > start)]
        span = (end - start) / 1e6
        for stream, g in in_step.groupby("tid"):
            busy = (
                intervals.length(
                    intervals.clip(intervals.union(g["ts_us"].to_numpy(), g["end_us"].to_numpy()), start, end)
                )
                / 1e6
            )
            rows.append(
                {
                    "step": step,
                    "stream": str(stream),
                    "busy_s": busy,
                    "idle_s": span - busy,
                    "busy_pct": 100.0 * busy / span if span else 0.0,
                }
            )
    return pd.DataFrame(rows, columns=["step", "stream", "busy_s", "idle_s", "busy_pct"])
