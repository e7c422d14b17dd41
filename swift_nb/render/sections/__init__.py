"""The report's sections, one module each (its title, the results panel's tab it goes to,
its builder), and ``SECTIONS``, the registry in report order, which report.html, the
results panel and the notebook's static outputs all iterate.

A new section is one module defining ``SECTION = SectionKind(title, tab, build)`` and one
line below.
"""

from __future__ import annotations

from swift_nb.render.sections import (
    breakdown,
    environment,
    findings,
    forecast,
    gpu,
    memory,
    modules,
    notes,
    oom,
    operators_memory,
    operators_time,
    ranks,
    summary,
    throughput,
    timeline,
    verdict,
)
from swift_nb.render.sections.base import TABS, FigurePart, ReportInputs, Section, SectionKind

SECTIONS: list[SectionKind] = [
    summary.SECTION,
    oom.SECTION,
    verdict.SECTION,
    findings.SECTION,
    throughput.SECTION,
    ranks.SECTION,
    timeline.SECTION,
    breakdown.SECTION,
    gpu.SECTION,
    memory.SECTION,
    forecast.SECTION,
    operators_time.SECTION,
    operators_memory.SECTION,
    modules.SECTION,
    environment.SECTION,
    notes.SECTION,
]

#: the sections a notebook shows with the Summary the moment its run is analysed, before
#: any figure is drawn (they have none): what happened and what bounds the step
FIRST: tuple[SectionKind, ...] = (oom.SECTION, verdict.SECTION)

__all__ = ["FIRST", "SECTIONS", "TABS", "FigurePart", "ReportInputs", "Section", "SectionKind"]
