"""The comparison view: the table (HTML and text), step times and memory of every variant
overlaid, what changed from the baseline to each variant (``analysis.diff``), and a
self-contained ``compare.html``."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from swift_nb.analysis.diff import RunDiff, diff
from swift_nb.errors import RecordError
from swift_nb.record import MEMORY_CATEGORIES, Run, atomic_write_text
from swift_nb.render.diff import diff_html
from swift_nb.render.figures import figure_png, new_figure
from swift_nb.render.html import CSP, STYLE, empty, figure_html
from swift_nb.units import fmt_bytes, fmt_seconds

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _prediction(words: str | None, peak_bytes: float | None) -> str:
    """The advisor's words, with the predicted peak added unless they already say it."""
    if peak_bytes is None or not np.isfinite(peak_bytes):
        return words or ""
    peak = fmt_bytes(peak_bytes)
    return words if words and peak in words else " ".join(filter(None, [words, f"(peak ≈ {peak})"]))


def _ratio(x) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x:.2f}×"


def _num(x, fmt) -> str:
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else fmt(x)


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """The comparison table with units, as strings."""
    out = pd.DataFrame(
        {
            "variant": table["variant"],
            "status": table["status"],
            "step (median)": [_num(x, fmt_seconds) for x in table["step_time_median_s"]],
            "step × base": [_ratio(x) for x in table["step_time_ratio"]],
            "steps/s": [_num(x, lambda v: f"{v:.2f}") for x in table["steps_per_s"]],
            "peak memory": [_num(x, fmt_bytes) for x in table["peak_mem_bytes"]],
            "memory × base": [_ratio(x) for x in table["peak_mem_ratio"]],
        }
    )
    for c in MEMORY_CATEGORIES:
        out[c.replace("_", " ")] = [_num(x, fmt_bytes) for x in table[f"{c}_bytes"]]
    out["util %"] = [_num(x, lambda v: f"{v:.0f}") for x in table["mean_util_pct"]]
    if "ranks" in table and (pd.to_numeric(table["ranks"], errors="coerce").fillna(1) > 1).any():
        # multi-rank variants (sequence parallel): the worst rank beside rank 0's numbers
        out["ranks"] = [_num(x, lambda v: f"{v:.0f}") for x in table["ranks"]]
        out["slowest rank step"] = [_num(x, fmt_seconds) for x in table["step_time_max_rank_s"]]
        out["max rank peak"] = [_num(x, fmt_bytes) for x in table["peak_mem_max_rank_bytes"]]
        out["max comm %"] = [_num(x, lambda v: f"{100 * v:.0f}") for x in table["collective_share_max_rank"]]
    out["predicted"] = [
        _prediction(w, p) for w, p in zip(table["predicted"], table["predicted_peak_bytes"], strict=True)
    ]
    out["notes"] = table["notes"]
    return out


def compare_table_html(table: pd.DataFrame) -> str:
    return display_table(table).to_html(index=False, classes="swift-nb-compare", border=0, escape=True)


def compare_table_text(table: pd.DataFrame) -> str:
    cols = ["variant", "status", "step (median)", "step × base", "peak memory", "memory × base", "notes"]
    return display_table(table)[cols].to_string(index=False)


def step_times_figure(runs: Sequence[tuple[str, Run]], width_in: float = 10.0) -> Figure:
    """Step duration per step, one line per variant."""
    fig = new_figure(width_in, 3.0)
    ax = fig.add_subplot()
    for name, run in runs:
        steps = run.steps[run.steps["trigger"] != "end"]
        ax.plot(
            steps["step"], pd.to_numeric(steps["duration_s"], errors="coerce") * 1e3, marker="o", label=name
        )
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="best", fontsize="small")
    ax.set_title("Step time per variant")
    return fig


def memory_curves_figure(runs: Sequence[tuple[str, Run]], width_in: float = 10.0) -> Figure:
    """Tensor memory over the recorded steps (sum of the categories), one line per variant."""
    fig = new_figure(width_in, 3.0)
    ax = fig.add_subplot()
    cols = [f"{c}_bytes" for c in MEMORY_CATEGORIES]
    top = 1.0
    for name, run in runs:
        mem = run.memory
        if not len(mem) or not set(cols) <= set(mem.columns):
            continue
        total = mem[cols].sum(axis=1)
        t = mem["t_s"] - mem["t_s"].iloc[0]
        ax.plot(t, total / 2**20, label=name)
        top = max(top, float(total.max()))
    ax.set_xlabel("time since the first recorded step (s)")
    ax.set_ylabel("tensor memory (MiB)")
    ax.set_ylim(bottom=0)
    if ax.lines:
        ax.legend(loc="best", fontsize="small")
    ax.set_title("Memory over the recorded steps")
    return fig


def compare_figures(runs: Sequence[tuple[str, Run]]) -> list[tuple[str, bytes]]:
    """(alt text, PNG) of the overlaid figures."""
    if not runs:
        return []
    return [
        ("step time per variant", figure_png(step_times_figure(runs))),
        ("memory over the recorded steps per variant", figure_png(memory_curves_figure(runs))),
    ]


#: a variant's diff against the baseline, or why it could not be made
Changed = tuple[str, RunDiff | str]


def variant_diffs(runs: Sequence[tuple[str, Run]]) -> list[Changed]:
    """What changed from the baseline (the first of ``runs``) to each other run: its
    ``RunDiff``, or the reason there is none (a damaged trace)."""
    if len(runs) < 2:
        return []
    base_name, base = runs[0]
    out: list[Changed] = []
    for name, run in runs[1:]:
        try:
            out.append((name, diff(base, run, names=(base_name, name))))
        except RecordError as e:
            out.append((name, f"not compared: {e.path.name} is damaged ({e.problem})"))
        except Exception as e:  # a failing diff must not cost the user the comparison
            out.append((name, f"not compared: the diff failed ({type(e).__name__}: {e})"))
    return out


def changed_html(diffs: Sequence[Changed]) -> str:
    """The "What changed" section: each variant's diff against the baseline."""
    if not diffs:
        return ""
    body = "".join(
        diff_html(d) if isinstance(d, RunDiff) else f"<h3>{escape(name)}</h3>{empty(d)}" for name, d in diffs
    )
    return f"<h2>What changed</h2>{body}"


def compare_html(
    table: pd.DataFrame,
    figures: Sequence[tuple[str, bytes]],
    title: str = "comparison",
    diffs: Sequence[Changed] = (),
) -> str:
    """A self-contained document: the table, the figures inlined, and what changed from
    the baseline to each variant (``variant_diffs``)."""
    imgs = "".join(figure_html(png, alt, alt.capitalize()) for alt, png in figures)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">"
        f"<title>swift_nb — {escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>swift_nb — {escape(title)}</h1>{compare_table_html(table)}{imgs}{changed_html(diffs)}"
        "</body></html>\n"
    )


def write_compare(
    path: Path | str,
    table: pd.DataFrame,
    runs: Sequence[tuple[str, Run]],
    title: str,
    diffs: Sequence[Changed] | None = None,
) -> Path:
    """Write compare.html for ``runs`` (the baseline first); ``diffs``: their
    ``variant_diffs`` when the caller holds them."""
    path = Path(path)
    diffs = variant_diffs(runs) if diffs is None else diffs
    atomic_write_text(path, compare_html(table, compare_figures(runs), title, diffs))
    return path
