"""Optimization toggles: one file per toggle, one registry line each.

``get("galore", rank=64)`` or ``parse("galore", "rank=64,gap=200")`` builds a toggle;
``toggle.apply(namespace)`` changes the models and optimizers found there and those
constructed while it stays applied; ``toggle.undo()`` restores them and returns the
report. ``applied(namespace, toggles)`` does both around a block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from swift_nb.errors import ConfigError
from swift_nb.toggles.base import Param, Toggle, ToggleReport, find_models, find_optimizers
from swift_nb.toggles.bf16_autocast import BF16Autocast
from swift_nb.toggles.flash_attention import FlashAttention
from swift_nb.toggles.galore import GaLore
from swift_nb.toggles.grad_checkpointing import GradCheckpointing
from swift_nb.toggles.sequence_parallel import SequenceParallel

TOGGLES: dict[str, type[Toggle]] = {
    t.id: t for t in (FlashAttention, GradCheckpointing, GaLore, SequenceParallel, BF16Autocast)
}
#: ``%%swift_profile`` option (argparse dest) → toggle id; each flag takes an optional
#: ``key=value,...`` spec. Shared by the magic and by reruns, which write these flags.
MAGIC_FLAGS = {
    "flash_attn": "flash_attention",
    "grad_ckpt": "grad_checkpointing",
    "galore": "galore",
    "sequence_parallel": "sequence_parallel",
    "bf16": "bf16_autocast",
}

__all__ = [
    "MAGIC_FLAGS",
    "TOGGLES",
    "Param",
    "Toggle",
    "ToggleReport",
    "applied",
    "build",
    "find_models",
    "find_optimizers",
    "get",
    "parse",
    "parse_params",
]


def get(toggle_id: str, **params: Any) -> Toggle:
    """The toggle ``toggle_id`` with ``params`` (names or aliases), validated."""
    cls = TOGGLES.get(toggle_id)
    if cls is None:
        raise ConfigError("toggle", f"must be one of {', '.join(TOGGLES)}", toggle_id)
    return cls(**params)


def parse_params(spec: str | None) -> dict[str, str]:
    """``"rank=64,gap=200"`` → ``{"rank": "64", "gap": "200"}`` (values converted later)."""
    out: dict[str, str] = {}
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("toggle parameter", "must be written key=value (e.g. rank=64,gap=200)", item)
        out[key.strip()] = value.strip()
    return out


def parse(toggle_id: str, spec: str | None = None) -> Toggle:
    """A toggle from its id and a ``key=value,...`` spec, as the magic's flags give them."""
    return get(toggle_id, **parse_params(spec))


def build(toggles: Sequence[Toggle | str] | Mapping[str, Mapping[str, Any]] | None) -> list[Toggle]:
    """Toggles from objects, ids (``"galore"``, ``"galore:rank=64"``) or ``{id: params}``."""
    if not toggles:
        return []
    if isinstance(toggles, Mapping):
        return [get(k, **dict(v or {})) for k, v in toggles.items()]
    out = []
    for t in toggles:
        if isinstance(t, Toggle):
            out.append(t)
        else:
            tid, _, spec = str(t).partition(":")
            out.append(parse(tid.strip(), spec))
    ids = [t.id for t in out]
    if len(set(ids)) != len(ids):
        raise ConfigError("toggles", "must name each toggle once", ids)
    return out


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
