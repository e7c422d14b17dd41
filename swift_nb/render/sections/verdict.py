"""The advisor's verdict: what bounds the step, and the evidence."""

from __future__ import annotations

from html import escape

from swift_nb.render.html import kv_table
from swift_nb.render.sections.base import Part, ReportInputs, SectionKind, not_analysed


def build(inputs: ReportInputs) -> list[Part]:
    verdict = inputs.verdict
    if verdict is None:
        return [not_analysed("No verdict", inputs.not_analysed, "the run was not analysed.")]
    evidence = kv_table(list(verdict.evidence.items())) if verdict.evidence else ""
    return [
        # The dash separates kind and reason in the text itself, not only the pill's CSS:
        # nbconvert's HTML, feed readers and copied text show no styles.
        f"<p class='verdict'><strong class='kind'>{escape(verdict.kind)}</strong> — "
        f"{escape(verdict.reason)}</p>"
        f"{evidence}"
    ]


SECTION = SectionKind("Verdict", tab="Advice", build=build)
