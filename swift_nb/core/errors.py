"""Errors a user can cause (raised before any work starts), the checks of a count and of a
positive amount that raise them, and the one error of a damaged record."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A bad option value. ``message(flag)`` names the option as the caller spells it
    (``active`` in the API, ``--active`` in the magic)."""

    def __init__(self, param: str, requirement: str, value: Any) -> None:
        self.param, self.requirement, self.value = param, requirement, value
        super().__init__(self.message())

    def message(self, name: Callable[[str], str] = str) -> str:
        return f"{name(self.param)} {self.requirement}; got {self.value!r}"

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled as its arguments: raised in a worker process, it arrives as raised
        return type(self), (self.param, self.requirement, self.value)


def check_whole(name: str, value: Any, least: int = 1, most: int | None = None) -> int:
    """``value`` as an int from ``least`` to ``most``; else a ``ConfigError`` naming ``name``.
    A bool, a float (even 2.0) or text is refused: a count is given as one."""
    n = int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None
    if n is None or n < least or (most is not None and n > most):
        span = f"between {least} and {most}" if most is not None else f"of at least {least}"
        raise ConfigError(name, f"must be a whole number {span}", value)
    return n


def check_positive(name: str, value: Any, unit: str) -> float:
    """``value`` as a finite float above 0; else a ``ConfigError`` naming ``name`` and the
    ``unit`` it is counted in (``"bytes, such as 24e9"``)."""
    x = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    if not (x > 0 and math.isfinite(x)):
        raise ConfigError(name, f"must be a positive number of {unit}", value)
    return x


class RunDirError(OSError):
    """The run folder cannot be created or written."""


class RecordWriteWarning(UserWarning):
    """A run's record could not be written at its end (a full disk, its folder removed);
    said instead of raised into the user's code after the training has run."""


class MissingDependencyError(ImportError):
    """An optional package a feature needs is not installed; the message says how to install it."""


class RecordError(ValueError):
    """A file of a run folder is damaged or not swift_nb's: ``path`` is the file,
    ``problem`` what is wrong with it (``'context' must be an object, got a list``)."""

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path, self.problem = Path(path), problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.path, self.problem)
