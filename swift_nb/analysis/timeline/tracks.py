"""Which track of the timeline each trace event goes on, and its depth there.

Tracks, in drawing order: the profiler's steps; the model's modules (each module's forward,
nested by the module tree: ``swift_nb.capture.memory.modules``' scopes, moved here from the
loop's thread); the DataLoader's batches (each wait for a batch, also drawn on its thread); the CPU threads of the training process, the loop's
thread first; other processes' threads (workers); the GPUs' streams, by device and stream.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from swift_nb.analysis.trace.tables import Trace, cat_in, per_name, per_value
from swift_nb.core import trace_names as tn

#: a row deeper than this holds every deeper event too (a thread's 40th level of nesting
#: is a recursion, not something to read)
MAX_DEPTH = 24
STEPS_TRACK = "steps"
DATA_TRACK = "dataloader"
MODULES_TRACK = "modules"
TRACK_COLUMNS = ["track", "label", "kind"]


def depths(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Nesting depth of each event of one track, given sorted by start and, at equal
    starts, longest first: how many earlier events are still open when it starts (for
    properly nested events, its ancestors). A zero-length event at another's start is its
    child; back-to-back siblings share a depth. O(n log n), no Python loop."""
    n = len(start)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    i = np.arange(n)
    ended = np.searchsorted(np.sort(end), start, side="right")  # events over by its start
    # of those, the zero-length ones at this very start sort at or after it: not earlier
    zero = np.concatenate([[0], np.cumsum(end <= start)])
    group_end = np.searchsorted(start, start, side="right")
    earlier_ended = ended - (zero[group_end] - zero[i])
    return np.clip(i - earlier_ended, 0, MAX_DEPTH).astype(np.int32)


def _stream_order(tid: str) -> tuple[int, str]:
    text = str(tid)
    digits = "".join(ch for ch in text if ch.isdigit())
    return (int(digits) if digits else 1 << 30, text)


def assign_tracks(trace: Trace) -> tuple[np.ndarray, pd.DataFrame, pd.DataFrame]:
    """``(track_of, tracks, extra)``: the track index of each event of ``trace.events``
    (-1: not drawn); the tracks (``track``, ``label``, ``kind``) in drawing order; and the
    spans drawn besides the events (``start_us``, ``end_us``, ``name``, ``source``: the
    event drawn again, -1 for a step; ``track``)."""
    ev = trace.events
    # as text, once per distinct value (astype(str) copies a million rows into Arrow strings)
    pid = per_value(ev["pid"], str, object, "None")
    tid = per_value(ev["tid"], str, object, "None")
    gpu = cat_in(ev, *tn.DEVICE_CATEGORIES)
    keys = pd.DataFrame(
        {"gpu": gpu, "pid": pd.Series(pid, dtype=object), "tid": pd.Series(tid, dtype=object)}
    )
    group = keys.groupby(["gpu", "pid", "tid"], sort=False).ngroup().to_numpy()
    firsts = keys.drop_duplicates(ignore_index=True)  # in group order
    loop_tid = str(trace.steps["tid"].iloc[0]) if len(trace.steps) else None
    cpu = firsts[~firsts["gpu"]]
    main_pid = _main_pid(cpu, keys, loop_tid)
    labelled = []
    sort: tuple[int, str, tuple[int | str, ...]]  # (kind's place, process, place in the process)
    for g, key in firsts.iterrows():
        if key["gpu"]:
            sort, kind, label = (
                (2, key["pid"], _stream_order(key["tid"])),
                "gpu",
                f"GPU {key['pid']} stream {key['tid']}",
            )
        elif key["pid"] == main_pid:
            first = key["tid"] == loop_tid
            sort = (0, "", (0 if first else 1, *_stream_order(key["tid"])))
            kind, label = "cpu", f"CPU thread {key['tid']}" + (" (training loop)" if first else "")
        else:
            sort, kind = (1, key["pid"], _stream_order(key["tid"])), "worker"
            label = f"Process {key['pid']} thread {key['tid']}"
        track = f"{kind}:{key['pid']}:{key['tid']}"
        labelled.append((sort, g, track, label, kind))
    labelled.sort(key=lambda x: x[0])
    is_data = per_name(trace, lambda n: tn.DATA.match(n) is not None) & ~gpu
    is_module = (
        per_name(trace, lambda n: n.startswith(tn.MODULE_PREFIX)) & ~gpu & (cat_in(ev, "user_annotation"))
    )
    head = [(STEPS_TRACK, "Steps", "steps")] if len(trace.steps) else []
    if is_module.any():
        head.append((MODULES_TRACK, "Modules", "cpu"))
    if is_data.any():
        head.append((DATA_TRACK, "DataLoader", "worker"))
    tracks = pd.DataFrame(
        head + [(t, label, kind) for _, _, t, label, kind in labelled], columns=TRACK_COLUMNS
    )
    index_of_group = np.empty(len(firsts), dtype=np.int32)
    for position, (_, g, *_rest) in enumerate(labelled):
        index_of_group[g] = len(head) + position
    track_of = index_of_group[group] if len(group) else np.zeros(0, dtype=np.int32)
    track_of[is_module] = -1  # drawn on the modules' track only
    steps = trace.steps
    place = {t: i for i, t in enumerate(tracks["track"])}
    again = np.flatnonzero(is_module | is_data)  # module scopes and batches, in trace order
    extra = pd.DataFrame(
        {
            "start_us": np.r_[steps["start_us"].to_numpy(dtype=float), ev["ts_us"].to_numpy()[again]],
            "end_us": np.r_[steps["end_us"].to_numpy(dtype=float), ev["end_us"].to_numpy()[again]],
            "name": [f"{tn.STEP_PREFIX}{int(s)}" for s in steps["step"]] + list(ev["name"].to_numpy()[again]),
            "source": np.r_[np.full(len(steps), -1), again].astype(np.int64),
            "track": np.r_[
                np.zeros(len(steps)),
                np.where(is_module[again], place.get(MODULES_TRACK, 0), place.get(DATA_TRACK, 0)),
            ].astype(np.int32),
        }
    )
    return track_of, tracks, extra


def _main_pid(cpu: pd.DataFrame, keys: pd.DataFrame, loop_tid: str | None) -> str | None:
    """The training process: the one whose thread ran the steps, else the busiest."""
    if loop_tid is not None:
        owners = cpu.loc[cpu["tid"] == loop_tid, "pid"]
        if len(owners):
            return str(owners.iloc[0])
    counts = keys.loc[~keys["gpu"], "pid"].value_counts()
    return str(counts.index[0]) if len(counts) else None
