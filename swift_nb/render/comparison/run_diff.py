"""What changed between two runs (``analysis.diff.RunDiff``) as text, for the terminal and
CI logs, and as an HTML fragment, for compare.html: the sentences, the environment's
differences, and the largest changes per step."""

from __future__ import annotations

from html import escape

import pandas as pd

from swift_nb.analysis.comparison.run_diff import RunDiff, short_name
from swift_nb.render.html import empty, frame_table

#: rows of the changes table shown, largest |Δ| first (the RunDiff holds them all)
SHOWN_ROWS = 15
KIND_WORDS = {"kernel_kind": "kernel kind", "kernel": "kernel", "operator": "operator"}
NOT_RECORDED = "not recorded"


def _status_words(d: RunDiff) -> dict[str, str]:
    return {"both": "both", "only_a": f"only in {d.a_name}", "only_b": f"only in {d.b_name}"}


def changes_table(d: RunDiff, rows: int | None = SHOWN_ROWS, width: int = 60) -> pd.DataFrame:
    """The first ``rows`` changes (all when None) as shown: kind, name (shortened to
    ``width``), ms per step in A and in B, their difference (rounded to 0.01 ms), where
    found."""
    c = d.changes if rows is None else d.changes.head(rows)
    return pd.DataFrame(
        {
            "kind": c["kind"].map(KIND_WORDS).fillna(c["kind"]),
            "name": [short_name(n, width) for n in c["name"]],
            f"{d.a_name} ms per step": c["a_ms_per_step"].astype(float).round(2),
            f"{d.b_name} ms per step": c["b_ms_per_step"].astype(float).round(2),
            "Δ ms per step": c["delta_ms_per_step"].astype(float).round(2),
            "found": c["status"].map(_status_words(d)).fillna(c["status"]),
        }
    )


def modules_table(d: RunDiff, rows: int | None = SHOWN_ROWS) -> pd.DataFrame:
    """The modules whose activations or time changed the most, as shown."""
    m = d.modules if rows is None else d.modules.head(rows)
    return pd.DataFrame(
        {
            "module": m["path"],
            "class": m["class"],
            f"{d.a_name} ms per step": (1e3 * m["a_total_s"].astype(float)).round(2),
            f"{d.b_name} ms per step": (1e3 * m["b_total_s"].astype(float)).round(2),
            f"{d.a_name} activations (MiB)": (m["a_saved_bytes"].astype(float) / 2**20).round(2),
            f"{d.b_name} activations (MiB)": (m["b_saved_bytes"].astype(float) / 2**20).round(2),
            "found": m["status"].map(_status_words(d)).fillna(m["status"]),
        }
    )


def environment_table(d: RunDiff) -> pd.DataFrame:
    """The environment's differences with the runs' names as columns."""
    env = d.environment
    return pd.DataFrame(
        {
            "": env["field"],
            d.a_name: env["a"].fillna(NOT_RECORDED),
            d.b_name: env["b"].fillna(NOT_RECORDED),
        }
    )


def _more(d: RunDiff, rows: int | None) -> str | None:
    hidden = 0 if rows is None else len(d.changes) - rows
    return f"{hidden} smaller changes not shown" if hidden > 0 else None


def diff_text(d: RunDiff, rows: int | None = SHOWN_ROWS) -> str:
    """The diff as plain text: heading, sentences, environment, changes table, notes."""
    parts = [
        f"What changed: {d.a_name} → {d.b_name} (per step over {d.a_steps} and {d.b_steps} recorded steps)"
    ]
    parts += [f"- {s}" for s in d.sentences] or ["- nothing measured differs"]
    if len(d.environment):
        parts += ["", environment_table(d).to_string(index=False)]
    if len(d.changes):
        parts += ["", changes_table(d, rows).to_string(index=False)]
        more = _more(d, rows)
        if more:
            parts.append(f"({more})")
    if len(d.modules):
        parts += ["", "By module:", modules_table(d).to_string(index=False)]
    parts += [f"note: {n}" for n in d.notes]
    return "\n".join(parts)


def diff_html(d: RunDiff, rows: int | None = SHOWN_ROWS) -> str:
    """The diff as an HTML fragment (an ``h3`` and what follows it), every string escaped."""
    sentences = "".join(f"<li>{escape(s)}</li>" for s in d.sentences)
    parts = [
        f"<h3>{escape(d.a_name)} → {escape(d.b_name)}</h3>",
        f"<p class='sub'>per step over {d.a_steps} and {d.b_steps} recorded steps</p>",
        f"<ul>{sentences}</ul>" if sentences else empty("nothing measured differs"),
    ]
    if len(d.environment):
        parts.append(frame_table(environment_table(d)))
    if len(d.changes):
        parts.append(frame_table(changes_table(d, rows, width=160)))
        more = _more(d, rows)
        if more:
            parts.append(empty(more))
    if len(d.modules):
        parts += ["<h4>By module</h4>", frame_table(modules_table(d))]
    parts += [empty(n) for n in d.notes]
    return "".join(parts)
