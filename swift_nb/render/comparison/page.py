"""The comparison view: the table (HTML and text), step times and memory of every variant
overlaid, each rank's memory against the forecast (variants on several ranks), what changed
from the baseline to each variant (``analysis.diff``), and a self-contained
``compare.html``."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from swift_nb.analysis.comparison.run_diff import RunDiff, diff
from swift_nb.analysis.comparison.variants import SHARDED_CATEGORIES, rank_memory
from swift_nb.core.errors import RecordError
from swift_nb.core.units import fmt_bytes, fmt_seconds
from swift_nb.record import MEMORY_CATEGORIES, Run, atomic_write_text
from swift_nb.render.comparison.run_diff import diff_html
from swift_nb.render.figures import figure_png, new_figure
from swift_nb.render.fonts import shown
from swift_nb.render.html import CSP, STYLE, cell, empty, figure_html, is_missing
from swift_nb.render.labels import label, step_column, step_note
from swift_nb.render.value_text import value_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def prediction_text(predicted_bytes: float | None, measured_bytes: float | None) -> str:
    """``predicted 22.8 MiB · measured 22.9 MiB · +0.4 %``: the advisor's peak beside the
    measured one, and how far the measurement is from it ("" without a prediction)."""
    if predicted_bytes is None or is_missing(predicted_bytes) or not predicted_bytes:
        return ""
    text = f"predicted {fmt_bytes(predicted_bytes)}"
    if measured_bytes is None or is_missing(measured_bytes):
        return text
    off = f"{(measured_bytes / predicted_bytes - 1) * 100:+.1f}".replace("-", "−")
    return f"{text} · measured {fmt_bytes(measured_bytes)} · {off} %"


def _ratio(x) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x:.2f}×"


def _num(x, fmt) -> str:
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else fmt(x)


#: the columns the table shows in its own way: any other a comparison holds (energy, cost,
#: the GPU's shares …) follows them, headed by its label, in its unit
SHOWN = {
    "variant",
    "status",
    "steps",
    "step_time_median_s",
    "step_time_basis",
    "step_time_median_all_s",
    "compile_s",
    "recompiles",
    "graph_breaks",
    "steps_per_s",
    "peak_mem_bytes",
    *(f"{c}_bytes" for c in MEMORY_CATEGORIES),
    "mean_util_pct",
    "mean_sm_active_pct",
    "mean_tensor_active_pct",
    "ranks",
    "step_time_max_rank_s",
    "peak_mem_max_rank_bytes",
    "collective_share_max_rank",
    "step_time_ratio",
    "peak_mem_ratio",
    "scaling_efficiency",
    "grew",
    "predicted",
    "predicted_peak_bytes",
    "notes",
    "run",
}


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """The comparison table as a reader reads it: one row per variant, each cell a number
    with its unit, the predicted peak beside the measured one (``prediction_text``); how
    each prediction was made, and the notes, are ``reasoning``'s. The step time's heading
    names the steps it is the median of, or each cell its own where variants differ."""
    step_head, steps = _step_column(table)
    out = pd.DataFrame(
        {
            "variant": table["variant"],
            "status": table["status"],
            step_head: steps,
            "step × base": [_ratio(x) for x in table["step_time_ratio"]],
            **_compile_columns(table),
            "steps/s": [_num(x, lambda v: f"{v:.2f}") for x in table["steps_per_s"]],
            "peak memory": [_num(x, fmt_bytes) for x in table["peak_mem_bytes"]],
            "memory × base": [_ratio(x) for x in table["peak_mem_ratio"]],
        }
    )
    predicted = [
        prediction_text(p, m)
        for p, m in zip(table["predicted_peak_bytes"], table["peak_mem_bytes"], strict=True)
    ]
    if any(predicted):
        out["peak predicted"] = [p or "–" for p in predicted]
    for c in MEMORY_CATEGORIES:
        out[c.replace("_", " ")] = [_num(x, fmt_bytes) for x in table[f"{c}_bytes"]]
    out["utilisation"] = [value_text("mean_util_pct", x) for x in table["mean_util_pct"]]
    for column, head in (("mean_sm_active_pct", "SMs active"), ("mean_tensor_active_pct", "tensor cores")):
        if column in table and pd.to_numeric(table[column], errors="coerce").notna().any():  # GPM's
            out[head] = [value_text(column, x) for x in table[column]]
    if "ranks" in table and (pd.to_numeric(table["ranks"], errors="coerce").fillna(1) > 1).any():
        # multi-rank variants (sequence parallel): the worst rank beside rank 0's numbers
        out["ranks"] = [_num(x, lambda v: f"{v:.0f}") for x in table["ranks"]]
        out["slowest rank step"] = [_num(x, fmt_seconds) for x in table["step_time_max_rank_s"]]
        out["max rank peak"] = [_num(x, fmt_bytes) for x in table["peak_mem_max_rank_bytes"]]
        out["max comm"] = [_num(x, lambda v: f"{100 * v:.0f} %") for x in table["collective_share_max_rank"]]
        if "scaling_efficiency" in table and table["scaling_efficiency"].notna().any():
            out["scaling efficiency"] = [
                _num(x, lambda v: f"{100 * v:.0f} %") for x in table["scaling_efficiency"]
            ]
            out["grew"] = [g if isinstance(g, str) else "–" for g in table["grew"]]
    for col in table.columns:
        values = table[col]
        if col in SHOWN or not pd.api.types.is_numeric_dtype(values) or values.isna().all():
            continue
        out[label(col)] = [value_text(col, v) for v in values]
    return out


def _bases(table: pd.DataFrame) -> list[object]:
    """Each variant's ``step_time_basis`` (None where its run has none)."""
    return list(table["step_time_basis"]) if "step_time_basis" in table else [None] * len(table)


def _step_column(table: pd.DataFrame) -> tuple[str, list[str]]:
    """The step time's heading and cells (``labels.step_column``)."""
    return step_column(
        "step (median", [_num(x, fmt_seconds) for x in table["step_time_median_s"]], _bases(table)
    )


def reasoning(table: pd.DataFrame) -> dict[str, list[str]]:
    """Per variant, how its prediction was made (the advisor's words for its toggles; a
    variant of one toggle without the toggle's name again) and its notes, in the table's
    order: what goes under the table (variants with neither are left out)."""
    out = {}
    for variant, words, notes in zip(table["variant"], table["predicted"], table["notes"], strict=True):
        said = [str(words).removeprefix(f"{variant}: ")] if isinstance(words, str) and words else []
        said += [f"note: {notes}"] if isinstance(notes, str) and notes else []
        if said:
            out[str(variant)] = said
    return out


def _compiles(table: pd.DataFrame) -> bool:
    """Whether any variant compiled (its steady step time is then apart from compile time)."""
    cols = [c for c in ("compile_s", "recompiles", "graph_breaks") if c in table]
    return bool(cols) and bool(
        (table[cols].apply(pd.to_numeric, errors="coerce").fillna(0) > 0).any(axis=None)
    )


def _compile_columns(table: pd.DataFrame) -> dict[str, list[str]]:
    """Compile time apart from the steady steps, when a variant compiled: "step (median, …)"
    is then the median of the steps that did not compile."""
    if not _compiles(table):
        return {}
    return {
        "step incl. compile": [_num(x, fmt_seconds) for x in table["step_time_median_all_s"]],
        "compile": [_num(x, fmt_seconds) for x in table["compile_s"]],
        "recompiles": [_num(x, lambda v: f"{v:.0f}") for x in table["recompiles"]],
        "graph breaks": [_num(x, lambda v: f"{v:.0f}") for x in table["graph_breaks"]],
    }


def compare_table_html(table: pd.DataFrame) -> str:
    """The comparison as HTML: the table, no cell over ``CELL_CHARS`` (a prediction's cell
    has its reasoning as a tooltip), and under it each variant's reasoning and notes."""
    shown = display_table(table)
    why = reasoning(table)
    head = "".join(f"<th>{escape(str(c))}</th>" for c in shown.columns)
    rows = []
    for variant, record in zip(shown["variant"], shown.itertuples(index=False, name=None), strict=True):
        said = " ".join(why.get(str(variant), []))
        cells = [
            cell(
                str(v), "text" if c in ("variant", "status") else "num", said if c == "peak predicted" else ""
            )
            for c, v in zip(shown.columns, record, strict=True)
        ]
        rows.append(f"<tr>{''.join(cells)}</tr>")
    listed = "".join(
        f"<li>{escape(variant)} — {escape(' '.join(said))}</li>" for variant, said in why.items()
    )
    note = step_note(_bases(table))
    return (
        f"<table class='swift-nb-compare'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        + (f"<p>{escape(note)}</p>" if note else "")
        + (f"<p>How each prediction was made:</p><ul class='reasoning'>{listed}</ul>" if listed else "")
    )


def compare_table_text(table: pd.DataFrame) -> str:
    """The comparison as text: the main columns, then each variant's reasoning and notes."""
    shown = display_table(table)
    cols = ["variant", "status", _step_column(table)[0], "step × base", "peak memory", "memory × base"]
    if _compiles(table):
        cols[3:3] = ["compile", "recompiles", "graph breaks"]
    if "peak predicted" in shown:
        cols.append("peak predicted")
    lines = [shown[cols].to_string(index=False)]
    note = step_note(_bases(table))
    lines += [note] if note else []
    lines += [f"{variant} — {' '.join(said)}" for variant, said in reasoning(table).items()]
    return "\n".join(lines)


def rank_memory_table(runs: Sequence[tuple[str, Run]]) -> pd.DataFrame:
    """Each rank's memory by category against the forecast, as strings, for the variants
    run on several ranks (with the baseline's own numbers first); empty when there are
    none. "error" is measured against forecast; parameters, gradients and optimizer
    state are held to ``RANK_TARGET_PCT`` (✓ within it, ✗ beyond): what the rank holds of
    them at most against the forecast's sharding (``analysis.compare.rank_memory``)."""
    df = rank_memory(runs)
    multi = df.groupby("variant")["rank"].nunique() > 1 if len(df) else pd.Series(dtype=bool)
    if not multi.any():
        return pd.DataFrame()
    keep = df[df["variant"].isin(multi[multi].index) | (df["variant"] == runs[0][0])]

    def error(row) -> str:
        if not np.isfinite(row.error_pct):
            return "–"
        mark = ""
        if row.category in SHARDED_CATEGORIES:
            mark = " ✓" if abs(row.error_pct) <= RANK_TARGET_PCT else " ✗"
        return f"{row.error_pct:+.1f} %{mark}"

    return pd.DataFrame(
        {
            "variant": keep["variant"],
            "rank": keep["rank"].astype(int),
            "category": keep["category"].str.replace("_", " "),
            "at peak": [_num(x, fmt_bytes) for x in keep["measured_bytes"]],
            "forecast at peak": [_num(x, fmt_bytes) for x in keep["forecast_bytes"]],
            "held (max)": [_num(x, fmt_bytes) for x in keep["held_bytes"]],
            "forecast held": [_num(x, fmt_bytes) for x in keep["forecast_held_bytes"]],
            "error": [error(r) for r in keep.itertuples()],
        }
    )


#: how close (±%) each rank's parameters, gradients and optimizer state should come to the forecast
RANK_TARGET_PCT = 10.0


def rank_memory_text(runs: Sequence[tuple[str, Run]]) -> str:
    """``rank_memory_table`` as text ("" when no variant ran on several ranks)."""
    try:
        table = rank_memory_table(runs)
    except Exception as e:  # as in rank_memory_html
        return f"memory per rank not shown: {type(e).__name__}: {e}"
    return "" if table.empty else table.to_string(index=False)


def rank_memory_html(runs: Sequence[tuple[str, Run]]) -> str:
    """The "Memory per rank" section ("" when no variant ran on several ranks)."""
    try:
        table = rank_memory_table(runs)
    except Exception as e:  # a failing forecast or damaged rank record must not cost the comparison
        return f"<h2>Memory per rank against the forecast</h2>{empty(f'not shown: {type(e).__name__}: {e}')}"
    if table.empty:
        return ""
    return (
        "<h2>Memory per rank against the forecast</h2>"
        "<p>Tensor bytes of each rank at its step peak and the most it held of each category; the "
        "forecast is the baseline's with the variant's toggles over its ranks. The error compares what a "
        "rank held of parameters, gradients and optimizer state with the forecast's sharding "
        f"(✓ within ±{RANK_TARGET_PCT:.0f} %), and the other categories at the peak.</p>"
        + table.to_html(index=False, classes="swift-nb-compare", border=0, escape=True)
    )


def step_times_figure(runs: Sequence[tuple[str, Run]], width_in: float = 10.0) -> Figure:
    """Step duration per step, one line per variant; steps that compiled marked ✕."""
    fig = new_figure(width_in, 3.0)
    ax = fig.add_subplot()
    marked = False
    for name, run in runs:
        steps = run.steps[run.steps["trigger"] != "end"]
        ms = pd.to_numeric(steps["duration_s"], errors="coerce") * 1e3
        (line,) = ax.plot(steps["step"], ms, marker="o", label=shown(name, run.id))
        compiling = (
            pd.to_numeric(steps.get("compile_s", pd.Series(0.0, index=steps.index)), errors="coerce") > 0
        )
        if compiling.any():
            ax.plot(
                steps["step"][compiling],
                ms[compiling],
                linestyle="none",
                marker="X",
                markersize=10,
                color=line.get_color(),
                label=None if marked else "compiling",
            )
            marked = True
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
        ax.plot(t, total / 2**20, label=shown(name, run.id))
        top = max(top, float(total.max()))
    ax.set_xlabel("time since the first recorded step (s)")
    ax.set_ylabel("tensor memory (MiB)")
    ax.set_ylim(bottom=0)
    if ax.lines:
        ax.legend(loc="best", fontsize="small")
    ax.set_title("Memory over the recorded steps")
    return fig


STEP_TIMES_ALT = "Lines of each variant's step time against the step number"
MEMORY_CURVES_ALT = "Lines of each variant's tensor memory against time during its recorded steps"
#: what each overlaid figure shows, by its alt text
CAPTIONS = {
    STEP_TIMES_ALT: "Step time per variant: one line per variant, one point per step (✕: a step that compiled).",
    MEMORY_CURVES_ALT: "Memory over the recorded steps per variant: live tensor bytes, all categories summed.",
}


def compare_figures(runs: Sequence[tuple[str, Run]]) -> list[tuple[str, bytes]]:
    """(alt text, PNG) of the overlaid figures; ``CAPTIONS`` says what each shows."""
    if not runs:
        return []
    return [
        (STEP_TIMES_ALT, figure_png(step_times_figure(runs))),
        (MEMORY_CURVES_ALT, figure_png(memory_curves_figure(runs))),
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
    runs: Sequence[tuple[str, Run]] = (),
) -> str:
    """A self-contained document: the table, the figures inlined, each rank's memory
    against the forecast (of ``runs``, the baseline first) and what changed from the
    baseline to each variant (``variant_diffs``)."""
    ranks = rank_memory_html(runs) if runs else ""
    imgs = "".join(figure_html(png, alt, CAPTIONS.get(alt, alt)) for alt, png in figures)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">"
        f"<title>swift_nb — {escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>swift_nb — {escape(title)}</h1>{compare_table_html(table)}{imgs}{ranks}{changed_html(diffs)}"
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
    atomic_write_text(path, compare_html(table, compare_figures(runs), title, diffs, runs))
    return path
