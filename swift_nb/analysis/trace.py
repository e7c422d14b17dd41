"""Read a run's Chrome trace into DataFrames the analyses share.

Times are microseconds on the trace's clock (``ts_us``, ``dur_us``, ``end_us``); every
event carries the profiler step it falls in (``step``, from the profiler's step spans,
``trace_names.STEP_NAME``).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from swift_nb import trace_names as tn
from swift_nb.record import Run, tables_path

EVENT_COLUMNS = [
    "name",
    "cat",
    "ts_us",
    "dur_us",
    "end_us",
    "pid",
    "tid",
    "step",
    "input_dims",
    "input_types",
    "ext_id",
]
MEMORY_COLUMNS = ["ts_us", "bytes", "total_allocated", "device_type", "device_id", "addr", "step"]
STEP_COLUMNS = ["step", "start_us", "end_us", "dur_us", "tid"]


@dataclass
class Trace:
    """A run's trace as tables.

    events: complete ("X") events; input_dims is the op's input shapes as text, input_types
    their element types (``['float', 'TensorList', …]``, empty for ops without shapes).
    memory: ``[memory]`` allocation (bytes > 0) and free (bytes < 0) events.
    steps: one row per profiler step span: step, start_us, end_us, dur_us, and the tid of
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
            "input_types": [str(t) if (t := a.get("Input type")) and "Input Dims" in a else "" for a in args],
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
    events = events.astype(
        {"name": str, "cat": str, "input_dims": str, "input_types": str}
    )  # typed even when empty
    numbers = {n: k for n in events["name"].unique() if (k := tn.step_of(n)) is not None}
    step_no = events["name"].map(numbers)
    is_step = step_no.notna()
    steps = (
        events.loc[is_step, ["ts_us", "end_us", "dur_us", "tid"]]
        .assign(step=step_no[is_step].astype(int))
        .rename(columns={"ts_us": "start_us"})
        .sort_values("start_us", ignore_index=True)[STEP_COLUMNS]
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


_TEXT_COLUMNS = {
    "events": ["name", "cat", "pid", "tid", "input_dims", "input_types"],
    "memory": ["addr"],
    "steps": ["tid"],
}


def load_trace(run: Run) -> Trace:
    """The run's trace as tables; an empty Trace when there is none."""
    return load_trace_file(run.trace_path)


def load_trace_file(path: Path | None) -> Trace:
    """A trace file as tables; an empty Trace when there is none.

    Decoding a big trace's JSON takes seconds, so the tables are kept beside it in
    ``<name>.tables.npz`` (plain arrays, no pickles) and read from there while they are
    newer than the trace; an unreadable copy is ignored and rebuilt.
    """
    if path is None or not Path(path).exists():
        return parse_events([])
    cache = tables_path(path)
    if cache.exists() and cache.stat().st_mtime >= Path(path).stat().st_mtime:
        try:
            return _read_tables(cache)
        except (OSError, ValueError, KeyError):
            pass
    with gzip.open(path, "rb") as f:
        doc = orjson.loads(f.read())
    trace = parse_events(doc.get("traceEvents", []))
    save_tables(trace, cache)
    return trace


def save_tables(trace: Trace, path: Path) -> None:
    """Write ``trace``'s tables to ``path`` (best effort: a read-only folder just means the
    JSON is decoded again next time)."""
    arrays: dict[str, np.ndarray] = {}
    for table_name in ("events", "memory", "steps"):
        table = getattr(trace, table_name)
        for col in table.columns:
            key = f"{table_name}/{col}"
            if col in _TEXT_COLUMNS[table_name]:
                codes, uniques = pd.factorize(table[col], use_na_sentinel=True)
                arrays[key] = codes.astype(np.int32)
                labels = orjson.dumps([u if isinstance(u, (int, str)) else str(u) for u in uniques])
                arrays[key + "#labels"] = np.frombuffer(labels, dtype=np.uint8)
            else:
                arrays[key] = pd.to_numeric(table[col], errors="coerce").to_numpy(dtype=float)
    tmp = path.with_name(f".{path.name}.tmp.npz")
    try:
        np.savez(tmp, **arrays)
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)


def _read_tables(path: Path) -> Trace:
    columns = {"events": EVENT_COLUMNS, "memory": MEMORY_COLUMNS, "steps": STEP_COLUMNS}
    tables = {}
    with np.load(path, allow_pickle=False) as z:
        for table_name, cols in columns.items():
            data = {}
            for col in cols:
                key = f"{table_name}/{col}"
                if col in _TEXT_COLUMNS[table_name]:
                    labels = np.array([*orjson.loads(z[key + "#labels"].tobytes()), None], dtype=object)
                    data[col] = labels[z[key]]  # code -1 (missing) picks the trailing None
                else:
                    data[col] = z[key]
            tables[table_name] = pd.DataFrame(data, columns=cols)
    events, memory, steps = tables["events"], tables["memory"], tables["steps"]
    for table, ints in (
        (events, ["step"]),
        (memory, ["bytes", "total_allocated", "device_type", "device_id", "step"]),
        (steps, ["step"]),
    ):
        for col in ints:
            table[col] = table[col].astype(np.int64)
    return Trace(
        events.astype({"name": str, "cat": str, "input_dims": str, "input_types": str}), memory, steps
    )
