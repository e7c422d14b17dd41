"""The "Will it fit" part of a report and a notebook: for each forecast configuration, its
sentences, a table (bytes by category, total, the device's capacity, its CUDA context, the
room for tensors, fit or not with the headroom, the largest batch and sequence that fit)
and one stacked bar per configuration against the device's room.

``forecast_section(forecasts)`` is the section's HTML body (the caller adds the ``TITLE``
heading, as for every section); ``forecast_text(forecasts)`` the same for a terminal;
``forecast_figure(forecasts)`` the bars alone; ``forecast_html(forecast)`` one forecast as a
notebook shows it (registered with IPython's HTML formatter by ``swift_nb``). ``parse_forecast_spec`` reads the magic's
``--forecast "H100-80GB batch=32 seq=4096 dtype=bf16"`` into ``forecast()``'s keywords.
Every string that comes from the user or the record is escaped.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

from swift_nb.analysis.forecast import Forecast, parse_forecast_spec
from swift_nb.core.units import fmt_bytes
from swift_nb.record import MEMORY_CATEGORIES
from swift_nb.render.figures import GIB, MEMORY_COLORS, figure_png, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "TITLE",
    "forecast_figure",
    "forecast_html",
    "forecast_section",
    "forecast_text",
    "parse_forecast_spec",
]

TITLE = "Will it fit"
BAR_HEIGHT_IN = 0.75  # per configuration, its label above its bar
FIGURE_WIDTH_IN = 8.0
# margins (inches): the axis' ticks, its label and the legend of the categories below the bars
TOP_IN, SIDE_IN, BOTTOM_IN = 0.3, 0.25, 0.75


def label(f: Forecast) -> str:
    """A configuration in a few words: ``H100-80GB · batch 32 × 4,096 · bfloat16 · flash_attention``."""
    shape = f"batch {f.batch_size}" + (f" × {f.seq_len:,}" if f.seq_len else "")
    parts = [f.device, shape, f.dtype, *f.toggles]
    if f.world_size > 1:
        parts.append(f"{f.world_size} ranks")
    return " · ".join(parts)


def _rows(f: Forecast) -> list[tuple[str, str, str, str]]:
    """(what, forecast, measured in the run, class) rows of one configuration's table."""
    rows = [
        (c.replace("_", " "), fmt_bytes(f.categories[c]), fmt_bytes(f.measured.get(c)), "")
        for c in MEMORY_CATEGORIES
    ]
    rows.append(("total", fmt_bytes(f.total_bytes), fmt_bytes(sum(f.measured.values())), "agg"))
    rows += [
        ("device capacity", fmt_bytes(f.capacity_bytes), "", ""),
        ("CUDA context", fmt_bytes(f.context_bytes), "", ""),
        ("room for tensors", fmt_bytes(f.usable_bytes), "", ""),
        (
            "fits" if f.fits else "does not fit",
            f"{fmt_bytes(f.headroom_bytes)} headroom" if f.fits else f"{fmt_bytes(-f.headroom_bytes)} short",
            "",
            "agg",
        ),
    ]
    if f.seq_len:
        rows.append((f"largest batch at {f.seq_len:,} tokens", _count(f.max_batch_size), "", ""))
        rows.append((f"longest sequence at batch {f.batch_size}", _count(f.max_seq_len, " tokens"), "", ""))
    else:
        rows.append(("largest batch", _count(f.max_batch_size), "", ""))
    return rows


def _count(value: int | None, unit: str = "") -> str:
    if value is None:
        return "not limited by memory"
    return f"{value:,}{unit}" if value else "none fits"


_AGG = " class='agg'"  # the total and the verdict, as the report styles aggregate rows


def _table(f: Forecast) -> str:
    body = "".join(
        f"<tr{_AGG if cls else ''}><th>{escape(what)}</th><td class='num'>{escape(value)}</td>"
        f"<td class='num'>{escape(measured)}</td></tr>"
        for what, value, measured, cls in _rows(f)
    )
    shape = f"batch {f.measured_config.get('batch_size') or '?'}"
    if f.measured_config.get("seq_len"):
        shape += f" × {f.measured_config['seq_len']:,}"
    if f.measured_config.get("finetune"):
        shape += f", {f.measured_config['finetune']}"
    head = f"<tr><th></th><th>forecast</th><th>measured ({escape(shape)})</th></tr>"
    return f"<table><thead>{head}</thead><tbody>{body}</tbody></table>"


def forecast_figure(forecasts: Sequence[Forecast]) -> Figure:
    """One stacked horizontal bar per configuration, each on its device's own scale and
    under its label: its bytes by category (GiB, every category in the legend), the
    device's room for tensors (solid line) and its whole capacity (dashed)."""
    n = max(1, len(forecasts))
    fig = new_figure(FIGURE_WIDTH_IN, TOP_IN + BOTTOM_IN + BAR_HEIGHT_IN * n)
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    w, h = fig.get_size_inches()
    fig.subplots_adjust(
        left=SIDE_IN / w, right=1 - SIDE_IN / w, top=1 - TOP_IN / h, bottom=BOTTOM_IN / h, hspace=0.9
    )
    for ax, f in zip(axes, forecasts, strict=False):
        left = 0.0
        for c in MEMORY_CATEGORIES:
            width = f.categories[c] / GIB
            ax.barh(0, width, left=left, height=0.7, color=MEMORY_COLORS[c], label=c.replace("_", " "))
            left += width
        ax.axvline(f.usable_bytes / GIB, color="#222", lw=1.5)
        ax.axvline(f.capacity_bytes / GIB, color="#222", lw=1, ls="--")
        right = max(left, f.capacity_bytes / GIB) * 1.02
        ax.set_xlim(0, right)
        ax.set_ylim(-0.6, 0.6)
        ax.set_yticks([])
        ax.set_title(label(f), loc="left", fontsize=8, pad=3)
        ax.tick_params(axis="x", labelsize=7)
        verdict = "fits" if f.fits else "does not fit"
        inside = left > 0.6 * right  # no room after the bar: write on it
        ax.text(
            left,
            0,
            f" {fmt_bytes(f.total_bytes)} of {fmt_bytes(f.usable_bytes)}: {verdict} ",
            ha="right" if inside else "left",
            va="center",
            fontsize=8,
            color="white" if inside else ("#222" if f.fits else "#c0392b"),
            bbox={"facecolor": "#333", "alpha": 0.7, "edgecolor": "none", "pad": 1} if inside else None,
        )
    axes[-1].set_xlabel("GiB", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncols=len(MEMORY_CATEGORIES), fontsize=8, frameon=False)
    return fig


def forecast_section(forecasts: Sequence[Forecast], figure: bool = True) -> str:
    """The section's HTML body: for each configuration its sentences, its table and how each
    number was found; then the bars (``figure``: as an embedded PNG)."""
    if not forecasts:
        return "<p class='empty'>No forecast was asked for.</p>"
    parts = []
    for f in forecasts:
        sentences = "".join(f"<p>{escape(s)}</p>" for s in f.sentences())
        how = "".join(f"<li>{escape(d)}</li>" for d in f.derivation)
        parts.append(
            f"<div class='forecast'><h3>{escape(label(f))}</h3>{sentences}{_table(f)}"
            f"<details><summary>How each number is found</summary><ul>{how}</ul></details></div>"
        )
    if figure:
        fig = forecast_figure(forecasts)
        data = base64.b64encode(figure_png(fig)).decode("ascii")
        alt = "Stacked bars of the forecast peak tensor memory by category for each configuration"
        parts.append(
            f"<figure><img alt='{escape(alt)}' src='data:image/png;base64,{data}'><figcaption>"
            "Each bar: the forecast peak by category; solid line: the device's room for tensors (capacity less "
            "the CUDA context); dashed: its capacity.</figcaption></figure>"
        )
    return "".join(parts)


def forecast_html(f: Forecast) -> str:
    """One forecast as a notebook cell shows it: its sentences, bytes by category (forecast
    and measured) and how each number is found."""
    rows = "".join(
        f"<tr><td>{escape(r.category.replace('_', ' '))}</td><td style='text-align:right'>"
        f"{escape(fmt_bytes(r.forecast_bytes))}</td><td style='text-align:right'>{escape(fmt_bytes(r.measured_bytes))}"
        f"</td></tr>"
        for r in f.table().itertuples()
    )
    paras = "".join(f"<p>{escape(s)}</p>" for s in f.sentences())
    how = "".join(f"<li>{escape(d)}</li>" for d in f.derivation)
    return (
        f"<div class='swift-nb-forecast'>{paras}<table><tr><th>category</th><th>forecast</th>"
        f"<th>measured</th></tr>{rows}</table><details><summary>How each number is found</summary>"
        f"<ul>{how}</ul></details></div>"
    )


def forecast_text(forecasts: Sequence[Forecast]) -> str:
    """The section for a terminal: each configuration's sentences, categories and derivation."""
    if not forecasts:
        return f"{TITLE}: no forecast was asked for."
    blocks = [f"{TITLE}?"]
    for f in forecasts:
        blocks.append(f"== {label(f)} ==\n{f}")
    return "\n\n".join(blocks)
