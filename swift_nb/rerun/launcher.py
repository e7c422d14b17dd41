"""Launch reruns: one worker process per variant, never touching the kernel's objects.

Each worker is its own process group (``start_new_session``), so ending it — cancel,
timeout, or clean-up after it exits — also ends every process it started (data loader
workers, anything it spawned); nothing is left behind. One rerun at a time per process:
starting another while one runs is refused (``RerunBusyError``), not queued, so two
workers never compete for the same cores or GPU and distort each other's measurements.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swift_nb.errors import ConfigError
from swift_nb.record import load_run, save
from swift_nb.rerun.worker import PROGRESS_FILE, RESULT_FILE
from swift_nb.toggles import Toggle, parse

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
    separate variants, ``+`` combines toggles, parentheses hold a toggle's parameters."""
    variants, depth, start = [], 0, 0
    parts = []
    for i, ch in enumerate(spec + ","):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(spec[start:i].strip())
            start = i + 1
    if depth:
        raise ConfigError("compare", "has unbalanced parentheses", spec)
    for part in filter(None, parts):
        toggles = []
        for item in part.split("+"):
            tid, _, params = item.strip().partition("(")
            toggles.append(parse(tid.strip(), params.rstrip(")")))
        variants.append(Variant(part.replace(" ", ""), toggles))
    if not variants:
        raise ConfigError("compare", "must name at least one toggle (e.g. flash_attention,galore)", spec)
    return variants


def magic_flags(toggles: list[Toggle]) -> str:
    """The ``%%swift_profile`` flags that apply ``toggles``."""
    from swift_nb.notebook.magic import TOGGLE_FLAGS

    flag_of = {tid: "--" + flag.replace("_", "-") for flag, tid in TOGGLE_FLAGS.items()}
    out = []
    for t in toggles:
        params = ",".join(f"{k}={v}" for k, v in t.values.items() if v is not None and v != _default(t, k))
        out.append(f"{flag_of[t.id]} {params}".strip())
    return " ".join(out)


_OWN_FLAGS = {
    "--compare",
    "--out",
    "--label",
    "--setup",
    "--timeout",
    "--flash-attn",
    "--grad-ckpt",
    "--galore",
}
_OPTIONAL_VALUE = {"--flash-attn", "--grad-ckpt", "--galore"}


def worker_line(line: str) -> str:
    """The user's ``%%swift_profile`` flags minus those a rerun sets itself (the variant's
    toggles, the comparison, the output folder — given to the worker as SWIFT_NB_DIR)."""
    tokens = shlex.split(line)
    out, i = [], 0
    while i < len(tokens):
        tok = tokens[i]
        name = tok.split("=", 1)[0]
        if name in _OWN_FLAGS:
            takes_value = "=" not in tok and (
                name not in _OPTIONAL_VALUE or (i + 1 < len(tokens) and not tokens[i + 1].startswith("--"))
            )
            i += 2 if takes_value else 1
            continue
        out.append(shlex.quote(tok))
        i += 1
    return " ".join(out)


def _default(t: Toggle, name: str) -> Any:
    return next(p.default for p in t.params if p.name == name)


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
        magic_line: str,
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
        self.spec = {
            "cells": cells,
            "cell": cell,
            "magic_line": f"{worker_line(magic_line)} {magic_flags(variant.toggles)}",
            "out_dir": str(self.out_dir),
            "cwd": os.getcwd(),
            "sys_path": [p for p in sys.path if p],
        }
        self.proc: subprocess.Popen | None = None
        self._t0 = 0.0
        self._cancelled = False

    @property
    def log_path(self) -> Path:
        return self.folder / "worker.log"

    def start(self) -> None:
        spec_path = self.folder / "spec.json"
        spec_path.write_text(json.dumps(self.spec))
        self._t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "swift_nb.rerun.worker", str(spec_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "MPLBACKEND": "Agg", WORKER_ENV: "1", "SWIFT_NB_DIR": str(self.out_dir)},
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

    def _kill_group(self) -> None:
        if self.proc is None:
            return
        for sig, grace in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                return
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and _group_alive(self.proc.pid):
                if self.proc.poll() is None:
                    try:
                        self.proc.wait(0.1)
                    except subprocess.TimeoutExpired:
                        pass
                else:
                    time.sleep(0.05)
            if not _group_alive(self.proc.pid):
                return

    def _outcome(self, timed_out: bool) -> Outcome:
        assert self.proc is not None
        wall = time.monotonic() - self._t0
        out = Outcome(self.variant.name, "ok", wall_s=wall)
        try:
            result = json.loads((self.folder / RESULT_FILE).read_text())
        except (OSError, ValueError):
            result = None
        if result is not None:
            out.run_path = result.get("run")
            out.status = result["status"]
            out.error = result.get("error")
        rc = self.proc.returncode
        if self._cancelled:
            out.status, out.error = "cancelled", "cancelled by the user"
        elif timed_out:
            out.status, out.error = "timeout", f"no result after {self.timeout_s:.0f} s; the worker was ended"
        elif result is None or (rc != 0 and out.status == "ok"):
            out.status = "crashed"
            out.error = _exit_reason(rc) + _tail(self.log_path)
        if out.run_path:
            self._tag(Path(out.run_path), out)
        if out.status == "ok":
            shutil.rmtree(self.folder, ignore_errors=True)
        else:
            out.notes.append(f"worker files: {self.folder}")
        return out

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


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _exit_reason(rc: int | None) -> str:
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
    magic_line: str,
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
            worker = Worker(cells, cell, magic_line, out_dir, variant, rerun_of, timeout_s)
            worker.start()
            report = None if on_progress is None else (lambda p, name=variant.name: on_progress(name, p))
            outcomes.append(worker.wait(report))
        return outcomes
    finally:
        _busy.release()
