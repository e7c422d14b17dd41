"""Step detection without code changes.

Every ``optimizer.step()`` of any torch optimizer ends a step: a global optimizer post
hook (``torch.optim.optimizer.register_optimizer_step_post_hook``) tells the active
listener. With several optimizers (GANs, per-group optimizers) only the first optimizer
that steps in a run marks boundaries, so one training iteration is one step. Loops
without an optimizer call ``swift_nb.step()``; once they do, optimizer hooks stop counting
for that run. A loop that calls both (``opt.step(); swift_nb.step()``) counts each
iteration once from the first: a first ``swift_nb.step()`` that comes after exactly one
optimizer boundary ends the iteration that boundary ended already, and is not counted again.

Wrappers count once per real update. accelerate's ``AcceleratedOptimizer`` (what
``accelerator.prepare`` and Hugging Face's Trainer step) calls the wrapped optimizer's
``step()`` only on the micro-batch that ends a gradient-accumulation cycle, so a run with
``gradient_accumulation_steps=4`` has one step per optimizer update, not four. Mixed
precision's ``GradScaler.step`` skips ``optimizer.step()`` when the gradients hold inf or
NaN; that iteration still ends a step (the Trainer counts it too): while a watcher is
installed ``GradScaler.step`` reports a skipped update as a boundary, and
``skipped_updates`` counts them.

At the first boundary the watcher also looks up the call stack for the training framework
that drives the loop (``swift_nb.capture.frameworks``) and keeps what it found in ``context``,
and for the models the cell holds (``swift_nb.capture.models``), kept in ``models``: the
session tells those the run uses from those only alive (``swift_nb.capture.memory.stale_models``)
and reads the fine-tuning from the former.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from swift_nb.capture import frameworks
from swift_nb.capture import models as found_models

StepListener = Callable[[str, "torch.optim.Optimizer | None"], None]

_lock = threading.Lock()
_listener: Callable[[], None] | None = None  # the active watcher's explicit-step entry


class StepWatcher:
    """Installs the global optimizer hook and forwards boundaries to ``listener``.

    ``listener(trigger, optimizer)`` gets ``trigger`` = "optimizer" or "explicit".
    Only one watcher is active per process. ``context``: what the first boundary found
    about the training framework (``frameworks.detect``; empty when none);
    ``skipped_updates``: boundaries whose update a GradScaler skipped.
    """

    def __init__(self, listener: StepListener, use_optimizer_hook: bool = True) -> None:
        self._listener = listener
        self._use_optimizer_hook = use_optimizer_hook
        self._primary: int | None = None
        self._optimizer_boundaries = 0  # counted before the first explicit step
        self._updates = 0  # optimizer post hooks seen, any optimizer
        self._handle: Any = None
        self._unpatch_scaler: Callable[[], None] | None = None
        self._looked_up = False
        self.optimizers: dict[int, torch.optim.Optimizer] = {}
        self.models: dict[str, torch.nn.Module] = {}
        self.context: dict[str, Any] = {}
        self.skipped_updates = 0

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
            self._unpatch_scaler = _watch_grad_scaler(self)

    def remove(self) -> None:
        global _listener
        self._remove_optimizer_hooks()
        with _lock:
            if _listener == self._explicit:
                _listener = None

    def _remove_optimizer_hooks(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self._unpatch_scaler is not None:
            self._unpatch_scaler()
            self._unpatch_scaler = None

    def _on_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._updates += 1
        key = id(optimizer)
        if self._primary is None:
            self._primary = key
        self.optimizers.setdefault(key, optimizer)
        if key == self._primary:
            self._optimizer_boundaries += 1
            self._look_up(sys._getframe(1), optimizer)
            self._listener("optimizer", optimizer)

    def _on_skipped_update(self, optimizer: torch.optim.Optimizer) -> None:
        """A GradScaler skipped ``optimizer.step()``: the iteration still ends here."""
        if self._primary in (None, id(optimizer)):
            self.skipped_updates += 1
        self._on_optimizer_step(optimizer, (), {})

    def _explicit(self) -> None:
        if self._handle is not None:
            self._remove_optimizer_hooks()
            # The first explicit step right after the run's only optimizer boundary is the
            # same iteration's end (a loop calling both). After several optimizer steps it
            # is not: the loop changed (training, then evaluation marked by step()).
            if self._optimizer_boundaries == 1:
                return
        self._look_up(sys._getframe(2), None)
        self._listener("explicit", None)

    def _look_up(self, frame: Any, optimizer: torch.optim.Optimizer | None) -> None:
        """Once per run, at the first boundary: the training framework and the models on
        the stack."""
        if self._looked_up:
            return
        self._looked_up = True
        try:
            self.context = frameworks.detect(frame, optimizer)
        except Exception:  # a framework's odd attribute must never break the training loop
            self.context = {}
        try:
            self.models = found_models.on_stack(frame)
        except Exception:
            self.models = {}


def _watch_grad_scaler(watcher: StepWatcher) -> Callable[[], None]:
    """Make ``torch.amp.GradScaler.step`` (the class that accelerate's, the Trainer's and
    ``torch.cuda.amp``'s scalers are or derive from) tell ``watcher`` when it skipped the
    optimizer's step; returns the function that puts the original back."""
    cls: Any = torch.amp.GradScaler
    original = cls.__dict__["step"]

    def step(scaler: Any, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        updates = watcher._updates
        out = original(scaler, optimizer, *args, **kwargs)
        if watcher._updates == updates and scaler.is_enabled():
            watcher._on_skipped_update(frameworks.unwrap_optimizer(optimizer))
        return out

    cls.step = step

    def restore() -> None:
        cls.step = original

    return restore


def step() -> None:
    """Mark a step boundary in the active profile (no-op when none is active).

    Use it in loops that do not call an optimizer's ``step()``, e.g. inference or a hand
    written update rule; after the first call, optimizer steps no longer mark boundaries. In
    a loop that also calls ``optimizer.step()`` each iteration is still one step.
    """
    listener = _listener
    if listener is not None:
        listener()
