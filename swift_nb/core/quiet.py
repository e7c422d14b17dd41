"""Third-party chatter kept from under the cell: what a library logs or warns while it is
imported (bitsandbytes, for one, warns at import about optional CPU kernels it could not
fetch) is collected as lines for the run's notes instead of printed."""

from __future__ import annotations

import contextlib
import importlib
import logging
import warnings
from collections.abc import Iterator
from types import ModuleType


class _Collect(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.lines.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def collected(logger: str) -> Iterator[list[str]]:
    """Within the block, warnings and ``logger``'s records (its children's included) go to
    the yielded list, not to stderr."""
    lines: list[str] = []
    log = logging.getLogger(logger)
    handler, propagate = _Collect(lines), log.propagate
    log.addHandler(handler)
    log.propagate = False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield lines
        lines += [
            f"{w.category.__name__}: {w.message}"
            for w in caught
            if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))
        ]
    finally:
        log.removeHandler(handler)
        log.propagate = propagate


def quiet_import(module: str, logger: str | None = None) -> tuple[ModuleType, list[str]]:
    """``module`` imported with what it logs (under ``logger``, by default the module's top
    package) and warns collected: (the module, those lines). ImportError passes through."""
    with collected(logger or module.partition(".")[0]) as lines:
        mod = importlib.import_module(module)
    return mod, lines
