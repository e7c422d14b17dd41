"""The folder of runs: each run's status as found, the listing, pins and retention."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from swift_nb.core.errors import ConfigError, RecordError
from swift_nb.record.finetune import FINETUNE_KEY, finetune_label
from swift_nb.record.layout import PIN_FILE, RUN_FILE, STEPS_FILE
from swift_nb.record.read import STEPS_MISSING, check_meta, is_live, load_json, status_as_found
from swift_nb.record.run import Run
from swift_nb.record.write import default_keep, default_root


class _Found(NamedTuple):
    """A run folder under a root: its checked run.json, or why it is damaged."""

    folder: Path
    meta: dict[str, Any] | None  # None: damaged
    problem: str | None  # "run.json: 'context' must be an object, got a list"
    started_at: str


def _scan(root: Path) -> list[_Found]:
    """The run folders under ``root`` (those with a run.json), oldest first; a damaged
    run.json makes its folder a ``_Found`` without meta and with the problem."""
    found: list[_Found] = []
    if not root.is_dir():
        return found
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        meta_path = folder / RUN_FILE
        if not meta_path.exists():
            continue
        raw: Any = None
        try:
            raw = load_json(meta_path)
            meta = check_meta(raw, meta_path)
        except RecordError as e:
            started = raw.get("started_at") if isinstance(raw, dict) else None
            problem = f"{RUN_FILE}: {e.problem}"
            found.append(_Found(folder, None, problem, started if isinstance(started, str) else ""))
            continue
        found.append(_Found(folder, meta, None, meta.get("started_at", "")))
    found.sort(key=lambda f: (f.started_at, f.folder.name))
    return found


#: runs()'s status of a folder whose run.json is damaged (never a record's own status).
DAMAGED = "damaged"

RUNS_COLUMNS = [
    "id",
    "label",
    "status",
    "started_at",
    "wall_s",
    "steps",
    "step_time_median_s",
    "step_time_basis",
    "peak_mem_bytes",
    "device_idle_pct",
    "device_compute_pct",
    "finetune",
    "pinned",
    "path",
    "world_size",
    "problem",
]


def _runs_row(found: _Found) -> dict[str, Any]:
    folder, meta = found.folder, found.meta
    row: dict[str, Any] = {"pinned": (folder / PIN_FILE).exists(), "path": str(folder)}
    if meta is None:
        return {
            **row,
            "id": folder.name,
            "status": DAMAGED,
            "started_at": found.started_at or None,
            "problem": found.problem,
        }
    summary = meta.get("summary", {})
    return {
        **row,
        "id": meta["id"],
        "label": meta.get("label"),
        "status": status_as_found(meta),
        "started_at": meta.get("started_at"),
        "wall_s": meta.get("wall_s"),
        "steps": summary.get("steps"),
        "step_time_median_s": summary.get("step_time_median_s"),
        "step_time_basis": summary.get("step_time_basis"),
        "device_idle_pct": summary.get("device_idle_pct"),
        "device_compute_pct": summary.get("device_compute_pct"),
        "finetune": finetune_label((meta.get("context") or {}).get(FINETUNE_KEY)) or None,
        "peak_mem_bytes": summary.get("peak_mem_bytes"),
        "world_size": meta.get("context", {}).get("world_size", 1),
        "problem": STEPS_MISSING if not (folder / STEPS_FILE).exists() else None,
    }


def runs(root: Path | str | None = None, limit: int | None = None) -> pd.DataFrame:
    """Recent runs under ``root``, newest first.

    A record left ``running`` by a process that no longer exists shows status ``crashed``.
    A folder whose run.json is damaged is a row too, status ``damaged`` (id: the folder's
    name), with what is wrong in ``problem``: listing it, rather than skipping it with a
    warning, keeps it in sight in a notebook, where warnings go unseen, and says where it
    is. ``problem`` also names a missing steps.csv.

    Args:
        root: the folder of run folders (default ``default_root()``: ``$SWIFT_NB_DIR`` or
            ``./swift_nb_runs``).
        limit: the most runs listed, the newest (default: all).

    Returns:
        A DataFrame, one row per run folder. Columns: id, label, status, started_at (ISO,
        UTC), wall_s, steps, step_time_median_s, step_time_basis (the steps it is the median
        of: ``record.write.PROFILER_OFF`` or ``EVERY_STEP``; None for a run recorded before
        it said), peak_mem_bytes, device_idle_pct,
        device_compute_pct, finetune (``LoRA r=8 · 0.9 %``; None when the run recorded none),
        pinned, path, world_size (ranks of the job; 1 for a single process), problem.
    """
    root = Path(root) if root is not None else default_root()
    found = list(reversed(_scan(root)))
    if limit is not None:
        found = found[:limit]
    rows = [_runs_row(f) for f in found]
    table = pd.DataFrame(rows, columns=RUNS_COLUMNS)
    for col in ("steps", "world_size"):  # whole numbers stay whole beside a row without one
        values = [r.get(col) for r in rows]
        table[col] = pd.Series(
            [math.nan if v is None else v for v in values], index=table.index, dtype=object
        )
    return table


def pin(run: Run | Path | str, pinned: bool = True) -> None:
    """Protect a run folder from retention (or lift the protection).

    Args:
        run: a saved Run, or its folder.
        pinned: True protects the folder, False lifts the protection (default True).
    """
    folder = run.path if isinstance(run, Run) else Path(run)
    if folder is None:
        raise ValueError("this run has not been saved yet; there is nothing to pin")
    marker = Path(folder) / PIN_FILE
    if pinned:
        marker.touch()
    else:
        marker.unlink(missing_ok=True)


def prune(root: Path | str | None = None, keep: int | None = None, spare: Path | None = None) -> list[Path]:
    """Delete the oldest finished runs beyond the newest ``keep``; return what was deleted.

    Runs still being written by a live process do not count and are never deleted: their
    own end, or any later prune, brings the folder back to ``keep``. Pinned runs do not
    count and are never deleted, nor are damaged folders (``runs()`` lists them: look
    before deleting what cannot be read).

    Args:
        root: the folder of run folders (default ``default_root()``: ``$SWIFT_NB_DIR`` or
            ``./swift_nb_runs``).
        keep: the finished runs kept (every status but a live ``running``), at least 1
            (default ``$SWIFT_NB_KEEP`` or 20).
        spare: the run folder that has just finished: one of those kept whatever its age,
            so a run that ran while a newer one started and ended is kept at its own end,
            and the other goes.

    Returns:
        The run folders deleted.
    """
    root = Path(root) if root is not None else default_root()
    keep = default_keep() if keep is None else keep
    if keep < 1:
        raise ConfigError("keep", "must be at least 1", keep)
    spare_resolved = Path(spare).resolve() if spare is not None else None
    finished = [
        f.folder
        for f in _scan(root)
        if f.meta is not None and not (f.folder / PIN_FILE).exists() and not is_live(f.meta)
    ]
    spared = [f for f in finished if f.resolve() == spare_resolved]
    others = [f for f in finished if f not in spared]
    doomed = others[: max(0, len(others) - (keep - len(spared)))]
    for folder in doomed:
        shutil.rmtree(folder, ignore_errors=True)
    return doomed
