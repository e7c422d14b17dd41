"""Where the run ran (versions, host, devices) and the context it recorded."""

from __future__ import annotations

from swift_nb.render.html import empty, kv_table
from swift_nb.render.sections.base import Part, ReportInputs, SectionKind


def build(inputs: ReportInputs) -> list[Part]:
    run = inputs.run
    return [
        kv_table(list(run.environment.items())) if run.environment else empty("Not recorded."),
        "<h3>Context</h3>",
        kv_table(list(run.context.items())) if run.context else empty("Not recorded."),
    ]


# In report.html only: the notebook's Files tab shows it, its static outputs do not.
SECTION = SectionKind("Environment", tab="Files", build=build, static=False)
