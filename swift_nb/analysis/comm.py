"""Collective communication from the traces: time, bytes and bandwidth per kind.

Each collective appears twice in a trace: the ``c10d::…`` op the training thread issues
(its name says the kind, its recorded input shapes the size) and the transfer itself —
``gloo:…`` on gloo's worker threads, an ``nccl…`` kernel on the GPU — whose duration
includes waiting for the slowest peer. Both run in issue order, so when their counts
agree the i-th transfer is the i-th issued op; otherwise the issuing ops' own durations
stand in (``time_source`` says which).

Sizes: ``bytes`` is the collective's payload (all-reduce and reduce-scatter: their
input; all-gather: its output, P × the input); ``wire_bytes`` what each rank sends with
ring algorithms: 2·(P−1)/P × bytes for all-reduce, (P−1)/P × bytes for all-gather and
reduce-scatter, bytes for broadcast. ``busbw_bytes_per_s`` = wire_bytes / time.

``optimizer_share``: part of a kind's time inside ``Optimizer.step`` (synchronising
master weights or gradients there, rather than overlapped with backward);
``overlap_share`` (GPU): part of its transfer time during which a compute kernel runs.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from swift_nb.analysis import intervals as iv
from swift_nb.analysis.trace import Trace, load_trace_file
from swift_nb.record import Run

KINDS = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "send": "send_recv",
    "recv": "send_recv",
    "barrier": "barrier",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
}
_C10D = re.compile(r"^c10d::(\w+?)_?$")
_TRANSFER = re.compile(r"^gloo:|^nccl(?:Dev)?Kernel|^ncclKernel", re.I)
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


def collective_kind(name: str) -> str | None:
    """``c10d::_reduce_scatter_base_`` → ``reduce_scatter``; None for other names."""
    m = _C10D.match(name)
    if m is None:
        return None
    return KINDS.get(m.group(1), KINDS.get(m.group(1).rstrip("_")))


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
    if not dims:
        return float("nan")
    # Element type of the first tensor argument; a TensorList does not record its own.
    elem = next((DTYPE_BYTES[t] for t in types[:2] if t in DTYPE_BYTES), 4)
    first = _numel(dims[0])
    if kind == "all_gather" and name == "c10d::allgather_" and len(dims) > 1:
        return float(_numel(dims[1]) * world * elem)  # (outputs[][], inputs[])
    if kind == "reduce_scatter":
        return float(first * world * elem)  # the first argument is this rank's output shard
    return float(first * elem)


def _wire_factor(kind: str, world: int) -> float:
    p = max(world, 1)
    if kind == "all_reduce":
        return 2.0 * (p - 1) / p
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (p - 1) / p
    return 1.0


def collectives(trace: Trace, world: int = 1, rank: int = 0) -> pd.DataFrame:
    """One row per collective kind in ``trace``'s recorded steps (see the module's
    docstring): calls, bytes, wire bytes and seconds per step, bus bandwidth (bytes/s)
    and the share of the step (0..1)."""
    ev = trace.events
    n_steps = len(trace.steps)
    if ev.empty or not n_steps:
        return pd.DataFrame(columns=COLUMNS)
    ev = ev[ev["step"] >= 0]
    issued = ev[ev["cat"] == "cpu_op"].copy()
    issued["kind"] = issued["name"].map(collective_kind)
    issued = issued.dropna(subset=["kind"]).sort_values("ts_us", kind="stable")
    if issued.empty:
        return pd.DataFrame(columns=COLUMNS)
    transfers = ev[ev["name"].str.match(_TRANSFER) & ev["cat"].isin(["user_annotation", "kernel"])]
    transfers = transfers.sort_values("ts_us", kind="stable")
    if len(transfers) == len(issued):
        issued["time_us"] = transfers["dur_us"].to_numpy()
        issued["t0_us"] = transfers["ts_us"].to_numpy()
        source = "transfer"
    else:
        issued["time_us"] = issued["dur_us"]
        issued["t0_us"] = issued["ts_us"]
        source = "issuing op"
    optim = ev[ev["name"].str.match(r"^Optimizer\.step#")]
    optim_iv = iv.union(optim["ts_us"].to_numpy(), optim["end_us"].to_numpy())
    compute = ev[(ev["cat"] == "kernel") & ~ev["name"].str.match(_TRANSFER)]
    compute_iv = iv.union(compute["ts_us"].to_numpy(), compute["end_us"].to_numpy())
    issued["bytes"] = [
        _payload_bytes(n, k, d, t, world)
        for n, k, d, t in issued[["name", "kind", "input_dims", "input_types"]].itertuples(index=False)
    ]
    step_s = float(trace.steps["dur_us"].mean()) / 1e6
    rows = []
    for kind, g in issued.groupby("kind", sort=True):
        time_s = float(g["time_us"].sum()) / 1e6 / n_steps
        nbytes = float(g["bytes"].sum()) / n_steps
        wire = nbytes * _wire_factor(str(kind), world)
        spans = iv.union(g["t0_us"].to_numpy(), (g["t0_us"] + g["time_us"]).to_numpy())
        total_us = iv.length(spans)
        rows.append(
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
                "overlap_share": _inside(spans, compute_iv, total_us) if len(compute) else float("nan"),
                "time_source": source,
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def _inside(spans: np.ndarray, other: np.ndarray, total_us: float) -> float:
    """Part of ``spans``' length covered by ``other`` (0..1)."""
    if total_us <= 0:
        return float("nan")
    return (total_us - iv.length(iv.subtract(spans, other))) / total_us


def job_collectives(run: Run, traces: dict[int, Trace] | None = None) -> pd.DataFrame:
    """``collectives`` of every rank's trace in the run folder, one table."""
    world = int(run.context.get("world_size") or run.environment.get("world_size") or 1)
    paths = run.rank_trace_paths()
    frames = []
    for rank, path in paths.items():
        trace = traces.get(rank) if traces else None
        trace = trace if trace is not None else load_trace_file(path)
        frames.append(collectives(trace, world, rank))
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)


def analytic_bytes(kind: str, payload_bytes: float, world: int) -> float:
    """Wire bytes per rank a ring algorithm sends for a collective of ``payload_bytes``."""
    return payload_bytes * _wire_factor(kind, world)
