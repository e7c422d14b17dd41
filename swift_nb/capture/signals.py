"""Signals that end a run: SIGTERM and SIGHUP save it, Ctrl-C waits for the save.

SIGTERM is what a job scheduler, ``timeout``, a notebook server's shutdown, torchrun
stopping its ranks or a preempted cloud VM sends; SIGHUP what a closed terminal sends.
While a run is being captured, either one first ends the run as ``terminated`` and saves
it in full, then takes its usual course: the handler that was there before (the user's
own, chained, not replaced) or the default action (the process ends, exit code 128 + N).
A signal that was ignored before the run stays ignored. Handlers can only be set from
the main thread; a run captured on another thread relies on the periodic journal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

#: signals that end a run as ``terminated``
TERMINATING = tuple(
    getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)
)  # no SIGHUP on Windows


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def deliver(signum: int, frame: FrameType | None, previous: Any) -> None:
    """Let ``signum`` take the course ``previous`` (a handler as ``signal.signal``
    returned it) gives it: call a Python handler, or re-raise it with the default action."""
    if callable(previous):
        previous(signum, frame)
    elif previous in (signal.SIG_DFL, None):
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # the default action: for SIGTERM, exit code 143
    # SIG_IGN: nothing


class TerminationHandler:
    """While installed, SIGTERM/SIGHUP call ``on_signal(signum)`` once (which saves the
    run), then continue with the handler that was there before. While ``busy`` (the
    session is inside its own step hook), a signal waits until ``release()``."""

    def __init__(self, on_signal: Callable[[int], None]) -> None:
        self._on_signal = on_signal
        self._previous: dict[int, Any] = {}
        self.busy = False
        self._pending: tuple[int, FrameType | None] | None = None

    def install(self) -> bool:
        """Install on the main thread; returns whether it did."""
        if not _main_thread():
            return False
        for signum in TERMINATING:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN:
                continue  # ignored before the run: it changes nothing, so neither do we
            self._previous[signum] = previous
            signal.signal(signum, self._handle)
        return True

    def restore(self) -> None:
        """Put back the handlers found at ``install`` (idempotent)."""
        previous, self._previous = self._previous, {}
        if not _main_thread():
            return
        for signum, handler in previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def previous(self, signum: int) -> Any:
        return self._previous.get(signum, signal.SIG_DFL)

    def release(self) -> None:
        """Leave the busy section; a signal that arrived inside it is handled now."""
        self.busy = False
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._handle(*pending)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.busy:
            self._pending = self._pending or (signum, frame)
            return
        previous = self._previous.get(signum, signal.SIG_DFL)
        try:
            self._on_signal(signum)
        finally:
            self.restore()
            deliver(signum, frame, previous)


@contextlib.contextmanager
def deferred(signums: tuple[int, ...] = (signal.SIGINT, *TERMINATING)) -> Iterator[None]:
    """Hold ``signums`` back while the record is written; afterwards deliver what arrived
    to the handlers in place then (SIGINT: a ``KeyboardInterrupt``)."""
    if not _main_thread():
        yield
        return
    pending: list[tuple[int, FrameType | None]] = []
    previous = {n: signal.signal(n, lambda signum, frame: pending.append((signum, frame))) for n in signums}
    try:
        yield
    finally:
        for n, handler in previous.items():
            signal.signal(n, handler if handler is not None else signal.SIG_DFL)
    interrupted = False
    for signum, frame in dict(pending).items():
        if signum == signal.SIGINT:
            interrupted = True
        else:
            deliver(signum, frame, signal.getsignal(signum))
    if interrupted:
        raise KeyboardInterrupt


def name(signum: int) -> str:
    return signal.Signals(signum).name
