"""Each profiled step's time split into its parts, with their medians."""

from __future__ import annotations

import pandas as pd

from swift_nb.render.figure_cache import figure_key
from swift_nb.render.figures import breakdown_figure
from swift_nb.render.html import frame_table
from swift_nb.render.sections.base import FigurePart, Part, ReportInputs, SectionKind, has_rows, not_analyzed


def parts(breakdown: pd.DataFrame | None, why: str | None = None) -> list[Part]:
    """The section's parts for ``analysis.breakdown.step_breakdown``'s table (``why``: why
    there is none, when the analysis could not run)."""
    if breakdown is None or not has_rows(breakdown):
        return [not_analyzed("No step breakdown", why, "the profiler recorded no step (no trace).")]
    median = breakdown.median(numeric_only=True).to_frame().T
    # step_s renamed so its header ("step time") differs from the step number's.
    table = (
        pd.concat([breakdown, median], ignore_index=True)
        .astype({"step": object})
        .rename(columns={"step_s": "step_time_s"})
    )
    table.loc[len(table) - 1, "step"] = "median"
    return [
        FigurePart(
            lambda: breakdown_figure(breakdown),
            "Stacked bars of step time by part",
            "Each bar is one profiled step; its parts add up to the step's time.",
            figure_key("breakdown", breakdown),
        ),
        frame_table(table, agg_rows=1),
    ]


def build(inputs: ReportInputs) -> list[Part]:
    return parts(inputs.breakdown, inputs.not_analyzed)


SECTION = SectionKind("Step time breakdown", tab="Timeline", build=build)
