"""Optimization toggles: one file per toggle; their names, flags and parameters live in
``swift_nb.vocabulary`` (one entry each).

``get("galore", rank=64)`` or ``parse("galore", "rank=64,gap=200")`` builds a toggle;
``toggle.apply(namespace)`` changes the models and optimizers found there and those
constructed while it stays applied; ``toggle.undo()`` restores them and returns the
report. ``applied(namespace, toggles)`` does both around a block.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from swift_nb import vocabulary
from swift_nb.core.errors import ConfigError
from swift_nb.toggles.base import Toggle, ToggleReport, find_models, find_optimizers
from swift_nb.vocabulary import Param

__all__ = [
    "Param",
    "Toggle",
    "ToggleReport",
    "applied",
    "build",
    "find_models",
    "find_optimizers",
    "get",
    "implementation",
    "parse",
]


def implementation(toggle_id: str) -> type[Toggle]:
    """The class that applies ``toggle_id`` (imported on first use); ConfigError for a
    toggle that does not exist or that only the forecast understands."""
    module, _, name = vocabulary.entry(toggle_id, runnable=True).implementation.partition(":")  # type: ignore[union-attr]
    return getattr(importlib.import_module(module), name)


def get(toggle_id: str, **params: Any) -> Toggle:
    """The toggle ``toggle_id`` with ``params`` (names or aliases), validated."""
    return implementation(toggle_id)(**params)


def parse(toggle_id: str, spec: str | None = None) -> Toggle:
    """A toggle from its id and a ``key=value,...`` spec, as the magic's flags give them."""
    return get(toggle_id, **vocabulary.parse_params(spec))


def build(toggles: Sequence[Toggle | str] | Mapping[str, Mapping[str, Any]] | None) -> list[Toggle]:
    """Toggles from objects, specs (``"galore"``, ``"galore:rank=64"``, ``"galore(rank=64)"``)
    or ``{id: params}``. Names given twice, or toggles that cannot run together, are refused
    before any is built."""
    if not toggles:
        return []
    wanted: list[Toggle | tuple[str, dict[str, Any]]] = []
    if isinstance(toggles, Mapping):
        wanted = [(k, dict(v or {})) for k, v in toggles.items()]
    else:
        for t in toggles:
            if isinstance(t, Toggle):
                wanted.append(t)
            else:
                wanted += list(map(vocabulary.parse_item, vocabulary.split_list(str(t))))
    ids = [w.id if isinstance(w, Toggle) else vocabulary.entry(w[0], runnable=True).id for w in wanted]
    if len(set(ids)) != len(ids):
        raise ConfigError("toggles", "must name each toggle once", ids)
    clash = vocabulary.clashes(ids)
    if clash:
        raise ConfigError("toggles", clash, ",".join(ids))
    return [w if isinstance(w, Toggle) else get(w[0], **w[1]) for w in wanted]


@contextlib.contextmanager
def applied(namespace: Mapping[str, Any] | None, toggles: Sequence[Toggle]) -> Iterator[list[ToggleReport]]:
    """Apply ``toggles`` for the block and undo them after it, even when it fails. The
    yielded list holds each toggle's final report once the block has ended."""
    reports: list[ToggleReport] = []
    done: list[Toggle] = []
    try:
        for t in toggles:
            t.apply(namespace)
            done.append(t)
        yield reports
    finally:
        for t in reversed(done):
            report = t.undo()
            if report is not None:
                reports.insert(0, report)
