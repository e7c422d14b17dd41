"""The run's notes, and the traceback that ended a failed run (collapsed)."""

from __future__ import annotations

from html import escape

from swift_nb.render.sections.base import Part, ReportInputs, SectionKind


def build(inputs: ReportInputs) -> list[Part] | None:
    run = inputs.run
    traceback = run.summary.get("traceback")
    parts: list[Part] = []
    if run.notes:
        parts.append("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in run.notes) + "</ul>")
    if isinstance(traceback, str) and traceback:
        parts.append(f"<details><summary>Traceback</summary><pre>{escape(traceback)}</pre></details>")
    return parts or None


# The notebook lists the notes in its summary (summary_html): no tab, no static output.
SECTION = SectionKind("Notes", tab=None, build=build, static=False)
