""" "Will it fit" for the configurations the run asked for (``--forecast``); its body is
``swift_nb.render.forecast``'s."""

from __future__ import annotations

from swift_nb.render.forecast import TITLE, forecast_section
from swift_nb.render.html import empty
from swift_nb.render.sections.base import Part, ReportInputs, SectionKind


def build(inputs: ReportInputs) -> list[Part] | None:
    if not inputs.run.context.get("forecast"):
        return None
    problem, forecasts = inputs.forecast_problem, inputs.forecasts
    if problem is not None or not forecasts:
        return [empty(f"No forecast — {problem or 'the run was not analyzed'}.")]
    return [forecast_section(forecasts)]


SECTION = SectionKind(TITLE, tab="Memory", build=build)
