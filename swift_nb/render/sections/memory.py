"""Live tensor memory by category (parameters, gradients, optimizer state, activations,
other) over the recorded steps, and at the run's peak (``record.write.peak_step``)."""

from __future__ import annotations

from html import escape

from swift_nb.core.units import fmt_bytes
from swift_nb.record import Run
from swift_nb.record.write import memory_steps, peak_step
from swift_nb.render.figure_cache import figure_key
from swift_nb.render.figures import memory_figure
from swift_nb.render.html import empty, frame_table
from swift_nb.render.sections.base import FigurePart, Part, ReportInputs, SectionKind, has_rows, not_analyzed
from swift_nb.render.tables import is_imported


def build(inputs: ReportInputs) -> list[Part]:
    timeline, footprint, why = inputs.timeline, inputs.footprint, inputs.not_analyzed
    step = peak_step(inputs.run.steps)
    parts: list[Part] = []
    if timeline is not None and has_rows(timeline):
        parts.append(
            FigurePart(
                lambda: memory_figure(timeline, step),
                "Stacked area of tensor memory by category over time",
                "Live tensor bytes by category during the recorded steps (dashed: step starts; ▼: the peak).",
                figure_key("memory", timeline, peak_step=step),
            )
        )
    if footprint is not None and has_rows(footprint):
        parts.append(frame_table(footprint.assign(category=footprint["category"].str.replace("_", " "))))
        if step is not None:
            parts.append(
                f"<p>{escape(peak_note(inputs.run, step, float(footprint['at_peak_bytes'].sum())))}</p>"
            )
    if not parts and is_imported(inputs.run) and why is None:
        parts.append(
            empty(
                "Tensor memory by category was not recorded in this trace: it needs the profiler's "
                "[memory] events, which torch.profiler writes only with profile_memory=True."
            )
        )
    if not parts:
        parts.append(
            not_analyzed(
                "No memory categories",
                why,
                "they are recorded only for steps the profiler recorded with memory profiling on.",
            )
        )
    return parts


def peak_note(run: Run, step: int, total_bytes: float) -> str:
    """What "at the peak" and each category's own maximum are, for this run: the step read,
    the steps it was chosen among, and the Summary's peak where it is another step's."""
    among = [int(k) for k in memory_steps(run.steps)["step"]]
    if len(among) > 1:
        which = f"the recorded step whose peak is the median of steps {', '.join(map(str, among))}"
        if len(among) % 2 == 0:
            which += " (of the two in the middle, the larger)"
    else:
        which = "the recorded step it is read from"
    text = (
        f"At the peak: each category at the peak moment of step {step}, {which}; the summary, the advice "
        "and the forecast read the same. Each category's own maximum: the most it held at any moment of "
        "those steps; those moments differ, so the maxima do not add up to a peak."
    )
    highest = run.summary.get("peak_mem_bytes")
    if highest and float(highest) > 1.005 * total_bytes:
        counted = " as the CUDA allocator counts it" if run.environment.get("device") == "cuda" else ""
        most = fmt_bytes(float(highest))
        text += f" The Summary's peak tensor memory ({most}) is the most any step held{counted}."
    return text


SECTION = SectionKind("Memory by category", tab="Memory", build=build)
