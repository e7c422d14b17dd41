"""Errors a user can cause, raised before any work starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ConfigError(ValueError):
    """A bad option value. ``message(flag)`` names the option as the caller spells it
    (``active`` in the API, ``--active`` in the magic)."""

    def __init__(self, param: str, requirement: str, value: Any) -> None:
        self.param, self.requirement, self.value = param, requirement, value
        super().__init__(self.message())

    def message(self, name: Callable[[str], str] = str) -> str:
        return f"{name(self.param)} {self.requirement}; got {self.value!r}"


class RunDirError(OSError):
    """The run folder cannot be created or written."""


class MissingDependencyError(ImportError):
    """An optional package a feature needs is not installed; the message says how to install it."""
