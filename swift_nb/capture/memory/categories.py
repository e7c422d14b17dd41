"""Tensor memory by category over each recorded step, from the profiler's allocation
events and what the optimizer holds at the step's edges.

At every edge of a recorded step the capture layer snapshots the storages of parameters,
gradients and optimizer state, the frozen weights of the models the run uses, and the
weights of models only alive in the kernel, as ``other`` (``Snapshot``: address ->
category, bytes). Replaying the
step's ``[memory]`` events on top of the snapshot at its start gives the live bytes of
each category at every allocation:
- an allocation never freed within the step whose address holds a gradient or optimizer
  state at the step's end is that category (gradients created by backward, state created
  by the first step);
- an allocation made outside backward and still alive when a later backward starts is an
  activation (saved for backward; under gradient accumulation each micro-batch's forward
  keeps its own);
- an allocation of the loss's logits (the LM head's output, what the loss computes from it,
  their gradients) is ``logits`` whether it is kept for backward or not: known by where it
  comes from (``capture.memory.logits``), the trace naming each such storage after it was
  made, never by its size;
- anything else (temporaries, the batch, outputs) is ``other``;
- a free is charged to the category of the allocation it ends, or to the snapshot's
  category for storages that existed when the step began (last step's gradients).
The result is exact for what the profiler sees; tensors that existed before profiling and
are none of the snapshot's (parameters, frozen weights, gradients, optimizer state) are not
counted until they are freed.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from swift_nb.core.intervals import union
from swift_nb.core.trace_names import AUTOGRAD_PREFIX, LOGITS_MARK, logits_addresses, step_of
from swift_nb.record import MEMORY_CATEGORIES as CATEGORIES

_INDEX = {c: i for i, c in enumerate(CATEGORIES)}
MAX_TIMELINE_POINTS = 400  # per step


Snapshot = dict[int, tuple[str, int]]
#: what the memory replay of a finished cycle needs: the snapshots at the recorded steps'
#: edges and the parameters' device type
ReplayInput = tuple[dict[int, Snapshot], int]


def logits_allocations(events: list[tuple[float, int, int]], marks: list[tuple[float, int]]) -> set[int]:
    """Which of a step's allocation events ``(ts_us, bytes, addr)`` (sorted by time) made the
    loss's logits: for each mark ``(ts_us, addr)`` (``capture.memory.logits``), the latest
    allocation at that address at or before it."""
    found: set[int] = set()
    latest: dict[int, int] = {}  # addr -> index of its latest allocation so far
    i = 0
    for ts, addr in sorted(marks):
        while i < len(events) and events[i][0] <= ts:
            if events[i][1] > 0:
                latest[events[i][2]] = i
            i += 1
        if addr in latest:
            found.add(latest[addr])
    return found


#: the snapshot's key (no storage has address 0) for the bytes the CUDA allocator holds at
#: the step's edge beyond the snapshot's storages: tensors made before the recording began
#: (library workspaces such as cuBLAS's, caches, the batch), counted as ``other`` from the
#: step's start, since the replay never sees them allocated
CARRIED = 0


def snapshot(optimizers, models=(), carried: bool = False, stale=()) -> Snapshot:
    """Address -> (category, bytes) of every storage the optimizers hold, and of the
    parameters and buffers of ``models`` (root modules) that they do not train
    (``frozen_parameters``: a parameter an optimizer holds with ``requires_grad`` off is
    frozen too). Quantized weights count at their packed storage plus their quantization
    state. ``stale``: root models alive that the run does not use
    (``swift_nb.capture.memory.stale_models``): their storages that none of the above holds are
    ``other``. Only storages on the device the parameters train on (``device_type_code``)
    count: the replay sees that device's allocations alone. With ``carried``, on CUDA, the
    allocator's bytes beyond those storages are the ``CARRIED`` entry."""
    import torch  # here: the replay (``step_memory``) runs where torch is not imported

    optimizers, models = list(optimizers), list(models)
    device = "cuda" if device_type_code(optimizers, models) == 1 else "cpu"
    out: Snapshot = {}
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                _add(out, device, p, "parameters" if p.requires_grad else "frozen_parameters")
                _add(out, device, p.grad, "gradients")
        for state in opt.state.values():
            for t in state.values():
                _add(out, device, t, "optimizer_state")
    for category, roots in (("frozen_parameters", models), ("other", stale)):
        for model in roots:
            for t in (*model.parameters(), *model.buffers()):
                for part in (t, *quantization_state(t)):
                    _add(out, device, part, category)
    if carried and device == "cuda":
        index = next((p.device for o in optimizers for g in o.param_groups for p in g["params"]), None)
        allocated = torch.cuda.memory_allocated(index)
        out[CARRIED] = ("other", max(0, int(allocated) - sum(n for _, n in out.values())))
    return out


def _add(out: Snapshot, device: str, t, category: str) -> None:
    """``t``'s storage into ``out`` as ``category``, unless it is on another device or
    already there (a storage met twice keeps its first category)."""
    import torch

    # FSDP2 keeps its shards as DTensors (no storage of their own): count the local
    # shard; GaLore keeps its projection on a projector object in the state.
    for attr in ("_local_tensor", "ortho_matrix"):
        inner = getattr(t, attr, None)
        if inner is not None:
            t = inner
    if isinstance(t, torch.Tensor) and t.device.type == device:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr and ptr not in out:
            out[ptr] = (category, st.nbytes())


def quantization_state(t) -> list:
    """The tensors a quantized weight keeps beside its packed data: bitsandbytes' 4-bit
    ``quant_state`` (absmax, code, and the nested state of double quantization) and its
    8-bit ``SCB`` scales. Empty for a plain tensor."""
    found = []
    scb = getattr(t, "SCB", None)
    if scb is not None:
        found.append(scb)
    state = getattr(t, "quant_state", None)
    seen = 0
    while state is not None and seen < 4:  # double quantization nests one state in another
        found += [v for v in vars(state).values() if hasattr(v, "untyped_storage")]
        state, seen = getattr(state, "state2", None), seen + 1
    return found


def device_type_code(optimizers, models=()) -> int:
    """The profiler's ``Device Type`` of the parameters' device (0 CPU, 1 CUDA): the
    trained parameters', else the models' first parameter's."""
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                return 1 if p.device.type == "cuda" else 0
    for model in models:
        for p in model.parameters():
            return 1 if p.device.type == "cuda" else 0
    return 0


@dataclass
class StepMemory:
    """Category bytes at the step's peak (``at_peak``), each category's own maximum
    (``maxima``), and a decimated timeline: rows of (ts_us, *category bytes)."""

    at_peak: dict[str, int]
    maxima: dict[str, int]
    timeline: np.ndarray
    start_us: float = 0.0  # the step's start on the trace clock
    carried: int = 0  # bytes of ``other`` alive from the step's start that the replay never saw made

    @property
    def peak(self) -> int:
        return sum(self.at_peak.values())


def replay(
    events: list[tuple[float, int, int]],
    start: Snapshot,
    end: Snapshot,
    backward: np.ndarray | float,
    logits: Collection[int] = (),
) -> StepMemory:
    """Replay one step's allocation events ``(ts_us, bytes, addr)`` (bytes < 0: free).

    ``backward``: the spans (µs, an ``(n, 2)`` array) in which the autograd engine ran
    backward nodes; a number is the first backward's start (one backward per step). An
    allocation made outside them and still alive when a later one begins is an activation:
    under gradient accumulation each micro-batch's forward keeps its own for its backward.
    ``logits``: the indices in ``events`` of the allocations that made the loss's logits
    (``logits_allocations``), their own category.
    """
    spans = _spans(backward)
    levels, start_live = _live_at_start(events, start, end)
    freed_at = _free_times(events)
    live: dict[int, int] = {}  # addr -> category index of allocations made in this step
    points = [(events[0][0] if events else 0.0, *levels)]
    peak_total, at_peak, maxima = int(levels.sum()), levels.copy(), levels.copy()
    for i, (ts, nbytes, addr) in enumerate(events):
        if nbytes > 0:
            if addr in end and i not in freed_at:  # the storage still there at the end
                cat = _INDEX[end[addr][0]]
            elif i in logits:
                cat = _INDEX["logits"]
            elif _kept_for_backward(spans, ts, freed_at.get(i, np.inf)):
                cat = _INDEX["activations"]
            else:
                cat = _INDEX["other"]
            live[addr] = cat
        else:
            cat = live.pop(addr, None)
            if cat is None:
                cat = _INDEX[start_live.pop(addr)[0]] if addr in start_live else _INDEX["other"]
        levels[cat] += nbytes
        np.maximum(maxima, levels, out=maxima)
        total = int(levels.sum())
        if total > peak_total:
            peak_total, at_peak = total, levels.copy()
        points.append((ts, *levels))
    timeline = np.array(points, dtype=float)
    # Frees of tensors that were alive before the step and are none of the above (last
    # step's batch or loss) drive `other` below zero: they were live at the step's start.
    other = 1 + _INDEX["other"]
    untracked = -min(0.0, float(timeline[:, other].min()))
    timeline[:, other] += untracked
    at_peak[_INDEX["other"]] += int(untracked)
    maxima[_INDEX["other"]] += int(untracked)
    return StepMemory(
        at_peak={c: int(at_peak[i]) for i, c in enumerate(CATEGORIES)},
        maxima={c: int(maxima[i]) for i, c in enumerate(CATEGORIES)},
        timeline=_decimated(timeline),
    )


def _live_at_start(
    events: list[tuple[float, int, int]], start: Snapshot, end: Snapshot
) -> tuple[np.ndarray, dict[int, tuple[str, int]]]:
    """Bytes by category of the storages from the step's start still live when it began,
    and those storages. One whose free the profiler did not see (it was allocated before
    memory profiling began, e.g. during warmup) is gone if the step allocates at its
    address or if the optimizer no longer holds it at the end. It is taken as freed when
    the step began: that is where zero_grad() runs in both usual loop orders, and gradients
    are what such storages are."""
    first_touch: dict[int, int] = {}
    for _, nbytes, addr in events:
        first_touch.setdefault(addr, nbytes)
    levels = np.zeros(len(CATEGORIES), dtype=np.int64)
    start_live: dict[int, tuple[str, int]] = {}
    for addr, (category, nbytes) in start.items():
        touch = first_touch.get(addr)
        if (touch is not None and touch < 0) or (touch is None and addr in end):
            levels[_INDEX[category]] += nbytes
            start_live[addr] = (category, nbytes)
    return levels, start_live


def _free_times(events: list[tuple[float, int, int]]) -> dict[int, float]:
    """When each allocation (by its index in ``events``) is freed: which survive into backward."""
    freed_at: dict[int, float] = {}
    open_allocs: dict[int, int] = {}
    for i, (ts, nbytes, addr) in enumerate(events):
        if nbytes > 0:
            open_allocs[addr] = i
        elif addr in open_allocs:
            freed_at[open_allocs.pop(addr)] = ts
    return freed_at


def _decimated(timeline: np.ndarray) -> np.ndarray:
    """At most ``MAX_TIMELINE_POINTS`` rows, evenly spread, the peak's row kept."""
    if len(timeline) <= MAX_TIMELINE_POINTS:
        return timeline
    keep = np.unique(
        np.concatenate(
            [
                np.linspace(0, len(timeline) - 1, MAX_TIMELINE_POINTS).astype(int),
                [int(np.argmax(timeline[:, 1:].sum(axis=1)))],
            ]
        )
    )
    return timeline[keep]


def _spans(backward: np.ndarray | float) -> np.ndarray:
    """Disjoint backward spans, sorted."""
    if np.ndim(backward) == 0:
        return np.array([[float(backward), np.inf]]) if np.isfinite(backward) else np.empty((0, 2))
    spans = np.asarray(backward, dtype=float).reshape(-1, 2)
    return union(spans[:, 0], spans[:, 1])


def _kept_for_backward(spans: np.ndarray, ts: float, freed: float) -> bool:
    """Whether an allocation at ``ts``, freed at ``freed``, is made outside every backward
    span and lives into the start of a later one."""
    i = int(np.searchsorted(spans[:, 0], ts, side="right"))  # spans starting after ts begin at i
    if i > 0 and ts <= spans[i - 1, 1]:
        return False  # made inside backward
    return i < len(spans) and freed >= spans[i, 0]


def step_memory(
    trace_events: list[dict], snapshots: dict[int, Snapshot], device_type: int
) -> dict[int, StepMemory]:
    """Category memory of every recorded step that has snapshots at both edges; the loss's
    logits are the allocations the trace's ``LOGITS_MARK`` events name."""
    spans = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), k)
        for e in trace_events
        if e.get("ph") == "X" and (k := step_of(e.get("name", ""))) is not None
    )
    if not spans:
        return {}
    starts = np.array([s for s, _, _ in spans])
    mem: dict[int, list[tuple[float, int, int]]] = {k: [] for _, _, k in spans}
    backward: dict[int, list[tuple[float, float]]] = {k: [] for _, _, k in spans}
    marks: dict[int, list[tuple[float, int]]] = {k: [] for _, _, k in spans}
    for e in trace_events:
        name = e.get("name", "")
        is_mem = name == "[memory]"
        is_mark = name.startswith(LOGITS_MARK)
        if not is_mem and not is_mark and not (e.get("ph") == "X" and name.startswith(AUTOGRAD_PREFIX)):
            continue
        ts = float(e["ts"])
        i = int(np.searchsorted(starts, ts, side="right")) - 1
        if i < 0 or ts > spans[i][1]:
            continue
        k = spans[i][2]
        if is_mem:
            a = e.get("args") or {}
            if int(a.get("Device Type", -1)) == device_type:
                mem[k].append((ts, int(a.get("Bytes", 0)), int(a.get("Addr") or 0)))
        elif is_mark:
            marks[k] += [(ts, addr) for addr in logits_addresses(name)]
        else:
            backward[k].append((ts, ts + float(e.get("dur", 0))))
    out = {}
    for start_us, _, k in spans:
        if k in snapshots and k + 1 in snapshots:
            events = sorted(mem[k], key=lambda m: m[0])
            out[k] = replay(
                events,
                snapshots[k],
                snapshots[k + 1],
                np.array(backward[k]),
                logits_allocations(events, marks[k]),
            )
            out[k].start_us = start_us
            out[k].carried = snapshots[k].get(CARRIED, ("other", 0))[1]
    return out
