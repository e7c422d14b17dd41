"""Markup shared by every HTML document swift_nb writes (report.html, compare.html) and by
the report's sections: the page's policy and style, the inline figure tag, tables whose
values carry the unit their column names, and value formatting.

Every string that comes from the user or the trace is escaped here.
"""

from __future__ import annotations

import base64
import json
import math
import numbers
from collections.abc import Sequence
from html import escape
from typing import Any

import pandas as pd

from swift_nb.units import fmt_bytes, fmt_pct, fmt_seconds

UNIT_SUFFIXES = ("_s", "_bytes", "_pct")
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


def is_missing(value: Any) -> bool:
    """Whether ``value`` is absent: None or NaN."""
    return value is None or (isinstance(value, numbers.Real) and math.isnan(float(value)))


def fmt_value(name: str, value: Any) -> str:
    """``value`` as text, in the unit its ``name`` carries (``_bytes``, ``_pct``, ``_s``
    anywhere among its ``_``-separated words, e.g. ``growth_bytes_per_step``)."""
    if is_missing(value):
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Real):
        words = name.split("_")
        if "bytes" in words:
            return fmt_bytes(value)
        if "pct" in words:
            return fmt_pct(value)
        if "s" in words:
            return fmt_seconds(value)
        return str(value) if isinstance(value, numbers.Integral) else f"{float(value):.4g}"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str)
    return str(value)


def fmt_si(value: float | None, unit: str) -> str:
    """``value`` with an SI prefix: ``fmt_si(3.2e12, "FLOP/s")`` → ``3.20 TFLOP/s``."""
    if is_missing(value):
        return "–"
    value = float(value)
    for factor, prefix in SI_PREFIXES:
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:.2f} {unit}"


def pct1(value: Any) -> str:
    """A percentage with one decimal (``12.3 %``)."""
    return "–" if is_missing(value) else f"{float(value):.1f} %"


def header(column: str) -> str:
    """A column's heading: its name without the unit suffix, words spaced."""
    for suffix in UNIT_SUFFIXES:
        if column.endswith(suffix):
            column = column.removesuffix(suffix)
            break
    return column.replace("_", " ")


def empty(text: str) -> str:
    """A note standing in for what is not there."""
    return f"<p class='empty'>{escape(text)}</p>"


def frame_table(df: pd.DataFrame, agg_rows: int = 0) -> str:
    """``df`` as an escaped HTML table, each value in the unit its column names; the
    last ``agg_rows`` rows are styled as aggregates."""
    numeric = {c: pd.api.types.is_numeric_dtype(df[c]) for c in df.columns}
    head = "".join(f"<th>{escape(header(str(c)))}</th>" for c in df.columns)
    rows = []
    for i, record in enumerate(df.itertuples(index=False, name=None)):
        cells = "".join(
            f"<td class='{'num' if numeric[c] else 'text'}'>{escape(fmt_value(str(c), v))}</td>"
            for c, v in zip(df.columns, record, strict=True)
        )
        agg = " class='agg'" if i >= len(df) - agg_rows else ""
        rows.append(f"<tr{agg}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def kv_table(pairs: Sequence[tuple[str, Any]]) -> str:
    """(name, value) pairs as a two-column table, each value in the unit its name carries."""
    body = "".join(
        f"<tr><th>{escape(str(k))}</th><td class='text'>{escape(fmt_value(str(k), v))}</td></tr>"
        for k, v in pairs
    )
    return f"<table><tbody>{body}</tbody></table>"


def text_table(rows: Sequence[tuple[str, str]], cell: str = "text") -> str:
    """(name, text) pairs, already formatted, as a two-column table (``cell``: the values'
    CSS class)."""
    body = "".join(f"<tr><th>{escape(k)}</th><td class='{cell}'>{escape(v)}</td></tr>" for k, v in rows)
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
