"""A saved run's analysis and report, and runs compared: the part of the API that reads
records and never runs training, so it imports no torch (a laptop reading a cluster's
traces, ``swift-nb report``, ``import_trace``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from swift_nb.analysis import Analysis, analysis_of, analyze
from swift_nb.analysis.comparison.variants import compare_runs
from swift_nb.analysis.cost import price
from swift_nb.analysis.device import RUN_SUMMARY_KEYS
from swift_nb.analysis.kernels import SUMMARY_KEYS as FILL_KEYS
from swift_nb.analysis.ranks import RankAnalysis
from swift_nb.analysis.stored import Kept, load_analysis, save_analysis
from swift_nb.analysis.trace.tables import (
    Trace,
    parse_events,
    save_tables,
    share,
    shared_traces,
    tables_fresh,
)
from swift_nb.core.devices import check_price
from swift_nb.core.errors import RecordError
from swift_nb.record import (
    COMPARE_FILE,
    REPORT_FILE,
    STEPS_MISSING,
    Run,
    load_run,
    save_meta,
    save_modules,
    steps_missing,
    tables_path,
)
from swift_nb.render.comparison.page import write_compare
from swift_nb.render.document import analysis_fields, document_html, report_sections, write_report
from swift_nb.render.figure_cache import FigureCache
from swift_nb.render.sections import Section
from swift_nb.render.sections.timeline import TimelinePart
from swift_nb.render.timeline.view import embedded_in


@dataclass
class Reported:
    """A saved run with its analyses (None when they failed) and the report's sections
    (figures rendered once, for report.html and the notebook alike)."""

    run: Run
    analysis: Analysis | None
    sections: list[Section]


def report(
    run: Run | Path | str,
    trace_events: list[dict] | None = None,
    trace_tables: Trace | None = None,
    figures: FigureCache | None = None,
    ranks: dict[int, RankAnalysis] | None = None,
    drawing: Callable[[], FigureCache | None] | None = None,
    price_per_hour: float | None = None,
    price_per_kwh: float | None = None,
    on_analysed: Callable[[Run, list[Section]], None] | None = None,
) -> Reported:
    """Analyze a saved run and write its ``report.html``. When the analysis cannot run (a
    damaged trace, steps.csv missing, a failing analysis), ``analysis`` is None and the
    reason is in ``run.problems`` and the report, never raised: what was measured is never
    lost to it. Only run.json is rewritten (the report's name in ``files``), never the
    tables read. Figures of the report this one replaces that show the same are not drawn
    again either (nor those given in ``figures``).

    Args:
        run: the saved Run, or its folder (loaded with ``load_run``).
        trace_events: the trace's events when the caller holds them already (saves reading
            the file).
        trace_tables: their tables, when built already (saves building them).
        figures: figures drawn already (``ReportAhead.figures``).
        ranks: for a job, its ranks' analyses made already (the importer's workers).
        drawing: figures being drawn elsewhere while this analyses (``api.finish``): called
            once the analysis is done, what it returns joins ``figures``; failing, they are
            drawn here.
        price_per_hour: USD per device-hour, kept in the run's context, for its money keys
            (``swift_nb.analysis.cost``; default: the price it was captured or imported with,
            else ``$SWIFT_NB_PRICE_PER_HOUR`` or the GPU's list price).
        price_per_kwh: USD per kWh, kept in the run's context, for its money keys (default:
            the price it was captured or imported with, else ``$SWIFT_NB_PRICE_PER_KWH``).
        on_analysed: called with the run and the report's sections the moment they are
            built, before any figure is drawn or the report written (a notebook shows the
            Summary and the verdict with it); its failure is not the report's.

    Returns:
        A ``Reported``: the run, its analyses (``analysis``; None when they could not run)
        and the report's sections.
    """
    price_per_hour = check_price("price_per_hour", price_per_hour)
    price_per_kwh = check_price("price_per_kwh", price_per_kwh)
    run = run if isinstance(run, Run) else load_run(run)
    with shared_traces(run.trace_path):  # the analyses, the timeline and the figures read its trace once
        return _report(
            run,
            trace_events,
            trace_tables,
            figures,
            ranks,
            drawing,
            price_per_hour,
            price_per_kwh,
            on_analysed,
        )


def _report(
    run: Run,
    trace_events: list[dict] | None,
    trace_tables: Trace | None,
    figures: FigureCache | None,
    ranks: dict[int, RankAnalysis] | None,
    drawing: Callable[[], FigureCache | None] | None,
    price_per_hour: float | None,
    price_per_kwh: float | None,
    on_analysed: Callable[[Run, list[Section]], None] | None,
) -> Reported:
    price(run, price_per_hour, price_per_kwh)  # the prices in its context: the verdict's words use them
    kept = load_analysis(run, Analysis) if trace_events is None and trace_tables is None else None
    if kept is not None:  # analysed before, and nothing it read has changed since
        analysis, failure = kept.analysis, None
    else:
        analysis, failure = _analysed(run, trace_events, trace_tables, ranks)
    if failure is not None and failure not in run.problems:
        run.problems.append(failure)
        if failure not in run.notes:
            run.notes.append(failure)
    if analysis is not None and len(analysis.modules):
        run.modules = analysis.modules
        save_modules(run)
    sections = _sections(run, analysis, failure, on_analysed)
    figures = figures if figures is not None else FigureCache()
    if drawing is not None:
        _take_drawn(figures, drawing)
    _reuse_earlier_figures(run, figures)
    figures.hand_out(sections)
    viewer = _earlier_viewer(run, kept, sections)
    write_report(run, document_html(run, sections))
    save_meta(run)
    if analysis is not None and failure is None:  # a reopen reads it instead of the trace
        save_analysis(run, analysis, _digest(viewer.viewer) if viewer is not None else None)
    return Reported(run, analysis, sections)


def _sections(
    run: Run,
    analysis: Analysis | None,
    failure: str | None,
    on_analysed: Callable[[Run, list[Section]], None] | None,
) -> list[Section]:
    """The report's sections of ``analysis``, handed to ``on_analysed`` (whose failure is
    not the report's), the device's figures and prices joining the run's summary."""
    if analysis is not None:  # the device's figures, where it has some, join the summary
        run.summary.update(
            {
                k: round(float(analysis.device[k]), 3)
                for k in (*RUN_SUMMARY_KEYS, *FILL_KEYS)
                if analysis.device.get(k) is not None
            }
        )
    price(run)  # again, with the device's idle share, which it prices
    sections = report_sections(run, **analysis_fields(analysis), not_analyzed=failure)
    if on_analysed is not None:
        try:
            on_analysed(run, sections)
        except Exception:  # what is shown early is shown again once the figures are drawn
            pass
    return sections


def preview(
    run: Run,
    on_analysed: Callable[[Run, list[Section]], None],
    price_per_hour: float | None = None,
    price_per_kwh: float | None = None,
) -> None:
    """The analyses of a run's record alone (its steps, samples and summary; no trace),
    handed to ``on_analysed`` with the report's sections they make: a notebook shows
    that Summary and verdict while the run's trace is still digested (``api.finish``).
    Nothing is written; ``run`` is a preview the report replaces."""
    price(run, price_per_hour, price_per_kwh)
    try:
        analysis, failure = analyze(run), None
    except Exception as e:  # the report, after the trace, says it
        analysis, failure = None, f"the analysis failed ({type(e).__name__}: {e}); the run's data is intact"
    _sections(run, analysis, failure, on_analysed)


def _digest(text: str | None) -> str | None:
    return hashlib.sha1(text.encode("utf-8")).hexdigest() if text is not None else None


def _earlier_viewer(run: Run, kept: Kept | None, sections: list[Section]) -> TimelinePart | None:
    """The report's timeline part, given the viewer the report it replaces embedded when
    that report was written with the same analysis (``kept``): the viewer shows the same,
    and taking it spares reading the trace."""
    part = next((p for s in sections for p in s.parts if isinstance(p, TimelinePart)), None)
    if part is None or kept is None or kept.viewer is None or run.path is None:
        return part
    try:
        earlier = embedded_in((Path(run.path) / REPORT_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return part
    if earlier is not None and _digest(earlier) == kept.viewer:
        part.embedded = earlier
    return part


def _analysed(
    run: Run,
    trace_events: list[dict] | None,
    trace_tables: Trace | None,
    ranks: dict[int, RankAnalysis] | None,
) -> tuple[Analysis | None, str | None]:
    """The run's analyses, or None and why they could not run."""
    if steps_missing(run):
        return None, STEPS_MISSING
    try:
        trace = None
        if run.trace_path is not None:  # tables of a trace the run did not keep are not its own
            trace = trace_tables
            if trace is None and trace_events is not None:
                trace = parse_events(trace_events)
            if trace is not None and not tables_fresh(run.trace_path):
                save_tables(trace, tables_path(run.trace_path), source=run.trace_path)
            if trace is not None:
                share(run.trace_path, trace)
        return analyze(run, trace=trace, ranks=ranks), None
    except RecordError as e:
        return None, f"{e.path.name} is damaged ({e.problem}): the analysis could not run"
    except Exception as e:  # a bug in an analysis must not cost the user the run
        return None, f"the analysis failed ({type(e).__name__}: {e}); the run's data is intact"


def _take_drawn(figures: FigureCache, drawing: Callable[[], FigureCache | None]) -> None:
    try:
        drawn = drawing()
    except Exception:  # drawn here instead
        return
    for key in drawn if drawn is not None else ():
        figures.put(key, drawn.png(key))


def _reuse_earlier_figures(run: Run, figures: FigureCache) -> None:
    """A report written again (``swift-nb report``, ``--open``) keeps the figures of the
    one it replaces that show the same: drawing them is most of a report's time."""
    if run.path is None:
        return
    try:
        figures.reuse((Path(run.path) / REPORT_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):  # no report yet, or one that cannot be read: draw them
        pass


def findings_of(run: Run | None) -> list:
    """The advisor's findings for ``run`` (empty when it cannot be analyzed)."""
    if run is None:
        return []
    try:
        return analysis_of(run).findings
    except Exception:  # predictions are optional; a missing trace must not stop the table
        return []


def compare(*runs: Run | Path | str, names: Sequence[str] | None = None, html: bool = False):
    """Compare runs side by side; the first is the baseline.

    Args:
        *runs: the runs (Runs or their folders), the baseline first.
        names: what to call them, one per run (default: each run's variant, label or id).
        html: also write ``compare.html`` into the baseline's folder (default False).

    Returns:
        The table, one row per run: step time, throughput, peak memory by category,
        utilisation, ratios to the baseline, the baseline advisor's prediction for each
        variant's toggles.
    """
    loaded = [r if isinstance(r, Run) else load_run(r) for r in runs]
    if names is None:
        names = [r.context.get("variant") or r.label or r.id for r in loaded]
    rows: list[tuple[str, Run | None, str | None, list[str]]] = [
        (n, r, None, []) for n, r in zip(names, loaded, strict=True)
    ]
    table = compare_runs(rows, findings_of(loaded[0] if loaded else None))
    if html and loaded and loaded[0].path is not None:
        write_compare(
            loaded[0].path / COMPARE_FILE, table, list(zip(names, loaded, strict=True)), "comparison"
        )
    return table
