"""The run's timeline: its trace as a zoomable viewer (report.html: the viewer and the
trace's events inline; the notebook's results panel: the timeline widget; static outputs:
a PNG of the whole timeline), then utilisation and memory over the run's time, the
profiler's steps shaded."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from html import escape
from typing import TYPE_CHECKING, Any

import pandas as pd

from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.timeline.places import places as finding_places
from swift_nb.analysis.timeline.query import Timeline
from swift_nb.analysis.timeline.ranks import rank_overview
from swift_nb.record import Run
from swift_nb.render.figure_cache import figure_key
from swift_nb.render.figures import figure_png, timeline_figure
from swift_nb.render.html import empty
from swift_nb.render.sections.base import FigurePart, Part, ReportInputs, SectionKind, figure_outputs
from swift_nb.render.tables import absent_text, is_imported
from swift_nb.render.timeline.view import embedded_html
from swift_nb.render.timeline.view import timeline_figure as trace_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: titles of the places that are not a finding's
PLACE_TITLES = {
    "slowest_step": "slowest step",
    "modules": "the model's forward, by module",
    "oom": "last allocations before the OOM",
}


#: what the report and the notebook say under the timeline
CAPTION = (
    "The trace's tracks: CPU threads (ops nested), GPU streams, DataLoader workers, the steps, "
    "and memory and utilisation as counters. Wheel or pinch to zoom, drag to pan, W/A/S/D, "
    "click for details."
)


@dataclass
class TimelinePart:
    """The trace's timeline among a section's parts: in report.html the viewer with the
    events embedded (``html``); in static outputs a PNG of the whole timeline
    (``outputs``); the results panel puts the widget in its place. ``places``: the
    findings' windows the viewer zooms to. The timeline is read when first needed, once for
    the report and the panel. Its PNG is a figure of the figure cache (``key``, ``drawn``):
    the helper draws it while a profiled run is analysed (``document.draw_run_ahead``); the
    report keeps no image of it to reuse."""

    run: Run
    findings: Sequence[Finding] = field(default_factory=list)
    alt: str = "The trace's timeline"
    caption: str = CAPTION
    drawn: bytes | None = field(default=None, repr=False)
    #: the viewer as an earlier report of the same analysis embedded it (``reporting``):
    #: taken as it is, without reading the trace
    embedded: str | None = field(default=None, repr=False)
    #: the viewer ``html`` embedded (None until then, or when it could not be drawn)
    viewer: str | None = field(default=None, init=False, repr=False)

    @cached_property
    def key(self) -> str | None:
        """What the PNG shows: the trace and the record's counters on its clock."""
        run, trace = self.run, self.run.trace_path
        if trace is None:
            return None
        return figure_key("trace_timeline", run.steps, run.samples, run.memory, trace=trace.name)

    @cached_property
    def timeline(self) -> Timeline:
        return Timeline.of_run(self.run)

    @cached_property
    def places(self) -> list[dict[str, Any]]:
        return place_list(self.run, self.findings)

    @cached_property
    def figure(self) -> Figure:
        return trace_figure(self.timeline)

    @cached_property
    def png(self) -> bytes:
        return self.drawn if self.drawn is not None else figure_png(self.figure)

    def outputs(self) -> list[dict[str, str]]:
        try:
            png = self.png
        except Exception as e:  # the other outputs stand without it
            why = not_drawn(e)
            return [{"text/html": empty(why), "text/plain": why}]
        return figure_outputs(png, self.alt, self.caption)

    def html(self) -> str:
        viewer = self.embedded
        if viewer is None:
            try:
                overview = rank_overview(self.run) if len(self.run.rank_trace_paths()) > 1 else None
                title = self.run.label or self.run.id
                viewer = embedded_html(self.timeline, self.places, title, overview, own_rank(self.run))
            except Exception as e:  # the rest of the report stands without its timeline
                return empty(not_drawn(e))
        self.viewer = viewer
        return f"{viewer}<p class='caption'>{escape(self.caption)}</p>"


def own_rank(run: Run) -> int:
    """The rank of the run's own trace in a job's folder (0 for a run of one process)."""
    return next((r for r, p in run.rank_trace_paths().items() if p == run.trace_path), 0)


def not_drawn(error: Exception) -> str:
    return f"The trace's timeline could not be drawn ({type(error).__name__}: {error})."


def place_list(run: Run, findings: Iterable[Finding]) -> list[dict[str, Any]]:
    """The viewer's places, ``[{id, title, start_us, end_us}]``: where each finding with a
    place in time happened (``analysis.timeline_places``), with the slowest step and an
    OOM's last allocations."""
    findings = list(findings)
    titles = {f.id: f.title for f in findings}
    return [
        {"id": key, "title": titles.get(key, PLACE_TITLES.get(key, key)), "start_us": s, "end_us": e}
        for key, (s, e) in finding_places(run, findings).items()
    ]


def build(inputs: ReportInputs) -> list[Part | TimelinePart]:
    run = inputs.run
    parts: list[Part | TimelinePart] = (
        [TimelinePart(run, list(inputs.findings or []))] if run.trace_path is not None else []
    )
    peaks = (
        pd.to_numeric(run.steps["peak_tensor_bytes"], errors="coerce")
        if "peak_tensor_bytes" in run.steps
        else None
    )
    if run.samples.empty and (peaks is None or peaks.isna().all()):
        why = (
            "a profiler trace holds no utilisation or memory samples"
            if is_imported(run)
            else "no sample was taken during the run"
        )
        return [*parts, empty(f"Utilisation and memory over time were {absent_text(run)}: {why}.")]
    return [
        *parts,
        FigurePart(
            lambda: timeline_figure(run),
            "Utilisation and memory over time",
            "Utilisation and memory against time; shading marks the profiler's warmup and active steps.",
            figure_key("timeline", run.samples, run.steps),
        ),
    ]


SECTION = SectionKind("Timeline", tab="Timeline", build=build)
