"""A running run's journal: its steps, samples and notes reach the run folder while it
runs, appended at a bounded interval on a thread of its own (never on the step hook), so
a process killed without warning (SIGKILL, the OOM killer, power loss) loses at most that
interval; its record then reads ``crashed`` with everything up to then. The final save
rewrites every file whole.
"""

from __future__ import annotations

import csv
import io
import json
import math
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from swift_nb.record import (
    RUN_FILE,
    SAMPLE_COLUMNS,
    SAMPLES_FILE,
    STEP_COLUMNS,
    STEPS_FILE,
    Run,
    atomic_write_text,
)

#: the longest a killed run's record lags behind the run (s)
FLUSH_INTERVAL_S = 1.0
#: step rows kept in memory once written: older ones are dropped from the session's list
#: (``dropped`` of them), so a run of any length holds a bounded number; the run's end
#: reads them back from steps.csv (``Session._steps_table``)
KEEP_STEPS = 10_000


def _cell(v: Any) -> Any:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _csv_lines(rows: Sequence[Sequence[Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerows([[_cell(v) for v in row] for row in rows])
    return buf.getvalue()


class Journal:
    """Appends ``steps`` (the session's growing list of step rows, in ``STEP_COLUMNS``
    order) and what ``drain_samples()`` returns to the run folder every ``interval_s``,
    and rewrites ``run.json`` when the step count or the notes changed. ``on_flush`` runs
    first at each flush, on this thread (the session's alerts read the new steps there).
    Rows written are then dropped from ``steps`` but the newest ``KEEP_STEPS``: ``dropped``
    counts them, the first rows of steps.csv."""

    def __init__(
        self,
        run: Run,
        steps: list[tuple],
        drain_samples: Callable[[], list[dict[str, Any]]],
        interval_s: float | None = None,
        on_flush: Callable[[], None] = lambda: None,
    ) -> None:
        assert run.path is not None, "the run folder exists before its journal starts"
        self.folder = Path(run.path)
        self._run = run
        self._steps = steps
        self._drain = drain_samples
        self._on_flush = on_flush
        self.interval_s = FLUSH_INTERVAL_S if interval_s is None else interval_s
        self._steps_written = 0
        self.dropped = 0  # written rows removed from the front of `steps`
        self._sample_columns: list[str] | None = None
        self._meta_key: tuple[int, int] = (0, len(run.notes))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.flushes = 0
        self.flush_s = 0.0  # time spent flushing, all flushes (s)
        self.failed: str | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="swift_nb-journal", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (the final save writes everything; no last flush here)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        import time

        while not self._stop.wait(self.interval_s):
            t0 = time.perf_counter()
            try:
                self.flush()
            except Exception as e:  # a full disk must not stop the training; noted once
                if self.failed is None:
                    self.failed = f"{type(e).__name__}: {e}"
            self.flushes += 1
            self.flush_s += time.perf_counter() - t0

    def flush(self) -> None:
        seen = len(self._steps)
        self._on_flush()  # it sees at least `seen` rows: those may go once written
        n = len(self._steps)
        if n > self._steps_written:
            with open(self.folder / STEPS_FILE, "a", encoding="utf-8") as f:
                f.write(_csv_lines(self._steps[self._steps_written : n]))
                f.flush()
            self._steps_written = n
        excess = seen - KEEP_STEPS
        if excess > 0:
            # one list operation, atomic against the training thread's append
            del self._steps[:excess]
            self._steps_written -= excess
            self.dropped += excess
        samples = self._drain()
        if samples:
            self._append_samples(samples)
        key = (n + self.dropped, len(self._run.notes))
        if key != self._meta_key:
            self._meta_key = key
            self._write_meta(key[0])

    def _append_samples(self, samples: list[dict[str, Any]]) -> None:
        path = self.folder / SAMPLES_FILE
        if self._sample_columns is None:
            # the first rows fix the columns (GPU columns depend on the machine)
            extra = [k for k in samples[0] if k not in SAMPLE_COLUMNS]
            self._sample_columns = [*SAMPLE_COLUMNS, *extra]
            header = ",".join(self._sample_columns) + "\n"
            atomic_write_text(path, header)
        cols = self._sample_columns
        with open(path, "a", encoding="utf-8") as f:
            f.write(_csv_lines([[s.get(c) for c in cols] for s in samples]))
            f.flush()

    def _write_meta(self, steps: int) -> None:
        run = self._run
        meta = run.meta()
        meta["notes"] = list(run.notes)
        meta["summary"] = {**meta.get("summary", {}), "steps": steps}
        try:
            text = json.dumps(meta, indent=2, default=str)
        except RuntimeError:  # the training thread changed a dict meanwhile: next time
            self._meta_key = (-1, -1)
            return
        atomic_write_text(self.folder / RUN_FILE, text)


def steps_table(
    rows: Sequence[tuple], dropped: int, folder: Path | None, say: Callable[[str], None]
) -> pd.DataFrame:
    """steps.csv's table: ``rows`` (the newest, as ``STEP_COLUMNS``) after the ``dropped``
    older ones a long run keeps only in ``folder``'s steps.csv (``KEEP_STEPS``), read back
    exactly (repr of each float); where they cannot be, the newest alone, said."""
    newest = pd.DataFrame(rows, columns=STEP_COLUMNS)
    if not dropped or folder is None:
        return newest
    try:
        older = pd.read_csv(Path(folder) / STEPS_FILE, nrows=dropped)[STEP_COLUMNS]
    except (OSError, ValueError, KeyError) as e:  # the folder removed or its file replaced meanwhile
        say(
            f"the first {dropped} steps' rows could not be read back from {STEPS_FILE} "
            f"({type(e).__name__}: {e}); the record holds the later ones"
        )
        return newest
    return pd.concat([older, newest], ignore_index=True)
