"""PyTorch's MemTracker keeping a fake step's peak alone (``capture.fake_step``), with the
bytes of the loss's logits alive at it, by the kind they were booked as. The logits are
known by where they come from, as in a measured run (``capture.memory.logits``): the output
of the head (``PeakTracker.follow``), what every operation computes from them until the
head's output has its gradient, never by their size. Its per-module peaks (not read here)
cost a pass over every tracked module at each operation: on a 7B Llama that was 70 % of the
step's time, growing with the layers.

Rests on MemTracker's internals (``_update_snap``, ``_update_peak_stats``,
``_curr_mem_snap``, ``_WINFO``), which ``check_internals`` checks before a fake step runs."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed._tools import mem_tracker
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

#: what the tracker reads of MemTracker and torch, checked before a fake step runs
#: (``check_internals``): (where, name)
INTERNALS = (
    (mem_tracker, "_TOTAL_KEY"),
    (mem_tracker, "_MemRefType"),
    (mem_tracker, "_UpdateType"),
    (mem_tracker.MemTracker, "_update_snap"),
    (mem_tracker.MemTracker, "_update_peak_stats"),
    (mem_tracker.MemTracker, "track_external"),
    (mem_tracker.MemTracker, "get_tracker_snapshot"),
    (torch._C._nn, "_parse_to"),
)
#: attributes a MemTracker instance must have
INSTANCE_INTERNALS = (
    "_WINFO",
    "_curr_mem_snap",
    "_peak_mem",
    "_peak_mem_snap",
    "_param_to_grad_hook_handles",
)
#: the torch releases the fake step was built against (major, minor), first and last
TESTED_TORCH = ((2, 6), (2, 13))


def check_internals() -> None:
    """Raise ``RuntimeError`` naming what changed when the PyTorch internals the fake step
    rests on are not as it was built against (``INTERNALS``): before any work, never
    inside the step, where a failure would look like a model's data-dependent operation."""
    missing = [
        f"{getattr(where, '__name__', where)}.{name}" for where, name in INTERNALS if not hasattr(where, name)
    ]
    if not missing:
        tracker = mem_tracker.MemTracker()
        missing = [f"MemTracker().{a}" for a in INSTANCE_INTERNALS if not hasattr(tracker, a)]
        kinds = [k for k in ("ACT", "TEMP", "OPT") if not hasattr(mem_tracker._MemRefType, k)]
        updates = [u for u in ("ADD", "DEL") if not hasattr(mem_tracker._UpdateType, u)]
        missing += [f"_MemRefType.{k}" for k in kinds] + [f"_UpdateType.{u}" for u in updates]
    if missing:
        (lo, hi) = TESTED_TORCH
        raise RuntimeError(
            f"a forecast from a model's config rests on PyTorch's MemTracker internals, and torch "
            f"{torch.__version__} changed them ({', '.join(missing)}); it was built against torch "
            f"{lo[0]}.{lo[1]}–{hi[0]}.{hi[1]}: install one of those, or forecast from a measured run "
            "(swift_nb.forecast(run))"
        )


_TOTAL = mem_tracker._TOTAL_KEY
_KINDS = (mem_tracker._MemRefType.ACT, mem_tracker._MemRefType.TEMP)


def _storages(tree: Any) -> list:
    return [t.untyped_storage() for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class PeakTracker(mem_tracker.MemTracker):
    """MemTracker with the step's peak alone and the logits alive at it (``logits_at_peak``:
    bytes by the kind MemTracker booked them as)."""

    def __init__(self) -> None:
        super().__init__()
        self.logits_alive: dict[int, tuple[str, int]] = {}  # id(winfo) → (kind, bytes)
        self.logits_at_peak: dict[str, float] = {}
        self._lineage = WeakIdKeyDictionary()  # the logits' storages → True
        self._open = False  # the lineage: from the head's output to its gradient
        self._tainting = False  # the operation running reads the logits
        self._ops = 0  # operations run
        self._peak_op = -1  # ... when the peak was last raised

    def follow(self, module: Any, head: Any, known: bool) -> None:
        """Follow the logits of ``module``'s ``head`` (``find_head``): its output where
        ``known``, else where ``module`` returns the head's output as it is."""
        if head is None:
            return
        last: list[Any] = []

        def on_head(_m: Any, _args: Any, output: Any) -> None:
            if known:
                self._start(output)
            else:
                last[:] = [output]

        def on_root(_m: Any, _args: Any, output: Any) -> None:
            got = last.pop() if last else None
            returned = getattr(output, "logits", output)
            returned = returned[0] if isinstance(returned, (tuple, list)) else returned
            if got is not None and got is returned:
                self._start(got)

        head.register_forward_hook(on_head)
        if not known:
            module.register_forward_hook(on_root)

    def _start(self, output: Any) -> None:
        for t in tree_flatten(output)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            self._lineage[st] = True
            winfo = self._WINFO.get(st, (None, None))[0]
            if winfo is not None and winfo.reftype in _KINDS:
                self.logits_alive[id(winfo)] = (winfo.reftype.value, winfo.mem_consumed)
                if self._peak_op == self._ops:  # the head's own operation raised the peak
                    kind = winfo.reftype.value
                    self.logits_at_peak[kind] = self.logits_at_peak.get(kind, 0.0) + winfo.mem_consumed
            if t.requires_grad:
                t.register_hook(self._close)
            self._open = True

    def _close(self, grad: Any) -> None:
        self._open = False  # from here backward computes the hidden states' gradient

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self._ops += 1
        self._tainting = self._open and any(st in self._lineage for st in _storages((args, kwargs)))
        try:
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if self._tainting:
                for st in _storages(out):
                    self._lineage[st] = True
            return out
        finally:
            self._tainting = False

    def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
        super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
        key = id(winfo)
        if u_type == mem_tracker._UpdateType.DEL or winfo.reftype not in _KINDS:
            self.logits_alive.pop(key, None)
        elif (u_type == mem_tracker._UpdateType.ADD and self._tainting) or key in self.logits_alive:
            self.logits_alive[key] = (winfo.reftype.value, winfo.mem_consumed)

    def _update_peak_stats(self, peak_state: Any) -> None:
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap[_TOTAL]:
                self._peak_mem[dev] = snap[_TOTAL]
                self._peak_mem_snap[dev] = dict(snap)
                self._peak_op = self._ops
                self.logits_at_peak = {}
                for kind, nbytes in self.logits_alive.values():
                    self.logits_at_peak[kind] = self.logits_at_peak.get(kind, 0.0) + nbytes
