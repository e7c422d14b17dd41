"""The advisor's verdict: what bounds the step, and the evidence, the deciding numbers
first."""

from __future__ import annotations

from html import escape
from typing import Any

from swift_nb.analysis.advisor.findings import Verdict
from swift_nb.render.html import evidence_html
from swift_nb.render.sections.base import Part, ReportInputs, SectionKind, not_analyzed

#: for each verdict, the evidence that decides it, in the order the reasoning reads it
#: (``analysis.advisor.verdict``: the host's shares on a CPU run, the GPU's window on a GPU
#: run); the rest follows in the verdict's own order
DECIDING: dict[str, tuple[str, ...]] = {
    "data-bound": ("data_pct", "data_s_per_step", "device_idle_pct", "data_s"),
    "overhead-bound": ("data_pct", "data_s_per_step", "device_idle_pct", "overhead_s"),
    "memory-bound": ("peak_mem_bytes",),
    "communication-bound": ("comm_pct", "device_idle_pct", "communication_s"),
    "compute-bound": ("forward_pct", "backward_pct", "optimizer_pct", "device_compute_pct"),
    "compile-bound": ("compile_pct", "compile_s", "compiling_steps", "steady_step_s", "steady_verdict"),
    "copy-bound": ("device_non_compute_pct", "copy_s"),
}


def deciding(verdict: Verdict) -> tuple[str, ...]:
    """The keys that decide ``verdict``: as ``DECIDING`` says, or as its reason says where
    one kind has two reasons (explicit attention or a full device; a tiny step or many tiny
    operators)."""
    if verdict.kind == "memory-bound" and "attention" in verdict.reason:
        return ("attention_seq", "peak_mem_bytes")
    if verdict.kind == "overhead-bound" and "ops per step" in verdict.reason:
        return ("ops_per_step", "heavy_op_pct")
    return DECIDING.get(verdict.kind, ())


def ordered(verdict: Verdict) -> dict[str, Any]:
    """The verdict's evidence with the numbers that decide it first."""
    ev = verdict.evidence
    return {**{k: ev[k] for k in deciding(verdict) if k in ev}, **ev}


def build(inputs: ReportInputs) -> list[Part]:
    verdict = inputs.verdict
    if verdict is None:
        return [not_analyzed("No verdict", inputs.not_analyzed, "the run was not analyzed.")]
    return [
        # The dash separates kind and reason in the text itself, not only the pill's CSS:
        # nbconvert's HTML, feed readers and copied text show no styles.
        f"<p class='verdict'><strong class='kind'>{escape(verdict.kind)}</strong> — "
        f"{escape(verdict.reason)}</p>"
        f"{evidence_html(ordered(verdict), within='verdict') if verdict.evidence else ''}"
    ]


SECTION = SectionKind("Verdict", tab="Advice", build=build)
