"""The operators that allocated the most bytes."""

from __future__ import annotations

from swift_nb.render.sections.base import Part, ReportInputs, SectionKind
from swift_nb.render.sections.operators import operator_parts

TITLE = "Top operators by memory allocated"
METRIC = "alloc_bytes"
CAPTION = "Bytes each operator allocated over the profiled steps."


def build(inputs: ReportInputs) -> list[Part]:
    return operator_parts(TITLE, inputs.operators_memory, METRIC, CAPTION, inputs.not_analyzed, inputs.run)


SECTION = SectionKind(TITLE, tab="Operators", build=build)
