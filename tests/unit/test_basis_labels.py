"""Labels of the step time say the steps it was actually the median of
(``record.write.step_durations``): "profiler off" only where at least ``MIN_OFF_STEPS``
steps ran with the profiler off, "every step" where fewer did and every step was used (a
4-step rerun whose profiler traced two of them, as notebook 06's), in the Summary, in
``swift-nb list`` (``runs_text``) and in the comparison (its table, as text and HTML)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from swift_nb import cli
from swift_nb.analysis.comparison.variants import compare_runs
from swift_nb.core.units import fmt_seconds
from swift_nb.record import STEP_COLUMNS, Run, runs, save, summarize
from swift_nb.record.write import EVERY_STEP, MIN_OFF_STEPS, PROFILER_OFF
from swift_nb.render.comparison.page import compare_table_html, compare_table_text, display_table
from swift_nb.render.labels import step_basis
from swift_nb.render.sections import throughput
from swift_nb.render.sections.base import ReportInputs
from swift_nb.render.tables import runs_html, runs_text, summary_text


def _run(tmp_path, run_id: str, phases: list[str], step_s: float) -> Run:
    """A saved run whose steps ran in ``phases`` (the profiler's: "none" is off), each
    ``step_s`` long but the traced ones, twice that."""
    n = len(phases)
    dur = np.array([2 * step_s if p in ("warmup", "active") else step_s for p in phases])
    start = np.concatenate([[0.0], np.cumsum(dur)[:-1]])
    steps = pd.DataFrame(
        {
            "step": range(n),
            "start_s": start,
            "end_s": start + dur,
            "duration_s": dur,
            "phase": phases,
            "trigger": "optimizer",
            "overhead_s": 0.0,
            "peak_tensor_bytes": 1e8,
            "reserved_bytes": np.nan,
            "rss_bytes": 1e9,
            "compile_s": 0.0,
        },
        columns=STEP_COLUMNS,
    )
    r = Run(id=run_id, label=run_id, status="ok", started_at=f"2026-12-06T10:0{len(run_id) % 10}:00+00:00")
    r.wall_s = float(dur.sum())
    r.steps = steps
    r.summary.update(summarize(steps, pd.DataFrame({"t_s": [0.0], "kind": ["periodic"]})))
    save(r, tmp_path / run_id)
    return r


#: notebook 06's reruns: 4 steps, the profiler warming up on one and tracing one
RERUN = ["none", "warmup", "active", "none"]
PLAIN = ["none"] * 8


@pytest.fixture
def rerun(tmp_path) -> Run:
    r = _run(tmp_path / "a", "rerun", RERUN, 0.05)
    assert r.summary["step_time_basis"] == EVERY_STEP  # fewer than MIN_OFF_STEPS off the profiler
    return r


@pytest.fixture
def plain(tmp_path) -> Run:
    r = _run(tmp_path / "b", "plain", PLAIN, 0.04)
    assert r.summary["step_time_basis"] == PROFILER_OFF
    return r


def _step_headers(text: str) -> list[str]:
    return re.findall(r"step \(median[^)]*\)", text)


def test_the_bases_read_as_words():
    assert step_basis(PROFILER_OFF) == "profiler off"
    assert step_basis(EVERY_STEP) == "every step"
    assert step_basis(None) == step_basis(np.nan) == step_basis("something newer") == ""
    assert MIN_OFF_STEPS == 3


def test_swift_nb_list_of_a_rerun_says_every_step_not_profiler_off(rerun, capsys):
    listed = runs(rerun.path.parent)
    text = runs_text(listed)
    assert "profiler off" not in text.splitlines()[0]
    assert _step_headers(text) == ["step (median, every step)"]
    assert "every step: fewer than 3 steps ran with the profiler off" in text
    assert "profiler off)" not in runs_html(listed)
    assert cli.main(["list", str(rerun.path.parent)]) == cli.OK
    printed = capsys.readouterr().out
    assert "step (median, every step)" in printed and "step (median, profiler off)" not in printed


def test_swift_nb_list_of_runs_on_both_bases_says_each_rows_own(rerun, plain, tmp_path):
    for r in (rerun, plain):
        save(r, tmp_path / "both" / r.id)
    listed = runs(tmp_path / "both").set_index("id", drop=False)
    text = runs_text(listed)
    assert _step_headers(text.splitlines()[0]) == ["step (median)"]
    rows = {line.split()[0]: line for line in text.splitlines()[1:] if line.split()}
    assert f"{fmt_seconds(rerun.summary['step_time_median_s'])} (every step)" in rows["rerun"]
    assert f"{fmt_seconds(0.04)} (profiler off)" in rows["plain"]


def test_swift_nb_list_of_plain_runs_still_says_profiler_off(plain):
    text = runs_text(runs(plain.path.parent))
    assert _step_headers(text) == ["step (median, profiler off)"]
    assert "fewer than 3" not in text


def test_the_comparison_of_reruns_says_every_step(rerun, tmp_path):
    other = _run(tmp_path / "c", "rerun2", RERUN, 0.06)
    table = compare_runs([("baseline", rerun, None, []), ("variant", other, None, [])])
    shown = display_table(table)
    assert "step (median, every step)" in shown.columns
    assert not [c for c in shown.columns if "profiler off" in c]
    text = compare_table_text(table)
    assert "profiler off)" not in text and _step_headers(text.splitlines()[0]) == [
        "step (median, every step)"
    ]
    assert "every step: fewer than 3 steps ran with the profiler off" in text
    html = compare_table_html(table)
    assert "<th>step (median, every step)</th>" in html and "profiler off)" not in html


def test_a_comparison_across_bases_labels_each_cell(rerun, plain):
    table = compare_runs([("baseline", plain, None, []), ("rerun", rerun, None, [])])
    shown = display_table(table).set_index("variant")
    assert shown.loc["baseline", "step (median)"] == f"{fmt_seconds(0.04)} (profiler off)"
    assert (
        shown.loc["rerun", "step (median)"]
        == f"{fmt_seconds(rerun.summary['step_time_median_s'])} (every step)"
    )


def test_the_summary_of_a_rerun_says_every_step_for_the_step_rate_too(rerun):
    text = summary_text(rerun)
    assert "Step time (median / 90th percentile, every step: fewer than 3 ran with the profiler off)" in text
    assert "profiler off)" not in text.replace("fewer than 3 ran with the profiler off)", "")


def test_the_reports_throughput_of_a_rerun_says_every_step(rerun):
    (table,) = throughput.build(ReportInputs(run=rerun, throughput=SimpleNamespace(steps_per_s=13.3)))
    assert "<th>Steps per second (1 / the median step, every step)</th>" in str(table)
