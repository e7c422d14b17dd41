"""Launch reruns: one worker process per variant, never touching the kernel's objects.

A single-process worker is forked from the session's warm fork server
(``swift_nb.rerun.forkserver``: torch and the session's training libraries already
imported), or started fresh (``python -m swift_nb.rerun.worker SPEC``) where forking is
off or cannot be done safely. Either way each worker is its own process group, so ending
it — cancel, timeout, or clean-up after it exits — also ends every process it started
(data loader workers, anything it spawned); nothing is left behind. One rerun at a time per process:
starting another while one runs is refused (``RerunBusyError``), not queued, so two
workers never compete for the same cores or GPU and distort each other's measurements.

A variant whose toggles need several processes (``sequence_parallel(sp_size=P)``) runs
as one job of P workers under torch's elastic launcher (``python -m
torch.distributed.run``, rendezvous on 127.0.0.1 at a free port, no restarts). When a
rank fails, the launcher stops the other ranks; the rerun fails with the first failing
rank's traceback, and the whole process group (launcher and ranks) is ended after.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from swift_nb import vocabulary
from swift_nb.capture import helper
from swift_nb.record import RUN_FILE, load_run, new_run_id, save
from swift_nb.rerun import forkserver
from swift_nb.rerun.files import PROGRESS_FILE, result_file
from swift_nb.toggles import Toggle, get
from swift_nb.vocabulary.options import ProfileOptions

WORKER_ENV = "SWIFT_NB_RERUN_WORKER"  # set inside workers: a replayed cell never starts reruns
DEFAULT_TIMEOUT_S = float(os.environ.get("SWIFT_NB_RERUN_TIMEOUT_S", 3600))
_busy = threading.Lock()


class RerunBusyError(RuntimeError):
    """A rerun is already in progress in this process."""


@dataclass
class Variant:
    """A named set of toggles (the baseline has none)."""

    name: str
    toggles: list[Toggle] = field(default_factory=list)


def parse_variants(spec: str) -> list[Variant]:
    """``"flash_attention,grad_checkpointing+galore(rank=64,gap=200)"`` → variants: commas
    separate variants, ``+`` combines toggles, parentheses hold a toggle's parameters
    (``swift_nb.vocabulary``'s grammar)."""
    return [
        Variant(name, [get(tid, **params) for tid, params in toggles])
        for name, toggles in vocabulary.parse_variants(spec)
    ]


def magic_flags(toggles: list[Toggle]) -> list[str]:
    """The ``%%swift_profile`` flags that apply ``toggles`` (those the magic has a flag for;
    the worker applies the others itself, see ``unflagged``)."""
    out = []
    for t in toggles:
        flag = vocabulary.flag_of(t.id)
        if flag is None:
            continue
        out.append(flag)
        params = ",".join(f"{k}={v}" for k, v in vocabulary.TOGGLES[t.id].changed(t.values).items())
        if params:
            out.append(params)
    return out


def unflagged(toggles: list[Toggle]) -> list[dict[str, Any]]:
    """The toggles the magic has no flag for, as the worker's spec lists them."""
    return [{"toggle": t.id, "params": dict(t.values)} for t in toggles if vocabulary.flag_of(t.id) is None]


def processes(toggles: list[Toggle]) -> int:
    """Worker processes a variant needs (a toggle's ``processes``, e.g. sequence_parallel's
    sp_size; 1 otherwise)."""
    return max((t.processes for t in toggles), default=1)


@dataclass
class Outcome:
    """How one variant's rerun ended. status: ok | failed | crashed | timeout | cancelled."""

    variant: str
    status: str
    run_path: str | None = None
    error: str | None = None
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)


class Worker:
    """One rerun process. ``start()``, then ``progress()`` while it runs, ``wait()``."""

    def __init__(
        self,
        cells: list[str],
        cell: str,
        options: ProfileOptions | str,
        out_dir: Path,
        variant: Variant,
        rerun_of: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.variant = variant
        self.out_dir = Path(out_dir)
        self.rerun_of = rerun_of
        self.timeout_s = timeout_s or DEFAULT_TIMEOUT_S
        self.folder = Path(tempfile.mkdtemp(prefix=f"swift_nb-rerun-{variant.name[:40]}-"))
        base = ProfileOptions.from_line(options) if isinstance(options, str) else options
        # the comparison reads the records' tables; each rerun's own report waits for
        # `swift-nb report RUN_DIR` (it would add seconds to every variant)
        self.options = base.replace(
            label=variant.name,
            out_dir=str(self.out_dir),
            run_id=new_run_id(variant.name),
            report=False,
        )
        #: the run folder the worker writes (a job folder when several ranks)
        self.run_path = self.out_dir / str(self.options.run_id)
        self.spec = {
            "cells": cells,
            "cell": cell,
            "magic_line": shlex.join([*self.options.to_argv(), *magic_flags(variant.toggles)]),
            "toggles": unflagged(variant.toggles),
            "run_dir": str(self.run_path),
            "cwd": os.getcwd(),
            "sys_path": [p for p in sys.path if p],
        }
        self.nproc = processes(variant.toggles)
        self._groups: set[int] = set()  # the ranks' process groups (several workers)
        self.proc: subprocess.Popen | forkserver.Forked | None = None
        self._t0 = 0.0
        self._cancelled = False

    @property
    def log_path(self) -> Path:
        return self.folder / "worker.log"

    def start(self) -> None:
        spec_path = self.folder / "spec.json"
        spec_path.write_text(json.dumps(self.spec))
        self._t0 = time.monotonic()
        env = {**os.environ, "MPLBACKEND": "Agg", WORKER_ENV: "1"}
        # its run writes no report: its helper imports the digest's modules alone
        env[helper.WARM_ENV] = ",".join(helper.WARM_DIGEST)
        cmd = [sys.executable, "-m", "swift_nb.rerun.worker", str(spec_path)]
        if self.nproc == 1:
            self.log_path.write_bytes(b"")
            self.proc = forkserver.fork_worker(spec_path, self.log_path, env)
            if self.proc is not None:
                return
        else:
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "1",
                "--nproc-per-node",
                str(self.nproc),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{_free_port()}",
                "--max-restarts",
                "0",
                "--monitor-interval",
                "0.2",
                *cmd[1:],
            ]
            # torchrun would set 1 (with a warning) when unset; share the cores instead.
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.nproc)))
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )

    def progress(self) -> dict[str, Any]:
        try:
            return json.loads((self.folder / PROGRESS_FILE).read_text())
        except (OSError, ValueError):
            return {"phase": "starting"}

    def cancel(self) -> None:
        self._cancelled = True
        self._kill_group()

    def wait(
        self, on_progress: Callable[[dict[str, Any]], None] | None = None, poll_s: float = 0.5
    ) -> Outcome:
        assert self.proc is not None, "start() first"
        timed_out = False
        try:
            while self.proc.poll() is None:
                if time.monotonic() - self._t0 > self.timeout_s:
                    timed_out = True
                    self._kill_group()
                    break
                self._track()
                if on_progress is not None:
                    on_progress(self.progress())
                try:
                    self.proc.wait(poll_s)
                except subprocess.TimeoutExpired:
                    pass
        except BaseException:  # Ctrl-C in the kernel cancels the rerun
            self.cancel()
            raise
        finally:
            self.proc.wait()
            self._kill_group()  # whatever the worker started and left behind
        return self._outcome(timed_out)

    def _track(self) -> None:
        """Remember the process groups of the job's ranks: torchrun starts each rank in a
        session of its own, outside the launcher's group, and once the launcher is gone
        they can no longer be found through it."""
        if self.nproc == 1 or self.proc is None:
            return
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            try:
                self._groups.add(os.getpgid(child.pid))
            except (ProcessLookupError, PermissionError):
                continue

    def _kill_group(self) -> None:
        if self.proc is None:
            return
        self._track()
        groups = {self.proc.pid} | self._groups
        for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0.0)):
            groups = {g for g in groups if _group_alive(g)}
            if not groups:
                return
            for g in groups:
                try:
                    os.killpg(g, sig)
                except (ProcessLookupError, PermissionError):
                    continue
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(_group_alive(g) for g in groups):
                if self.proc.poll() is None:
                    try:
                        self.proc.wait(0.1)
                    except subprocess.TimeoutExpired:
                        pass
                else:
                    time.sleep(0.05)

    def _outcome(self, timed_out: bool) -> Outcome:
        assert self.proc is not None
        wall = time.monotonic() - self._t0
        out = Outcome(self.variant.name, "ok", wall_s=wall)
        results = self._results()
        if 0 in results and (self.run_path / RUN_FILE).is_file():
            out.run_path = str(self.run_path)
        failed = self._failed_ranks(results)
        if failed:
            rank, first = failed[0]
            out.status = first["status"]
            out.error = first.get("error") if self.nproc == 1 else f"rank {rank}: {first.get('error')}"
            if len(failed) > 1:
                out.notes.append(f"ranks that failed too: {', '.join(str(r) for r, _ in failed[1:])}")
        rc = self.proc.returncode
        # a forked worker whose server ended first: its status is lost, its result is not
        lost = getattr(self.proc, "lost", False)
        ended_badly = rc != 0 and not lost
        if self._cancelled:
            out.status, out.error = "cancelled", "cancelled by the user"
        elif timed_out:
            out.status, out.error = "timeout", f"no result after {self.timeout_s:.0f} s; the worker was ended"
        elif not failed and (len(results) < self.nproc or ended_badly):
            out.status = "crashed"
            out.error = _exit_reason(rc, lost) + _tail(self.log_path)
        if out.run_path:
            self._tag(Path(out.run_path), out)
        if out.status == "ok":
            shutil.rmtree(self.folder, ignore_errors=True)
        else:
            out.notes.append(f"worker files: {self.folder}")
        return out

    def _results(self) -> dict[int, dict[str, Any]]:
        """Each rank's result (rank 0 alone for a single worker), with when it was written."""
        out = {}
        for rank in range(self.nproc):
            path = self.folder / result_file(rank)
            try:
                out[rank] = {**json.loads(path.read_text()), "_mtime": path.stat().st_mtime}
            except (OSError, ValueError):
                continue
        return out

    @staticmethod
    def _failed_ranks(results: dict[int, dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
        """Ranks that did not finish ok, the first to fail first: the others usually
        failed because it did (stopped by the elastic launcher, or timed out waiting)."""
        failed = [(r, res) for r, res in results.items() if res.get("status") != "ok"]
        return sorted(failed, key=lambda item: item[1]["_mtime"])

    def _tag(self, path: Path, out: Outcome) -> None:
        """Mark the worker's run record as a rerun (of which run, which variant)."""
        try:
            run = load_run(path)
        except Exception as e:
            out.notes.append(f"the rerun's record could not be read ({e})")
            return
        run.context["rerun_of"] = self.rerun_of
        run.context["variant"] = self.variant.name
        save(run)
        out.notes.extend(
            n for t in run.context.get("toggles", []) for n in t.get("notes", []) if isinstance(n, str)
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` runs. Zombies do not count: a worker's helper
    that outlived it is reparented to pid 1, and in a container pid 1 may never reap it."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                return True
        except (ProcessLookupError, PermissionError):
            continue
    return False


def _exit_reason(rc: int | None, lost: bool = False) -> str:
    if lost:
        return "the worker ended after its fork server; its exit status is unknown"
    if rc is not None and rc < 0:
        name = signal.Signals(-rc).name
        why = " (out of memory, or killed from outside)" if -rc == signal.SIGKILL else ""
        return f"the worker was killed by {name}{why}"
    return f"the worker exited with code {rc} without a result"


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace").rstrip().splitlines()[-lines:]
    except OSError:
        return ""
    return ("; last output:\n" + "\n".join(text)) if text else ""


def run_variants(
    cells: list[str],
    cell: str,
    options: ProfileOptions | str,
    variants: list[Variant],
    out_dir: Path,
    rerun_of: str | None = None,
    timeout_s: float | None = None,
    on_progress: Callable[[str, dict[str, Any]], None] | None = None,
) -> list[Outcome]:
    """A baseline rerun, then one rerun per variant, one after another; a failing variant
    never stops the others. Refused while another rerun runs in this process."""
    if os.environ.get(WORKER_ENV):
        raise RerunBusyError("this is a rerun worker: reruns cannot start reruns (the cell was skipped)")
    if not _busy.acquire(blocking=False):
        raise RerunBusyError("a rerun is already in progress; wait for it to finish (or cancel it) first")
    try:
        outcomes = []
        for variant in [Variant("baseline"), *variants]:
            worker = Worker(cells, cell, options, out_dir, variant, rerun_of, timeout_s)
            worker.start()
            report = None if on_progress is None else (lambda p, name=variant.name: on_progress(name, p))
            outcomes.append(worker.wait(report))
        return outcomes
    finally:
        _busy.release()
