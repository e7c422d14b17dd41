"""What every toggle shares: typed parameters, the report, finding models and optimizers
in a namespace, and catching the ones constructed while a toggle is active.

A toggle acts in two places. ``apply(namespace)`` changes the models and optimizers that
already exist (the notebook's variables); while it stays applied, models that run their
first forward and optimizers constructed afterwards are changed too (a training cell
usually builds its model and optimizer itself). ``undo()`` puts every changed object back.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from swift_nb import vocabulary
from swift_nb.capture import frameworks
from swift_nb.core.errors import ConfigError
from swift_nb.vocabulary import Param


@dataclass
class ToggleReport:
    """What a toggle changed (``changes``), what it could not reach and why (``notes``),
    and numbers worth keeping (``details``, e.g. optimizer-state bytes)."""

    toggle: str
    params: dict[str, Any]
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def applied(self) -> bool:
        return bool(self.changes)

    def change(self, msg: str) -> None:
        self.changes.append(msg)

    def note(self, msg: str) -> None:
        if msg not in self.notes:
            self.notes.append(msg)

    def to_dict(self) -> dict[str, Any]:
        return {
            "toggle": self.toggle,
            "params": dict(self.params),
            "applied": self.applied,
            "changes": list(self.changes),
            "notes": list(self.notes),
            "details": dict(self.details),
        }

    def __str__(self) -> str:
        lines = [f"{self.toggle}: {c}" for c in self.changes]
        lines += [f"{self.toggle}: {n}" for n in self.notes]
        return "\n".join(lines) or f"{self.toggle}: nothing to change"


class Toggle:
    """Base class. Subclasses set ``id`` (their ``title`` and ``params`` come from its
    ``swift_nb.vocabulary`` entry) and implement
    ``_apply_model`` (called once per root model) and/or ``_apply_optimizer`` (once per
    optimizer); each registers how to undo what it did with ``self._undo.append``."""

    id: ClassVar[str]
    title: ClassVar[str]
    params: ClassVar[tuple[Param, ...]] = ()
    #: whether models constructed while applied are changed at their first forward
    watches_models: ClassVar[bool] = False
    #: optimizer classes whose instances constructed while applied are changed
    watched_optimizers: ClassVar[tuple[type, ...]] = ()
    #: worker processes a rerun with this toggle launches (sequence parallelism: one per rank)
    processes: int = 1

    def __init__(self, **values: Any) -> None:
        self.values = self.validate(values)
        self.report: ToggleReport | None = None
        self._undo: list[Callable[[], None]] = []
        self._seen_modules: set[int] = set()
        self._roots: set[int] = set()  # the models changed, by id
        self._seen_optimizers: set[int] = set()
        self._hooks: list[Any] = []
        self._namespace: Mapping[str, Any] = {}
        #: what a library the toggle imported logged or warned (``core.quiet``): the run's notes
        self._said: list[str] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        words = vocabulary.TOGGLES[cls.id]
        cls.title, cls.params = words.title, words.params

    @classmethod
    def validate(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """Full parameter values from ``values`` (names or aliases); a ConfigError names
        the first bad one."""
        return vocabulary.TOGGLES[cls.id].validate(values)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.values.items())
        return f"{type(self).__name__}({args})"

    # -- lifecycle -------------------------------------------------------------------------

    def apply(self, namespace: Mapping[str, Any] | None = None) -> ToggleReport:
        """Change the models and optimizers in ``namespace`` and keep changing those built
        while applied, until ``undo()``. Returns the report, which keeps growing."""
        if self.report is not None:
            raise RuntimeError(f"{self.id} is already applied; undo() it first")
        self.report = ToggleReport(self.id, dict(self.values))
        for line in self._said:
            self.report.note(f"said while imported: {line}")
        self._namespace = namespace or {}
        models, optimizers = find_models(namespace or {}), find_optimizers(namespace or {})
        try:
            for name, model in models:
                self._model(model, name)
            for name, opt in optimizers:
                self._optimizer(opt, name)
            self._watch()
        except BaseException:
            self.undo()
            raise
        return self.report

    def undo(self) -> ToggleReport | None:
        """Restore every object this toggle changed, newest change first; returns the
        final report (None if it was not applied)."""
        report = self.report
        if report is not None:
            self._finalize(report)
            if not report.changes and not report.notes:
                report.note(self._nothing_found())
        for remove in self._hooks:
            remove()
        self._hooks.clear()
        while self._undo:
            self._undo.pop()()
        self._seen_modules.clear()
        self._roots.clear()
        self._seen_optimizers.clear()
        self._namespace = {}
        self.report = None
        return report

    def _finalize(self, report: ToggleReport) -> None:
        """Add what is only known once the work ran (counts), before undoing."""

    def _nothing_found(self) -> str:
        return "no model or optimizer it applies to was found"

    # -- per object ------------------------------------------------------------------------

    def _model(self, model: nn.Module, name: str) -> None:
        if id(model) in self._seen_modules:
            return
        # A wrapper around a model changed already (torch.compile's OptimizedModule, DDP, as
        # the Trainer and accelerate.prepare add them) runs that model: nothing to change twice.
        wrapper = any(id(m) in self._roots for m in model.modules())
        self._seen_modules |= {id(m) for m in model.modules()}
        if wrapper or next(model.parameters(), None) is None:  # or a loss function, not a model
            return
        self._roots.add(id(model))
        self._apply_model(model, name)
        self._seen_modules |= {id(m) for m in model.modules()}  # wrappers it added

    def _optimizer(self, opt: torch.optim.Optimizer, name: str) -> None:
        if id(opt) in self._seen_optimizers:
            return
        self._seen_optimizers.add(id(opt))
        self._apply_optimizer(opt, name)

    def _apply_model(self, model: nn.Module, name: str) -> None:
        """Change one root model (found under ``name``); toggles for models override it."""

    def _apply_optimizer(self, opt: torch.optim.Optimizer, name: str) -> None:
        """Change one optimizer; toggles for optimizers override it."""

    # -- objects constructed while applied ---------------------------------------------------

    def _watch(self) -> None:
        if self.watches_models:
            handle = _on_first_forward(self._seen_modules, lambda m: self._model(m, self._name_of(m)))
            self._hooks.append(handle.remove)
        for cls in self.watched_optimizers:
            self._hooks.append(_on_construct(cls, lambda opt: self._optimizer(opt, self._name_of(opt))))

    def _name_of(self, obj: Any) -> str:
        """The variable holding ``obj`` in the namespace (a model built by a cell's
        top-level code is assigned by its first forward; an optimizer is caught in its
        constructor, before the assignment); an optimizer a Trainer is creating is its
        ``.optimizer``; else ``new <class>``."""
        for name, value in _candidates(self._namespace):
            if value is obj:
                return name
        if isinstance(obj, torch.optim.Optimizer):
            running = frameworks.running_trainer(sys._getframe(1))
            if running is not None:
                variable, trainer = running
                return f"{variable or type(trainer).__name__}.optimizer"
        return f"new {type(obj).__name__}"


def _on_first_forward(seen: set[int], apply: Callable[[nn.Module], None]):
    """A global forward pre-hook: the first module to run forward that is not part of an
    already seen model is a new root model (the outermost module's hook runs before its
    children's), so it is changed before any of its submodules computes."""

    def hook(module: nn.Module, args: Any) -> None:
        if id(module) not in seen:
            apply(module)

    return nn.modules.module.register_module_forward_pre_hook(hook)


def _on_construct(cls: type, apply: Callable[[Any], None]) -> Callable[[], None]:
    """Wrap ``cls.__init__`` so instances of exactly ``cls`` are passed to ``apply`` once
    constructed, whatever name the user's code imported the class under. Returns the
    function that unwraps it."""
    original = cls.__dict__["__init__"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        original(self, *args, **kwargs)
        if type(self) is cls:
            apply(self)

    cls.__init__ = __init__

    def restore() -> None:
        cls.__init__ = original

    return restore


def refuse_without_cuda(toggle_id: str, why_not_here: str) -> None:
    """ConfigError naming CUDA (and the compute capability the vocabulary says the toggle
    needs) when this machine cannot run ``toggle_id``, before any work."""
    least = vocabulary.needs_cuda(toggle_id)
    if least is None:
        return
    cap = f" of compute capability ≥ {least[0]}.{least[1]}" if least > (0, 0) else ""
    if not torch.cuda.is_available():
        raise ConfigError(
            toggle_id,
            f"needs a CUDA device{cap}, and torch {torch.__version__} sees none ({why_not_here})",
            toggle_id,
        )
    found = torch.cuda.get_device_capability()
    if found < least:
        raise ConfigError(
            toggle_id,
            f"needs a CUDA device{cap}; {torch.cuda.get_device_name()} is {found[0]}.{found[1]} "
            f"({why_not_here})",
            toggle_id,
        )


# -- finding things in a namespace ------------------------------------------------------------


def _candidates(namespace: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    for name, value in list(namespace.items()):
        if name.startswith("_"):  # IPython's output cache (_, _3) and private names
            continue
        yield name, value
        for attr in ("model", "module", "optimizer"):  # Trainer-like holders
            inner = getattr(value, attr, None) if not isinstance(value, (nn.Module, type)) else None
            if inner is not None:
                yield f"{name}.{attr}", inner


def find_models(namespace: Mapping[str, Any]) -> list[tuple[str, nn.Module]]:
    """Root ``nn.Module`` objects in ``namespace`` (a module held inside another found
    module is not listed separately), with the name they were found under."""
    found: dict[int, tuple[str, nn.Module]] = {}
    for name, value in _candidates(namespace):
        if isinstance(value, nn.Module) and id(value) not in found:
            found[id(value)] = (name, value)
    inner: set[int] = set()
    for _, m in found.values():
        inner |= {id(c) for c in m.modules() if c is not m}
    return [(n, m) for k, (n, m) in found.items() if k not in inner]


def find_optimizers(namespace: Mapping[str, Any]) -> list[tuple[str, torch.optim.Optimizer]]:
    """The optimizers in ``namespace``, with the name they were found under. A wrapper
    (accelerate's ``AcceleratedOptimizer``, which ``accelerator.prepare`` returns and a
    Trainer holds) is listed as the optimizer it steps, under the wrapper's name."""
    found: dict[int, tuple[str, torch.optim.Optimizer]] = {}
    for name, value in _candidates(namespace):
        if isinstance(value, torch.optim.Optimizer):
            value = frameworks.unwrap_optimizer(value)
            found.setdefault(id(value), (name, value))
    return list(found.values())


def hf_model(module: nn.Module) -> bool:
    """A Hugging Face transformers model (checked without importing transformers)."""
    return any(
        c.__module__.startswith("transformers.") and c.__name__ == "PreTrainedModel"
        for c in type(module).__mro__
    )
