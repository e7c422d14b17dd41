"""``%%swift_profile --compare``: progress while the reruns run, then the comparison as
static outputs (HTML table with a text twin, overlaid figures as PNG)."""

from __future__ import annotations

import time
from html import escape
from typing import Any

from IPython.display import display

from swift_nb.render.comparison.page import (
    CAPTIONS,
    compare_figures,
    compare_table_html,
    compare_table_text,
    rank_memory_html,
    rank_memory_text,
)
from swift_nb.render.sections.base import figure_outputs
from swift_nb.rerun import Compared, compare_cell
from swift_nb.rerun.launcher import Variant
from swift_nb.vocabulary.options import ProfileOptions


class Progress:
    """One output line, replaced in place at most twice a second."""

    def __init__(self, variants: list[Variant]) -> None:
        self.names = ["baseline", *(v.name for v in variants)]
        self.handle = display(self._bundle("starting the baseline rerun…"), raw=True, display_id=True)
        self._last = 0.0

    def _bundle(self, text: str) -> dict[str, str]:
        return {
            "text/html": f"<div class='swift-nb-compare-progress'>{escape(text)}</div>",
            "text/plain": text,
        }

    def __call__(self, name: str, p: dict[str, Any]) -> None:
        now = time.monotonic()
        if now - self._last < 0.5 or self.handle is None:
            return
        self._last = now
        i = self.names.index(name) + 1 if name in self.names else 0
        where = (
            f"replaying cell {p.get('cell', 0)}/{p.get('cells', '?')}"
            if p.get("phase") == "replay"
            else f"profiling: {p.get('steps', 0)} steps"
            if p.get("phase") == "profile"
            else p.get("phase", "starting")
        )
        self.handle.update(self._bundle(f"rerun {i}/{len(self.names)} — {name}: {where}"), raw=True)

    def done(self, compared: Compared) -> None:
        if self.handle is not None:
            statuses = ", ".join(f"{o.variant}: {o.status}" for o in compared.outcomes)
            self.handle.update(self._bundle(f"reruns finished — {statuses}"), raw=True)


def run_comparison(
    shell: Any,
    options: ProfileOptions,
    cell: str,
    variants: list[Variant],
    out: str | None,
    setup: str | None,
    timeout_s,
) -> Compared:
    progress = Progress(variants)
    compared = compare_cell(
        shell,
        options,
        cell,
        variants,
        out_dir=out,
        setup_file=setup,
        timeout_s=timeout_s,
        on_progress=progress,
    )
    progress.done(compared)
    show_comparison(compared)
    return compared


def show_comparison(compared: Compared) -> None:
    table = compared.table
    display(
        {
            "text/html": f"<h4>Comparison</h4>{compare_table_html(table)}",
            "text/plain": compare_table_text(table),
        },
        raw=True,
    )
    for alt, png in compare_figures(compared.runs):
        for output in figure_outputs(png, alt, CAPTIONS.get(alt, alt)):
            display(output, raw=True)
    per_rank = rank_memory_text(compared.runs)
    if per_rank:
        display({"text/html": rank_memory_html(compared.runs), "text/plain": per_rank}, raw=True)
    if compared.html_path is not None:
        print(f"comparison: {compared.html_path}")
