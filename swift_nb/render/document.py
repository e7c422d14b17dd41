"""One self-contained HTML report of a run: its sections (``swift_nb.render.sections``, in
the registry's order) in one document.

The document opens offline and from an email attachment alike: CSS is inline, figures
are base64 PNGs, the one script (the timeline's viewer) is inline and allowed by its hash,
and a Content-Security-Policy forbids loading anything else. Every string that comes from
the user or the trace is escaped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from swift_nb.analysis import Analysis
from swift_nb.analysis.breakdown import trace_breakdown
from swift_nb.analysis.memory import memory_timeline
from swift_nb.analysis.modules import module_table
from swift_nb.analysis.operators import by_memory, top_operators
from swift_nb.analysis.trace.tables import Trace, load_trace, parse_events, save_tables
from swift_nb.record import REPORT_FILE, Run, atomic_write_text, tables_path
from swift_nb.render import sections
from swift_nb.render.figure_cache import FigureCache
from swift_nb.render.html import CSP, STYLE
from swift_nb.render.sections import breakdown, operators_memory, operators_time
from swift_nb.render.sections import memory as memory_section
from swift_nb.render.sections import modules as modules_section
from swift_nb.render.sections import timeline as timeline_section
from swift_nb.render.sections.base import FigurePart, ReportInputs, Section
from swift_nb.render.sections.operators import operator_parts
from swift_nb.render.sections.timeline import TimelinePart
from swift_nb.render.timeline.view import script_sources

__all__ = [
    "REPORT_FILE",
    "analysis_fields",
    "document_html",
    "draw_ahead",
    "draw_run_ahead",
    "report_html",
    "report_sections",
    "write_report",
]


def report_sections(run: Run, figures: FigureCache | None = None, **analyses: Any) -> list[Section]:
    """The report's sections in order (the notebook shows the same ones). ``analyses``:
    the fields of ``ReportInputs`` (the analyses' outputs and ``not_analyzed``); a missing
    or empty one makes its section say so, or leaves it out. ``figures``: PNGs drawn
    earlier, which the sections' figures take instead of being drawn again."""
    inputs = ReportInputs(run, **analyses)
    built = [kind.section(inputs) for kind in sections.SECTIONS]
    out = [s for s in built if s is not None]
    if figures is not None:
        figures.hand_out(out)
    return out


def report_html(run: Run, **analyses: Any) -> str:
    """The whole report as one HTML document; ``analyses`` are ``report_sections``'s
    keyword arguments (any may be missing, as for a run without a trace)."""
    return document_html(run, report_sections(run, **analyses))


def document_html(run: Run, parts: Sequence[Section]) -> str:
    """The report document around already-built sections."""
    name = run.label or run.id
    body = [
        f"<h1>swift_nb report — {escape(name)}</h1>",
        f"<p class='sub'>run {escape(run.id)} · started {escape(run.started_at or '–')} · "
        f"status {escape(run.status)}</p>",
        *(section.html() for section in parts),
    ]
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}{script_sources(''.join(body))}\">"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>swift_nb report — {escape(name)}</title><style>{STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def draw_ahead(trace: Trace, figures: FigureCache, top_n: int = 15) -> None:
    """Draw the figures that the trace alone determines (the step breakdown and the top
    operators, as ``analyze`` and ``report_sections`` make them) into ``figures``, so that
    the report after the cell finds them drawn. For the work done while a profiled cell
    still runs (``swift_nb.api``)."""
    parts = breakdown.parts(trace_breakdown(trace))
    ops = top_operators(None, n=None, trace=trace)
    for table, section in ((ops, operators_time), (by_memory(ops), operators_memory)):
        shown = table.head(top_n).reset_index(drop=True)
        parts += operator_parts(section.TITLE, shown, section.METRIC, section.CAPTION)
    for part in parts:
        if isinstance(part, FigurePart):
            figures.keep(part)


def build_ahead(events: list[dict], trace_path: Path, written: Path) -> FigureCache:
    """What a profiled run does with its finished trace while the cell still runs, in the
    helper process (``capture.helper``, through ``api.ReportAhead``): the trace's tables, built and kept beside the
    trace (``written``: the file holding it until it is named ``trace_path``), and the
    figures the trace alone determines, drawn and returned. The analyses read the tables
    from their file after the cell."""
    trace = parse_events(events)
    del events
    save_tables(trace, tables_path(trace_path), source=written)
    figures = FigureCache()
    try:
        draw_ahead(trace, figures)
    except Exception:  # drawn again, and any failure reported, after the cell
        pass
    return figures


def draw_run_ahead(run: Run, trace_timeline: bool = False) -> FigureCache:
    """The figures that the run's record alone determines (utilisation and memory over
    time; the modules' icicle; with ``trace_timeline``, the trace's timeline as the PNG a
    notebook's static outputs show), drawn and returned: in the helper process, while the training process
    analyses the run (``swift_nb.api.finish``). The report's figures that show the same
    take them."""
    figures = FigureCache()
    inputs = ReportInputs(run, timeline=memory_timeline(run))
    kinds = [timeline_section.SECTION, memory_section.SECTION]
    if run.context.get("modules"):  # the icicle: the trace and what the capture counted
        with contextlib.suppress(Exception):  # drawn where it is shown, if not here
            inputs.modules = module_table(load_trace(run), run.context["modules"])
            kinds.append(modules_section.SECTION)
    for kind in kinds:
        section = kind.section(inputs)
        for part in section.parts if section is not None else ():
            if isinstance(part, FigurePart):
                figures.keep(part)
            elif trace_timeline and isinstance(part, TimelinePart) and part.key is not None:
                with contextlib.suppress(Exception):  # drawn, or its failure said, where it is shown
                    figures.put(part.key, part.png)
    return figures


def draw_run_and_timeline_ahead(run: Run) -> FigureCache:
    """``draw_run_ahead`` with the trace's timeline: for a notebook, which shows it."""
    return draw_run_ahead(run, trace_timeline=True)


def analysis_fields(analysis: Analysis | None) -> dict[str, Any]:
    """The keyword arguments of ``report_html``/``report_sections`` for an Analysis."""
    if analysis is None:
        return {}
    return dict(
        breakdown=analysis.breakdown,
        footprint=analysis.footprint,
        timeline=analysis.timeline,
        operators_time=analysis.operators_time,
        operators_memory=analysis.operators_memory,
        throughput=analysis.throughput,
        verdict=analysis.verdict,
        findings=analysis.findings,
        per_rank=analysis.per_rank,
        collectives=analysis.collectives,
        device=analysis.device,
        device_steps=analysis.device_steps,
        kernel_kinds=analysis.kernel_kinds,
        idle_causes=analysis.idle_causes,
        forecasts=analysis.forecasts,
        forecast_problem=analysis.forecast_problem,
        modules=analysis.modules,
    )


def write_report(run: Run, html: str) -> Path:
    """Write ``html`` to ``report.html`` in the run folder (atomically) and name it in
    ``run.files["report"]``; saving ``run.json`` again is the caller's job."""
    if run.path is None:
        raise ValueError("this run has not been saved yet; save it (swift_nb.save) before writing its report")
    path = Path(run.path) / REPORT_FILE
    atomic_write_text(path, html)
    run.files["report"] = REPORT_FILE
    return path
