"""A job's ranks side by side: one summary track per rank, its steps cut into what the rank
was doing — computing (``busy``), in a collective not hidden by compute
(``communicating``), or neither (``idle``). Past 16 ranks a timeline shows this first,
and a rank's own timeline (``Timeline.of_run(run, rank)``) opens from it.

On a GPU trace the states are the device's (its kernels); on a CPU trace, the training
thread's ops. Each rank keeps its own trace's clock (ranks' clocks agree as well as their
hosts' do).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from swift_nb.analysis.device import device_work
from swift_nb.analysis.timeline.query import Timeline
from swift_nb.analysis.trace.tables import (
    Trace,
    cat_in,
    load_trace_file,
    parse_events,
    per_name,
    per_value,
    spans_trace,
)
from swift_nb.core import intervals
from swift_nb.core import trace_names as tn
from swift_nb.core.errors import RecordError
from swift_nb.record import Run

STATES = ("busy", "communicating", "idle")
#: past this many ranks a job's timeline opens on the overview
OVERVIEW_RANKS = 16


def rank_states(trace: Trace) -> list[tuple[str, np.ndarray]]:
    """``(state, intervals)`` of one rank's trace, intervals in µs on its clock, inside its
    profiler steps."""
    if trace.steps.empty:
        return []
    steps = intervals.union(trace.steps["start_us"].to_numpy(), trace.steps["end_us"].to_numpy())
    work = device_work(trace)
    if len(work):
        origin = float(trace.events["ts_us"].min())
        comm_mask = work["comm"].to_numpy(dtype=bool)
        t0, t1 = work["ts_us"].to_numpy() + origin, work["end_us"].to_numpy() + origin
        busy = intervals.union(t0[~comm_mask], t1[~comm_mask])
        comm = intervals.union(t0[comm_mask], t1[comm_mask])
    else:
        ev = trace.events
        loop_tid = str(trace.steps["tid"].iloc[0])
        loop = per_value(ev["tid"], lambda t: str(t) == loop_tid)
        is_comm = per_name(trace, tn.is_collective) & loop
        ops = (cat_in(ev, "cpu_op")) & loop & ~is_comm
        busy = intervals.union(ev["ts_us"].to_numpy()[ops], ev["end_us"].to_numpy()[ops])
        comm = intervals.union(ev["ts_us"].to_numpy()[is_comm], ev["end_us"].to_numpy()[is_comm])
    busy = intervals.intersect(busy, steps)
    comm = intervals.subtract(intervals.intersect(comm, steps), busy)
    idle = intervals.subtract(intervals.subtract(steps, busy), comm)
    return [("busy", busy), ("communicating", comm), ("idle", idle)]


def rank_overview(run: Run) -> Timeline:
    """One track per rank of a job's folder (``rank:<r>``, labelled ``Rank <r>``, kind
    ``rank``) holding its states (``rank_states``); a rank whose trace cannot be read has
    an empty track and a line in the run's problems."""
    names, starts, ends, tids = [], [], [], []
    paths = sorted(run.rank_trace_paths().items())
    for rank, path in paths:
        try:
            trace = load_trace_file(path)
        except (OSError, RecordError) as e:
            run.problems.append(f"rank {rank}: its trace could not be read for the overview ({e})")
            continue
        for state, iv in rank_states(trace):
            names.append(np.full(len(iv), state, dtype=object))
            tids.append(np.full(len(iv), f"{rank:07d}", dtype=object))
            starts.append(iv[:, 0])
            ends.append(iv[:, 1])
        del trace
    if names:
        ts, end = np.concatenate(starts), np.concatenate(ends)
        spans = spans_trace(np.concatenate(names), "rank_state", ts, end - ts, "ranks", np.concatenate(tids))
    else:
        spans = parse_events([])
    timeline = Timeline(spans)
    ranks = [int(t.rsplit(":", 1)[1]) for t in timeline.tracks["track"]]
    timeline.tracks["track"] = [f"rank:{r}" for r in ranks]
    timeline.tracks["label"] = [f"Rank {r}" for r in ranks]
    timeline.tracks["kind"] = "rank"
    return timeline


def states_per_rank(timeline: Timeline) -> pd.DataFrame:
    """µs of each state per rank of an overview: ``track``, ``busy``, ``communicating``,
    ``idle``."""
    items = timeline.all_items()
    items["us"] = items["end_us"] - items["start_us"]
    table = items.pivot_table(index="track", columns="name", values="us", aggfunc="sum", fill_value=0.0)
    return table.reindex(columns=list(STATES), fill_value=0.0).reset_index()
