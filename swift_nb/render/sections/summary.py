"""The run at a glance: id, status, steps, times, memory, device, ranks, folder."""

from __future__ import annotations

from swift_nb.render.sections.base import Part, ReportInputs, SectionKind
from swift_nb.render.tables import summary_table_html


def build(inputs: ReportInputs) -> list[Part]:
    return [summary_table_html(inputs.run)]


# The panel's Summary tab opens with summary_html, which says the same and lists the notes.
SECTION = SectionKind("Summary", tab=None, build=build, static=False)
