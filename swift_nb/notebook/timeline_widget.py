"""``swift_nb.timeline(run)``: a run's trace as a zoomable timeline in a notebook.

An anywidget (one ES module, ``render/static``: JupyterLab, Notebook 7, VS Code, Colab)
that never holds the trace: on every zoom and pan, debounced, its JavaScript asks this
kernel what to draw (``Timeline.query`` at the canvas's width) through the widget's custom
messages, and hover, click and search likewise (``TimelineWidget.answer``). Its first view
comes with the widget, so it paints before any message returns.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from html import escape
from itertools import count
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as widgets
import traitlets

from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.timeline.query import Timeline, step_window
from swift_nb.analysis.timeline.ranks import rank_overview
from swift_nb.record import Run, load_run
from swift_nb.render.sections.timeline import own_rank, place_list
from swift_nb.render.timeline.view import viewer_js

#: the first view's width in pixels, before the browser says how wide the canvas is
INITIAL_WIDTH_PX = 1000
#: past this many ranks a job opens on one summary track per rank
OVERVIEW_RANKS = 16

_goto_seq = count(1)


class TimelineWidget(anywidget.AnyWidget):
    """The timeline of one run (one rank of a job: ``rank``; past 16 ranks, with none
    given, one summary track per rank that opens into its detail on a click).

    ``places``: ``[{id, title, start_us, end_us}]``, the findings' windows, each a button
    that zooms there; ``show(start_us, end_us)`` zooms from Python."""

    _esm = viewer_js()
    initial = traitlets.Dict().tag(sync=True)
    places = traitlets.List().tag(sync=True)
    ranks = traitlets.List().tag(sync=True)
    rank = traitlets.Int(-1).tag(sync=True)
    goto = traitlets.Dict().tag(sync=True)
    #: the window drawn, as the viewer last asked for it (µs: start_us, end_us)
    view = traitlets.Dict().tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)

    def __init__(
        self,
        run: Run,
        rank: int | None = None,
        timeline: Timeline | None = None,
        places: Sequence[dict[str, Any]] = (),
    ) -> None:
        self.run = run
        paths = run.rank_trace_paths()
        ranks = sorted(paths)
        self.overview = timeline is None and rank is None and len(ranks) > OVERVIEW_RANKS
        if timeline is None:
            timeline = rank_overview(run) if self.overview else Timeline.of_run(run, rank)
        if rank is None:
            rank = own_rank(run)
        self.timeline = timeline
        super().__init__(
            initial=self._first_view(timeline),
            places=list(places),
            ranks=ranks if len(ranks) > 1 else [],
            rank=-1 if self.overview else rank,
            title=run.label or run.id,
        )
        self.on_msg(self._on_message)

    @staticmethod
    def _first_view(timeline: Timeline) -> dict[str, Any]:
        return timeline.payload(
            timeline.query(width_px=INITIAL_WIDTH_PX), timeline.counters(width_px=INITIAL_WIDTH_PX)
        )

    def show(self, start_us: float, end_us: float, exact: bool = False) -> None:
        """Zoom the drawn timeline to ``start_us``…``end_us`` (µs, the trace's clock),
        with a margin around it unless ``exact``."""
        self.goto = {
            "start_us": float(start_us),
            "end_us": float(end_us),
            "exact": exact,
            "seq": next(_goto_seq),
        }

    def answer(self, content: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]:
        """The reply to one of the viewer's requests (``op``: ``query``, ``detail``,
        ``search``, ``trace``, ``rank``) and its binary buffers; a request that fails is
        answered with its ``error``, which the viewer shows."""
        reply: dict[str, Any] = {"id": content.get("id"), "op": content.get("op")}
        try:
            out, buffers = self._answer(content)
        except Exception as e:  # the viewer says so; the kernel and the widget carry on
            return {**reply, "error": f"{type(e).__name__}: {e}"}, []
        return {**reply, **out}, buffers

    def _answer(self, content: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]:
        op, tl = content.get("op"), self.timeline
        if op == "query":
            window = (content.get("start_us"), content.get("end_us"), int(content.get("width_px", 1000)))
            return {"payload": tl.payload(tl.query(*window), tl.counters(*window))}, []
        if op == "detail":
            return {
                "detail": tl.detail(str(content["track"]), int(content["depth"]), float(content["t_us"]))
            }, []
        if op == "search":
            return {"results": tl.search(str(content.get("text", ""))).to_dict("records")}, []
        if op == "trace":
            path = self._trace_path()
            return {}, [path.read_bytes()] if path is not None and path.is_file() else []
        if op == "rank":
            return self._switch_rank(int(content["rank"])), []
        raise ValueError(f"unknown request {op!r}")

    def _trace_path(self) -> Path | None:
        return self.run.rank_trace_paths().get(self.rank, self.run.trace_path)

    def _switch_rank(self, rank: int) -> dict[str, Any]:
        """Another rank's timeline (-1: the overview of every rank) in place of this one."""
        self.overview = rank < 0
        self.timeline = rank_overview(self.run) if self.overview else Timeline.of_run(self.run, rank)
        self.rank = rank
        return {"initial": self._first_view(self.timeline), "rank": rank}

    def _on_message(self, _widget: Any, content: dict[str, Any], _buffers: list[bytes]) -> None:
        reply, buffers = self.answer(content)
        self.send(reply, buffers)


def timeline(
    run: Run | str | os.PathLike,
    rank: int | None = None,
    other: Run | str | os.PathLike | None = None,
    step: int | None = None,
    findings: Iterable[Finding] | None = None,
) -> widgets.Widget:
    """The zoomable timeline of ``run``.

    Args:
        run: a Run or its folder.
        rank: one rank of a job's folder (default: the run's own rank; past 16 ranks, one
            summary track per rank).
        other: a second run (or its folder) drawn below the first, both zoomed to profiler
            step ``step`` (the diff view).
        step: the profiler step the timeline opens zoomed to (default: the whole trace).
        findings: the advisor's, for "show on timeline" (by default the run is analyzed for
            them).

    Returns:
        The widget: the timeline, or with ``other`` both runs' timelines, each under its
        name, the two following each other's zoom.
    """
    run = run if isinstance(run, Run) else load_run(run)
    if other is None:
        return _with_places(TimelineWidget(run, rank=rank), findings, step)
    other = other if isinstance(other, Run) else load_run(other)
    pair = [
        _with_places(TimelineWidget(r, rank=rank), findings if r is run else None, step) for r in (run, other)
    ]
    at_step = f" · step {step}" if step is not None else ""
    heads = [widgets.HTML(f"<b>{escape(r.label or r.id)}</b>{at_step}") for r in (run, other)]
    starts = [step_window(w.timeline, step)[0] if step is not None else w.timeline.start_us for w in pair]
    follow(pair[1], pair[0], starts[1] - starts[0])
    follow(pair[0], pair[1], starts[0] - starts[1])
    return widgets.VBox([heads[0], pair[0], heads[1], pair[1]])


def follow(follower: TimelineWidget, leader: TimelineWidget, offset_us: float) -> None:
    """Keep ``follower`` on ``leader``'s window shifted by ``offset_us`` (the diff view:
    the same time from the step's start in both). A window it already shows, to the µs,
    is not asked again, so two widgets that follow each other settle."""

    def move(change: dict[str, Any]) -> None:
        start, end = change["new"]["start_us"] + offset_us, change["new"]["end_us"] + offset_us
        shown = follower.view
        if shown and abs(shown["start_us"] - start) < 1 and abs(shown["end_us"] - end) < 1:
            return
        follower.show(start, end, exact=True)

    leader.observe(move, "view")


def _with_places(
    widget: TimelineWidget, findings: Iterable[Finding] | None, step: int | None
) -> TimelineWidget:
    if findings is None:
        from swift_nb.reporting import findings_of

        findings = findings_of(widget.run)
    if widget.overview:
        return widget
    widget.places = place_list(widget.run, findings)
    if step is not None:
        window = step_window(widget.timeline, step)
        widget.show(*window)
    return widget
