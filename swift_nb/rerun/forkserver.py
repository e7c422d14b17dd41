"""A warm process that forks the rerun workers, so that each variant starts in a second.

A fresh worker process pays, before it replays a line, for importing torch, for the
import that torch's first optimizer triggers (``torch._dynamo``) and for the training
libraries the replayed cells import: 5 s of CPU on a laptop core for torch alone, twice
that with transformers. The fork server pays it once per session. Started at the first
rerun, it imports torch, ``torch._dynamo``, IPython's shell, the worker, and the modules
of the training libraries the session has imported (``LIBRARIES``); then it forks one
worker per variant. Each forked worker is what ``python -m swift_nb.rerun.worker SPEC``
would be: its own session (``setsid``: ending it ends all it started), the launcher's
environment, its log as stdout and stderr, stdin from ``/dev/null``; ``ps`` names it
``swift_nb-rerun``.

Forking is safe because the server never runs a tensor operation, never touches CUDA,
and starts no Python thread; it checks so after its imports, and when a module it
imported broke that, it says so and the launcher starts fresh processes instead. It is
reused only while the session's environment is the one it started with (``VOLATILE``
aside; libraries read some variables once, at import: OMP_NUM_THREADS, the Hugging Face
paths); another environment starts another server, and the old one ends when its workers
have. It ends when the session closes its stdin, or after
``SWIFT_NB_RERUN_FORKSERVER_IDLE_S`` (600 s) without a worker. ``SWIFT_NB_RERUN_FORK=0``
turns it off: every worker a fresh process.

The protocol is JSON lines: requests on the server's stdin (``{"preload": [...],
"sys_path": [...]}`` first, then ``{"spec": ..., "log": ..., "env": {...}}`` per worker),
replies on its stdout (``{"ready": true}`` or ``{"ready": false, "why": ...}``, then
``{"started": PID}`` per request and ``{"exited": PID, "rc": RC}`` per worker, RC as
``subprocess`` gives it: negative for a signal).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

import psutil

FORK_ENV = "SWIFT_NB_RERUN_FORK"
IDLE_ENV = "SWIFT_NB_RERUN_FORKSERVER_IDLE_S"
#: how long the session waits for a server to import what it preloads (s); past it, the
#: worker starts as a fresh process and the server keeps starting for the next one
READY_TIMEOUT_S = 120.0
#: the process name (``ps``, ``top``) of a forked worker
WORKER_NAME = "swift_nb-rerun"
#: torch asks NVML, not the CUDA driver, whether CUDA is there, where this is "1"
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
#: what every worker imports, whatever the session's cells do
ALWAYS = ("torch", "torch._dynamo", "IPython.core.interactiveshell", "swift_nb.rerun.worker")
#: training libraries whose imported modules the server imports too when the session has
LIBRARIES = (
    "accelerate",
    "bitsandbytes",
    "cut_cross_entropy",
    "datasets",
    "diffusers",
    "einops",
    "galore_torch",
    "liger_kernel",
    "numpy",
    "pandas",
    "peft",
    "safetensors",
    "timm",
    "tokenizers",
    "torchvision",
    "transformers",
    "trl",
)
#: variables that change under a session without changing what an import reads (pytest
#: names the running test in one); a worker still gets them as they are
VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})
_SERVE = "from swift_nb.rerun.forkserver import serve; serve()"


def enabled() -> bool:
    """Whether workers are forked (Linux; ``SWIFT_NB_RERUN_FORK`` not ``0``)."""
    return sys.platform.startswith("linux") and os.environ.get(FORK_ENV, "1") != "0"


def preloads(modules: dict[str, Any] | None = None) -> list[str]:
    """The modules a server imports for this session: the session's modules of
    ``LIBRARIES``, in the order the session imported them. Not torch's beyond ``ALWAYS``:
    a session imports many that a worker never needs (and inductor's may start its
    compile workers)."""
    names = list(modules if modules is not None else sys.modules)
    return [
        n
        for n in names
        if n.split(".", 1)[0] in LIBRARIES and not any(part.startswith("__") for part in n.split("."))
    ]


# -- the session's side ------------------------------------------------------------------


class Forked:
    """A forked worker, as much of ``subprocess.Popen`` as the launcher uses: ``pid``,
    ``returncode``, ``poll()``, ``wait(timeout)``. ``lost`` is set when the server ended
    before the worker: its exit status is unknown (``returncode`` 1)."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid
        self.returncode: int | None = None
        self.lost = False

    def poll(self) -> int | None:
        if self.returncode is None:
            rc = self.server.exit_status(self.pid)
            if rc is not None:
                self.returncode = rc
            elif not self.server.alive() and not _pid_alive(self.pid):
                self.returncode, self.lost = 1, True
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(WORKER_NAME, timeout or 0.0)
            self.server.wait_for_exit(min(left, 0.5) if left is not None else 0.5)
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    """One server process, seen from the session. ``fork(spec, log, env)`` starts a
    worker; ``ready()`` whether it can (it waits for the server's imports)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = dict(env)
        self.why_not: str | None = None
        self._ready = threading.Event()
        self._ok = False
        self._changed = threading.Condition()
        self._exits: dict[int, int] = {}
        self._started: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # one request at a time
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,  # the kernel's Ctrl-C is not the server's
        )
        self._send({"preload": preloads(), "sys_path": [p for p in sys.path if p]})
        threading.Thread(target=self._read, name="swift_nb-forkserver", daemon=True).start()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        """Whether the server can fork workers, waiting up to ``timeout`` for its imports."""
        self._ready.wait(timeout)
        return self._ok and self.alive()

    def fork(self, spec: Path, log: Path, env: dict[str, str]) -> Forked:
        """A worker for ``spec``, forked. Raises ``OSError`` when the server cannot."""
        with self._lock:
            self._send({"spec": str(spec), "log": str(log), "env": env})
            reply = self._next_started(timeout=30.0)
        if "started" not in reply:
            raise OSError(f"the rerun fork server could not fork: {reply.get('error', reply)}")
        return Forked(self, int(reply["started"]))

    def exit_status(self, pid: int) -> int | None:
        with self._changed:
            return self._exits.get(pid)

    def wait_for_exit(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait(timeout)

    def close(self) -> None:
        """Stop taking requests: the server ends when its last worker has."""
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def _next_started(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not self._started:
                left = deadline - time.monotonic()
                if left <= 0 or not self.alive():
                    return {"error": "no reply from the server"}
                self._changed.wait(min(left, 0.5))
            return self._started.pop(0)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            with self._changed:
                if "ready" in message:
                    self._ok, self.why_not = bool(message["ready"]), message.get("why")
                    self._ready.set()
                elif "exited" in message:
                    self._exits[int(message["exited"])] = int(message["rc"])
                else:
                    self._started.append(message)
                self._changed.notify_all()
        with self._changed:
            self.why_not = self.why_not or f"the server ended (exit code {self.proc.wait()})"
            self._ready.set()
            self._changed.notify_all()


_server: ForkServer | None = None
_server_lock = threading.Lock()


def server_for(env: dict[str, str]) -> ForkServer:
    """This session's server for workers of environment ``env``: the running one, or a
    new one when there is none, it ended, or it started with another environment."""
    global _server
    with _server_lock:
        if _server is not None and (not _same(_server.env, env) or not _server.alive()):
            _server.close()
            _server = None
        if _server is None:
            _server = ForkServer(env)
        return _server


def _same(a: dict[str, str], b: dict[str, str]) -> bool:
    """Whether two environments are the same to a server's imports (``VOLATILE`` aside)."""
    return {k: v for k, v in a.items() if k not in VOLATILE} == {
        k: v for k, v in b.items() if k not in VOLATILE
    }


def fork_worker(spec: Path, log: Path, env: dict[str, str]) -> Forked | None:
    """A worker forked from this session's server, or None where forking is off or the
    server could not start (the caller starts a fresh process)."""
    if not enabled():
        return None
    server = server_for(env)
    if not server.ready():
        return None
    try:
        return server.fork(spec, log, env)
    except OSError:
        return None


# -- the server's side -------------------------------------------------------------------


def serve() -> None:
    """The server: preload, check it is safe to fork, then fork a worker per request."""
    protocol = os.dup(1)  # replies go here; stray prints of imports go to /dev/null
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)
    requests = _Lines(0)
    first = requests.next(timeout=None)
    if first is None:
        return
    why = _preload(first)
    _reply(protocol, {"ready": why is None, **({"why": why} if why else {})})
    if why is None:
        _loop(requests, protocol, float(os.environ.get(IDLE_ENV, 600)))


def _preload(first: dict[str, Any]) -> str | None:
    """Import what workers would; None when it is safe to fork, else why not."""
    for p in reversed(first.get("sys_path", [])):
        if p not in sys.path:
            sys.path.insert(0, p)
    return preload([*ALWAYS, *first.get("preload", [])])


def preload(names: Iterable[str]) -> str | None:
    """Import ``names`` (one that fails is left to the children) in a process that will
    fork, then ``fork_unsafe()``. While they import, a library that asks torch whether CUDA
    is there asks NVML, not the CUDA driver (``PYTORCH_NVML_BASED_CUDA_CHECK``): a driver
    initialised before ``fork()`` fails in every child. The variable is put back after."""
    before = os.environ.get(NVML_CHECK)
    os.environ[NVML_CHECK] = "1"
    try:
        for name in names:
            with contextlib.suppress(Exception):
                importlib.import_module(name)
    finally:
        if before is None:
            os.environ.pop(NVML_CHECK, None)
        else:
            os.environ[NVML_CHECK] = before
    return fork_unsafe()


def fork_unsafe() -> str | None:
    """Why this process cannot fork children safely (a thread besides this one; CUDA
    initialised or its driver loaded), or None."""
    if threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.current_thread())
        return f"an imported module started a thread ({names})"
    torch = sys.modules.get("torch")
    if (torch is not None and torch.cuda.is_initialized()) or cuda_driver_loaded():
        return "an imported module initialised CUDA"
    return None


def cuda_driver_loaded(maps: str | None = None) -> bool:
    """Whether this process has loaded the CUDA driver (``libcuda.so``): the CUDA runtime
    loads it at its first call, which initialises it for this process alone. ``maps``:
    the text of ``/proc/self/maps`` (read when None)."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return False
    return any(line.rsplit("/", 1)[-1].startswith("libcuda.so") for line in maps.splitlines())


def _loop(requests: _Lines, protocol: int, idle_s: float) -> None:
    children: set[int] = set()
    idle_since = time.monotonic()
    while True:
        if requests.open:
            request = requests.next(timeout=0.2)
            if request is not None:
                children.add(_fork(request, protocol, requests.fd))
        else:
            time.sleep(0.2)
        for pid, rc in _reap(children):
            _reply(protocol, {"exited": pid, "rc": rc})
        if children:
            idle_since = time.monotonic()
        elif not requests.open or time.monotonic() - idle_since > idle_s:
            return


def _fork(request: dict[str, Any], protocol: int, stdin: int) -> int:
    """Fork a worker; reply once it leads its own session (a kill of its group reaches it)."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _child(request, protocol, stdin, write)
    os.close(write)
    os.read(read, 1)  # the child's setsid, or its end
    os.close(read)
    _reply(protocol, {"started": pid})
    return pid


def _reap(children: set[int]) -> list[tuple[int, int]]:
    ended = []
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            children.discard(pid)
            ended.append((pid, os.waitstatus_to_exitcode(status)))
    return ended


def _child(request: dict[str, Any], protocol: int, stdin: int, started: int) -> NoReturn:
    """In the forked worker: the session, the files, the environment, then the worker."""

    def body() -> int:
        os.setsid()
        os.write(started, b"1")
        os.close(started)
        os.close(protocol)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, stdin)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.environ.clear()
        os.environ.update(request["env"])
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _name(WORKER_NAME)
        from swift_nb.rerun import worker

        sys.argv = [worker.__file__, request["spec"]]  # as ``python -m swift_nb.rerun.worker SPEC``
        return worker.run(Path(request["spec"]))

    child_exits(body)


def child_exits(body: Callable[[], int]) -> NoReturn:
    """End a forked child with ``body()``'s exit code, never returning into the parent's
    code: an exception, printed to the child's stderr (its log), exits 1; the standard
    streams are flushed first (``os._exit`` skips it)."""
    code = 1
    try:
        code = body()
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _name(name: str) -> None:
    """The process's name as ``ps`` shows it (Linux ``prctl(PR_SET_NAME)``)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)


def _reply(fd: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie that no one reaped has ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


class _Lines:
    """JSON lines from a file descriptor, without a thread: ``next(timeout)``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.open = True
        self._buffer = b""

    def next(self, timeout: float | None) -> dict[str, Any] | None:
        while b"\n" not in self._buffer:
            if not self.open:
                return None
            ready, _, _ = select.select([self.fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.open = False
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)
