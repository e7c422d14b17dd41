"""A run's trace as a timeline that answers "what is there to draw between two times, at
this width" in time bounded by what it returns, not by the trace's size.

Every complete event of the trace goes on a track: one per CPU thread (ops nested by
depth), one per GPU stream (kernels, memcpy, memset), the DataLoader's batches, a band of
the profiler's steps. Each (track, depth) is a *row* whose events are kept sorted by start
in flat arrays, so a window is found by binary search and each pixel column's events by one
more. Counter tracks (memory by category, the sampler's series) are put on the trace's
clock through the steps both clocks saw (``timeline_counters``).

Times are µs on the trace's clock, as in ``analysis.trace``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from swift_nb.analysis.timeline.counters import COUNTER_COLUMNS, counter_series, downsample
from swift_nb.analysis.timeline.tracks import MAX_DEPTH, STEPS_TRACK, assign_tracks, depths
from swift_nb.analysis.trace.tables import Trace, cat_in, load_trace_file
from swift_nb.core import trace_names as tn
from swift_nb.core.errors import ConfigError
from swift_nb.record import Run

#: columns of ``Timeline.query``
ITEM_COLUMNS = ["track", "name", "start_us", "end_us", "count", "depth"]
_ITEM_DTYPES = {
    "track": object,
    "name": object,
    "start_us": float,
    "end_us": float,
    "count": np.int64,
    "depth": np.int32,
}
#: items a page carries at most (``Timeline.embed``): about 7 MB of JSON
EMBED_BUDGET = 200_000
#: events sampled to name a merged run of events (its dominant name, by time)
_NAME_SAMPLES = 8
#: launches a detail lists at most (an optimizer's foreach step launches thousands)
_MAX_LAUNCHES = 200


@dataclass(frozen=True)
class _Rows:
    """Every event of the timeline, grouped by row and sorted by start within a row:
    row ``r`` is ``[offsets[r], offsets[r + 1])`` of the flat arrays."""

    start: np.ndarray  # float64 µs
    end: np.ndarray  # float64 µs
    name: np.ndarray  # int32 code into Timeline.names
    source: np.ndarray  # int64 row of Trace.events; -1 for a step span
    offsets: np.ndarray  # int64, one more than the rows
    track: np.ndarray  # int32 index into Timeline.tracks, per row
    depth: np.ndarray  # int32, per row

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.start, self.end, self.name, self.source, self.offsets))


class Timeline:
    """The tracks and rows of one trace (see the module's docstring).

    ``tracks``: one row per track in drawing order: ``track`` (id), ``label``, ``kind``
    (``steps``, ``cpu``, ``gpu``, ``worker``, ``counter``), ``max_depth`` and, for
    counters, ``unit`` (``bytes``, ``%``, ``W``; empty for the other kinds).
    ``start_us``/``end_us``: the trace's bounds. ``names``: every event name, by code.
    """

    tracks: pd.DataFrame

    def __init__(self, trace: Trace, counters: pd.DataFrame | None = None):
        self._events = trace.events
        self._build(trace)
        self._counters = (
            pd.DataFrame(columns=COUNTER_COLUMNS) if counters is None else counters
        ).sort_values(["track", "t_us"], kind="stable", ignore_index=True)
        units = (
            self._counters.groupby("track", sort=False)["unit"].first() if "unit" in self._counters else {}
        )
        counter_tracks = [
            {"track": t, "label": t, "kind": "counter", "max_depth": 0, "unit": units.get(t, "")}
            for t in self._counters["track"].unique()
        ]
        if counter_tracks:
            self.tracks = pd.concat([self.tracks, pd.DataFrame(counter_tracks)], ignore_index=True)
        self._position: np.ndarray | None = None

    def _build(self, trace: Trace) -> None:
        ev = trace.events
        codes, uniques = trace._name_codes
        track_of, self.tracks, extra = assign_tracks(trace)
        names = [str(u) for u in uniques]
        # the step band and the DataLoader's batches are drawn again on their own tracks
        start = np.concatenate([ev["ts_us"].to_numpy(dtype=float), extra["start_us"].to_numpy(dtype=float)])
        end = np.concatenate([ev["end_us"].to_numpy(dtype=float), extra["end_us"].to_numpy(dtype=float)])
        extra_codes = pd.Index(names).get_indexer(extra["name"])
        new = extra["name"][extra_codes < 0].unique()
        names += list(new)
        extra_codes = pd.Index(names).get_indexer(extra["name"])
        code: np.ndarray = np.concatenate([codes, extra_codes]).astype(np.int32)
        source: np.ndarray = np.concatenate([np.arange(len(ev)), extra["source"].to_numpy()]).astype(np.int64)
        track: np.ndarray = np.concatenate([track_of, extra["track"].to_numpy()]).astype(np.int32)
        keep = track >= 0
        start, end, code, source, track = (a[keep] for a in (start, end, code, source, track))
        order = np.lexsort((-end, start, track))
        start, end, code, source, track = (a[order] for a in (start, end, code, source, track))
        bounds = np.searchsorted(track, np.arange(len(self.tracks) + 1))
        depth: np.ndarray = np.zeros(len(start), dtype=np.int32)
        for t in range(len(self.tracks)):
            depth[bounds[t] : bounds[t + 1]] = depths(
                start[bounds[t] : bounds[t + 1]], end[bounds[t] : bounds[t + 1]]
            )
        order = np.lexsort((start, depth, track))
        start, end, code, source, track, depth = (a[order] for a in (start, end, code, source, track, depth))
        key = track.astype(np.int64) * (MAX_DEPTH + 1) + depth
        first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, dtype=np.int64)
        self._rows = _Rows(
            start, end, code, source, np.r_[first, len(key)].astype(np.int64), track[first], depth[first]
        )
        self.tracks["max_depth"] = [
            int(self._rows.depth[self._rows.track == t].max(initial=0)) for t in range(len(self.tracks))
        ]
        self.names = np.array(names, dtype=object)
        self.start_us = float(start.min()) if len(start) else 0.0
        self.end_us = float(end.max()) if len(end) else 0.0

    @classmethod
    def of_trace(
        cls,
        trace: Trace,
        samples: pd.DataFrame | None = None,
        memory: pd.DataFrame | None = None,
        steps_csv: pd.DataFrame | None = None,
    ) -> Timeline:
        """The timeline of ``trace``; ``samples``/``memory``/``steps_csv``: a run's
        samples.csv, memory.csv and steps.csv, drawn as counters on the trace's clock."""
        return cls(trace, counter_series(trace, samples, memory, steps_csv))

    @classmethod
    def of_run(cls, run: Run, rank: int | None = None) -> Timeline:
        """The timeline of a saved run, or of one rank's trace in a job's folder."""
        paths = run.rank_trace_paths()
        path = run.trace_path if rank is None else paths.get(rank)
        if rank is not None and path is None:
            have = ", ".join(str(r) for r in sorted(paths)) or "none"
            raise ConfigError(
                "rank", f"must be a rank with a trace in {run.path} (the ranks with one: {have})", rank
            )
        if path is None:
            raise ConfigError(
                "run",
                "has no trace to draw: the profiler recorded no step (profile more steps than the "
                "schedule's wait and warmup, or see the run's notes)",
                run.id,
            )
        trace = load_trace_file(path)
        if path == run.trace_path:  # the record's samples and memory are its own rank's
            return cls.of_trace(trace, run.samples, run.memory, run.steps)
        return cls.of_trace(trace)

    @property
    def nbytes(self) -> int:
        """Bytes held beside the trace's own columns (the rows and the counters)."""
        return self._rows.nbytes + int(self._counters.memory_usage(deep=False).sum())

    # -- what to draw -----------------------------------------------------------------

    def window(self, start_us: float | None, end_us: float | None) -> tuple[float, float]:
        """``start_us``/``end_us`` with None read as the trace's bounds; ConfigError for a
        window that ends before it starts."""
        t0 = self.start_us if start_us is None else float(start_us)
        t1 = self.end_us if end_us is None else float(end_us)
        if not (np.isfinite(t0) and np.isfinite(t1)) or t1 < t0:
            raise ConfigError(
                "end_us", "must be after start_us: a timeline window ends after it starts", (start_us, end_us)
            )
        return t0, t1

    def query(
        self, start_us: float | None = None, end_us: float | None = None, width_px: int = 1000
    ) -> pd.DataFrame:
        """What to draw of the span tracks between ``start_us`` and ``end_us`` (None: the
        trace's bounds) on ``width_px`` pixel columns: ``track``, ``name``, ``start_us``,
        ``end_us``, ``count``, ``depth``, by row and start.

        Each pixel column of each row (a track at one depth) has at most two items: a
        column's events are drawn as they are when there are one or two; otherwise the
        event that runs past the column is drawn as itself and the others, too small to
        see, merge into one item whose ``count`` says how many it holds and whose ``name``
        covers most of their time (judged from up to eight of them spread evenly, so the
        cost stays bounded by the items returned). Events partly inside keep their bounds."""
        t0, t1 = self.window(start_us, end_us)
        if int(width_px) < 1:
            raise ConfigError("width_px", "is the drawing's width in pixels, at least 1", width_px)
        width = int(width_px)
        px = max(t1 - t0, 1e-6) / width
        parts = [p for r in range(len(self._rows.track)) if (p := self._row_items(r, t0, t1, px, width))]
        if not parts:
            return pd.DataFrame({c: pd.Series(dtype=t) for c, t in _ITEM_DTYPES.items()})
        row, code, start, end, count = (np.concatenate(c) for c in zip(*parts, strict=True))
        return pd.DataFrame(
            {
                "track": self.tracks["track"].to_numpy()[self._rows.track[row]],
                "name": self.names[code],
                "start_us": start,
                "end_us": end,
                "count": count,
                "depth": self._rows.depth[row],
            },
            columns=ITEM_COLUMNS,
        )

    def _row_items(self, r: int, t0: float, t1: float, px: float, width: int):
        rows = self._rows
        a, b = int(rows.offsets[r]), int(rows.offsets[r + 1])
        s, e = rows.start[a:b], rows.end[a:b]
        lo = int(np.searchsorted(s, t0, side="left"))
        if lo > 0 and e[lo - 1] > t0:  # the event already running when the window opens
            lo -= 1
        hi = int(np.searchsorted(s, t1, side="right"))
        if hi <= lo:
            return None
        # each pixel column's first event by start; one running into the window is column 0's
        cuts = np.searchsorted(s[lo:hi], t0 + px * np.arange(1, width), side="left") + lo
        first = np.concatenate([[lo], cuts, [hi]])
        count = np.diff(first)
        cols = np.flatnonzero(count)
        at, n = first[cols], count[cols]
        last = at + n - 1
        wide = e[last] > t0 + px * (cols + 1)  # runs past its column: drawn as itself
        few = n <= 2
        merged_at, merged_n = at[~few], n[~few] - wide[~few]
        single = merged_n == 1  # one small event beside a wide one: no merge needed
        exact = np.concatenate(
            [np.repeat(at[few], n[few]) + _ranks(n[few]), last[~few & wide], merged_at[single]]
        )
        merged_at, merged_n = merged_at[~single], merged_n[~single]
        exact += a
        merged_at += a
        m_end = np.zeros(0)
        if len(merged_at):  # each run's latest end; the slice makes the last run end at its own end
            bounds = np.column_stack([merged_at, merged_at + merged_n]).ravel()
            m_end = np.maximum.reduceat(rows.end[: bounds[-1]], bounds[:-1])[::2]
        return (
            np.full(len(exact) + len(merged_at), r, dtype=np.int64),
            np.concatenate([rows.name[exact], self._dominant(merged_at, merged_n)]),
            np.concatenate([rows.start[exact], rows.start[merged_at]]),
            np.concatenate([rows.end[exact], m_end]),
            np.concatenate([np.ones(len(exact), dtype=np.int64), merged_n.astype(np.int64)]),
        )

    def _dominant(self, first: np.ndarray, n: np.ndarray) -> np.ndarray:
        """The name covering most time among up to ``_NAME_SAMPLES`` events spread evenly
        over each run ``[first, first + n)`` of the flat arrays."""
        if not len(first):
            return np.zeros(0, dtype=np.int32)
        k = np.minimum(n, _NAME_SAMPLES)[:, None]
        j = np.arange(_NAME_SAMPLES)[None, :]
        valid = j < k
        pick = np.where(valid, first[:, None] + (j * n[:, None]) // k, first[:, None])
        codes = self._rows.name[pick]
        weight = np.where(valid, self._rows.end[pick] - self._rows.start[pick], 0.0) + valid * 1e-9
        score = ((codes[:, :, None] == codes[:, None, :]) * weight[:, None, :]).sum(axis=2)
        return codes[np.arange(len(first)), score.argmax(axis=1)]

    def counters(
        self, start_us: float | None = None, end_us: float | None = None, width_px: int = 1000
    ) -> pd.DataFrame:
        """The counter tracks in the window: ``track``, ``t_us``, ``value``; at most each
        pixel column's lowest and highest value, plus the values in force at both edges."""
        t0, t1 = self.window(start_us, end_us)
        return downsample(self._counters, t0, t1, max(int(width_px), 1))

    # -- one event --------------------------------------------------------------------

    def _row_of(self, track: str, depth: int) -> int | None:
        t = np.flatnonzero(self.tracks["track"].to_numpy() == track)
        if not len(t):
            return None
        r = np.flatnonzero((self._rows.track == t[0]) & (self._rows.depth == int(depth)))
        return int(r[0]) if len(r) else None

    def _at(self, r: int, t_us: float) -> int | None:
        """The flat index of row ``r``'s event under ``t_us``, if any."""
        a, b = int(self._rows.offsets[r]), int(self._rows.offsets[r + 1])
        i = int(np.searchsorted(self._rows.start[a:b], t_us, side="right")) - 1
        return a + i if i >= 0 and self._rows.end[a + i] >= t_us else None

    def _item(self, i: int) -> dict[str, Any]:
        rows = self._rows
        r = int(np.searchsorted(rows.offsets, i, side="right")) - 1
        return {
            "track": str(self.tracks["track"].iloc[rows.track[r]]),
            "name": str(self.names[rows.name[i]]),
            "start_us": float(rows.start[i]),
            "end_us": float(rows.end[i]),
            "depth": int(rows.depth[r]),
        }

    def detail(self, track: str, depth: int, t_us: float) -> dict[str, Any] | None:
        """The event under ``t_us`` on ``track`` at ``depth``, or None: its ``name``,
        ``start_us``, ``end_us``, ``dur_us``, ``shapes`` and ``types`` (of its inputs, as
        recorded), ``stack`` (the names of the events around it on its track, outermost
        first: the user's code when the trace has Python frames), ``launches`` (the device
        work it launched, directly or through the ops inside it) and ``launched_by`` (for
        device work: the runtime call that launched it)."""
        r = self._row_of(track, depth)
        i = None if r is None else self._at(r, float(t_us))
        if i is None:
            return None
        out = self._item(i)
        out["dur_us"] = out["end_us"] - out["start_us"]
        src = int(self._rows.source[i])
        row = self._events.iloc[src] if src >= 0 else None
        out["shapes"] = "" if row is None else str(row["input_dims"] or "")
        out["types"] = "" if row is None else str(row["input_types"] or "")
        out["stack"] = [
            self._item(j)["name"]
            for d in range(int(depth))
            if (rr := self._row_of(track, d)) is not None and (j := self._at(rr, out["start_us"])) is not None
        ]
        out["launches"], out["launched_by"] = self._flows(i, out, row)
        return out

    def _flows(self, i: int, item: dict[str, Any], row: pd.Series | None) -> tuple[list[dict], dict | None]:
        if row is None:
            return [], None
        ev = self._events
        correlation = ev["correlation"].to_numpy()
        if row["cat"] in tn.DEVICE_CATEGORIES:
            calls = np.flatnonzero((correlation == row["correlation"]) & cat_in(ev, *tn.LAUNCH_CATEGORIES))
            return [], (
                self._item(self._flat(int(calls[0]))) if len(calls) and row["correlation"] >= 0 else None
            )
        # the runtime calls on this thread inside the event, and the device work they launched
        ts = ev["ts_us"].to_numpy()
        inside = (
            (ts >= item["start_us"])
            & (ts <= item["end_us"])
            & (ev["tid"].to_numpy() == row["tid"])
            & (ev["pid"].to_numpy() == row["pid"])
            & (correlation >= 0)
            & cat_in(ev, *tn.LAUNCH_CATEGORIES)
        )
        wanted = np.unique(correlation[inside])
        device = np.flatnonzero(cat_in(ev, *tn.DEVICE_WORK) & np.isin(correlation, wanted))
        return [self._item(self._flat(int(k))) for k in device[:_MAX_LAUNCHES]], None

    def _flat(self, source: int) -> int:
        """The flat index of the trace's event ``source``."""
        if self._position is None:
            pos = np.full(len(self._events), -1, dtype=np.int64)
            own = self._rows.source >= 0
            # an event drawn twice (a DataLoader batch) is found on the later track: its thread's
            pos[self._rows.source[own]] = np.flatnonzero(own)
            self._position = pos
        return int(self._position[source])

    def search(self, text: str, limit: int = 200) -> pd.DataFrame:
        """Events whose name holds ``text`` (any case), the first ``limit`` by start:
        ``track``, ``name``, ``start_us``, ``end_us``, ``depth``."""
        match = np.flatnonzero(
            pd.Series(self.names, dtype=object).str.contains(text, case=False, regex=False)
        )
        hits = np.flatnonzero(np.isin(self._rows.name, match))
        hits = hits[np.argsort(self._rows.start[hits], kind="stable")[: int(limit)]]
        cols = ["track", "name", "start_us", "end_us", "depth"]
        return pd.DataFrame([self._item(int(i)) for i in hits], columns=cols)

    def all_items(self) -> pd.DataFrame:
        """Every event of the span tracks as an item (``count`` 1): the full detail."""
        rows = self._rows
        row = np.repeat(np.arange(len(rows.track)), np.diff(rows.offsets))
        return pd.DataFrame(
            {
                "track": self.tracks["track"].to_numpy()[rows.track[row]],
                "name": self.names[rows.name],
                "start_us": rows.start,
                "end_us": rows.end,
                "count": np.ones(len(rows.start), dtype=np.int64),
                "depth": rows.depth[row],
            },
            columns=ITEM_COLUMNS,
        )

    def payload(self, items: pd.DataFrame, counters: pd.DataFrame | None = None) -> dict[str, Any]:
        """``items`` (of ``query``) and ``counters`` (of ``counters``) as JSON-able columns
        for a viewer: ``origin_us`` (the trace's start; every time below is µs after it,
        to a nanosecond), ``start_us``/``end_us`` (the trace's bounds, on its clock),
        ``tracks`` (``track``, ``label``, ``kind``, ``max_depth``, ``unit``), ``names``, ``items``
        (``track`` and ``name`` as indices into those lists, ``start``, ``end``, ``count``,
        ``depth``) and ``counters`` (``track`` index, ``t``, ``value``)."""
        origin = self.start_us
        track_index = pd.Index(self.tracks["track"])
        name_codes, names = pd.factorize(items["name"])
        counters = pd.DataFrame(columns=COUNTER_COLUMNS) if counters is None else counters
        return {
            "origin_us": origin,
            "start_us": self.start_us,
            "end_us": self.end_us,
            "tracks": _track_records(self.tracks),
            "names": [str(n) for n in names],
            "items": {
                "track": track_index.get_indexer(items["track"]).tolist(),
                "name": name_codes.tolist(),
                "start": _rounded(items["start_us"].to_numpy(dtype=float) - origin),
                "end": _rounded(items["end_us"].to_numpy(dtype=float) - origin),
                "count": items["count"].astype(np.int64).tolist(),
                "depth": items["depth"].astype(np.int64).tolist(),
            },
            "counters": {
                "track": track_index.get_indexer(counters["track"]).tolist(),
                "t": _rounded(counters["t_us"].to_numpy(dtype=float) - origin),
                "value": [float(v) for v in counters["value"]],
            },
        }

    def embed(self, budget_items: int = EMBED_BUDGET, counter_width_px: int = 4000) -> dict[str, Any]:
        """A ``payload`` of the whole trace for a page to carry: every event while they are
        no more than ``budget_items``; beyond, the level of detail of the whole trace at
        the widest drawing whose items fit the budget, and a ``note`` saying so
        (``detail``: ``full`` or ``merged``)."""
        if self.events <= budget_items:
            items, note, detail = self.all_items(), None, "full"
        else:
            # the widest drawing (doubling from a guess) whose items fit the budget
            width = max(budget_items // (2 * max(len(self._rows.track), 1)), 1)
            items = self.query(width_px=width)
            while len(items) > budget_items and width > 1:
                width //= 2
                items = self.query(width_px=width)
            while len(wider := self.query(width_px=2 * width)) <= budget_items:
                width, items = 2 * width, wider
            note = (
                f"The trace holds {self.events:,} events, more than the {budget_items:,} this page "
                f"carries: runs of events shorter than 1/{width:,} of the trace are merged into "
                "one bar each (its count and commonest name on hover). The notebook's timeline, or "
                "Perfetto, shows every event."
            )
            detail = "merged"
        out = self.payload(items, self.counters(width_px=counter_width_px))
        out["note"], out["detail"] = note, detail
        return out

    @property
    def events(self) -> int:
        """How many events the span tracks hold."""
        return len(self._rows.start)


def _track_records(tracks: pd.DataFrame) -> list[dict[str, Any]]:
    """The tracks as JSON-able records; ``unit`` empty where a track has none."""
    out = tracks.reindex(columns=["track", "label", "kind", "max_depth", "unit"])
    out["unit"] = [u if isinstance(u, str) else "" for u in out["unit"]]
    return out.to_dict("records")


def _rounded(us: np.ndarray) -> list[float]:
    """µs to the nanosecond, for JSON (a float's 17 digits would double a page's size)."""
    return np.round(us, 3).tolist()


def _ranks(n: np.ndarray) -> np.ndarray:
    """0, 1, …, n_i − 1 for each entry of ``n``, concatenated."""
    if not len(n):
        return np.zeros(0, dtype=np.int64)
    return np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)


__all__ = ["ITEM_COLUMNS", "STEPS_TRACK", "Timeline"]


def step_window(tl: Timeline, step: int) -> tuple[float, float]:
    """Profiler step ``step``'s span on the timeline's step band (µs); a ``ConfigError``
    naming the recorded steps when the trace has no such step."""
    hits = tl.search(tn.STEP_PREFIX)
    hits = hits[hits["track"] == STEPS_TRACK]
    steps = hits["name"].map(tn.step_of)
    match = hits[steps == step]
    if match.empty:
        recorded = ", ".join(str(s) for s in steps.dropna().astype(int)) or "none"
        raise ConfigError("step", f"must be a profiler step of the trace (recorded: {recorded})", step)
    return float(match["start_us"].iloc[0]), float(match["end_us"].iloc[0])
