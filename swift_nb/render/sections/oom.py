"""A run that ran out of memory leads with why (``swift_nb.render.oom``)."""

from __future__ import annotations

from swift_nb.render.oom import TITLE, oom_html
from swift_nb.render.sections.base import Part, ReportInputs, SectionKind


def build(inputs: ReportInputs) -> list[Part] | None:
    body = oom_html(inputs.run)
    return [body] if body is not None else None


SECTION = SectionKind(TITLE, tab="Summary", build=build)
