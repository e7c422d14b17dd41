"""Step detection without code changes.

Every ``optimizer.step()`` of any torch optimizer ends a step: a global optimizer post
hook (``torch.optim.optimizer.register_optimizer_step_post_hook``) tells the active
listener. With several optimizers (GANs, per-group optimizers) only the first optimizer
that steps in a run marks boundaries, so one training iteration is one step. Loops
without an optimizer call ``swift_nb.step()``; once they do, optimizer hooks stop counting
for that run. A loop that calls both (``opt.step(); swift_nb.step()``) counts each
iteration once from the first: a first ``swift_nb.step()`` that comes after exactly one
optimizer boundary ends the iteration that boundary ended already, and is not counted again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

StepListener = Callable[[str, "torch.optim.Optimizer | None"], None]

_lock = threading.Lock()
_listener: Callable[[], None] | None = None  # the active watcher's explicit-step entry


class StepWatcher:
    """Installs the global optimizer hook and forwards boundaries to ``listener``.

    ``listener(trigger, optimizer)`` gets ``trigger`` = "optimizer" or "explicit".
    Only one watcher is active per process.
    """

    def __init__(self, listener: StepListener, use_optimizer_hook: bool = True) -> None:
        self._listener = listener
        self._use_optimizer_hook = use_optimizer_hook
        self._primary: int | None = None
        self._optimizer_boundaries = 0  # counted before the first explicit step
        self._handle: Any = None
        self.optimizers: dict[int, torch.optim.Optimizer] = {}

    def install(self) -> None:
        global _listener
        with _lock:
            if _listener is not None:
                raise RuntimeError(
                    "another swift_nb profile is already active in this process; "
                    "nested profiles are not supported — finish the outer one first"
                )
            _listener = self._explicit
        if self._use_optimizer_hook:
            self._handle = register_optimizer_step_post_hook(self._on_optimizer_step)

    def remove(self) -> None:
        global _listener
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        with _lock:
            if _listener == self._explicit:
                _listener = None

    def _on_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        key = id(optimizer)
        if self._primary is None:
            self._primary = key
        self.optimizers.setdefault(key, optimizer)
        if key == self._primary:
            self._optimizer_boundaries += 1
            self._listener("optimizer", optimizer)

    def _explicit(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
            # The first explicit step right after the run's only optimizer boundary is the
            # same iteration's end (a loop calling both). After several optimizer steps it
            # is not: the loop changed (training, then evaluation marked by step()).
            if self._optimizer_boundaries == 1:
                return
        self._listener("explicit", None)


def step() -> None:
    """Mark a step boundary in the active profile (no-op when none is active).

    Use it in loops that do not call an optimizer's ``step()``, e.g. inference or a hand
    written update rule; after the first call, optimizer steps no longer mark boundaries. In
    a loop that also calls ``optimizer.step()`` each iteration is still one step.
    """
    listener = _listener
    if listener is not None:
        listener()
