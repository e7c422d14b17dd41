"""The advisor's findings: each with its evidence, suggestion, toggle and predicted effect."""

from __future__ import annotations

from html import escape

from swift_nb.analysis.advisor.findings import Finding
from swift_nb.render.html import empty, evidence_html
from swift_nb.render.sections.base import Part, ReportInputs, SectionKind, not_analyzed

SEVERITIES = ("info", "warning", "critical")


def finding_html(f: Finding) -> str:
    # The severity becomes a CSS class, so only known values may reach the attribute.
    severity = f.severity if f.severity in SEVERITIES else "warning"
    parts = [
        # report.html's timeline viewer adds "Show on timeline" to a finding with a place in time
        f"<div class='finding {severity}' data-finding='{escape(f.id)}'>",
        f"<div class='severity'>{escape(str(f.severity))} · {escape(f.id)}</div>",
        f"<h3>{escape(f.title)}</h3>",
    ]
    if f.evidence:
        parts.append(evidence_html(f.evidence, within=f.id))
    parts.append(f"<p><b>Suggestion:</b> {escape(f.suggestion)}</p>")
    if f.toggles:
        offered = " or ".join(f"<code>{escape(t)}</code>" for t in f.toggles)
        parts.append(f"<p><b>Toggle{'s' if len(f.toggles) > 1 else ''}:</b> {offered}</p>")
    if f.predicted_effect:
        parts.append(f"<p><b>Predicted effect:</b> {escape(f.predicted_effect)}</p>")
    if f.formula:
        parts.append(f"<p><b>Estimated by:</b> <code>{escape(f.formula)}</code></p>")
    parts.append("</div>")
    return "".join(parts)


def build(inputs: ReportInputs) -> list[Part]:
    findings = inputs.findings
    if findings is None:
        return [not_analyzed("No findings", inputs.not_analyzed, "the run was not analyzed.")]
    if not findings:
        return [empty("No findings: no rule's threshold was crossed.")]
    return ["".join(finding_html(f) for f in findings)]


SECTION = SectionKind("Findings", tab="Advice", build=build)
