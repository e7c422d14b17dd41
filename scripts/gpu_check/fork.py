"""The checks' child processes, forked from this one once it has imported what every check
imports (torch, what its first optimizer imports, transformers, swift_nb): each check then
starts in a moment instead of paying those imports again, on a GPU's rented minutes too.

Forking is safe while this process has started no thread and not touched CUDA (a library
that asks torch whether CUDA is there at import is made to ask NVML); ``warm()`` checks
both after its imports, and where either fails, or ``SWIFT_NB_GPU_CHECK_FORK=0``, every
child is a fresh ``python scripts/gpu_check OUT --one NAME`` as before. A forked child is
what that command would be: its own session (killed whole at its limit), the log as its
stdout and stderr, ``main(argv)`` run, and its exit code."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import IO

PRELOAD = ("torch", "torch._dynamo", "transformers", "swift_nb", "swift_nb.api", "swift_nb.analysis")
_state: dict[str, str | None] = {}


def warm() -> str | None:
    """Import ``PRELOAD`` (once); None when children can be forked, else why not."""
    if "why" in _state:
        return _state["why"]
    why = None
    if not sys.platform.startswith("linux") or os.environ.get("SWIFT_NB_GPU_CHECK_FORK", "1") == "0":
        why = "off"
    else:
        from swift_nb.rerun.forkserver import preload

        why = preload(PRELOAD)
    _state["why"] = why
    return why


class Child:
    """A check's process: ``pid``, ``returncode``, ``wait(timeout)`` (raises
    ``subprocess.TimeoutExpired``), ``kill()`` (its whole session)."""

    def __init__(self, pid: int, popen: subprocess.Popen | None = None) -> None:
        self.pid = pid
        self.popen = popen
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.popen is not None:
            self.returncode = self.popen.wait(timeout)
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
            elif deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            else:
                time.sleep(0.05)
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.wait()


def start(cmd: list[str], argv: list[str], main: Callable[[list[str]], int], log: IO) -> Child:
    """``main(argv)`` in a forked child, or ``cmd`` as a fresh process where forking is off
    or unsafe; stdout and stderr to ``log``."""
    if warm() is not None:
        popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return Child(popen.pid, popen)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        from swift_nb.rerun.forkserver import child_exits

        def body() -> int:
            os.setsid()
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            return main(argv)

        child_exits(body)
    return Child(pid)
