"""Keep torch's profiler noise out of the user's stderr, and nothing else.

Kineto writes ``USDT: ... SyncActivityProfilerHandler.cpp ... profiler_start`` at every
trace start and stop, and the CPU allocator warns about blocks "allocated before the
profiling started", straight to file descriptor 2 (ipykernel forwards fd 2 into the
cell's output). Kineto's log level is read when torch is imported, too early for us. So
while a run is active, fd 2 is a pipe; one thread forwards every line to the original fd
2 except those that match our machinery's noise.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading

NOISE = re.compile(
    rb"^(?:USDT:|STAGE:).*$"
    rb"|^.*(?:SyncActivityProfilerHandler|ActivityProfilerController)\.cpp.*$"
    rb"|^.*CPUAllocator\.cpp:\d+\] Memory block of unknown size was allocated before the profiling started.*$"
)


def drop_noise(data: bytes) -> bytes:
    """``data`` without the lines that are profiler noise (line endings kept)."""
    return b"".join(line for line in data.splitlines(keepends=True) if not NOISE.match(line.rstrip(b"\r\n")))


class StderrFilter:
    """Route fd 2 through a noise filter between ``start()`` and ``stop()``."""

    def __init__(self, fd: int | None = None) -> None:
        self._fd = fd
        self._saved: int | None = None
        self._write_end: int | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        fd = self._fd
        if fd is None:
            try:
                fd = sys.__stderr__.fileno() if sys.__stderr__ is not None else 2
            except (AttributeError, ValueError, OSError):
                return  # no real fd 2 (embedded interpreters): nothing to filter
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        read_end, write_end = os.pipe()
        self._fd, self._saved, self._write_end = fd, os.dup(fd), write_end
        os.dup2(write_end, fd)
        self._thread = threading.Thread(
            target=self._pump, args=(read_end, self._saved), name="swift_nb-stderr", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Restore fd 2. Child processes that inherited the pipe (e.g. DataLoader workers)
        keep it open: then the thread goes on forwarding their output until they exit."""
        if self._saved is None:
            return
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(self._saved, self._fd)
        os.close(self._write_end)
        self._write_end = None
        saved, self._saved = self._saved, None
        if self._thread is not None:
            self._thread.join(timeout_s)
            if not self._thread.is_alive():
                os.close(saved)
            self._thread = None

    @staticmethod
    def _pump(read_end: int, out: int) -> None:
        pending = b""
        try:
            while chunk := os.read(read_end, 65536):
                pending += chunk
                head, sep, pending = pending.rpartition(b"\n")
                if sep:
                    kept = drop_noise(head + sep)
                    if kept:
                        os.write(out, kept)
            if pending:
                kept = drop_noise(pending)
                if kept:
                    os.write(out, kept)
        finally:
            os.close(read_end)
