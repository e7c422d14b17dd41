"""The quickstart notebook in a real JupyterLab, driven by Debian's Chromium through
Playwright: the live panel renders and reaches the last step, the results tabs render and
the Memory and Modules tabs show their figures (the Modules tab's link brings the
Timeline forward), and our outputs log no JavaScript errors. Then a 40-step
cell added to it, without ``--steps``, ends with a full bar: the panel learns the total
only as the steps come, and sends the bound before the value.

Screenshots of both panels land in the test's folder; with ``SWIFT_NB_SCREENSHOTS=1`` they
are also copied to ``docs/live_panel.png`` and ``docs/results_panel.png``.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from playwright.sync_api import expect
from support.common import quickstart_steps
from waits import CELLS_S, open_notebook, run_all

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "notebooks" / "01_quickstart.ipynb"
DOCS = ROOT / "docs"
TABS = ["Summary", "Timeline", "Memory", "Operators", "Modules", "Advice", "Files"]
STEPS = quickstart_steps()  # its --steps hint, equal to its loader's length


FORTY_STEPS = """%%swift_profile --no-report
import torch
tiny = torch.nn.Linear(16, 16)
tiny_opt = torch.optim.SGD(tiny.parameters(), lr=0.01)
for _ in range(40):
    tiny(torch.randn(4, 16)).sum().backward()
    tiny_opt.step()
    tiny_opt.zero_grad()
"""

RUN_NEW_LAST_CELL = """(source) => {
  const nb = window.jupyterapp.shell.currentWidget;
  const cells = nb.content.model.sharedModel;
  cells.insertCell(cells.cells.length, {cell_type: 'code', source});
  nb.content.activeCellIndex = nb.content.widgets.length - 1;
  window.jupyterapp.commands.execute('notebook:run-cell');
}"""

LAST_CELL_RAN = """() => {
  const nb = window.jupyterapp.shell.currentWidget;
  const last = nb.content.widgets[nb.content.widgets.length - 1];
  return last.model.executionCount !== null && nb.sessionContext.session.kernel.status === 'idle';
}"""


def _forty_steps_without_a_hint(page) -> None:
    """A cell of 40 steps the magic was told nothing about ends with a full bar at 40 / 40."""
    page.evaluate(RUN_NEW_LAST_CELL, FORTY_STEPS)
    page.wait_for_function(LAST_CELL_RAN, polling=250, timeout=CELLS_S * 1000)
    last = page.locator(".jp-Notebook .jp-CodeCell").last
    step = last.locator(".swift-nb-live .swift-nb-step").first
    expect(step).to_have_attribute("data-step", "40")
    assert step.get_attribute("data-total") == "40"
    bar = last.locator(".swift-nb-live .widget-hprogress .progress-bar")
    expect(bar).to_have_attribute("style", re.compile(r"width: 100%"))


def test_quickstart_in_jupyterlab(lab, new_page, tmp_path):
    shutil.copy(QUICKSTART, lab[2])
    page = new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))

    open_notebook(page, lab, QUICKSTART.name)
    before_run = len(errors)  # JupyterLab's own start-up (no network here, ...) is not ours to judge
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

    live = page.locator(".swift-nb-live").first
    # the profiled cell starts once the model is built: the first step within the cells' time
    page.wait_for_function(
        "() => Number(document.querySelector('.swift-nb-live .swift-nb-step')?.dataset.step) > 0",
        polling=100,
        timeout=CELLS_S * 1000,
    )
    live.screenshot(path=tmp_path / "live_panel_running.png")

    outcome = run_all(page, started=True)
    assert outcome == "done", page.inner_text(".jp-Notebook")

    step = live.locator(".swift-nb-step").first
    assert step.get_attribute("data-step") == str(STEPS) == step.get_attribute("data-total")
    bar = live.locator(".widget-hprogress .progress-bar")
    assert bar.evaluate("b => b.style.width") == "100%"
    assert "progress-bar-success" in bar.get_attribute("class")
    live.screenshot(path=tmp_path / "live_panel.png")

    results = page.locator(".swift-nb-results").first
    tabs = results.locator(".lm-TabBar-tab")
    assert [t.strip() for t in tabs.all_inner_texts()] == TABS
    results.scroll_into_view_if_needed()
    assert "swift-nb-summary" in results.inner_html()
    results.screenshot(path=tmp_path / "results_summary.png")
    # The static twins of the panel's content are hidden where the panel renders.
    static = page.locator(".jp-OutputArea-child:has(.swift-nb-results) ~ .jp-OutputArea-child")
    assert static.count() > 5 and not static.first.is_visible()

    tabs.filter(has_text="Memory").click()
    image = results.locator(".widget-tab-contents img:visible").first
    page.wait_for_function("img => img.complete && img.naturalWidth > 100", arg=image.element_handle())
    results.screenshot(path=tmp_path / "results_panel.png")

    tabs.filter(has_text="Modules").click()
    icicle = results.locator(".widget-tab-contents img:visible").first
    page.wait_for_function("img => img.complete && img.naturalWidth > 100", arg=icicle.element_handle())
    expect(results.locator(".widget-tab-contents .widget-vbox:visible").first).to_contain_text("By time")
    results.screenshot(path=tmp_path / "results_modules.png")
    results.locator(".swift-nb-show-on-timeline:visible").first.click()  # the model's forward
    expect(results.locator(".lm-TabBar-tab.lm-mod-current")).to_have_text("Timeline")

    tabs.filter(has_text="Files").click()
    files = results.locator(".widget-tab-contents .widget-vbox:visible").first
    expect(files).to_contain_text("ui.perfetto.dev")
    expect(files).to_contain_text("report.html")
    tabs.filter(has_text="Advice").click()
    expect(results.locator(".lm-TabBar-tab.lm-mod-current")).to_have_text("Advice")
    results.screenshot(path=tmp_path / "results_advice.png")
    tabs.filter(has_text="Memory").click()

    _forty_steps_without_a_hint(page)
    ours = errors[before_run:]
    assert not ours, "\n".join(ours)

    if os.environ.get("SWIFT_NB_SCREENSHOTS") == "1":
        DOCS.mkdir(exist_ok=True)
        shutil.copy(tmp_path / "live_panel.png", DOCS / "live_panel.png")
        shutil.copy(tmp_path / "results_panel.png", DOCS / "results_panel.png")
