"""The "Will it scale?" form on a recorded run, built without a kernel: its levers become
``swift_nb.scale``'s arguments, a press draws the table and the efficiency plot, a bad
lever is said in the form, and a link the run measured is offered first."""

from __future__ import annotations

from pathlib import Path

import pytest
from ipywidgets import HTML

import swift_nb
from swift_nb.core.links import PRESETS
from swift_nb.notebook.panel import results_panel
from swift_nb.notebook.scale_form import MEASURED, ScaleForm, can_scale
from swift_nb.render.scale import efficiency_figure, scale_html

COST_RUN = Path(__file__).parents[1] / "data" / "cost_run"


@pytest.fixture(scope="module")
def run() -> swift_nb.Run:
    return swift_nb.load_run(COST_RUN)


def test_a_press_shows_the_table_and_the_plot(run):
    form = ScaleForm(run)
    assert can_scale(run) and form.link.value == "nvlink4"
    form.world_sizes.value = "1, 2, 8"
    form.link.value = "pcie4"
    form.fsdp.value = False
    table = form.press()
    assert table is not None
    assert table["world_size"].tolist() == [1, 2, 8] and set(table["layout"]) == {"ddp"}
    assert "Over pcie4" in form.out.value and "<img" in form.out.value
    assert form.out.value.count("<tr>") == 1 + 3  # the head and one row per world size


def test_a_bad_lever_is_said_in_the_form(run):
    form = ScaleForm(run)
    form.world_sizes.value = "2, eight"
    assert form.press() is None and "world_sizes" in form.out.value
    form.world_sizes.value = "0"
    assert form.press() is None and "at least 1" in form.out.value


def test_a_link_the_run_measured_comes_first(run):
    measured = PRESETS["pcie5"].to_dict() | {"name": "measured gloo (2 ranks, cpu)"}
    mine = swift_nb.Run(**{**run.__dict__, "context": {**run.context, "link": measured}})
    form = ScaleForm(mine)
    assert form.link.value == MEASURED and form.kwargs()["link"] == measured
    assert form.press()["link"].iloc[0] == "measured gloo (2 ranks, cpu)"


def test_the_render_marks_a_measured_job_beside_its_row(run):
    table = swift_nb.scale(run, (1, 2), "pcie4", "ddp")
    table["measured_step_s"] = [float("nan"), 0.02]
    table["measured_comm_s"] = [float("nan"), 0.005]
    table["measured_efficiency"] = [float("nan"), 0.5]
    html = scale_html(table)
    assert "measured step" in html and "20.0 ms" in html and "50%" in html
    fig = efficiency_figure(table)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["ddp (forecast)", "ddp (measured)"]


def test_the_results_panel_has_the_form(run):
    tabs = results_panel(run, []).children[1]
    memory = tabs.children[list(tabs.titles).index("Memory")]
    forms = [
        w
        for w in memory.children
        if isinstance(w.children[0], HTML) and "Will it scale?" in w.children[0].value
    ]
    assert len(forms) == 1
