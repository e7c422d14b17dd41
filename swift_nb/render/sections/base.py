"""What every report section is made of: the inputs it is built from, its kind (title, tab,
builder) and the built section (escaped HTML fragments and figures, in order)."""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from html import escape
from typing import TYPE_CHECKING, Any, Protocol

import pandas as pd

from swift_nb.analysis.advisor.findings import Finding, Verdict
from swift_nb.record import Run
from swift_nb.render.figures import figure_png
from swift_nb.render.html import empty, figure_html

if TYPE_CHECKING:
    from matplotlib.figure import Figure


#: The results panel's tabs, in order; every section names the one it goes to
TABS = ("Summary", "Timeline", "Memory", "Operators", "Modules", "Advice", "Files")


@dataclass
class ReportInputs:
    """What the sections are built from: the run and its analyses' outputs
    (``step_breakdown``, ``memory_footprint``, ``memory_timeline``, ``top_operators`` by
    time and by memory, throughput, the advisor's verdict and findings, for a job of several
    ranks ``analysis.ranks.per_rank`` and the collectives, for a trace with device work
    ``analysis.device``'s summary, per-step table, kernel kinds and idle causes, and the
    forecasts). Any may be missing; ``not_analyzed``: why the analysis could not run
    (``trace.json.gz is damaged (…): the analysis could not run``), which each section
    without its analysis then says."""

    run: Run
    breakdown: pd.DataFrame | None = None
    footprint: pd.DataFrame | None = None
    timeline: pd.DataFrame | None = None
    operators_time: pd.DataFrame | None = None
    operators_memory: pd.DataFrame | None = None
    throughput: Any = None
    verdict: Verdict | None = None
    findings: Sequence[Finding] | None = None
    per_rank: pd.DataFrame | None = None
    collectives: pd.DataFrame | None = None
    device: dict | None = None
    device_steps: pd.DataFrame | None = None
    kernel_kinds: pd.DataFrame | None = None
    idle_causes: pd.DataFrame | None = None
    forecasts: Sequence[Any] | None = None
    forecast_problem: str | None = None
    modules: pd.DataFrame | None = None
    not_analyzed: str | None = None


@dataclass
class FigurePart:
    """A figure inside a section: embedded as a PNG in the report, shown as an image/png
    output in a notebook. ``draw`` makes the figure when it is first needed; ``key``
    (``figure_cache.figure_key``) names what it shows, so that a PNG drawn earlier
    (``drawn``, handed out by a ``FigureCache``) is used instead."""

    draw: Callable[[], Figure]
    alt: str
    caption: str
    key: str | None = None
    drawn: bytes | None = field(default=None, repr=False)

    @cached_property
    def figure(self) -> Figure:
        return self.draw()

    @cached_property
    def png(self) -> bytes:
        return self.drawn if self.drawn is not None else figure_png(self.figure)

    def html(self) -> str:
        return figure_html(self.png, self.alt, self.caption, self.key)

    def outputs(self) -> list[dict[str, str]]:
        """The figure as a notebook's outputs: the PNG, then its caption saying what it
        shows (an image output carries no alternative text of its own)."""
        return figure_outputs(self.png, self.alt, self.caption)


def figure_outputs(png: bytes, alt: str, caption: str) -> list[dict[str, str]]:
    """A figure as a notebook's display outputs: ``image/png`` (its text twin the alt
    text), then the caption as HTML and text."""
    return [
        {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": f"[{alt}]"},
        {"text/html": f"<p class='swift-nb-caption'><i>{escape(caption)}</i></p>", "text/plain": caption},
    ]


Part = str | FigurePart


class EmbeddedPart(Protocol):
    """A part that is neither text nor a figure of the cache, and renders itself: the
    timeline's viewer (``sections.timeline.TimelinePart``)."""

    alt: str
    caption: str
    drawn: bytes | None

    @property
    def key(self) -> str | None: ...

    def html(self) -> str: ...


@dataclass(frozen=True)
class SectionKind:
    """One section of the report: its ``title``, the results panel's ``tab`` it goes to
    (one of ``TABS``; None: the panel shows it otherwise, as the summary), whether the
    notebook's ``static`` outputs show it, and ``build``, which makes its parts from the
    report's inputs (None: the run has no such section)."""

    title: str
    tab: str | None
    build: Callable[[ReportInputs], Sequence[Part | EmbeddedPart] | None]
    static: bool = True

    def __post_init__(self) -> None:
        if self.tab is not None and self.tab not in TABS:
            raise ValueError(
                f"section {self.title!r}: tab must be one of {', '.join(TABS)}; got {self.tab!r}"
            )

    def section(self, inputs: ReportInputs) -> Section | None:
        parts = self.build(inputs)
        return Section(self, parts) if parts is not None else None


@dataclass
class Section:
    """A built section: escaped HTML fragments and figures, in order."""

    kind: SectionKind
    parts: Sequence[Part | EmbeddedPart] = field(default_factory=list)

    @property
    def title(self) -> str:
        return self.kind.title

    @property
    def tab(self) -> str | None:
        return self.kind.tab

    @property
    def static(self) -> bool:
        return self.kind.static

    def html(self) -> str:
        body = "".join(p if isinstance(p, str) else p.html() for p in self.parts)
        return f"<h2>{escape(self.title)}</h2>{body}"


def has_rows(df: pd.DataFrame | None) -> bool:
    return df is not None and not df.empty


def not_analyzed(what: str, reason: str | None, otherwise: str) -> str:
    """The empty note of a section without its analysis: why the analysis could not run
    when it could not (``reason``), else ``otherwise`` (it ran, and found nothing)."""
    return empty(f"{what} — {reason}." if reason is not None else f"{what}: {otherwise}")
