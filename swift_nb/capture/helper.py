"""Work done outside the training process: one helper process per profiled run.

A thread of the training process holds the GIL whenever it runs Python, and the training
thread needs the GIL between every operator, so background work there slows every step it
overlaps. What a run does with its finished trace (decode, tables, memory replay, figures)
therefore runs in a helper: a fresh interpreter, started when the run starts (its start-up
overlaps the first steps) at the lowest CPU priority, that runs jobs given as a
``"module:function"`` name and a picklable argument.

The training process writes a job into the run folder and sends its file name down the
helper's stdin; the helper writes the result beside it and answers on a pipe of its own.
Nothing the training thread does waits on the helper: it only writes a small file and a
line. If the helper cannot start, or dies before it answers, the job runs in this process
instead (``Pending.result``) and the run's notes say so once. The helper leaves with its
run (``close``), and on its own when the training process is gone.

Run ``python -m swift_nb.capture.helper`` only as the helper.
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: the interpreter the helper runs in (a fault test points it somewhere that does not exist)
PYTHON = sys.executable
_NICE = 19
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def resolve(target: str) -> Callable[[Any], Any]:
    """The function named ``"package.module:function"``."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class HelperDiedError(RuntimeError):
    """The helper process ended before it answered."""


class Pending:
    """A job given to the helper (or, without one, to a thread of this process). ``result``
    waits for it; where the helper died meanwhile, it runs the job here."""

    def __init__(self, helper: Helper, target: str, arg: Any, job_file: Path | None) -> None:
        self._helper, self.target, self._arg = helper, target, arg
        self._job_file = job_file
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _run_here(self, background: bool) -> None:
        def run() -> None:
            try:
                self._value = resolve(self.target)(self._arg)
            except BaseException as e:  # handed to whoever asks for the result
                self._error = e
            self._done.set()

        if background:
            # Not a daemon: an interpreter exiting right after the cell still completes it.
            self._thread = threading.Thread(target=run, name="swift_nb-digest", daemon=False)
            self._thread.start()
        else:
            run()

    def _answered(self, ok: bool, value: Any) -> None:
        if ok:
            self._value = value
        else:
            self._error = value
        self._done.set()

    def result(self) -> Any:
        """The job's result (its exception raised here)."""
        while not self._done.wait(0.1):
            dead = self._thread is None and not self._helper.alive
            if dead and not self._helper._answer_pending(self):  # it died before answering
                self._helper.tell(self._helper.death())
                self._run_here(background=False)
        if self._thread is not None:
            self._thread.join()
        if self._job_file is not None:
            self._job_file.unlink(missing_ok=True)
        if self._error is not None:
            raise self._error
        return self._value


class Helper:
    """The helper process of one run. ``folder``: where jobs and results are written (the
    run's folder); ``note``: where a problem is told (the run's notes), once."""

    def __init__(self, folder: Path, note: Callable[[str], None]) -> None:
        self.folder = folder
        self._note = note
        self._told = False
        self.proc: subprocess.Popen | None = None
        self._pending: list[Pending] = []
        self._lock = threading.Lock()
        self._count = 0
        self._reader: threading.Thread | None = None

    # -- life ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the helper (never raises: without one, jobs run in this process)."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        env["SWIFT_NB_HELPER_PARENT"] = str(os.getpid())
        try:
            self.proc = subprocess.Popen(
                [PYTHON, "-m", "swift_nb.capture.helper"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                close_fds=True,
            )
        except OSError as e:
            self.tell(f"the helper process could not start ({e}); the trace was digested in this process")
            return
        # From its first instruction (its imports too) it gives way to the training. Not
        # SCHED_IDLE: starved, the helper stays runnable for the rest of the run and its
        # cache and memory traffic slowed every later step (1.4x, benchmarks/never_waits.py)
        # where nice 19 lets it finish within a few steps.
        try:
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, _NICE)
        except OSError:
            pass
        self._reader = threading.Thread(target=self._read, name="swift_nb-helper", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def death(self) -> str:
        code = self.proc.returncode if self.proc is not None else None
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return f"the helper process ended before it finished ({how}); the trace was digested in this process"

    def tell(self, message: str) -> None:
        if not self._told:
            self._told = True
            self._note(message)

    def close(self) -> None:
        """End the helper: its jobs are answered or abandoned by now, so it is killed
        rather than waited for (an interpreter's exit costs a quarter second)."""
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=1.0)  # it reads the pipe's end, then leaves
        if proc.stdout is not None:
            proc.stdout.close()

    # -- jobs ----------------------------------------------------------------------------

    def submit(self, target: str, arg: Any) -> Pending:
        """Give the helper ``target(arg)`` to run; the training thread only writes a small
        file and a line."""
        if not self.alive:
            if self.proc is not None:
                self.tell(self.death())
            pending = Pending(self, target, arg, None)
            pending._run_here(background=True)
            return pending
        self._count += 1
        job_file = self.folder / f".helper-job{self._count}.pkl"
        pending = Pending(self, target, arg, job_file)
        try:
            with open(job_file, "wb") as f:
                pickle.dump((target, arg), f, protocol=pickle.HIGHEST_PROTOCOL)
            with self._lock:
                self._pending.append(pending)
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(f"{job_file}\n".encode())
            self.proc.stdin.flush()
        except (OSError, ValueError) as e:  # a broken pipe: it died; a full disk: no job file
            with self._lock:
                if pending in self._pending:
                    self._pending.remove(pending)
            job_file.unlink(missing_ok=True)
            self.tell(f"the helper process could not take the trace ({e}); it was digested in this process")
            pending._job_file = None
            pending._run_here(background=True)
        return pending

    def _answer_pending(self, pending: Pending) -> bool:
        """Whether ``pending`` was answered (the reader may still be handing it over)."""
        if self._reader is not None:
            self._reader.join(timeout=1.0)
        return pending._done.is_set()

    def _read(self) -> None:
        """The helper's answers, in the order the jobs were sent: ``<result file>``."""
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                pending = self._pending.pop(0) if self._pending else None
            if pending is None:
                continue
            result_file = Path(line.decode().strip())
            try:
                with open(result_file, "rb") as f:
                    ok, value = pickle.load(f)
            except Exception as e:
                ok, value = False, HelperDiedError(f"the helper's answer could not be read ({e})")
            result_file.unlink(missing_ok=True)
            pending._answered(ok, value)


# -- the helper's side -------------------------------------------------------------------


def _watch_parent(parent: int) -> None:
    """Leave as soon as the training process is gone (its pipe may outlive it in a child)."""
    while True:
        if os.getppid() != parent:
            os._exit(0)
        threading.Event().wait(1.0)


def serve() -> None:
    """The helper's loop: a job file name per line of stdin, a result file name per answer."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever a library prints goes where its errors go, not into the answers
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a notebook's interrupt is for the cell
    parent = int(os.environ.get("SWIFT_NB_HELPER_PARENT", os.getppid()))
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    for line in sys.stdin.buffer:
        job_file = Path(line.decode().strip())
        try:
            with open(job_file, "rb") as f:
                target, arg = pickle.load(f)
            answer: tuple[bool, Any] = (True, resolve(target)(arg))
        except BaseException as e:
            e.__traceback__ = None
            answer = (False, _picklable(e))
        result_file = job_file.with_name(job_file.name.replace("job", "result"))
        tmp = result_file.with_name(result_file.name + ".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(answer, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, result_file)
        answers.write(f"{result_file}\n".encode())
        answers.flush()


def _picklable(e: BaseException) -> BaseException:
    try:
        pickle.dumps(e)
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")


if __name__ == "__main__":
    serve()
