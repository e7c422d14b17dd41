"""Collective communication from the traces: collective time and exposed communication
per step; time, bytes and bandwidth per kind.

Two measures of a step's communication, each computed once (``comm_per_step``):
``collective_s``, the collective time: seconds inside at least one collective (issued op,
backend annotation or transfer, on any thread or device; ``trace_names.collective_us``);
``exposed_comm_s``, the exposed communication: the part of it during which no compute
kernel runs (``trace_names.exposed_comm_us``). Overlapping compute hides communication
only on a GPU; on CPU gloo runs the collectives on the cores the backward needs, so there
the two are equal. The breakdown's ``comm_s`` is neither: it is the host time the step's
partition gives to communication.

Each collective appears twice in a trace: the ``c10d::…`` op the training thread issues
(its name says the kind, its recorded input shapes the size) and the transfer itself —
``gloo:…`` on gloo's worker threads, an ``nccl…`` kernel on the GPU — whose duration
includes waiting for the slowest peer. Both run in issue order, so when their counts
agree the i-th transfer is the i-th issued op; otherwise the issuing ops' own durations
stand in (``time_source`` says which).

Sizes: ``bytes`` is the collective's payload (all-reduce and reduce-scatter: their
input; all-gather: its output, P × the input); ``wire_bytes`` what each rank sends with
ring algorithms: 2·(P−1)/P × bytes for all-reduce, (P−1)/P × bytes for all-gather and
reduce-scatter, bytes for broadcast. ``busbw_bytes_per_s`` = wire_bytes / time. The
payload comes from the issued op's recorded input shapes; where the profiler did not
record shapes (or recorded a TensorList without them), from what it recorded inside the
op: ``record_param_comms``'s message size and element type ("In/Out msg nelems",
"dtype"; then P is its "Group size"), else the backend annotation's input shape
(``nccl:all_reduce`` of ``[[19618307]]`` floats) for the kinds whose input is the payload.
Unknown sizes stay NaN, never 0.

``optimizer_share``: part of a kind's time inside ``Optimizer.step`` (synchronising
master weights or gradients there, rather than overlapped with backward);
``overlap_share`` (GPU): part of its transfer time during which a compute kernel runs.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from swift_nb.analysis.trace.tables import Trace, cat_in, derived, per_name, per_value
from swift_nb.core import intervals
from swift_nb.core import trace_names as tn

DTYPE_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "int": 4,
    "long int": 8,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
}
# Element sizes by the names record_param_comms and NCCL kernels give types (c10's ScalarType).
MSG_DTYPE_BYTES = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Int": 4,
    "Long": 8,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
}
# Kinds whose backend annotation's first input is the whole payload.
_INPUT_IS_PAYLOAD = ("all_reduce", "broadcast", "all_to_all")
COLUMNS = [
    "rank",
    "kind",
    "calls_per_step",
    "bytes_per_step",
    "wire_bytes_per_step",
    "time_s_per_step",
    "busbw_bytes_per_s",
    "step_share",
    "optimizer_share",
    "overlap_share",
    "time_source",
]


def _numel(dims) -> int:
    """Elements of a recorded argument: a shape, or a (nested) list of shapes."""
    if not dims:
        return 0
    if isinstance(dims[0], list):
        return sum(_numel(d) for d in dims)
    return int(np.prod(dims))


def _payload_bytes(name: str, kind: str, dims_text: str, types_text: str, world: int) -> float:
    """The collective's full payload in bytes (see the module's docstring)."""
    try:
        dims = json.loads(dims_text) if dims_text else []
        types = json.loads(types_text.replace("'", '"')) if types_text else []
    except ValueError:
        return float("nan")
    if not dims or (not dims[0] and types[:1] == ["TensorList"]):
        return float("nan")  # no shapes, or a TensorList recorded without its tensors' shapes
    # Element type of the first tensor argument; a TensorList does not record its own.
    elem = next((DTYPE_BYTES[t] for t in types[:2] if t in DTYPE_BYTES), 4)
    first = _numel(dims[0])
    if kind == "all_gather" and name == "c10d::allgather_" and len(dims) > 1:
        return float(_numel(dims[1]) * world * elem)  # (outputs[][], inputs[])
    if kind == "reduce_scatter":
        return float(first * world * elem)  # the first argument is this rank's output shard
    return float(first * elem)


def _nested(outer: pd.DataFrame, inner: pd.DataFrame) -> pd.DataFrame:
    """For each row of ``outer``, in its order, the columns of the first row of ``inner``
    that starts inside it on the same thread (NaN where none)."""
    left = pd.DataFrame(
        {
            "ts_us": outer["ts_us"].to_numpy(),
            "end_us": outer["end_us"].to_numpy(),
            "tid": outer["tid"].to_numpy(),
            "_row": np.arange(len(outer)),
        }
    ).sort_values("ts_us", kind="stable")
    right = inner.drop(columns="end_us").assign(_start=inner["ts_us"]).sort_values("ts_us", kind="stable")
    hit = pd.merge_asof(left, right, on="ts_us", by="tid", direction="forward")
    hit = hit.sort_values("_row").reset_index(drop=True)
    values = [c for c in inner.columns if c not in ("ts_us", "end_us", "tid")]
    hit.loc[~(hit["_start"] <= hit["end_us"]), values] = np.nan
    return hit


def _recorded_payload(
    issued: pd.DataFrame, ev: pd.DataFrame, world: int, among: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, group size) of each issued op (in ``ts_us`` order) from what the profiler
    recorded inside it (see the module's docstring), among the events ``among`` selects;
    NaN where nothing says."""
    n = len(issued)
    nbytes, group = np.full(n, np.nan), np.full(n, np.nan)
    cols = ["ts_us", "end_us", "tid"]
    params = ev[among & (ev["name"] == tn.PARAM_COMMS).to_numpy() & ev["msg_nelems"].notna().to_numpy()]
    params = params[cat_in(params, "cpu_op")]
    if len(params):
        hit = _nested(issued, params[[*cols, "msg_nelems", "msg_dtype", "group_size"]])
        elem = hit["msg_dtype"].map(MSG_DTYPE_BYTES).to_numpy(dtype=float)
        nbytes = hit["msg_nelems"].to_numpy(dtype=float) * elem
        group = hit["group_size"].to_numpy(dtype=float)
    notes = ev[among & (cat_in(ev, "user_annotation"))]
    notes = notes[notes["input_dims"] != ""]
    notes = notes[per_value(notes["name"], lambda n: tn.collective_kind(n) in _INPUT_IS_PAYLOAD)]
    if len(notes) and np.isnan(nbytes).any():
        hit = _nested(issued, notes[[*cols, "name", "input_dims", "input_types"]])
        for i in np.flatnonzero(np.isnan(nbytes) & hit["name"].notna().to_numpy()):
            kind = issued["kind"].iat[i]
            if kind in _INPUT_IS_PAYLOAD:
                nbytes[i] = _payload_bytes(
                    hit["name"].iat[i], kind, hit["input_dims"].iat[i], hit["input_types"].iat[i], world
                )
    return nbytes, group


def _wire_factor(kind: str, world: int) -> float:
    p = max(world, 1)
    if kind == "all_reduce":
        return 2.0 * (p - 1) / p
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (p - 1) / p
    return 1.0


PER_STEP_COLUMNS = ["step", "step_s", "collective_s", "exposed_comm_s"]


def comm_per_step(trace: Trace) -> pd.DataFrame:
    """One row per profiled step: ``step``, ``step_s`` (the profiler's step span),
    ``collective_s`` (collective time) and ``exposed_comm_s`` (exposed communication), in
    seconds (see the module's docstring)."""
    return derived(trace.events, f"comm_per_step/{id(trace.steps)}", lambda: _comm_per_step(trace)).copy()


def _comm_per_step(trace: Trace) -> pd.DataFrame:
    ev, steps = trace.events, trace.steps
    spans = ev[["ts_us", "end_us"]].to_numpy(dtype=float)
    step_spans = steps[["start_us", "end_us"]].to_numpy(dtype=float)
    named = per_name(trace, tn.is_collective)
    coll = spans[tn.collective_mask(named, ev["cat"])]
    compute = spans[tn.compute_mask(named, ev["cat"])]
    return pd.DataFrame(
        {
            "step": steps["step"].to_numpy(),
            "step_s": steps["dur_us"].to_numpy(dtype=float) / 1e6,
            "collective_s": intervals.collective_us(step_spans, coll) / 1e6,
            "exposed_comm_s": intervals.exposed_comm_us(step_spans, coll, compute) / 1e6,
        },
        columns=PER_STEP_COLUMNS,
    )


def comm_shares(per_step: pd.DataFrame) -> tuple[float, float]:
    """(collective share, exposed communication share) of the profiled steps' time, 0..1,
    from ``comm_per_step``: summed over the steps, as the per-rank table measures it; (0, 0)
    without steps."""
    total = float(per_step["step_s"].sum())
    if not total > 0:
        return 0.0, 0.0
    return float(per_step["collective_s"].sum()) / total, float(per_step["exposed_comm_s"].sum()) / total


def collectives(trace: Trace, world: int = 1, rank: int = 0) -> pd.DataFrame:
    """One row per collective kind in ``trace``'s recorded steps (see the module's
    docstring): calls, bytes, wire bytes and seconds per step, bus bandwidth (bytes/s)
    and the share of the step (0..1). Computed once per trace and arguments (the
    report and the advisor both read it)."""
    return derived(
        trace.events, f"collectives/{world}/{rank}", lambda: _collectives(trace, world, rank)
    ).copy()


def _collectives(trace: Trace, world: int, rank: int) -> pd.DataFrame:
    ev = trace.events
    n_steps = len(trace.steps)
    if ev.empty or not n_steps:
        return pd.DataFrame(columns=COLUMNS)
    # masks over every event, and rows taken only where few: a trace's events are not
    # copied whole (a 1 GB trace's table is hundreds of MB a copy)
    in_steps = (ev["step"] >= 0).to_numpy()
    cats = ev["cat"].to_numpy(dtype=object)

    def rows(mask: np.ndarray) -> pd.DataFrame:
        return ev.iloc[np.flatnonzero(mask & in_steps)]

    kinds = per_name(trace, tn.collective_kind, object, None)
    with_kind = (cats == "cpu_op") & pd.notna(kinds) & in_steps
    issued = ev.iloc[np.flatnonzero(with_kind)].assign(kind=kinds[with_kind])
    issued = issued.sort_values("ts_us", kind="stable")
    if issued.empty:
        return pd.DataFrame(columns=COLUMNS)
    is_transfer = per_name(trace, lambda n: bool(tn.TRANSFER.match(n)))
    transfers = rows(is_transfer & ((cats == "user_annotation") | (cats == "kernel")))
    transfers = transfers.sort_values("ts_us", kind="stable")
    if len(transfers) == len(issued):
        issued["time_us"] = transfers["dur_us"].to_numpy()
        issued["t0_us"] = transfers["ts_us"].to_numpy()
        source = "transfer"
    else:
        issued["time_us"] = issued["dur_us"]
        issued["t0_us"] = issued["ts_us"]
        source = "issuing op"
    optim = rows(per_name(trace, lambda n: bool(tn.OPTIMIZER_STEP.match(n))))
    optim_iv = intervals.union(optim["ts_us"].to_numpy(), optim["end_us"].to_numpy())
    computing = np.flatnonzero(tn.compute_mask(per_name(trace, tn.is_collective), cats) & in_steps)
    compute_iv = intervals.union(ev["ts_us"].to_numpy()[computing], ev["end_us"].to_numpy()[computing])
    issued["bytes"] = [
        _payload_bytes(n, k, d, t, world)
        for n, k, d, t in issued[["name", "kind", "input_dims", "input_types"]].itertuples(index=False)
    ]
    recorded, group = _recorded_payload(issued, ev, world, in_steps)
    issued["bytes"] = issued["bytes"].fillna(pd.Series(recorded, index=issued.index))
    issued["group"] = np.where(np.isnan(group), world, group)
    step_s = float(trace.steps["dur_us"].mean()) / 1e6
    out_rows = []
    for kind, g in issued.groupby("kind", sort=True):
        time_s = float(g["time_us"].sum()) / 1e6 / n_steps
        nbytes = float(g["bytes"].sum(min_count=1)) / n_steps  # NaN when no size is known
        wire = nbytes * _wire_factor(str(kind), int(g["group"].max()))
        spans = intervals.union(g["t0_us"].to_numpy(), (g["t0_us"] + g["time_us"]).to_numpy())
        total_us = intervals.length(spans)
        out_rows.append(
            {
                "rank": rank,
                "kind": kind,
                "calls_per_step": len(g) / n_steps,
                "bytes_per_step": nbytes,
                "wire_bytes_per_step": wire,
                "time_s_per_step": time_s,
                "busbw_bytes_per_s": wire / time_s if time_s > 0 else float("nan"),
                "step_share": time_s / step_s if step_s > 0 else float("nan"),
                "optimizer_share": _inside(spans, optim_iv, total_us),
                "overlap_share": _inside(spans, compute_iv, total_us) if len(computing) else float("nan"),
                "time_source": source,
            }
        )
    return pd.DataFrame(out_rows, columns=COLUMNS)


def _inside(spans: np.ndarray, other: np.ndarray, total_us: float) -> float:
    """Part of ``spans``' length covered by ``other`` (0..1)."""
    if total_us <= 0:
        return float("nan")
    return (total_us - intervals.length(intervals.subtract(spans, other))) / total_us
