"""Isolated reruns: replay the session's code in a fresh worker process with toggles
applied, measured exactly like the baseline, and compare side by side. The kernel's own
objects are never touched.

``compare_cell(shell, options, cell, "flash_attention,galore")`` is what
``%%swift_profile --compare`` runs; ``run_variants`` launches workers from any list of
cells (a setup file, say).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from swift_nb.analysis.comparison.variants import compare_runs
from swift_nb.api import findings_of
from swift_nb.record import COMPARE_FILE, Run, default_root, load_run
from swift_nb.render.comparison.page import write_compare
from swift_nb.rerun.history import SKIP_MARK, install, replay_cells
from swift_nb.rerun.launcher import Outcome, RerunBusyError, Variant, Worker, parse_variants, run_variants
from swift_nb.vocabulary.options import ProfileOptions

__all__ = [
    "SKIP_MARK",
    "Compared",
    "Outcome",
    "RerunBusyError",
    "Variant",
    "Worker",
    "compare_cell",
    "comparison",
    "install",
    "parse_variants",
    "replay_cells",
    "run_variants",
]


@dataclass
class Compared:
    """A finished comparison: the table, each variant's outcome and run, and compare.html."""

    table: pd.DataFrame
    outcomes: list[Outcome]
    runs: list[tuple[str, Run]]
    html_path: Path | None


def compare_cell(
    shell: Any,
    options: ProfileOptions | str,
    cell: str,
    variants: list[Variant] | str,
    out_dir: Path | str | None = None,
    setup_file: Path | str | None = None,
    timeout_s: float | None = None,
    rerun_of: str | None = None,
    on_progress: Callable[[str, dict[str, Any]], None] | None = None,
    cells: list[str] | None = None,
) -> Compared:
    """Rerun ``cell`` (after the session's history, ``setup_file``, or ``cells`` when
    given) as a baseline and once per variant, each in its own worker, then compare them.
    ``options``: the profile options of every rerun (a ``%%swift_profile`` line is read
    for them: ``--active 5`` and the like)."""
    if isinstance(variants, str):
        variants = parse_variants(variants)
    if cells is None:
        cells = replay_cells(shell, setup_file)
    root = Path(out_dir) if out_dir is not None else default_root()
    root.mkdir(parents=True, exist_ok=True)
    outcomes = run_variants(cells, cell, options, variants, root, rerun_of, timeout_s, on_progress)
    loaded: list[tuple[Outcome, Run | None]] = []
    for o in outcomes:
        run = None
        if o.run_path:
            try:
                run = load_run(o.run_path)
            except Exception as e:
                o.notes.append(f"its record could not be read ({e})")
        loaded.append((o, run))
    return comparison(loaded)


def comparison(outcomes: list[tuple[Outcome, Run | None]]) -> Compared:
    """The comparison of finished reruns (baseline first): table, and compare.html in the
    baseline rerun's folder. A failed row's notes end with the traceback's last lines."""
    rows = [(o.variant, run, None if o.status == "ok" else o.status, _notes(o)) for o, run in outcomes]
    base = outcomes[0][1] if outcomes else None
    table = compare_runs(rows, findings_of(base))
    ran = [(o.variant, run) for o, run in outcomes if run is not None]
    html_path = None
    if base is not None and base.path is not None:
        html_path = write_compare(base.path / COMPARE_FILE, table, ran, "comparison of reruns")
    return Compared(table, [o for o, _ in outcomes], ran, html_path)


def _notes(o: Outcome) -> list[str]:
    notes = list(o.notes)
    if o.error:
        notes.append(" | ".join(o.error.strip().splitlines()[-3:]))
    return notes
