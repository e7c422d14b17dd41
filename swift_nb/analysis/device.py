"""The device's time in a CUDA trace: how much of it is idle, compute and non-compute, how
much communication overlaps compute, which kinds of kernels take it, and why it idles.

Device work is every kernel, memory copy and memory set (``trace_names.DEVICE_WORK``) on any
stream; the device is busy while at least one runs. Each piece of work is tied to the
host runtime call that launched it by its ``correlation`` id.

Windows. The whole-trace figures (``device_summary``, ``kernels_by_kind``,
``idle_by_cause``) use HolisticTraceAnalysis's (HTA's) window: the device work launched
before the last profiler step begins (HTA leaves the last step out, as its work may be cut
off when the profiler stops; ``include_last_step=True`` keeps it, as HTA's
``include_last_profiler_step`` does), or all of it when the trace has fewer than two steps;
the window runs from that work's first start to its last end. With ``by_step=True`` each
profiler step has its own window: from the first start of the work launched during the
step to the first start of the next step's work (the last step: to its work's last end), so
the steps' windows tile the device's timeline and every idle moment belongs to one step.

The shares are HTA's (``get_temporal_breakdown``, ``get_comm_comp_overlap``):
``idle_pct`` is the part of the window with no device work running; ``compute_pct`` the
part with a compute kernel running (``trace_names.is_compute``: not NCCL, not a copy or
set); ``non_compute_pct`` the rest of the busy time (communication, copies, sets alone), so
the three add up to 100; ``comm_compute_overlap_pct`` is the part of the time communication
kernels run during which a compute kernel runs too. All are None on a trace without
device work (a CPU run), and the overlap is None without communication kernels.

Pure functions over a ``Trace``; times in seconds, shares in percent (0–100).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from swift_nb.analysis.trace.tables import Trace, cat_in, derived, per_name, steps_of
from swift_nb.core import intervals
from swift_nb.core import trace_names as tn

SHARES = ["idle_pct", "compute_pct", "non_compute_pct", "comm_compute_overlap_pct"]
SUMMARY_KEYS = [
    "device_idle_pct",
    "device_compute_pct",
    "device_non_compute_pct",
    "comm_compute_overlap_pct",
    "window_s",
    "last_step_left_out",
]
#: the device figures a run's summary keeps (``run.summary``: ``runs()``, ``swift-nb list``,
#: comparisons), percent of the window; absent on a run without device work
RUN_SUMMARY_KEYS = [
    "device_idle_pct",
    "device_compute_pct",
    "device_non_compute_pct",
    "comm_compute_overlap_pct",
]
KIND_COLUMNS = ["kind", "count", "time_s", "time_pct"]
#: Why the device idles, in the order a moment's cause is chosen (``idle_by_cause``).
CAUSES = ["comm_wait_s", "sync_s", "copy_s", "data_s", "host_bound_s", "other_s"]
IDLE_COLUMNS = ["window_s", "idle_s", *CAUSES]
STEP_COLUMNS = ["step", "window_s", *SHARES, "idle_s", *CAUSES]


def _origin(trace: Trace) -> float:
    """The trace's first timestamp (µs). Times are taken relative to it before durations are
    added: a trace's clock reads ~1.7e15 µs, where float64 resolves only a quarter of a
    microsecond, while a nanosecond-resolution kernel's duration is exact."""
    ts = trace.events["ts_us"]
    return float(ts.min()) if len(ts) else 0.0


def _spans(events: pd.DataFrame, origin: float) -> tuple[np.ndarray, np.ndarray]:
    start = events["ts_us"].to_numpy(dtype=float) - origin
    return start, start + events["dur_us"].to_numpy(dtype=float)


def device_work(trace: Trace) -> pd.DataFrame:
    """One row per piece of device work: ``name``, ``kind`` (``trace_names.kernel_kind``),
    ``compute`` and ``comm`` (HTA's compute rule; an NCCL kernel), ``ts_us`` and ``end_us``
    (µs since the trace's first event), ``launch_us`` (when the runtime call that launched
    it began, on the same clock; NaN when the trace does not have it) and ``step`` (the
    profiler step that launched it; -1: none), in start order."""
    return derived(trace.events, f"device_work/{id(trace.steps)}", lambda: _device_work(trace))


def _device_work(trace: Trace) -> pd.DataFrame:
    ev = trace.events
    origin = _origin(trace)
    is_work = cat_in(ev, *tn.DEVICE_WORK)
    work = ev[is_work]
    calls = ev[cat_in(ev, *tn.LAUNCH_CATEGORIES) & (ev["correlation"] >= 0)]
    launch_at = calls.drop_duplicates("correlation").set_index("correlation")["ts_us"]
    launch = work["correlation"].map(launch_at).to_numpy(dtype=float)
    start, end = _spans(work, origin)
    return (
        pd.DataFrame(
            {
                # object columns, as the events' (pandas would copy a million names into Arrow strings)
                "name": pd.Series(work["name"].to_numpy(), dtype=object),
                "kind": pd.Series(per_name(trace, tn.kernel_kind, object, None)[is_work], dtype=object),
                "compute": per_name(trace, tn.is_compute)[is_work],
                "comm": per_name(trace, lambda n: tn.COMM_KERNEL.match(n) is not None)[is_work],
                "ts_us": start,
                "end_us": end,
                "launch_us": launch - origin,
                "step": steps_of(launch, trace.steps),
            }
        )
        .sort_values("ts_us", kind="stable")
        .reset_index(drop=True)
    )


def window_work(
    trace: Trace, work: pd.DataFrame | None = None, include_last_step: bool = False
) -> pd.DataFrame:
    """The device work the whole-trace figures cover (``device_summary``'s window)."""
    return _in_window(work if work is not None else device_work(trace), trace, include_last_step)


def _in_window(work: pd.DataFrame, trace: Trace, include_last_step: bool) -> pd.DataFrame:
    """The work HTA's whole-trace figures cover (see the module's docstring)."""
    steps = trace.steps
    if len(steps) < 2:
        return work
    launch = work["launch_us"].to_numpy() + _origin(trace)
    if include_last_step:
        return work[launch <= steps["end_us"].max()]
    return work[launch < steps["start_us"].max()]


def _union(work: pd.DataFrame, mask=None) -> np.ndarray:
    w = work if mask is None else work[mask]
    return intervals.union(w["ts_us"].to_numpy(), w["end_us"].to_numpy())


def _shares(windows: np.ndarray, work: pd.DataFrame) -> pd.DataFrame:
    """HTA's shares of each window (rows of (start, end), µs) from ``work``."""
    span = windows[:, 1] - windows[:, 0]
    busy = intervals.covered(windows, _union(work))
    compute_iv = _union(work, work["compute"].to_numpy())
    comm_iv = _union(work, work["comm"].to_numpy())
    compute = intervals.covered(windows, compute_iv)
    comm = intervals.covered(windows, comm_iv)
    both = intervals.covered(windows, intervals.intersect(comm_iv, compute_iv))
    with np.errstate(invalid="ignore", divide="ignore"):
        pct = np.where(span > 0, 100.0 / span, np.nan)
        return pd.DataFrame(
            {
                "window_s": span / 1e6,
                "idle_pct": (span - busy) * pct,
                "compute_pct": compute * pct,
                "non_compute_pct": (busy - compute) * pct,
                "comm_compute_overlap_pct": np.where(comm > 0, 100.0 * both / comm, np.nan),
            }
        )


def _whole_window(work: pd.DataFrame) -> np.ndarray:
    return np.array([[work["ts_us"].min(), work["end_us"].max()]])


def device_summary(trace: Trace, include_last_step: bool = False, work: pd.DataFrame | None = None) -> dict:
    """HTA's temporal breakdown and communication/compute overlap of the whole trace's
    window: ``device_idle_pct``, ``device_compute_pct``, ``device_non_compute_pct``,
    ``comm_compute_overlap_pct`` (percent), ``window_s`` (seconds) and
    ``last_step_left_out`` (whether the window leaves the last step's work out); every
    value None without device work, the overlap None without communication kernels.
    ``work``: ``device_work(trace)`` when the caller holds it."""
    work = _in_window(work if work is not None else device_work(trace), trace, include_last_step)
    if work.empty:
        return dict.fromkeys(SUMMARY_KEYS)
    row = _shares(_whole_window(work), work).iloc[0]
    out: dict[str, float | bool | None] = {
        f"device_{k}": float(row[k]) for k in ("idle_pct", "compute_pct", "non_compute_pct")
    }
    overlap = row["comm_compute_overlap_pct"]
    out["comm_compute_overlap_pct"] = None if np.isnan(overlap) else float(overlap)
    out["window_s"] = float(row["window_s"])
    out["last_step_left_out"] = len(trace.steps) >= 2 and not include_last_step
    return out


def _step_windows(work: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(steps, windows): each step that launched device work, and its window (µs)."""
    launched = work[work["step"] >= 0]
    if launched.empty:
        return np.empty(0, dtype=int), np.empty((0, 2))
    g = launched.groupby("step", sort=True)
    first, last = g["ts_us"].min(), g["end_us"].max()
    starts = first.to_numpy()
    ends = np.append(starts[1:], last.to_numpy()[-1])
    return first.index.to_numpy(), np.column_stack([starts, np.maximum(ends, starts)])


def device_steps(trace: Trace, work: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per profiler step that launched device work: ``step``, its window
    (``window_s``), HTA's shares of it (``idle_pct``, ``compute_pct``, ``non_compute_pct``,
    ``comm_compute_overlap_pct``; percent, the overlap NaN without communication) and its
    idle seconds by cause (``idle_s`` = ``comm_wait_s`` + ``host_bound_s`` + ``other_s``, see
    ``idle_by_cause``). Empty without device work or steps. ``work``: ``device_work(trace)``
    when the caller holds it."""
    work = work if work is not None else device_work(trace)
    steps, windows = _step_windows(work)
    if not len(steps):
        return pd.DataFrame(columns=STEP_COLUMNS)
    shares = _shares(windows, work)
    causes = _idle_causes(trace, work, windows)
    return pd.concat([pd.DataFrame({"step": steps}), shares, causes.drop(columns="window_s")], axis=1)[
        STEP_COLUMNS
    ]


def kernels_by_kind(
    trace: Trace, by_step: bool = False, include_last_step: bool = False, work: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Device time by kind of work (``trace_names.KERNEL_KIND_NAMES``): ``kind``,
    ``count``, ``time_s`` (summed durations, seconds; overlapping work counts in full) and
    ``time_pct`` (share of the summed device time, percent), longest first, over the
    whole trace's window; ``by_step``: the same per profiler step that launched the work,
    with a ``step`` column. Empty without device work. ``work``: ``device_work(trace)``
    when the caller holds it."""
    work = work if work is not None else device_work(trace)
    if by_step:
        work, keys = work[work["step"] >= 0], ["step", "kind"]
    else:
        work, keys = _in_window(work, trace, include_last_step), ["kind"]
    columns = ["step", *KIND_COLUMNS] if by_step else KIND_COLUMNS
    if work.empty:
        return pd.DataFrame(columns=columns)
    dur = (work["end_us"] - work["ts_us"]) / 1e6
    table = (
        work.assign(time_s=dur)
        .groupby(keys, sort=False)
        .agg(count=("time_s", "size"), time_s=("time_s", "sum"))
        .reset_index()
    )
    total = table.groupby(keys[:-1])["time_s"].transform("sum") if by_step else table["time_s"].sum()
    table["time_pct"] = 100.0 * table["time_s"] / total
    order = ["step", "time_s"] if by_step else ["time_s"]
    ascending = [True, False] if by_step else [False]
    return table.sort_values(order, ascending=ascending, ignore_index=True)[columns]


def _host_spans(trace: Trace) -> dict[str, np.ndarray]:
    """Disjoint sorted spans (µs) of the host, by what it does (see ``idle_by_cause``):
    ``comm`` inside a collective or a wait, ``sync`` from a synchronising runtime call to the
    thread's next launch, ``copy`` inside a memcpy call, ``data`` loading a batch, ``work``
    running an operator or a runtime call, or inside a step's annotation."""
    return derived(trace.events, "host_spans", lambda: _host_spans_of(trace))


def _host_spans_of(trace: Trace) -> dict[str, np.ndarray]:
    ev = trace.events
    is_host = ~cat_in(ev, *tn.DEVICE_CATEGORIES)
    # the host's columns this needs, taken as arrays: most of a trace's events are the
    # host's, and a copy of their rows would hold every column of the table again
    host = np.flatnonzero(is_host)
    cat = ev["cat"].to_numpy(dtype=object)[host]
    ts = ev["ts_us"].to_numpy(dtype=float)[host] - _origin(trace)
    te = ts + ev["dur_us"].to_numpy(dtype=float)[host]

    def named(test) -> np.ndarray:
        return per_name(trace, test)[is_host]

    comm = named(lambda n: tn.is_collective(n) or tn.WAIT.search(n) is not None)
    comm &= np.isin(cat, tn.COLLECTIVE_CATEGORIES)
    runtime = np.isin(cat, tn.LAUNCH_CATEGORIES)
    sync = named(lambda n: tn.SYNC.match(n) is not None) & runtime
    copy = named(lambda n: tn.MEMCPY_CALL.match(n) is not None) & runtime
    data = named(lambda n: tn.DATA.match(n) is not None or tn.DATA_ANNOTATION.search(n) is not None)
    work = np.isin(cat, tn.HOST_WORK) | (cat == "user_annotation")
    origin = _origin(trace)
    steps = trace.steps  # the profiler's ProfilerStep#N spans, kept apart from the events
    step_ts, step_te = steps["start_us"].to_numpy() - origin, steps["end_us"].to_numpy() - origin
    return {
        "comm": intervals.union(ts[comm], te[comm]),
        "sync": _until_next_launch(
            ev["tid"].to_numpy()[host],
            ts,
            te,
            sync,
            runtime & named(lambda n: tn.LAUNCH.match(n) is not None),
        ),
        "copy": intervals.union(ts[copy], te[copy]),
        "data": intervals.union(ts[data], te[data]),
        "work": intervals.union(np.concatenate([ts[work], step_ts]), np.concatenate([te[work], step_te])),
    }


def _until_next_launch(
    tid: np.ndarray, ts: np.ndarray, te: np.ndarray, sync: np.ndarray, launch: np.ndarray
) -> np.ndarray:
    """Spans from each synchronising call's start to the next launch on its thread (to its
    own end when none follows): the device drains during the call and stays idle until the
    host puts work on it again (``tid``: each event's thread)."""
    starts, ends = [], []
    for thread in np.unique(tid[sync]):
        on = tid == thread
        launches = np.sort(ts[on & launch])
        s, e = ts[on & sync], te[on & sync]
        nxt = np.searchsorted(launches, e)
        after = np.where(nxt < len(launches), launches[np.minimum(nxt, len(launches) - 1)], e)
        starts.append(s)
        ends.append(np.maximum(after, e))
    if not starts:
        return np.empty((0, 2))
    return intervals.union(np.concatenate(starts), np.concatenate(ends))


def _idle_causes(trace: Trace, work: pd.DataFrame, windows: np.ndarray, busy=None) -> pd.DataFrame:
    """Idle seconds of each window by cause; ``busy``: the device's busy spans (default:
    all of ``work``)."""
    busy = _union(work) if busy is None else busy
    hull = np.array([[windows[:, 0].min(), windows[:, 1].max()]])
    rest = intervals.subtract(hull, busy)
    spans = _host_spans(trace)
    # a collective launched and not yet running also holds the device
    queued = work[work["comm"].to_numpy() & (work["launch_us"] < work["ts_us"]).to_numpy()]
    comm = intervals.union(
        np.concatenate([spans["comm"][:, 0], queued["launch_us"].to_numpy()]),
        np.concatenate([spans["comm"][:, 1], queued["ts_us"].to_numpy()]),
    )
    out = {
        "window_s": (windows[:, 1] - windows[:, 0]) / 1e6,
        "idle_s": intervals.covered(windows, rest) / 1e6,
    }
    for cause, held in zip(
        CAUSES[:-1], (comm, spans["sync"], spans["copy"], spans["data"], spans["work"]), strict=True
    ):
        out[cause] = intervals.covered(windows, intervals.intersect(rest, held)) / 1e6
        rest = intervals.subtract(rest, held)
    out["other_s"] = intervals.covered(windows, rest) / 1e6
    return pd.DataFrame(out)


def idle_by_cause(
    trace: Trace, by_step: bool = False, include_last_step: bool = False, work: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The device's idle seconds by cause, over the whole trace's window (one row) or,
    ``by_step``, per profiler step (a ``step`` column): ``window_s``, ``idle_s`` and its
    parts, ``CAUSES``, which add up to it. Empty without device work.

    Each idle moment (no device work running on any stream) gets the first cause that
    holds:

    1. ``comm_wait_s``, waiting on communication: a host thread is inside a collective
       (``c10d::…``, ``nccl:…``, ``gloo:…``, ``record_param_comms``, ``ProcessGroup…``) or
       an operator or annotation that waits (``trace_names.WAIT``: c10d and functional
       collectives' waits, awaitables), or an NCCL kernel has been launched and not yet
       started;
    2. ``sync_s``, a synchronisation stall: from a call that blocks the host until the
       device drains (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
       ``cudaEventSynchronize``: ``.item()``, ``.cpu()``, ``nonzero``, printing a tensor) to
       the thread's next launch;
    3. ``copy_s``: the host inside a memcpy call (a copy from pageable memory blocks it);
    4. ``data_s``: the host loading a batch (``enumerate(DataLoader)``, a ``data_load``
       annotation);
    5. ``host_bound_s``, a launch gap: a host thread is running an operator or a CUDA
       runtime/driver call, or is inside a user annotation of its step (``## forward ##``,
       ``ProfilerStep#N``) between traced operators, so the host, not the device, sets the
       pace;
    6. ``other_s``: none of these: the host is outside the step's traced work (between
       steps, untraced threads).

    ``work``: ``device_work(trace)`` when the caller holds it.
    """
    work = work if work is not None else device_work(trace)
    if by_step:
        steps, windows = _step_windows(work)
        if not len(steps):
            return pd.DataFrame(columns=["step", *IDLE_COLUMNS])
        return pd.concat([pd.DataFrame({"step": steps}), _idle_causes(trace, work, windows)], axis=1)
    chosen = _in_window(work, trace, include_last_step)
    if chosen.empty:
        return pd.DataFrame(columns=IDLE_COLUMNS)
    return _idle_causes(trace, work, _whole_window(chosen), busy=_union(chosen))
