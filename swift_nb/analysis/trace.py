"""Read a run's Chrome trace into DataFrames the analyses share.

Times are microseconds on the trace's clock (``ts_us``, ``dur_us``, ``end_us``); every
event carries the profiler step it falls in (``step``, from ``ProfilerStep#N``).
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from swift_nb.record import Run

_STEP = re.compile(r"^ProfilerStep#(\d+)$")

EVENT_COLUMNS = ["name", "cat", "ts_us", "dur_us", "end_us", "pid", "tid", "step", "input_dims", "ext_id"]
MEMORY_COLUMNS = ["ts_us", "bytes", "total_allocated", "device_type", "device_id", "addr", "step"]


@dataclass
class Trace:
    """A run's trace as tables.

    events: complete ("X") events; input_dims is the op's input shapes as text.
    memory: ``[memory]`` allocation (bytes > 0) and free (bytes < 0) events.
    steps: one row per ``ProfilerStep#N``: step, start_us, end_us, dur_us, and the tid of
    the thread that ran the training loop.
    """

    events: pd.DataFrame
    memory: pd.DataFrame
    steps: pd.DataFrame

    @property
    def empty(self) -> bool:
        return self.steps.empty


def _shapes(args: dict) -> str:
    # str() of a list of int lists is valid JSON and several times faster than json.dumps
    dims = args.get("Input Dims")
    return str(dims) if dims else ""


def parse_events(raw: list[dict]) -> Trace:
    """Build a Trace from Chrome trace events (the ``traceEvents`` list)."""
    # One comprehension per column: much faster than one loop building row tuples.
    xs = [e for e in raw if e.get("ph") == "X"]
    args = [e.get("args") or {} for e in xs]
    ts = np.fromiter((e["ts"] for e in xs), dtype=float, count=len(xs))
    dur = np.fromiter((e.get("dur", 0.0) for e in xs), dtype=float, count=len(xs))
    events = pd.DataFrame(
        {
            "name": [e.get("name", "") for e in xs],
            "cat": [e.get("cat", "") for e in xs],
            "ts_us": ts,
            "dur_us": dur,
            "end_us": ts + dur,
            "pid": [e.get("pid") for e in xs],
            "tid": [e.get("tid") for e in xs],
            "step": -1,
            "input_dims": [_shapes(a) for a in args],
            "ext_id": [a.get("External id") for a in args],
        },
        columns=EVENT_COLUMNS,
    )
    mem_events = [e for e in raw if e.get("ph") == "i" and e.get("name") == "[memory]"]
    margs = [e.get("args") or {} for e in mem_events]
    memory = pd.DataFrame(
        {
            "ts_us": [float(e["ts"]) for e in mem_events],
            "bytes": [int(a.get("Bytes", 0)) for a in margs],
            "total_allocated": [int(a.get("Total Allocated", 0)) for a in margs],
            "device_type": [int(a.get("Device Type", 0)) for a in margs],
            "device_id": [int(a.get("Device Id", -1)) for a in margs],
            "addr": [a.get("Addr") for a in margs],
            "step": -1,
        },
        columns=MEMORY_COLUMNS,
    ).sort_values("ts_us", kind="stable", ignore_index=True)
    events = events.astype({"name": str, "cat": str, "input_dims": str})  # typed even when empty
    is_step = events["name"].str.startswith("ProfilerStep#")
    steps = (
        events.loc[is_step, ["ts_us", "end_us", "dur_us", "tid"]]
        .assign(step=events.loc[is_step, "name"].str.extract(_STEP.pattern, expand=False).astype(int))
        .rename(columns={"ts_us": "start_us"})
        .sort_values("start_us", ignore_index=True)[["step", "start_us", "end_us", "dur_us", "tid"]]
    )
    events = events.loc[~is_step & (events["cat"] != "Trace")].reset_index(drop=True)
    events["step"] = _assign_steps(events["ts_us"].to_numpy(), steps)
    memory["step"] = _assign_steps(memory["ts_us"].to_numpy(), steps)
    return Trace(events, memory, steps)


def _assign_steps(ts: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """The step whose span holds each timestamp (-1 outside every step)."""
    if steps.empty or not len(ts):
        return np.full(len(ts), -1, dtype=int)
    starts, ends = steps["start_us"].to_numpy(), steps["end_us"].to_numpy()
    idx = np.searchsorted(starts, ts, side="right") - 1
    inside = (idx >= 0) & (ts <= ends[np.clip(idx, 0, None)])
    return np.where(inside, steps["step"].to_numpy()[np.clip(idx, 0, None)], -1)


def load_trace(run: Run) -> Trace:
    """The run's trace as tables; an empty Trace when there is none. Parsing a big trace
    takes a while: load it once and pass it to each analysis (``analyze`` does)."""
    path = run.trace_path
    if path is None or not Path(path).exists():
        return parse_events([])
    with gzip.open(path, "rb") as f:
        doc = orjson.loads(f.read())
    return parse_events(doc.get("traceEvents", []))
