"""Markup shared by every HTML document swift_nb writes (report.html, compare.html) and by
the report's sections: the page's policy and style, the inline figure tag, and tables
whose headings are their keys' labels and whose values carry their units
(``swift_nb.render.labels``), no cell longer than ``CELL_CHARS``.

Every string that comes from the user or the trace is escaped here.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

import pandas as pd

from swift_nb.render.labels import label
from swift_nb.render.value_text import is_missing, value_text

#: the most characters a table cell shows: longer text is prose, and goes under the table
CELL_CHARS = 80
SI_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))

# A policy that allows only inline styles and data: images: even if a string slipped past
# escaping, the page could neither run a script nor reach the network.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       margin: 0 auto; max-width: 1080px; padding: 1.5em; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; overflow-wrap: anywhere; }
h2 { font-size: 1.2em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.8em; }
h3 { font-size: 1.05em; margin: 0 0 0.4em; overflow-wrap: anywhere; }
.sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { padding: 0.2em 0.8em 0.2em 0; text-align: left; vertical-align: top; }
thead th { border-bottom: 1px solid #bbb; }
tbody tr:nth-child(even) { background: #f6f6f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.text { overflow-wrap: anywhere; max-width: 32em; }
tr.agg td { border-top: 1px solid #bbb; font-weight: 600; }
figure { margin: 1em 0; }
figure img { max-width: 100%; height: auto; display: block; }
figcaption { color: #666; font-size: 0.85em; }
.verdict { font-size: 1.1em; }
.kind { display: inline-block; padding: 0.1em 0.6em; border-radius: 0.8em; background: #444; color: #fff;
        font-weight: 600; }
.finding { border-left: 4px solid #e0a800; background: #fffbea; padding: 0.6em 0.9em; margin: 0.8em 0; }
.finding.info { border-color: #4c72b0; background: #f0f5fb; }
.finding.critical { border-color: #c0392b; background: #fdf0ee; }
.finding p { margin: 0.3em 0; }
.severity { text-transform: uppercase; font-size: 0.75em; color: #666; letter-spacing: 0.05em; }
code { background: #eee; padding: 0 0.25em; border-radius: 3px; overflow-wrap: anywhere; }
.empty { color: #777; font-style: italic; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
"""


def clipped(text: str, limit: int = CELL_CHARS) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis in the middle, so both ends
    (an operator's namespace and its variant, a path's root and its file) stay readable."""
    if len(text) <= limit:
        return text
    head = (limit - 1) * 2 // 3
    return f"{text[:head]}…{text[len(text) - (limit - 1 - head) :]}"


def cell(text: str, cls: str, tooltip: str = "") -> str:
    """A table cell of at most ``CELL_CHARS`` characters; a longer text is clipped, whole in
    its tooltip (``tooltip``: what the tooltip says otherwise)."""
    shown = clipped(text)
    tooltip = text if shown != text else tooltip
    title = f" title='{escape(tooltip)}'" if tooltip else ""
    return f"<td class='{cls}'{title}>{escape(shown)}</td>"


def fmt_si(value: float | None, unit: str) -> str:
    """``value`` with an SI prefix: ``fmt_si(3.2e12, "FLOP/s")`` → ``3.20 TFLOP/s``."""
    if is_missing(value):
        return "–"
    assert value is not None  # is_missing: None is missing
    value = float(value)
    for factor, prefix in SI_PREFIXES:
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:.2f} {unit}"


def pct1(value: Any) -> str:
    """A percentage with one decimal (``12.3 %``)."""
    return "–" if is_missing(value) else f"{float(value):.1f} %"


def header(column: str, within: str | None = None) -> str:
    """A column's heading: its key's label (``swift_nb.render.labels``); a column named in words
    already stays as it is."""
    return column if not column.isidentifier() else label(column, within)


def empty(text: str) -> str:
    """A note standing in for what is not there."""
    return f"<p class='empty'>{escape(text)}</p>"


def frame_table(df: pd.DataFrame, agg_rows: int = 0) -> str:
    """``df`` as an escaped HTML table: each column headed by its label, each value in the
    unit its column's key names, no cell over ``CELL_CHARS``; the last ``agg_rows`` rows
    are styled as aggregates."""
    numeric = {c: pd.api.types.is_numeric_dtype(df[c]) for c in df.columns}
    head = "".join(f"<th>{escape(header(str(c)))}</th>" for c in df.columns)
    rows = []
    for i, record in enumerate(df.itertuples(index=False, name=None)):
        cells = "".join(
            cell(value_text(str(c), v), "num" if numeric[c] else "text")
            for c, v in zip(df.columns, record, strict=True)
        )
        agg = " class='agg'" if i >= len(df) - agg_rows else ""
        rows.append(f"<tr{agg}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def kv_table(pairs: Sequence[tuple[str, Any]], within: str | None = None) -> str:
    """(key, value) pairs as a two-column table: each key's label, its value in its unit
    (``within``: the finding the keys belong to, see ``labels.label``)."""
    return text_table([(header(str(k), within), value_text(str(k), v)) for k, v in pairs])


def evidence_html(evidence: Mapping[str, Any], within: str | None = None) -> str:
    """The numbers behind a verdict or a finding, in their order: those whose value fits a
    cell as a table of labels and values, the longer ones (a list of guards, where a
    count comes from) as a list under it, whole."""
    rows = [(header(str(k), within), value_text(str(k), v)) for k, v in evidence.items()]
    short = [(k, v) for k, v in rows if len(v) <= CELL_CHARS]
    long = "".join(f"<li>{escape(k)}: {escape(v)}</li>" for k, v in rows if len(v) > CELL_CHARS)
    return (text_table(short) if short else "") + (f"<ul class='evidence'>{long}</ul>" if long else "")


def text_table(rows: Sequence[tuple[str, str]], cls: str = "text") -> str:
    """(name, text) pairs, already formatted, as a two-column table (``cls``: the values'
    CSS class); a text over ``CELL_CHARS`` is clipped, whole in its tooltip."""
    body = "".join(f"<tr><th>{escape(k)}</th>{cell(v, cls)}</tr>" for k, v in rows)
    return f"<table><tbody>{body}</tbody></table>"


def figure_html(png: bytes, alt: str, caption: str, key: str | None = None) -> str:
    """A PNG inlined as a data: URL with its caption; ``key`` (``figure_cache.figure_key``)
    marks what it shows, so that a report written again can reuse it."""
    data = base64.b64encode(png).decode("ascii")
    keyed = f" data-figure='{key}'" if key is not None else ""
    return (
        f"<figure><img alt='{escape(alt)}'{keyed} src='data:image/png;base64,{data}'>"
        f"<figcaption>{escape(caption)}</figcaption></figure>"
    )
