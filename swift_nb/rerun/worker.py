"""A rerun's worker process: ``python -m swift_nb.rerun.worker SPEC.json``.

Replays the spec's cells in a fresh IPython shell (so magics work), then runs the
profiled cell under ``%%swift_profile`` with the variant's options (its run folder among
them: ``--out DIR --run-id ID``) and toggle flags, and writes
``result.json`` beside the spec. Progress (which cell, how many optimizer steps) goes to
``progress.json`` twice a second; the user's output goes to the log the launcher chose.

Under torchrun (``WORLD_SIZE`` > 1: a variant with ``sequence_parallel``), every rank
initialises the default process group from torchrun's environment before replaying
(NCCL when CUDA is available, the device taken from ``LOCAL_RANK``; gloo otherwise),
replays the same cells and profiles itself; rank 0 writes ``result.json`` and the
progress, rank R > 0 ``result.rank<R>.json``. Toggles without a magic flag (the spec's
``toggles``) are applied on every rank around the profiled cell; rank 0 adds their
reports to the job record.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from swift_nb.record import RUN_FILE, atomic_write_text
from swift_nb.rerun.files import PROGRESS_FILE, result_file
from swift_nb.toggles import applied, get

#: how long a rank waits in a collective for a peer before failing (s)
PG_TIMEOUT_S = float(os.environ.get("SWIFT_NB_RERUN_PG_TIMEOUT_S", 600))


def init_distributed() -> int:
    """Join the job torchrun started (nothing to do for a single process); returns the rank."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return 0
    import torch.distributed as dist

    backend = "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "nccl"
    dist.init_process_group(backend, timeout=timedelta(seconds=PG_TIMEOUT_S))
    return dist.get_rank()


class Progress:
    """Counts optimizer steps (any optimizer) and publishes the state to a file."""

    def __init__(self, path: Path, n_cells: int) -> None:
        self.path = path
        self.state: dict[str, Any] = {"phase": "replay", "cell": 0, "cells": n_cells, "steps": 0}
        self._stop = threading.Event()
        self._hook = register_optimizer_step_post_hook(self._on_step)
        self._thread = threading.Thread(
            target=self._publish_loop, name="swift_nb-rerun-progress", daemon=True
        )
        self._thread.start()

    def _on_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.state["steps"] += 1

    def set(self, **kv: Any) -> None:
        self.state.update(kv)
        self.publish()

    def publish(self) -> None:
        atomic_write_text(self.path, json.dumps({**self.state, "time": time.time()}))

    def _publish_loop(self) -> None:
        while not self._stop.wait(0.5):
            self.publish()

    def close(self) -> None:
        self._stop.set()
        self._hook.remove()
        self.publish()


def run(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    folder = spec_path.parent
    os.chdir(spec.get("cwd") or os.getcwd())
    for p in reversed(spec.get("sys_path", [])):
        if p not in sys.path:
            sys.path.insert(0, p)
    rank = int(os.environ.get("RANK", "0"))
    cells: list[str] = spec["cells"]
    progress_name = PROGRESS_FILE if rank == 0 else f"progress.rank{rank}.json"
    progress = Progress(folder / progress_name, len(cells))
    result: dict[str, Any] = {"status": "ok", "run": None, "error": None, "failed_cell": None, "rank": rank}
    try:
        rank = init_distributed()
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
        for i, code in enumerate(cells):
            progress.set(cell=i + 1)
            res = shell.run_cell(code, store_history=True)
            if not res.success:
                err = res.error_before_exec or res.error_in_exec
                result.update(
                    status="failed", failed_cell=i + 1, error=_describe(err, f"replayed cell {i + 1}")
                )
                return 1
        progress.set(phase="profile", cell=len(cells), steps=0)
        shell.run_line_magic("load_ext", "swift_nb")
        # The magic runs the cell as an inner run_cell and then marks the outer one failed
        # with its own marker exception: keep the inner (the user's) error.
        errors: list[BaseException] = []
        shell.events.register(
            "post_run_cell",
            lambda r: errors.append(r.error_before_exec or r.error_in_exec) if not r.success else None,
        )
        # toggles the magic has no flag for ({"toggle": id, "params": {...}}), applied on
        # every rank around the profiled cell; their reports go to the run record
        toggles = [get(t["toggle"], **t.get("params", {})) for t in spec.get("toggles") or []]
        with applied(shell.user_ns, toggles) as reports:
            res = shell.run_cell(f"%%swift_profile {spec['magic_line']}\n{spec['cell']}", store_history=True)
        if rank == 0 and (Path(spec["run_dir"]) / RUN_FILE).is_file():
            result["run"] = spec["run_dir"]
            _record_toggles(result["run"], reports)
        if not res.success:
            err = next((e for e in errors if type(e).__name__ != "ProfiledCellError"), None)
            err = err or res.error_before_exec or res.error_in_exec
            result.update(status="failed", error=_describe(err, "the profiled cell"))
            return 1
        return 0
    except BaseException as e:  # report anything, then exit non-zero
        result.update(status="failed", error=_describe(e, "the worker"))
        return 1
    finally:
        progress.set(phase="done")
        progress.close()
        atomic_write_text(folder / result_file(rank), json.dumps(result))
        sys.stdout.flush()
        sys.stderr.flush()


def _record_toggles(run_path: str | None, reports: list[Any]) -> None:
    """Add the reports of the toggles applied around the magic to its run record."""
    reports = [r for r in reports if r is not None]
    if not reports or run_path is None:
        return
    from swift_nb.record import load_run, save

    for r in reports:
        print(r)
    run = load_run(run_path)
    run.context["toggles"] = [*(run.context.get("toggles") or []), *(r.to_dict() for r in reports)]
    save(run)


def _describe(err: BaseException | None, where: str) -> str:
    if err is None:
        return f"{where} failed"
    lines = traceback.format_exception(type(err), err, err.__traceback__)
    return f"{where} raised:\n" + "".join(lines[-12:])


if __name__ == "__main__":
    code = run(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown (torch's takes seconds); everything is written already
    os._exit(code)
