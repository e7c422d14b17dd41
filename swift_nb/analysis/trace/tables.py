"""Read a run's Chrome trace into DataFrames the analyses share.

Times are microseconds on the trace's clock (``ts_us``, ``dur_us``, ``end_us``); every
event carries the profiler step it falls in (``step``, from the profiler's step spans,
``trace_names.STEP_NAME``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from swift_nb.analysis.trace.decode import (
    DEFAULT_MAX_BYTES,
    check_nesting,
    decode_events,
    give_back_freed_memory,
    read_json_bytes,
    split_document,
    too_deep,
)
from swift_nb.core import trace_names as tn
from swift_nb.core.errors import RecordError
from swift_nb.core.gc_pause import paused
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
    "correlation",
    "msg_nelems",
    "msg_dtype",
    "group_size",
    "seq",
    "occupancy_pct",
    "blocks_per_sm",
]
MEMORY_COLUMNS = ["ts_us", "bytes", "total_allocated", "device_type", "device_id", "addr", "step"]
STEP_COLUMNS = ["step", "start_us", "end_us", "dur_us", "tid"]
#: the event columns that hold text: plain Python strings (object columns) of which a trace
#: has a few thousand distinct, each interned, so a million-row column is a million
#: pointers. pandas' Arrow-backed ``str`` type would copy every string into Arrow and again
#: at each row selection, which the analyses make dozens of: several times the decode's
#: own time on a large trace (benchmarks/scale.py)
TEXT_COLUMNS = ("name", "cat", "input_dims", "input_types", "msg_dtype")
_EVENT_TYPES = {
    **dict.fromkeys(TEXT_COLUMNS, object),
    "correlation": np.int64,
    "msg_nelems": float,
    "group_size": float,
    "seq": np.int64,
    "occupancy_pct": float,
    "blocks_per_sm": float,
}


@dataclass
class Trace:
    """A run's trace as tables.

    events: complete ("X") events; input_dims is the op's input shapes as text, input_types
    their element types (``['float', 'TensorList', …]``, empty for ops without shapes);
    correlation links a device event to the runtime call that launched it (-1: none);
    msg_nelems, msg_dtype and group_size are a collective's payload as the profiler records
    it on ``record_param_comms`` and NCCL kernels (the larger of its "In msg nelems" and
    "Out msg nelems", its element type such as ``Float``, the process group's size; NaN
    and empty where not recorded); seq is the autograd sequence number the profiler records
    on a forward op and on the backward node that differentiates it (-1: none);
    occupancy_pct and blocks_per_sm are what Kineto records of a kernel's launch on an NVIDIA
    GPU ("est. achieved occupancy %": the share of the SMs' warp slots its blocks could fill;
    "blocks per SM": its grid over the device's SMs, below 1 when some SMs get no block), NaN
    for every other event and on other devices.
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

    @cached_property
    def _name_codes(self) -> tuple[np.ndarray, np.ndarray]:
        # factorized once per trace: the analyses ask a dozen questions of its names
        codes, uniques = pd.factorize(self.events["name"])
        return codes, np.asarray(uniques, dtype=object)


def _shapes(args: dict) -> str:
    # str() of a list of int lists is valid JSON and several times faster than json.dumps
    dims = args.get("Input Dims")
    return str(dims) if dims else ""


def _msg_nelems(args: dict) -> float:
    n_in, n_out = args.get("In msg nelems"), args.get("Out msg nelems")
    if n_in is None and n_out is None:
        return np.nan
    return float(max(n_in or 0, n_out or 0))


def parse_events(raw: list[dict]) -> Trace:
    """Build a Trace from Chrome trace events (the ``traceEvents`` list)."""
    with paused():  # the columns are millions of objects made at once (see gc_pause)
        return _parse_events(raw)


def _parse_events(raw: list[dict]) -> Trace:
    # One comprehension per column: much faster than one loop building row tuples.
    xs = [e for e in raw if e.get("ph") == "X"]
    args = [e.get("args") or {} for e in xs]
    ts = np.fromiter((e["ts"] for e in xs), dtype=float, count=len(xs))
    dur = np.fromiter((e.get("dur", 0.0) for e in xs), dtype=float, count=len(xs))
    events = {
        "name": [e.get("name", "") for e in xs],
        "cat": [e.get("cat", "") for e in xs],
        "ts": ts,
        "dur": dur,
        "pid": [e.get("pid") for e in xs],
        "tid": [e.get("tid") for e in xs],
        "input_dims": check_nesting([_shapes(a) for a in args]),
        "input_types": check_nesting(
            [str(t) if (t := a.get("Input type")) and "Input Dims" in a else "" for a in args]
        ),
        "ext_id": [a.get("External id") for a in args],
        "correlation": [a.get("correlation", -1) for a in args],
        "msg_nelems": [_msg_nelems(a) for a in args],
        "msg_dtype": [a.get("dtype") or "" for a in args],
        "group_size": [a.get("Group size", np.nan) for a in args],
        "seq": [a.get("Sequence number", -1) for a in args],
        "occupancy": [a.get("est. achieved occupancy %", np.nan) for a in args],
        "blocks_per_sm": [a.get("blocks per SM", np.nan) for a in args],
    }
    mem_events = [e for e in raw if e.get("ph") == "i" and e.get("name") == "[memory]"]
    margs = [e.get("args") or {} for e in mem_events]
    memory = {
        "ts": [float(e["ts"]) for e in mem_events],
        "bytes": [int(a.get("Bytes", 0)) for a in margs],
        "total_allocated": [int(a.get("Total Allocated", 0)) for a in margs],
        "device_type": [int(a.get("Device Type", 0)) for a in margs],
        "device_id": [int(a.get("Device Id", -1)) for a in margs],
        "addr": [a.get("Addr") for a in margs],
    }
    return _trace_from_columns(events, memory)


def spans_trace(
    name: np.ndarray, cat: str, ts: np.ndarray, dur: np.ndarray, pid: Any, tid: np.ndarray
) -> Trace:
    """The Trace of complete events given as columns (``name`` and ``tid`` per event, one
    ``cat`` and ``pid`` for all), without args: what ``parse_events`` makes of the same
    events' dicts, without a dict per event (a job's overview has hundreds of thousands)."""
    n = len(ts)
    with paused():
        return _trace_from_columns(
            {
                "name": name,
                "cat": np.full(n, cat, dtype=object),
                "ts": np.asarray(ts, dtype=float),
                "dur": np.asarray(dur, dtype=float),
                "pid": np.full(n, pid, dtype=object),
                "tid": tid,
                "input_dims": np.full(n, "", dtype=object),
                "input_types": np.full(n, "", dtype=object),
                "ext_id": np.full(n, None, dtype=object),  # as parse_events leaves a missing one
                "correlation": np.full(n, -1, dtype=np.int64),
                "msg_nelems": np.full(n, np.nan),
                "msg_dtype": np.full(n, "", dtype=object),
                "group_size": np.full(n, np.nan),
                "seq": np.full(n, -1, dtype=np.int64),
                "occupancy": np.full(n, np.nan),
                "blocks_per_sm": np.full(n, np.nan),
            },
            {key: [] for key in ("ts", "bytes", "total_allocated", "device_type", "device_id", "addr")},
        )


def text_column(values: Any) -> pd.Series:
    """A text column of the events: an object column of ``str``, a missing value (None)
    as NaN and anything else (a number where a name belongs) as its ``str``, as pandas'
    ``astype(str)`` makes them."""
    arr = (
        np.asarray(values, dtype=object)
        if not isinstance(values, np.ndarray)
        else values.astype(object, copy=False)
    )
    if len(arr) and pd.api.types.infer_dtype(arr, skipna=False) != "string":
        arr = np.array(
            [v if type(v) is str else (np.nan if v is None or v != v else str(v)) for v in arr], dtype=object
        )
    return pd.Series(arr, dtype=object)


def _trace_from_columns(ev: dict[str, Any], mem: dict[str, Any]) -> Trace:
    """The tables from their columns, as ``_parse_events`` or ``trace_decode`` fill them
    (``ts``, ``dur`` and the args' values of each complete event; ``ts`` and the args'
    values of each ``[memory]`` event). ``ev`` is emptied as its columns are taken: each
    is typed and cut to the events kept (not the step spans, not the trace's own spans)
    once, and let go before the next, so the tables are built without a second copy of
    the events."""
    name = text_column(ev.pop("name"))
    cat = text_column(ev.pop("cat")).to_numpy()
    ts, dur = np.asarray(ev.pop("ts"), dtype=float), np.asarray(ev.pop("dur"), dtype=float)
    step_no = per_value(name, tn.step_of, float, np.nan)  # None (not a step span) → NaN
    is_step = ~np.isnan(step_no)
    keep = ~is_step & (cat != "Trace")
    tid = _typed(ev.pop("tid"), None)
    steps = (
        pd.DataFrame({"ts_us": ts[is_step], "end_us": (ts + dur)[is_step], "dur_us": dur[is_step]})
        .assign(tid=tid[is_step], step=step_no[is_step].astype(int))
        .rename(columns={"ts_us": "start_us"})
        .sort_values("start_us", ignore_index=True)[STEP_COLUMNS]
    )
    kept = (lambda a: a) if keep.all() else (lambda a: a[keep])
    columns: dict[str, Any] = {
        "name": kept(name.to_numpy()),
        "cat": kept(cat),
        "ts_us": kept(ts),
        "dur_us": kept(dur),
        "end_us": kept(ts + dur),
        "tid": kept(tid),
    }
    del name, cat, tid
    columns["step"] = steps_of(columns["ts_us"], steps)
    for column, key in _EVENT_KEYS.items():
        if column not in columns:
            values = ev.pop(key)
            columns[column] = kept(
                text_column(values).to_numpy()
                if column in TEXT_COLUMNS
                else _typed(values, _EVENT_TYPES.get(column))
            )
            del values
    for column, values in columns.items():  # an object array as it is: a DataFrame would infer text
        if isinstance(values, np.ndarray) and values.dtype == object:
            columns[column] = pd.Series(values, dtype=object, copy=False)
    events = pd.DataFrame(columns, columns=EVENT_COLUMNS, copy=False)
    memory = pd.DataFrame(
        {
            "ts_us": mem["ts"],
            "bytes": mem["bytes"],
            "total_allocated": mem["total_allocated"],
            "device_type": mem["device_type"],
            "device_id": mem["device_id"],
            "addr": mem["addr"],
            "step": -1,
        },
        columns=MEMORY_COLUMNS,
    ).sort_values("ts_us", kind="stable", ignore_index=True)
    memory["step"] = steps_of(memory["ts_us"].to_numpy(), steps)
    return Trace(events, memory, steps)


#: the events table's columns (but ``step`` and ``end_us``, derived) → their key in the
#: columns ``_trace_from_columns`` is given
_EVENT_KEYS = {
    **{c: c for c in EVENT_COLUMNS if c not in ("ts_us", "dur_us", "end_us", "step")},
    "ts_us": "ts",
    "dur_us": "dur",
    "occupancy_pct": "occupancy",
}


def _typed(values: Any, dtype: Any) -> Any:
    """``values`` as a column of ``dtype`` (None: inferred), as a DataFrame of them has it."""
    if dtype is None and not len(values):
        return np.array([], dtype=float)  # what a DataFrame makes of no values
    column = pd.Series(values, copy=False) if isinstance(values, np.ndarray) else pd.Series(values)
    column = column.astype(dtype) if dtype is not None else column
    # pandas' own types (its ``str``) kept as they are: a DataFrame built from the values has them
    return column.array if isinstance(column.dtype, pd.api.extensions.ExtensionDtype) else column.to_numpy()


_DERIVED: dict[int, dict[str, object]] = {}


def derived(table: pd.DataFrame, key: str, compute: Callable[[], object]):
    """``compute()``, once per ``table`` and ``key``: several analyses derive the same
    intermediate table from a trace's events (the device's work, operators' nesting).
    Kept while ``table`` lives; callers must not change what they get."""
    return _kept(table, key, compute)


def _kept(table: pd.DataFrame, key: str, compute: Callable[[], object]):
    slot = _DERIVED.get(id(table))
    if slot is None:
        slot = _DERIVED[id(table)] = {}
        weakref.finalize(table, _DERIVED.pop, id(table), None)
    if key not in slot:
        slot[key] = compute()
    return slot[key]


def cat_in(table: pd.DataFrame, *cats: str) -> np.ndarray:
    """Whether each row's ``cat`` is one of ``cats``, from the column factorized once per
    table: comparing a million events' text per question cost seconds over an analysis."""
    codes, uniques = _kept(table, "cat_codes", lambda: pd.factorize(table["cat"]))  # an index, not a table
    wanted = [i for i, u in enumerate(uniques) if u in cats]
    return np.isin(codes, wanted) if len(wanted) > 1 else codes == (wanted[0] if wanted else -2)


def step_rows(table: pd.DataFrame) -> dict[int, np.ndarray]:
    """The positions of each step's rows of ``table`` (by its ``step`` column; -1: outside
    every step), in table order, found once per table: an analysis that goes step by step
    takes each step's rows in O(its rows), not a pass over every event per step."""

    def rows() -> dict[int, np.ndarray]:
        steps = table["step"].to_numpy()
        order = np.argsort(steps, kind="stable")
        ordered = steps[order]
        bounds = np.flatnonzero(np.diff(ordered)) + 1
        firsts = ordered[np.r_[0, bounds]] if len(ordered) else ordered
        return {int(k): rows for k, rows in zip(firsts, np.split(order, bounds), strict=True)}

    return derived(table, "step_rows", rows)


def per_value(
    column: pd.Series, fn: Callable[[Any], Any], dtype: Any = bool, missing: Any = False
) -> np.ndarray:
    """``fn(v)`` for each value ``v`` of ``column`` (``missing`` where it has none), called
    once per distinct value: a trace's 100 000 events have a few hundred names, and
    pandas' per-element ``map`` and ``str`` methods on text cost more than the analysis."""
    codes, uniques = pd.factorize(column)
    return np.array([*(fn(u) for u in uniques), missing], dtype=dtype)[codes]


def per_name(trace: Trace, fn: Callable[[str], Any], dtype: Any = bool, missing: Any = False) -> np.ndarray:
    """``per_value(trace.events["name"], fn, …)``: ``fn`` of each event's name, one entry
    per event, from the names factorized once per trace (a mask of the events selects the
    entries of some of them)."""
    codes, uniques = trace._name_codes
    return np.array([*(fn(u) for u in uniques), missing], dtype=dtype)[codes]


def steps_of(ts: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """The step whose span (a row of ``Trace.steps``) holds each timestamp (µs); -1 outside
    every step."""
    if steps.empty or not len(ts):
        return np.full(len(ts), -1, dtype=int)
    starts, ends = steps["start_us"].to_numpy(), steps["end_us"].to_numpy()
    idx = np.searchsorted(starts, ts, side="right") - 1
    inside = (idx >= 0) & (ts <= ends[np.clip(idx, 0, None)])
    return np.where(inside, steps["step"].to_numpy()[np.clip(idx, 0, None)], -1)


_TEXT_COLUMNS = {
    "events": ["name", "cat", "pid", "tid", "input_dims", "input_types", "msg_dtype"],
    "memory": ["addr"],
    "steps": ["tid"],
}


#: while ``shared_traces()`` is open: trace file (its path, modification time and size) → its
#: tables, so that the analyses, the figures and the timeline of one report read them once
_SHARED: dict[tuple[str, int, int], Trace] | None = None
#: the one trace file whose tables ``shared_traces()`` keeps (None: none is open)
_SHARED_PATH: str | None = None


def _file_key(path: Path) -> tuple[str, int, int]:
    st = Path(path).stat()
    return str(Path(path).resolve()), st.st_mtime_ns, st.st_size


@contextmanager
def shared_traces(path: Path | None) -> Iterator[None]:
    """Inside it, ``load_trace_file`` reads the trace file ``path`` once: a report's
    analyses, timeline and places share the same tables (a large trace's tables take
    seconds to read and are held only while it lasts). Only that one: a job's other ranks
    are read, reduced and let go one at a time, so memory does not grow with the ranks."""
    global _SHARED, _SHARED_PATH
    outer = _SHARED is not None
    if not outer:
        _SHARED = {}
        _SHARED_PATH = str(Path(path).resolve()) if path is not None else None
    try:
        yield
    finally:
        if not outer:
            _SHARED, _SHARED_PATH = None, None


def share(path: Path | None, trace: Trace) -> None:
    """Hand the tables of the trace file ``path`` to the ``shared_traces()`` open (nothing
    when none is, or it keeps another file's)."""
    if _SHARED is not None and path is not None and Path(path).exists():
        key = _file_key(path)
        if key[0] == _SHARED_PATH:
            _SHARED[key] = trace


def load_trace(run: Run) -> Trace:
    """The run's trace as tables; an empty Trace when there is none."""
    return load_trace_file(run.trace_path)


def load_trace_file(path: Path | None, max_bytes: int = DEFAULT_MAX_BYTES) -> Trace:
    """A trace file as tables; an empty Trace when there is none. A damaged or foreign
    file (cut short, empty, not gzip, not a Chrome trace, over ``max_bytes`` of JSON)
    raises ``RecordError``.

    Decoding a big trace's JSON takes seconds, so the tables are kept beside it in
    ``<name>.tables.npz`` (plain arrays, no pickles, and the trace's size) and read from
    there while they are newer than the trace and of a trace of its size; a copy that
    cannot be read, or disagrees with itself or the trace in any way, is rebuilt from the
    trace.
    """
    if path is None or not Path(path).exists():
        return parse_events([])
    path = Path(path)
    if _SHARED is not None and (shared := _SHARED.get(_file_key(path))) is not None:
        return shared
    trace = _load_trace_file(path, max_bytes)
    share(path, trace)
    return trace


def _load_trace_file(path: Path, max_bytes: int) -> Trace:
    cache = tables_path(path)
    if tables_fresh(path):
        try:
            return _read_tables(cache, path.stat().st_size)
        except Exception:  # whatever is wrong with a cache, the trace is the truth
            pass
    trace = read_trace(path, max_bytes)
    save_tables(trace, cache, source=path)
    return trace


def tables_fresh(path: Path) -> bool:
    """Whether the trace file ``path`` has cached tables written after it (they may still
    turn out to be another trace's or damaged: reading them checks)."""
    try:
        return tables_path(path).stat().st_mtime >= Path(path).stat().st_mtime
    except OSError:
        return False


def read_trace(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Trace:
    """A Chrome trace file (gzipped or not; the object or the bare array form) decoded
    into tables, without a dict per event (``trace_decode``); the same tables as
    ``parse_events`` of its events. ``max_bytes``: the most JSON the file may hold,
    decompressed (default 16 GiB); ``RecordError`` says what is wrong with a file that is
    not a trace or is larger."""
    return read_trace_with_meta(path, max_bytes)[0]


def read_trace_with_meta(
    path: Path, max_bytes: int = DEFAULT_MAX_BYTES, decode: Callable[..., Any] = decode_events
) -> tuple[Trace, dict[str, Any]]:
    """``read_trace`` and the trace's other top-level keys (``distributedInfo``,
    ``deviceProperties``, ``baseTimeNanoseconds``, …). ``decode``: what turns the events'
    byte ranges into columns (``decode_events``'s arguments and result; the importer's
    decodes a large trace in two processes)."""
    path = Path(path)
    data = read_json_bytes(path, max_bytes)
    meta, raw_events = split_document(path, data)
    with paused():
        columns = decode(path, raw_events, data)
        del raw_events, data  # the JSON text goes before the frames are built
        try:
            trace = _trace_from_columns(*columns.columns())
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise RecordError(path, f"malformed trace events ({type(e).__name__}: {e})") from None
    del columns
    give_back_freed_memory()
    return trace, meta


def read_trace_document(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> dict:
    """A Chrome trace file decoded whole, a dict per event: a dict whose ``traceEvents``
    is the list of events, with the trace's other top-level keys. For code that needs the
    events themselves (the memory replay); tables come cheaper from ``read_trace``.
    ``RecordError`` says what is wrong with a file that is not one."""
    data = read_json_bytes(path, max_bytes)
    if not data.strip():
        raise RecordError(path, "the file is empty")
    try:
        with paused():
            doc = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise RecordError(path, f"not JSON: {e}") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise RecordError(path, "not a Chrome trace: no list of traceEvents")
    return doc


def parse_document(path: Path, doc: dict) -> Trace:
    """``parse_events`` of a decoded trace file; ``RecordError`` for malformed events."""
    try:
        return parse_events(doc["traceEvents"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise RecordError(path, f"malformed trace events ({type(e).__name__}: {e})") from None
    except RecursionError:  # args nested deeper than str() recurses (orjson decodes 1024 levels)
        raise too_deep(path) from None


#: the trace's size in bytes when its tables were cached: a cache of another trace is not used
_SOURCE_SIZE = "source/size"


def save_tables(trace: Trace, path: Path, source: Path | None = None) -> None:
    """Write ``trace``'s tables to ``path`` (best effort: a read-only folder just means the
    JSON is decoded again next time); ``source``: the trace file they come from (its size
    is kept with them; without it the cache is rebuilt on its first read)."""
    arrays: dict[str, np.ndarray] = {}
    if source is not None:
        arrays[_SOURCE_SIZE] = np.array([Path(source).stat().st_size], dtype=np.int64)
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
        # numpy's stub types savez's **kwds as its allow_pickle: bool, not as the arrays they are
        np.savez(tmp, **arrays)  # type: ignore[arg-type]
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)


_INT_COLUMNS = {
    "events": ["step", "correlation", "seq"],
    "memory": ["bytes", "total_allocated", "device_type", "device_id", "step"],
    "steps": ["step"],
}


def _text_column(z, key: str, missing: Any = None) -> np.ndarray:
    labels = orjson.loads(z[key + "#labels"].tobytes())
    codes = z[key]
    if not isinstance(labels, list) or not np.issubdtype(codes.dtype, np.integer):
        raise ValueError(f"{key}: not codes and labels")
    if len(codes) and (codes.min() < -1 or codes.max() >= len(labels)):
        raise ValueError(f"{key}: codes outside its {len(labels)} labels")
    return np.array([*labels, missing], dtype=object)[codes]  # code -1 picks the trailing missing value


def _read_tables(path: Path, source_size: int) -> Trace:
    """The cached tables; ValueError/KeyError/… when they are not whole and consistent
    (each table's columns of one length, codes within their labels, integers whole) or
    were cached from a trace of another size."""
    columns = {"events": EVENT_COLUMNS, "memory": MEMORY_COLUMNS, "steps": STEP_COLUMNS}
    tables = {}
    with np.load(path, allow_pickle=False) as z:
        if int(z[_SOURCE_SIZE][0]) != source_size:
            raise ValueError("cached from another trace")
        for table_name, cols in columns.items():
            data = {}
            for col in cols:
                key = f"{table_name}/{col}"
                if col in _TEXT_COLUMNS[table_name]:
                    # a text column's missing value is NaN (text_column); a pid's or an address's, None
                    missing = np.nan if table_name == "events" and col in TEXT_COLUMNS else None
                    data[col] = pd.Series(_text_column(z, key, missing), dtype=object)
                elif not np.issubdtype(z[key].dtype, np.number):
                    raise ValueError(f"{key}: not numbers")
                else:
                    data[col] = z[key]
            if len({len(v) for v in data.values()}) > 1:
                raise ValueError(f"{table_name}: columns of different lengths")
            for col in _INT_COLUMNS[table_name]:
                if not np.isfinite(data[col]).all():
                    raise ValueError(f"{table_name}/{col}: not whole numbers")
                data[col] = data[col].astype(np.int64)
            tables[table_name] = pd.DataFrame(data, columns=cols)
    events, memory, steps = tables["events"], tables["memory"], tables["steps"]
    return Trace(events.astype(_EVENT_TYPES), memory, steps)
