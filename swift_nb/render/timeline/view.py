"""The timeline viewer outside Python: its JavaScript as one ES module (the notebook
widget's and report.html's), the report's embedded viewer, and the static PNG that an
executed notebook keeps of a timeline.

The viewer's source is five files under ``static/`` (data, drawing, the view's state, its
input, the viewer that composes them), joined here in that order (``SOURCES``) with their
relative imports taken out: one module, no bundler, no network. ``tests/js`` tests their
pure functions under ``node --test``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from swift_nb.render.figures import new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from swift_nb.analysis.timeline.query import Timeline

STATIC = Path(__file__).with_name("static")
#: the viewer's files, each after the ones it imports from
SOURCES = ("timeline_data.js", "timeline_draw.js", "timeline_state.js", "timeline_input.js", "timeline.js")
_LOCAL_IMPORT = re.compile(r'^import \{[^}]*\} from "\./timeline_\w+\.js";\n', re.MULTILINE)
_INLINE_SCRIPT = re.compile(r"<script type=\"module\">(.*?)</script>", re.DOTALL)
#: the report's viewer: where it mounts and where its data is
HOST_ID = "swift-timeline"
DATA_ID = "swift-timeline-data"


@functools.cache
def viewer_js() -> str:
    """The viewer as one ES module (its default export is anywidget's ``render``)."""
    return "\n".join(_LOCAL_IMPORT.sub("", (STATIC / name).read_text("utf-8")) for name in SOURCES)


def embedded_html(
    timeline: Timeline,
    places: list[dict[str, Any]],
    title: str,
    overview: Timeline | None = None,
    rank: int = 0,
) -> str:
    """The report's viewer: a host element, the timeline's embedded items as a JSON data
    block (``Timeline.embed``: every event if under its budget, else the merged level of
    detail, with a note) and the viewer's module, inline. ``places``: the findings'
    windows, ``[{id, title, start_us, end_us}]``. A job's ``overview`` (one summary track
    per rank, ``analysis.timeline_ranks``) is embedded beside its ``rank``'s events."""
    data = timeline.embed()
    data.update(places=places, title=title, rank=rank)
    if overview is not None:
        data["overview"] = overview.embed()
    # "<" escaped keeps any name from ending the data block ("</script>") early
    text = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    boot = (
        f"mountEmbedded(document.getElementById({HOST_ID!r}),"
        f" JSON.parse(document.getElementById({DATA_ID!r}).textContent));"
    )
    return (
        f"<div id='{HOST_ID}' class='swift-tl-host'></div>"
        f"<script type='application/json' id='{DATA_ID}'>{text}</script>"
        f'<script type="module">{viewer_js()}\n{boot}</script>'
    )


def embedded_in(html: str) -> str | None:
    """The viewer ``embedded_html`` made, as it stands in the report ``html`` (None when it
    has none): its host, its data block and its module, which a report written again from
    the same analysis takes as it is."""
    start = html.find(f"<div id='{HOST_ID}'")
    data_end = html.find("</script>", start) if start >= 0 else -1
    end = html.find("</script>", data_end + 1) if data_end >= 0 else -1
    return html[start : end + len("</script>")] if end >= 0 else None


def script_sources(html: str) -> str:
    """The Content-Security-Policy's ``script-src`` for the inline module scripts in
    ``html``: each one's sha256, so those run and nothing else does (empty: no scripts)."""
    hashes = [
        "'sha256-" + base64.b64encode(hashlib.sha256(m.encode("utf-8")).digest()).decode("ascii") + "'"
        for m in _INLINE_SCRIPT.findall(html)
    ]
    return f"; script-src {' '.join(hashes)}" if hashes else ""


#: the PNG's colours by track kind
KIND_COLORS = {"steps": "#8c8c8c", "cpu": "#4c72b0", "gpu": "#55a868", "worker": "#c44e52"}
_ROW_IN = 0.16
_COUNTER_IN = 0.45


def timeline_figure(timeline: Timeline, width_px: int = 1000, width_in: float = 10.0) -> Figure:
    """The whole timeline as a static figure: each span track's rows as bars (from
    ``Timeline.query`` at ``width_px``), each counter as a filled line, on a shared time
    axis in ms from the trace's start."""
    from matplotlib.ticker import NullLocator

    tracks = timeline.tracks.reset_index(drop=True)
    items = timeline.query(width_px=width_px)
    counters = timeline.counters(width_px=width_px)
    heights = [
        _COUNTER_IN if k == "counter" else _ROW_IN * (int(d) + 1)
        for k, d in zip(tracks["kind"], tracks["max_depth"], strict=True)
    ]
    fig = new_figure(width_in, 0.9 + sum(heights) + 0.08 * len(heights))
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=2.0 / w, right=1 - 0.2 / w, top=1 - 0.35 / h, bottom=0.5 / h, hspace=0.15)
    # one time axis, drawn under the last track: the others get no ticks at all (not
    # shared ones hidden), which would be most of the figure's drawing time
    axes = fig.subplots(len(tracks), 1, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0]
    t0 = timeline.start_us
    span_ms = max(timeline.end_us - t0, 1e-3) / 1000
    for ax, track in zip(axes, tracks.itertuples(index=False), strict=True):
        ax.set_xlim(0, span_ms)
        if ax is not axes[-1]:
            ax.xaxis.set_major_locator(NullLocator())
            ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_locator(NullLocator())
        ax.yaxis.set_minor_locator(NullLocator())
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
        ax.set_ylabel(
            track.label if len(track.label) <= 28 else track.label[:27] + "…",
            rotation=0,
            ha="right",
            va="center",
            fontsize=7,
        )
        if track.kind == "counter":
            series = counters[counters["track"] == track.track]
            ax.fill_between(
                (series["t_us"] - t0) / 1000, series["value"], step="post", color="#4c72b0", alpha=0.4, lw=0.8
            )
            continue
        rows = items[items["track"] == track.track]
        for depth, row in rows.groupby("depth"):
            spans = list(
                zip(
                    (row["start_us"] - t0) / 1000,
                    np.maximum((row["end_us"] - row["start_us"]) / 1000, 0),
                    strict=True,
                )
            )
            ax.broken_barh(spans, (-depth - 0.9, 0.8), color=KIND_COLORS.get(track.kind, "#4c72b0"), lw=0)
        ax.set_ylim(-int(track.max_depth) - 1, 0)
    axes[-1].set_xlabel("time since the trace's start (ms)")
    axes[0].set_title(
        "Timeline of the profiled steps (swift_nb.timeline(run) opens it zoomable)", fontsize=9, loc="left"
    )
    return fig
