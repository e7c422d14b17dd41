"""Work done outside the training process: one helper process, shared by the runs of a
training process (a notebook's kernel, a script).

A thread of the training process holds the GIL whenever it runs Python, and the training
thread needs the GIL between every operator, so background work there slows every step it
overlaps. What a run does with its finished trace (decode, tables, memory replay, figures)
therefore runs in a helper: a fresh interpreter at the lowest CPU priority that runs jobs
given as a ``"module:function"`` name and a picklable argument.

The helper outlives its run: it is started by the first run (or ahead of it, ``prewarm``,
as ``%load_ext swift_nb`` does), imports what the digests and figures need while nothing
waits for it, and serves every later run of the process warm, so a cell does not pay an
interpreter's start and pandas' and matplotlib's imports (about a second of CPU on a small
machine) each time. It leaves when the training process does (``atexit``, or on its own
when that process is gone), and is killed when a run ends with a job of it unanswered (an
interrupted cell): a later run starts a fresh one rather than queue behind abandoned work.

The training process writes a job into the run folder and sends its file name down the
helper's stdin; the helper writes the result beside it and answers on a pipe of its own.
Nothing the training thread does waits on the helper: it only writes a small file and a
line. If the helper cannot start, or dies before it answers, the job runs in this process
instead (``Pending.result``) and the run's notes say so once.

Run ``python -m swift_nb.capture.helper`` only as the helper.
"""

from __future__ import annotations

import atexit
import importlib
import itertools
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: the interpreter the helper runs in (a fault test points it somewhere that does not exist)
PYTHON = sys.executable
_NICE = int(os.environ.get("SWIFT_NB_HELPER_NICE", "19"))
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
#: what the helper imports as soon as it starts, before its first job asks for them: the
#: digest's modules, and the figures' where its runs write reports
WARM_DIGEST = ("swift_nb.capture.digest",)
WARM = (*WARM_DIGEST, "swift_nb.render.document", "matplotlib.pyplot")
#: the environment variable that tells the helper what to import first (commas); a process
#: whose runs write no report (a rerun's worker) sets it to the digest's modules alone
WARM_ENV = "SWIFT_NB_HELPER_WARM"


#: the jobs' folders in the temporary directory: ``swift_nb-helper-<training pid>-<random>``
_JOBS_PREFIX = "swift_nb-helper-"


def _remove_stale_jobs() -> None:
    """Remove the jobs' folders whose training process is gone: where that process and its
    helper were killed together (a process group's SIGKILL), neither could."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_JOBS_PREFIX}*-*"):
        pid = folder.name[len(_JOBS_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            pass  # alive, another user's


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

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        """Whether the job is done within ``timeout`` seconds (``result`` takes it)."""
        return self._done.wait(timeout)

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
        while not self._done.wait(0.05):
            process = self._helper.process
            dead = self._thread is None and (process is None or not process.alive)
            if dead and not (process is not None and process.answered(self)):  # it died before answering
                self._helper.tell(self._helper.death())
                self._run_here(background=False)
        if self._thread is not None:
            self._thread.join()
        if self._job_file is not None:
            self._job_file.unlink(missing_ok=True)
        if self._error is not None:
            raise self._error
        return self._value


class HelperProcess:
    """The helper interpreter: its pipes, and the jobs it has not answered yet, in order."""

    def __init__(self, warm: tuple[str, ...] = WARM) -> None:
        self.warm = warm
        self.proc: subprocess.Popen | None = None
        self.owner = os.getpid()  # a forked child (a DataLoader worker) does not own it
        self._pending: list[Pending] = []
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self.error: OSError | None = None
        # its jobs and answers, outside any run folder (a cell may remove its runs' folder),
        # named by the training process that owns them
        _remove_stale_jobs()
        self.jobs = Path(tempfile.mkdtemp(prefix=f"{_JOBS_PREFIX}{self.owner}-"))

    def start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        env["SWIFT_NB_HELPER_PARENT"] = str(os.getpid())
        env["SWIFT_NB_HELPER_JOBS"] = str(self.jobs)
        env[WARM_ENV] = ",".join(self.warm)
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
            self.error = e
            return
        # From its first instruction (its imports too) it gives way to the training: niced,
        # and on Linux in the idle class, which runs only where a core has nothing else to
        # run; a training whose intra-op threads fill every core, and spin-wait on each
        # other, is not slowed by a helper holding one of them.
        try:
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, _NICE)
            if _NICE >= 19 and hasattr(os, "SCHED_IDLE"):
                os.sched_setscheduler(self.proc.pid, os.SCHED_IDLE, os.sched_param(0))
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

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._pending)

    def send(self, pending: Pending, job_file: Path) -> None:
        """Queue ``pending`` (its job already in ``job_file``); OSError/ValueError: the pipe
        is broken (the helper died)."""
        with self._lock:
            self._pending.append(pending)
        try:
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write(f"{job_file}\n".encode())
            self.proc.stdin.flush()
        except BaseException:
            with self._lock:
                if pending in self._pending:
                    self._pending.remove(pending)
            raise

    def answered(self, pending: Pending) -> bool:
        """Whether ``pending`` was answered (the reader may still be handing it over)."""
        if self._reader is not None:
            self._reader.join(timeout=1.0)
        return pending.done

    def abandon(self, jobs: list[Pending]) -> bool:
        """Whether any of ``jobs`` is still queued here (the helper is then busy with work
        nobody waits for)."""
        with self._lock:
            return any(p in self._pending for p in jobs)

    def close(self) -> None:
        """End the helper: killed rather than waited for (an interpreter's exit costs a
        quarter second)."""
        proc = self.proc
        if os.getpid() != self.owner:
            return
        shutil.rmtree(self.jobs, ignore_errors=True)
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


_shared: HelperProcess | None = None
_shared_lock = threading.Lock()


def shared(start: bool = True, figures: bool = True) -> HelperProcess | None:
    """This process's helper, started (or started again, if it died) when ``start``;
    None where it is not running and not to be started. ``figures``: a helper started here
    imports what figures need ahead too (``$SWIFT_NB_HELPER_WARM`` decides where set); a
    run without a report needs the digest's modules alone, and saves the helper a second
    of CPU."""
    global _shared
    with _shared_lock:
        process = _shared
        if process is not None and (process.owner != os.getpid() or not process.alive):
            if process.owner == os.getpid():
                process.close()
            process = _shared = None
        if process is None and start:
            named = os.environ.get(WARM_ENV)
            warm = tuple(m for m in named.split(",") if m) if named is not None else None
            process = HelperProcess(warm if warm is not None else WARM if figures else WARM_DIGEST)
            process.start()
            if process.proc is not None:
                _shared = process
            else:
                shutil.rmtree(process.jobs, ignore_errors=True)
        return process


def prewarm() -> None:
    """Start the helper now, so that its imports are done before the first run needs it."""
    shared()


def stop_shared() -> None:
    """End this process's helper (the next run starts a fresh one)."""
    global _shared
    with _shared_lock:
        process, _shared = _shared, None
    if process is not None:
        process.close()


atexit.register(stop_shared)


class Helper:
    """One run's use of the helper process. ``folder``: where its jobs and results are
    written (the run's folder); ``note``: where a problem is told (the run's notes), once."""

    def __init__(self, folder: Path, note: Callable[[str], None]) -> None:
        self.folder = folder
        self._note = note
        self._told = False
        self.process: HelperProcess | None = None
        self._jobs: list[Pending] = []
        self._count = itertools.count(1)

    def start(self, launch: bool = True, figures: bool = True) -> None:
        """Take this process's helper, starting it where none runs (``launch``; else only
        one already running; ``figures``: as ``shared`` takes it). Never raises: without
        one, jobs run in this process."""
        process = shared(start=launch, figures=figures)
        if process is not None and process.proc is None:
            self.tell(
                f"the helper process could not start ({process.error}); the trace was digested in this process"
            )
            return
        self.process = process

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.alive

    def death(self) -> str:
        proc = self.process.proc if self.process is not None else None
        code = proc.returncode if proc is not None else None
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return f"the helper process ended before it finished ({how}); the trace was digested in this process"

    def tell(self, message: str) -> None:
        if not self._told:
            self._told = True
            self._note(message)

    def close(self) -> None:
        """The run is over: a helper still working on a job of it is ended (nobody waits
        for that work, and the next run should not queue behind it); an idle one serves the
        next run."""
        process = self.process
        self.process = None
        if process is not None and process.abandon(self._jobs):
            if _shared is process:
                stop_shared()
            else:
                process.close()
        for job in self._jobs:
            if not job.done and job._job_file is not None:
                job._job_file.unlink(missing_ok=True)
        self._jobs.clear()

    def submit(self, target: str, arg: Any) -> Pending:
        """Give the helper ``target(arg)`` to run; the training thread only writes a small
        file and a line."""
        process = self.process
        if process is None or not process.alive:
            if process is not None:
                self.tell(self.death())
            pending = Pending(self, target, arg, None)
            pending._run_here(background=True)
            return pending
        job_file = process.jobs / f"job{next(self._count)}-{id(self)}.pkl"
        pending = Pending(self, target, arg, job_file)
        try:
            with open(job_file, "wb") as f:
                pickle.dump((target, arg), f, protocol=pickle.HIGHEST_PROTOCOL)
            process.send(pending, job_file)
        except (OSError, ValueError) as e:  # a broken pipe: it died; a full disk: no job file
            job_file.unlink(missing_ok=True)
            self.tell(f"the helper process could not take the trace ({e}); it was digested in this process")
            pending._job_file = None
            pending._run_here(background=True)
            return pending
        self._jobs.append(pending)
        return pending


# -- the helper's side -------------------------------------------------------------------


def _watch_parent(parent: int) -> None:
    """Leave as soon as the training process is gone (its pipe may outlive it in a child)."""
    while True:
        if os.getppid() != parent:
            _leave()
        threading.Event().wait(1.0)


def _leave() -> None:
    """End the helper, and remove its jobs' folder: a training process that ended without
    its ``atexit`` (``os._exit``, a signal, a rank torn down) cannot."""
    jobs = os.environ.get("SWIFT_NB_HELPER_JOBS")
    if jobs:
        shutil.rmtree(jobs, ignore_errors=True)
    os._exit(0)


def _warm() -> None:
    """Import what jobs need, while no job waits (a failure shows when a job imports it)."""
    named = os.environ.get(WARM_ENV)
    for name in named.split(",") if named is not None else WARM:
        if not name:
            continue
        try:
            importlib.import_module(name)
        except Exception:
            pass


def serve() -> None:
    """The helper's loop: a job file name per line of stdin, a result file name per answer."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever a library prints goes where its errors go, not into the answers
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a notebook's interrupt is for the cell
    os.environ.setdefault("MPLBACKEND", "Agg")  # figures are drawn into PNGs, never shown
    parent = int(os.environ.get("SWIFT_NB_HELPER_PARENT", os.getppid()))
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    _warm()
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
    _leave()  # stdin closed: the training process closed it, or is gone


def _picklable(e: BaseException) -> BaseException:
    try:
        pickle.dumps(e)
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")


if __name__ == "__main__":
    serve()
