"""The HTML report opens offline in a real browser, escapes what users and traces wrote,
and its figures draw whatever data they get."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from support.demo_run import EVIL_OP
from support.report import (
    GLUED,
    OPERATOR_COLUMNS,
    operators,
    reader_text,
)

from swift_nb.analysis.advisor.findings import Verdict
from swift_nb.record import MEMORY_CATEGORIES, MEMORY_COLUMNS, Run
from swift_nb.render.comparison.page import STEP_TIMES_ALT, compare_html
from swift_nb.render.document import report_html, write_report
from swift_nb.render.figures import (
    breakdown_figure,
    figure_png,
    memory_figure,
    operators_figure,
    short_name,
)


def test_verdict_reads_as_a_sentence_without_css():
    verdict = Verdict(
        "compute-bound", "96.8 % of the step is forward, backward and optimizer work", {"step_s": 0.02}
    )
    html = report_html(Run(id="bare"), verdict=verdict)
    paragraph = re.search(r"<p class='verdict'>.*?</p>", html).group(0)
    # even stripped of every tag with nothing put in their place
    assert re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", paragraph)) == (
        "compute-bound — 96.8 % of the step is forward, backward and optimizer work"
    )
    text = reader_text(html)
    assert "Verdict compute-bound — 96.8 % of the step is forward" in text
    assert GLUED.search(text) is None and re.search(r"[a-z]-bound\d", text) is None


def test_compare_table_names_each_ratio():
    row = {
        "variant": "flash",
        "status": "ok",
        "step_time_median_s": 0.01,
        "step_time_ratio": 0.8,
        "steps_per_s": 100.0,
        "peak_mem_bytes": 2**20,
        "peak_mem_ratio": 0.5,
        "mean_util_pct": 90.0,
        "predicted": "",
        "predicted_peak_bytes": None,
        "notes": "",
        **{f"{c}_bytes": 0 for c in MEMORY_CATEGORIES},
    }
    text = reader_text(compare_html(pd.DataFrame([row]), [(STEP_TIMES_ALT, b"png")]))
    # two ratio columns: each header says which quantity it compares
    assert "step × base" in text and "memory × base" in text and "0.80× 100.00 1.0 MiB 0.50×" in text
    assert "Step time per variant" in text


def test_write_report_needs_a_saved_run():
    with pytest.raises(ValueError, match="not been saved"):
        write_report(Run(id="unsaved"), "<html></html>")


def test_breakdown_figure_stacks_nonzero_parts_per_step():
    bd = pd.DataFrame(
        {
            "step": [3, 4, 5],
            "step_s": [0.010, 0.012, 0.011],
            "data_s": [0.0, 0.0, 0.0],
            "forward_s": [0.004, 0.005, 0.004],
            "backward_s": [0.005, 0.006, 0.005],
            "optimizer_s": [0.0, 0.0, 0.0],
            "comm_s": [0.0, 0.0, 0.0],
            "h2d_s": [0.0, 0.0, 0.0],
            "other_s": [0.0, 0.0, 0.0],
            "untraced_s": [0.001, 0.001, 0.002],
        }
    )
    fig = breakdown_figure(bd)
    ax = fig.axes[0]
    assert [len(c) for c in ax.containers] == [3, 3, 3]  # forward, backward, untraced
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "untraced (Python, waits)",
        "backward",
        "forward",
    ]
    assert ax.get_ylabel() == "time per step (ms)"
    tops = [sum(c[i].get_height() for c in ax.containers) for i in range(3)]
    assert tops == pytest.approx([10.0, 12.0, 11.0])
    figure_png(fig)


def test_memory_figure_stacks_every_category():
    mib = 2**20
    tl = pd.DataFrame(
        [
            (0.10, 1, mib, 4 * mib, 0, 2 * mib, 0, 0, 0),
            (0.11, 1, mib, 4 * mib, mib, 2 * mib, 2 * mib, mib, 0),
            (0.20, 2, mib, 4 * mib, mib, 2 * mib, 0, 0, mib),
        ],
        columns=MEMORY_COLUMNS,
    )
    fig = memory_figure(tl)
    ax = fig.axes[0]
    assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 7
    assert {"frozen parameters", "logits"} <= set(ax.get_legend_handles_labels()[1])
    assert ax.get_ylabel() == "tensor memory (MiB)" and ax.get_xlabel() == "time since start (s)"
    assert "11.0 MiB" in ax.get_title()  # the peak: 1 + 4 + 1 + 2 + 3 MiB at t = 0.11 s
    big = tl.assign(parameters_bytes=4 * 2**30)
    assert memory_figure(big).axes[0].get_ylabel() == "tensor memory (GiB)"
    figure_png(fig)


def test_operators_figure_shows_top_bars_with_units():
    ops = operators(20)
    fig = operators_figure(ops, metric="self_time_s", top=15)
    ax = fig.axes[0]
    assert len(ax.patches) == 15
    assert ax.get_xlabel() == "self time (ms)"
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[-1] == EVIL_OP  # largest at the top
    assert all(len(label) <= 48 for label in labels)
    assert "aten::$x$" in labels  # "$" stays literal text, not TeX
    mem = operators_figure(ops.head(3), metric="alloc_bytes")
    assert len(mem.axes[0].patches) == 3 and mem.axes[0].get_xlabel() == "bytes allocated (MiB)"
    figure_png(fig)
    figure_png(mem)
    with pytest.raises(ValueError, match="metric must be one of"):
        operators_figure(ops, metric="wall")


def test_short_name_keeps_both_ends():
    name = "autograd::engine::evaluate_function: ScaledDotProductEfficientAttentionBackward0"
    short = short_name(name)
    assert len(short) == 48 and short.startswith("autograd::") and short.endswith("AttentionBackward0")
    assert short_name("aten::mm") == "aten::mm"


@pytest.mark.parametrize(
    "make",
    [
        lambda: breakdown_figure(pd.DataFrame(columns=["step", "step_s", "forward_s"])),
        lambda: memory_figure(pd.DataFrame(columns=MEMORY_COLUMNS)),
        lambda: operators_figure(pd.DataFrame(columns=OPERATOR_COLUMNS)),
        lambda: operators_figure(pd.DataFrame(columns=OPERATOR_COLUMNS), metric="alloc_bytes"),
    ],
)
def test_figures_of_empty_data_say_so(make):
    fig = make()
    assert isinstance(fig, Figure)
    assert any(t.get_text().startswith("No ") for ax in fig.axes for t in ax.texts)
    assert figure_png(fig).startswith(b"\x89PNG")
