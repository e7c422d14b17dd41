"""Which code a rerun replays: the session's executed cells, in order, without the ones
that failed.

IPython keeps every executed input (``history_manager.input_hist_raw``, indexed by
execution count) but not whether it succeeded; ``install`` adds a ``post_run_cell``
listener that remembers failures from then on (``%load_ext swift_nb`` installs it).

Replayed cells: magics stay (so ``%load_ext`` and ``%%time`` work); an earlier
``%%swift_profile`` cell is replayed without its magic line (its training runs, nothing
is profiled); cells that only list runs are dropped; a cell whose first line is
``# swift_nb: skip`` is never replayed (mark cells with external side effects — writing
files, sending messages — that way). Instead of the history, a setup file can be given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SKIP_MARK = "# swift_nb: skip"
_FAILED = "_swift_nb_failed_cells"


def install(shell: Any) -> None:
    """Remember which cells fail from now on (idempotent)."""
    if getattr(shell, _FAILED, None) is not None:
        return
    failed: set[int] = set()
    setattr(shell, _FAILED, failed)

    def post_run_cell(result: Any) -> None:
        count = getattr(result, "execution_count", None)
        if count is not None and not result.success:
            failed.add(count)

    shell.events.register("post_run_cell", post_run_cell)


def replay_cells(shell: Any, setup_file: Path | str | None = None) -> list[str]:
    """The code a rerun executes before the profiled cell: the setup file's text, or the
    session's successful cells before the current one."""
    if setup_file is not None:
        path = Path(setup_file)
        if not path.is_file():
            raise FileNotFoundError(f"setup file {path} does not exist")
        return [path.read_text()]
    failed: set[int] = getattr(shell, _FAILED, None) or set()
    hist = shell.history_manager.input_hist_raw
    # The running cell was stored last (IPython stores a cell's input before running it
    # and, in recent versions, already counts it in execution_count): never replay it.
    current = len(hist) - 1
    cells = []
    for count in range(1, current):
        if count in failed:
            continue
        code = prepare(hist[count])
        if code:
            cells.append(code)
    return cells


def prepare(code: str) -> str:
    """A cell as a rerun replays it ('' to drop it)."""
    stripped = code.strip()
    if not stripped or stripped.startswith(SKIP_MARK):
        return ""
    first, _, rest = stripped.partition("\n")
    if first.startswith("%%swift_profile"):
        return "" if "--compare" in first else rest
    if stripped.startswith(("%swift_runs", "%swift_profile")) and "\n" not in stripped:
        return ""
    return code
