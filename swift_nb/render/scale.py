"""``swift_nb.scale``'s table as HTML, and its efficiency against the number of ranks."""

from __future__ import annotations

import base64
import math
from html import escape
from typing import TYPE_CHECKING, Any

import pandas as pd

from swift_nb.core.units import fmt_bytes
from swift_nb.render.figures import figure_png, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LAYOUT_COLORS = {"ddp": "#1f77b4", "fsdp": "#ff7f0e"}


def _ms(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v) * 1e3:.1f} ms"


def _pct(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.0%}"


def _cells(r: pd.Series, measured: bool) -> list[str]:
    fits = {True: "yes", False: "no"}.get(r["fits"], "")
    tokens = r.get("tokens_per_s")
    cells = [
        str(int(r["world_size"])),
        escape(str(r["layout"])),
        _ms(r["compute_s"]),
        _ms(r["comm_s"]),
        _ms(r["exposed_comm_s"]),
        _ms(r["step_s"]),
        _pct(r["efficiency"]),
        f"{float(tokens):,.0f}" if tokens is not None and not pd.isna(tokens) else "",
        fmt_bytes(r["peak_bytes"]) if not pd.isna(r["peak_bytes"]) else "",
        fits,
    ]
    if measured:
        cells += [_ms(r["measured_step_s"]), _ms(r["measured_comm_s"]), _pct(r["measured_efficiency"])]
    return cells


def scale_html(table: pd.DataFrame) -> str:
    """The table: per world size and layout, the step's terms, efficiency, throughput and
    peak per rank; the measured job's figures beside its row; why, under each."""
    measured = "measured_step_s" in table
    head = [
        "ranks",
        "layout",
        "compute",
        "communication",
        "exposed",
        "step",
        "efficiency",
        "tokens/s",
        "peak per rank",
        "fits",
    ]
    if measured:
        head += ["measured step", "measured comm.", "measured eff."]
    rows = []
    for _, r in table.iterrows():
        tds = "".join(f"<td>{c}</td>" for c in _cells(r, measured))
        rows.append(f"<tr>{tds}</tr>")
        if r["why"]:
            rows.append(
                f"<tr class='why'><td></td><td colspan='{len(head) - 1}'>{escape(str(r['why']))}</td></tr>"
            )
    link = escape(str(table["link"].iloc[0])) if len(table) else ""
    ths = "".join(f"<th>{h}</th>" for h in head)
    return (
        f"<div class='swift-nb-scale'><p>Over {link}, every rank at the measured per-rank batch.</p>"
        f"<table><thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def efficiency_figure(table: pd.DataFrame, width_in: float = 6.0) -> Figure:
    """Scaling efficiency against the number of ranks, one line per layout; the measured
    job as a point."""
    fig = new_figure(width_in, 2.8)
    ax = fig.add_subplot(1, 1, 1)
    fig.subplots_adjust(left=0.12, right=0.97, top=0.88, bottom=0.18)
    for layout, rows in table.groupby("layout", sort=False):
        rows = rows.sort_values("world_size")
        color = LAYOUT_COLORS.get(str(layout), "#444")
        ax.plot(rows["world_size"], rows["efficiency"], marker="o", color=color, label=f"{layout} (forecast)")
        if "measured_efficiency" in rows:
            seen = rows.dropna(subset=["measured_efficiency"])
            if len(seen):
                ax.plot(
                    seen["world_size"],
                    seen["measured_efficiency"],
                    "s",
                    color=color,
                    label=f"{layout} (measured)",
                )
    ax.axhline(1.0, color="#999", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(table["world_size"].unique()))
    ax.set_xticklabels([str(int(n)) for n in sorted(table["world_size"].unique())])
    ax.set_xlabel("ranks", fontsize=8)
    ax.set_ylabel("scaling efficiency", fontsize=8)
    ax.set_ylim(0, max(1.1, float(table["efficiency"].max()) * 1.05))
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, frameon=False)
    ax.set_title("Will it scale? throughput at N ÷ (N × throughput at 1)", fontsize=8, loc="left")
    return fig


def scale_section(table: pd.DataFrame) -> str:
    """The table and the efficiency plot (an embedded PNG)."""
    data = base64.b64encode(figure_png(efficiency_figure(table))).decode("ascii")
    alt = "Scaling efficiency against the number of ranks, one line per layout"
    return (
        scale_html(table) + f"<figure><img alt='{escape(alt)}' src='data:image/png;base64,{data}'>"
        "<figcaption>Efficiency 100 %: N ranks do N times the work of one in the same time.</figcaption></figure>"
    )
