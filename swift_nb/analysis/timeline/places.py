"""Where in a run's trace a finding happened, so a timeline can show it: a window (µs on
the trace's clock) around the moment that decided it.

Keys are finding ids (``Finding.id``) plus ``slowest_step``, ``modules`` (the longest
forward a module scope recorded: the model's, on the modules' track) and ``oom`` (the run's
last allocations before it ran out of memory), each present only where the trace holds it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.device import device_work
from swift_nb.analysis.trace.tables import Trace, cat_in, load_trace, per_name
from swift_nb.core import intervals
from swift_nb.core import trace_names as tn

#: allocations an OOM's place shows, the last ones before the failure
OOM_ALLOCATIONS = 50
#: a window shows this share of its event's length on each side, and at least _MIN_PAD_US
_PAD = 0.25
_MIN_PAD_US = 5.0


def _window(start_us: float, end_us: float) -> tuple[float, float]:
    pad = max((end_us - start_us) * _PAD, _MIN_PAD_US)
    return float(start_us - pad), float(end_us + pad)


def _longest(events: pd.DataFrame) -> pd.Series | None:
    if events.empty:
        return None
    return events.loc[events["dur_us"].idxmax()]


def slowest_step(trace: Trace) -> tuple[float, float] | None:
    """The profiler's longest step."""
    row = _longest(trace.steps.rename(columns={"start_us": "ts_us"}))
    return None if row is None else _window(row["ts_us"], row["end_us"])


def launch_gap(trace: Trace) -> tuple[float, float] | None:
    """The longest time inside the steps when no device work ran (the gap between two
    pieces of device work, on the device's own timeline)."""
    work = device_work(trace)
    work = work[work["step"] >= 0]
    if len(work) < 2:
        return None
    busy = intervals.union(work["ts_us"].to_numpy(), work["end_us"].to_numpy())
    gaps = busy[1:, 0] - busy[:-1, 1]
    if not len(gaps):
        return None
    i = int(np.argmax(gaps))
    origin = float(trace.events["ts_us"].min())  # device_work's times are from the trace's start
    return _window(origin + busy[i, 1], origin + busy[i + 1, 0])


def sync_stall(trace: Trace) -> tuple[float, float] | None:
    """The longest synchronisation, with the op that asked for it (``.item()``'s
    ``aten::_local_scalar_dense``, a ``.cpu()`` copy …) when one encloses it."""
    ev = trace.events
    sync = ev[per_name(trace, lambda n: tn.SYNC.match(n) is not None)]
    row = _longest(sync)
    if row is None:
        return None
    start, end = row["ts_us"], row["end_us"]
    around = ev[
        (ev["tid"] == row["tid"]) & (cat_in(ev, "cpu_op")) & (ev["ts_us"] <= start) & (ev["end_us"] >= end)
    ]
    if len(around):  # the innermost op around it: the user's call
        inner = around.loc[around["dur_us"].idxmin()]
        start, end = inner["ts_us"], inner["end_us"]
    return _window(start, end)


def longest_collective(trace: Trace) -> tuple[float, float] | None:
    """The longest collective the host called (``c10d::…``, ``nccl:…``, ``gloo:…``)."""
    ev = trace.events
    calls = ev[per_name(trace, tn.is_collective) & (cat_in(ev, "cpu_op")) & (ev["step"] >= 0).to_numpy()]
    row = _longest(calls)
    return None if row is None else _window(row["ts_us"], row["end_us"])


def longest_batch(trace: Trace) -> tuple[float, float] | None:
    """The longest wait for a DataLoader's batch."""
    ev = trace.events
    row = _longest(ev[per_name(trace, lambda n: tn.DATA.match(n) is not None)])
    return None if row is None else _window(row["ts_us"], row["end_us"])


def last_allocations(trace: Trace, n: int = OOM_ALLOCATIONS) -> tuple[float, float] | None:
    """The last ``n`` allocations the profiler saw."""
    allocs = trace.memory[trace.memory["bytes"] > 0]
    if allocs.empty:
        return None
    ts = allocs["ts_us"].to_numpy()
    return _window(float(ts[-min(n, len(ts))]), float(ts[-1]))


def module_forward(trace: Trace, path: str | None = None) -> tuple[float, float] | None:
    """The longest forward of the module ``path`` (any module's: the model's own, when None)."""
    ev = trace.events
    if path is None:
        is_scope = per_name(trace, lambda n: n.startswith(tn.MODULE_PREFIX))
    else:
        is_scope = per_name(trace, lambda n: n == tn.MODULE_PREFIX + path)
    row = _longest(ev[is_scope & (cat_in(ev, "user_annotation"))])
    return None if row is None else _window(row["ts_us"], row["end_us"])


#: finding id → where it happened
_BY_FINDING = {
    "overhead": launch_gap,
    "sync_stalls": sync_stall,
    "straggler": longest_collective,
    "communication": longest_collective,
    "data_loading": longest_batch,
    "pageable_copies": sync_stall,
}


def places(
    run, findings: Iterable[Finding] = (), trace: Trace | None = None
) -> dict[str, tuple[float, float]]:
    """Finding id → the window (start_us, end_us) to show it in, for ``findings`` with a
    place in time, plus ``slowest_step`` and, for a run that ran out of memory, ``oom``."""
    trace = load_trace(run) if trace is None else trace
    if trace.events.empty:
        return {}
    out: dict[str, tuple[float, float]] = {}
    if (w := slowest_step(trace)) is not None:
        out["slowest_step"] = w
    if (w := module_forward(trace)) is not None:
        out["modules"] = w
    if getattr(run, "oom", None) is not None and (w := last_allocations(trace)) is not None:
        out["oom"] = w
    for finding in findings:
        where = _BY_FINDING.get(finding.id)
        if finding.id == "slow_block":  # the block it names
            w = module_forward(trace, str(finding.evidence.get("block")))
        else:
            w = where(trace) if where is not None and finding.id not in out else None
        if w is not None and finding.id not in out:
            out[finding.id] = w
    return out
