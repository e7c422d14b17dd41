"""Utilisation and memory over the run's time, the profiler's steps shaded."""

from __future__ import annotations

import pandas as pd

from swift_nb.render.figures import timeline_figure
from swift_nb.render.html import empty
from swift_nb.render.sections.base import FigurePart, Part, ReportInputs, SectionKind
from swift_nb.render.sections.figure_cache import figure_key
from swift_nb.render.tables import absent_text, is_imported


def build(inputs: ReportInputs) -> list[Part]:
    run = inputs.run
    peaks = (
        pd.to_numeric(run.steps["peak_tensor_bytes"], errors="coerce")
        if "peak_tensor_bytes" in run.steps
        else None
    )
    if run.samples.empty and (peaks is None or peaks.isna().all()):
        why = (
            "a profiler trace holds no utilisation or memory samples"
            if is_imported(run)
            else "no sample was taken during the run"
        )
        return [empty(f"Utilisation and memory over time were {absent_text(run)}: {why}.")]
    return [
        FigurePart(
            lambda: timeline_figure(run),
            "Utilisation and memory over time",
            "Utilisation and memory against time; shading marks the profiler's warmup and active steps.",
            figure_key("timeline", run.samples, run.steps),
        )
    ]


SECTION = SectionKind("Timeline", tab="Timeline", build=build)
