"""The operators that took the most time themselves (children excluded)."""

from __future__ import annotations

from swift_nb.render.sections.base import Part, ReportInputs, SectionKind
from swift_nb.render.sections.operators import operator_parts

TITLE = "Top operators by self time"
METRIC = "self_time_s"
CAPTION = "Time spent in each operator itself, children excluded, over the profiled steps."


def build(inputs: ReportInputs) -> list[Part]:
    return operator_parts(TITLE, inputs.operators_time, METRIC, CAPTION, inputs.not_analyzed, inputs.run)


SECTION = SectionKind(TITLE, tab="Operators", build=build)
