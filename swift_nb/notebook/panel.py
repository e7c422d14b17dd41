"""What a profiled cell shows once its run is saved: the results panel (ipywidgets tabs)
and the same results as static outputs.

Both are built from the report's ``Section``s (figures rendered once, as for
report.html); each section names its tab and whether the static outputs show it
(``swift_nb.render.sections``). The static outputs — HTML for text and tables,
``image/png`` for figures, each with a plain-text twin — are always emitted, so
nbconvert's HTML, GitHub's viewer, a kernel-less JupyterLab and a terminal show every
result; nothing exists only in a widget.
Where the panel renders, a style rule inside it hides those static outputs of the same
cell (they say the same), so a live notebook shows each result once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

import ipywidgets as widgets
from IPython.display import DisplayHandle, display

from swift_nb.core.units import fmt_bytes
from swift_nb.notebook.forecast_form import ForecastForm, has_memory
from swift_nb.notebook.scale_form import ScaleForm, can_scale
from swift_nb.notebook.timeline_widget import TimelineWidget
from swift_nb.record import Run
from swift_nb.render.html import empty
from swift_nb.render.sections import FIRST, TABS, FigurePart, Section
from swift_nb.render.sections.timeline import TimelinePart, not_drawn
from swift_nb.render.tables import summary_html, summary_text

PANEL_STYLE = """<style>
.swift-nb-results .widget-html-content { line-height: 1.4; }
.swift-nb-results table { border-collapse: collapse; margin: 0.4em 0; font-size: 12px; }
.swift-nb-results th, .swift-nb-results td { padding: 0.15em 0.8em 0.15em 0; text-align: left;
  vertical-align: top; }
.swift-nb-results thead th { border-bottom: 1px solid #bbb; }
.swift-nb-results td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.swift-nb-results tr.agg td { border-top: 1px solid #bbb; font-weight: 600; }
.swift-nb-results h4 { margin: 0.8em 0 0.3em; }
.swift-nb-results h3 { font-size: 1.05em; margin: 0 0 0.4em; }
.swift-nb-results .caption, .swift-nb-results .empty { color: #666; font-size: 12px; }
.swift-nb-results .kind { display: inline-block; padding: 0 0.6em; border-radius: 0.8em; background: #444;
  color: #fff; font-weight: 600; }
.swift-nb-results .finding { border-left: 4px solid #e0a800; background: #fffbea; padding: 0.4em 0.8em;
  margin: 0.6em 0; }
.swift-nb-results .finding.info { border-color: #4c72b0; background: #f0f5fb; }
.swift-nb-results .finding.critical { border-color: #c0392b; background: #fdf0ee; }
.swift-nb-results .severity { text-transform: uppercase; font-size: 0.75em; color: #666; }
.jp-OutputArea-child:has(.swift-nb-results) ~ .jp-OutputArea-child { display: none; }
</style>"""

PERFETTO_NOTE = (
    "open it in <a href='https://ui.perfetto.dev' target='_blank' rel='noopener'>ui.perfetto.dev</a>"
)


def show_first(
    run: Run, sections: Sequence[Section], instead_of: DisplayHandle | None = None
) -> DisplayHandle | None:
    """The Summary and the verdict (``sections.FIRST``), shown the moment the run is
    analysed, while its figures are still drawn; ``show_run`` puts its first output in
    their place, so that nothing is shown twice. ``instead_of``: what an earlier call
    showed (a preview's, before the trace was in), replaced in place and returned."""
    first = [s for s in sections if s.kind in FIRST]
    html = summary_html(run) + "".join(f"<div class='swift-nb-section'>{s.html()}</div>" for s in first)
    text = "\n".join([summary_text(run), *(f"[{s.title}: the figures follow]" for s in first)])
    bundle = {"text/html": html, "text/plain": text}
    if instead_of is not None:
        instead_of.update(bundle, raw=True)
        return instead_of
    return display(bundle, raw=True, display_id=True)


def show_run(
    run: Run,
    sections: Sequence[Section],
    panel: bool = True,
    actions: widgets.Widget | None = None,
    first: DisplayHandle | None = None,
) -> None:
    """Display a saved run: the results panel when ``panel`` (a kernel with a widget
    frontend; ``actions`` go to its Advice tab), then the static outputs, always. ``first``:
    what ``show_first`` showed, which the first of these outputs replaces."""
    if panel:
        tabs = results_panel(run, sections, actions)
        bundle = tabs._repr_mimebundle_()
        bundle["text/plain"] = "swift_nb results panel (needs a running kernel; the same results follow)"
        _show(bundle, first)
        first = None
    show_static(run, sections, first)


def results_panel(
    run: Run, sections: Sequence[Section], actions: widgets.Widget | None = None
) -> widgets.VBox:
    """Tabs of a run's results: Summary, Timeline (the trace's timeline widget first),
    Memory, Operators, Advice (a "Show on timeline" button for each finding with a place
    in time, then ``actions``, the rerun controls, when given), Files."""
    content: dict[str, list[widgets.Widget]] = {t: [] for t in TABS}
    content["Summary"].append(_html(summary_html(run)))
    viewers: list[TimelineWidget] = []
    for section in sections:
        if section.tab is not None:
            content[section.tab] += _section_widgets(section, viewers)
    if has_memory(run):
        controls = getattr(actions, "controls", None)  # the rerun controls, when reruns can start
        content["Memory"].append(ForecastForm(run, rerun=getattr(controls, "try_toggles", None)).widget())
    if can_scale(run):
        content["Memory"].append(ScaleForm(run).widget())
    content["Files"][:0] = [_html(files_html(run))]
    buttons: list[widgets.Button] = []
    linked: list[tuple[widgets.Button, dict]] = []
    if viewers and viewers[0].places:
        buttons = [_place_button(p) for p in viewers[0].places]
        content["Advice"].append(_html("<h4>On the timeline</h4>"))
        content["Advice"].append(widgets.HBox(buttons, layout=widgets.Layout(flex_flow="row wrap")))
        # the module scopes' places have a button in the Modules tab too
        for p in viewers[0].places:
            if p["id"] in MODULE_PLACES:
                linked.append((_place_button(p), p))
                content["Modules"].append(linked[-1][0])
    if actions is not None:
        content["Advice"].append(actions)
    for tab in TABS:
        if not content[tab]:
            content[tab].append(_html("<p class='empty'>Nothing recorded for this tab.</p>"))
    tabs = widgets.Tab(children=[widgets.VBox(content[t]) for t in TABS], titles=TABS)
    for button, place in [*zip(buttons, viewers[0].places if viewers else (), strict=False), *linked]:
        button.on_click(_show_place(tabs, viewers[0], place))
    return widgets.VBox([widgets.HTML(PANEL_STYLE), tabs], _dom_classes=["swift-nb-results"])


#: the places (``analysis.timeline.places``) the Modules tab links to
MODULE_PLACES = ("modules", "slow_block")


def _place_button(place: dict) -> widgets.Button:
    return widgets.Button(
        description=f"Show on timeline: {place['title']}",
        tooltip=place["title"],
        layout=widgets.Layout(width="auto"),
        _dom_classes=["swift-nb-show-on-timeline"],
    )


def _show_place(tabs: widgets.Tab, viewer: TimelineWidget, place: dict) -> Callable[[widgets.Button], None]:
    def show(_button: widgets.Button) -> None:
        tabs.selected_index = TABS.index("Timeline")
        viewer.show(place["start_us"], place["end_us"])

    return show


def files_html(run: Run) -> str:
    """The run folder and its files, the trace with a pointer to Perfetto."""
    if run.path is None or not run.path.is_dir():
        return "<p class='empty'>The run was not saved.</p>"
    rows = []
    for path in sorted(p for p in run.path.iterdir() if p.is_file()):
        note = ""
        if run.trace_path is not None and path == run.trace_path:
            note = f"the profiler trace: {PERFETTO_NOTE}"
        elif path.name == run.files.get("report"):
            note = "this report as one HTML file (opens offline)"
        rows.append(
            f"<tr><td><code>{escape(path.name)}</code></td><td class='num'>{escape(fmt_bytes(path.stat().st_size))}"
            f"</td><td>{note}</td></tr>"
        )
    trace = (
        f"<p>Trace: <code>{escape(str(run.trace_path))}</code> — {PERFETTO_NOTE}.</p>"
        if run.trace_path is not None
        else "<p class='empty'>No trace: the profiler recorded no step.</p>"
    )
    return (
        f"<h4>Run folder</h4><p><code>{escape(str(run.path))}</code></p>{trace}"
        f"<table><tbody>{''.join(rows)}</tbody></table>"
    )


def _html(value: str) -> widgets.HTML:
    return widgets.HTML(value, layout=widgets.Layout(max_width="100%"))


def _section_widgets(section: Section, viewers: list[TimelineWidget]) -> list[widgets.Widget]:
    """A section's parts as widgets; the trace's timeline as its widget (kept in
    ``viewers``)."""
    out: list[widgets.Widget] = []
    html = [f"<h4>{escape(section.title)}</h4>"]
    for part in section.parts:
        if isinstance(part, str):
            html.append(part)
            continue
        out.append(_html("".join(html)))
        html = []
        if isinstance(part, TimelinePart):
            out.append(_timeline_widget(part, viewers))
        else:
            out.append(widgets.Image(value=part.png, format="png", layout=widgets.Layout(max_width="100%")))
        out.append(_html(f"<div class='caption'>{escape(part.caption)}</div>"))
    if html:
        out.append(_html("".join(html)))
    return out


def _timeline_widget(part: TimelinePart, viewers: list[TimelineWidget]) -> widgets.Widget:
    """The trace's timeline widget (kept in ``viewers``), or why there is none."""
    try:
        viewer = TimelineWidget(part.run, timeline=part.timeline, places=part.places)
    except Exception as e:  # the rest of the panel stands without it
        return _html(empty(not_drawn(e)))
    viewers.append(viewer)
    return viewer


def show_static(run: Run, sections: Sequence[Section], first: DisplayHandle | None = None) -> None:
    """The run's report, section by section, as static outputs: HTML for text and tables,
    image/png for figures, each with a plain-text fallback for terminals. The Summary
    replaces ``first`` when given."""
    _show({"text/html": summary_html(run), "text/plain": summary_text(run)}, first)
    for section in sections:
        if not section.static:
            continue
        html = [f"<h4>{escape(section.title)}</h4>"]
        for part in section.parts:
            if isinstance(part, str):
                html.append(part)
                continue
            _display_html(html, section.title)
            html = []
            _display_figure(part)
        _display_html(html, section.title)
    if "report" in run.files:
        print(f"report: {run.path / run.files['report']}")


def _show(bundle: dict[str, str], instead_of: DisplayHandle | None) -> None:
    if instead_of is None:
        display(bundle, raw=True)
    else:
        instead_of.update(bundle, raw=True)


def _display_figure(part: FigurePart) -> None:
    for output in part.outputs():
        display(output, raw=True)


def _display_html(fragments: list[str], title: str) -> None:
    if fragments:
        html = f"<div class='swift-nb-section'>{''.join(fragments)}</div>"
        display({"text/html": html, "text/plain": f"[{title}: see the HTML output or report.html]"}, raw=True)
