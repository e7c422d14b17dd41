"""Live tensor memory by category (parameters, gradients, optimizer state, activations,
other) over the recorded steps, and at each step's peak."""

from __future__ import annotations

from swift_nb.render.figure_cache import figure_key
from swift_nb.render.figures import memory_figure
from swift_nb.render.html import empty, frame_table
from swift_nb.render.sections.base import FigurePart, Part, ReportInputs, SectionKind, has_rows, not_analyzed
from swift_nb.render.tables import is_imported


def build(inputs: ReportInputs) -> list[Part]:
    timeline, footprint, why = inputs.timeline, inputs.footprint, inputs.not_analyzed
    parts: list[Part] = []
    if timeline is not None and has_rows(timeline):
        parts.append(
            FigurePart(
                lambda: memory_figure(timeline),
                "Stacked area of tensor memory by category over time",
                "Live tensor bytes by category during the recorded steps (dashed: step starts).",
                figure_key("memory", timeline),
            )
        )
    if footprint is not None and has_rows(footprint):
        parts.append(frame_table(footprint.assign(category=footprint["category"].str.replace("_", " "))))
    if not parts and is_imported(inputs.run) and why is None:
        parts.append(
            empty(
                "Tensor memory by category was not recorded in this trace: it needs the profiler's "
                "[memory] events, which torch.profiler writes only with profile_memory=True."
            )
        )
    if not parts:
        parts.append(
            not_analyzed(
                "No memory categories",
                why,
                "they are recorded only for steps the profiler recorded with memory profiling on.",
            )
        )
    return parts


SECTION = SectionKind("Memory by category", tab="Memory", build=build)
