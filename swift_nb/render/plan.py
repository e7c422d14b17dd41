""" "What would make it fit?": a plan table (``swift_nb.plan``) as a notebook and a terminal
show it: the top plans, each with its toggles, predicted peak, whether it fits and by how
much, its estimated step time against today's, and why. Every string is escaped."""

from __future__ import annotations

import math
from html import escape

import pandas as pd

from swift_nb.core.units import fmt_bytes, fmt_seconds

TITLE = "What would make it fit?"


def _step(row: pd.Series) -> str:
    text = f"×{row['step_factor']:.2f}"
    if isinstance(row["predicted_step_s"], float) and math.isfinite(row["predicted_step_s"]):
        text += f" ({fmt_seconds(row['predicted_step_s'])})"
    return text


def _verdict(row: pd.Series) -> str:
    room = fmt_bytes(abs(row["headroom_bytes"]))
    return f"fits, {room} to spare" if row["fits"] else f"short by {room}"


def plan_html(table: pd.DataFrame, top: int = 8) -> str:
    """The first ``top`` plans as an HTML table, with a line on how they are ranked."""
    if table.empty:
        return "<p class='empty'>No toggle applies to this run.</p>"
    fitting = int(table["fits"].sum())
    head = (
        f"<p>{fitting} of {len(table)} combinations fit; best first: those that fit with room beyond the "
        "forecast's error, keep the training as it is, and are fastest. Step times are estimates (rules of "
        "thumb per toggle), the peaks forecasts.</p>"
        if fitting
        else f"<p>None of the {len(table)} combinations fits; the closest first.</p>"
    )
    rows = "".join(
        "<tr>"
        f"<td><code>{escape(str(r['toggles']))}</code></td>"
        f"<td>{escape(fmt_bytes(r['predicted_peak_bytes']))} ± {r['expected_error_pct']:.0f} %</td>"
        f"<td>{escape(_verdict(r))}</td>"
        f"<td>{escape(_step(r))}</td>"
        f"<td>{'yes' if r['changes_training'] else ''}</td>"
        f"<td class='why'>{escape(str(r['why']))}</td>"
        "</tr>"
        for _, r in table.head(top).iterrows()
    )
    return (
        head + "<table class='swift-nb-plan'><thead><tr><th>toggles</th><th>peak</th><th>fits</th>"
        f"<th>step</th><th>changes training</th><th>why</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def plan_text(table: pd.DataFrame, top: int = 8) -> str:
    """The first ``top`` plans, one line each."""
    if table.empty:
        return "No toggle applies to this run."
    return "\n".join(
        f"{r['toggles']}: {fmt_bytes(r['predicted_peak_bytes'])} ± {r['expected_error_pct']:.0f} %, "
        f"{_verdict(r)}, step {_step(r)}" + (" (changes the training)" if r["changes_training"] else "")
        for _, r in table.head(top).iterrows()
    )
