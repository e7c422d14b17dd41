"""The live panel shows the GPU's SM activity beside its utilisation, in a real JupyterLab
through Playwright: the notebook's kernel gets the NVML of tests/support/nvml.py (a busy
GPU whose SMs are 31 % active: this machine has no driver), everything after the readings
is the real sampler, session and panel. The gap between the two sparklines is the message."""

from __future__ import annotations

from pathlib import Path

import nbformat
from playwright.sync_api import expect
from waits import CELLS_S, open_notebook, run_all

TESTS = Path(__file__).resolve().parents[1]
NAME = "gpu_counters.ipynb"

INJECT = f"""import sys
sys.path[:0] = [{str(TESTS)!r}, {str(TESTS / "support")!r}]
from support.nvml import fake_gpm_nvml
sys.modules["pynvml"] = fake_gpm_nvml()  # the GPU this machine lacks, GPM included
%load_ext swift_nb"""

# 40 steps of 60 ms: GPM reads windows of 100 ms or more, so the panel gets a dozen readings
PROFILED = """%%swift_profile --no-report --steps 40
import time
import torch
net = torch.nn.Linear(16, 16)
sgd = torch.optim.SGD(net.parameters(), lr=0.01)
for _ in range(40):
    net(torch.randn(4, 16)).sum().backward()
    sgd.step()
    sgd.zero_grad()
    time.sleep(0.06)"""

CHART_VALUE = """([panel, label]) => {
  const chart = [...panel.querySelectorAll('.chart')].find((c) => c.textContent.startsWith(label + ':'));
  return chart ? chart.querySelector('b').textContent : null;
}"""


def test_the_live_panel_shows_sm_activity_beside_utilisation(lab, new_page):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(INJECT), nbformat.v4.new_code_cell(PROFILED)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, Path(lab[2]) / NAME)
    page = new_page(viewport={"width": 1280, "height": 900})
    open_notebook(page, lab, NAME)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    live = page.locator(".swift-nb-live").first
    # while the cell runs: the SM activity's sparkline appears beside the utilisation's
    expect(live.locator(".chart", has_text="SMs active")).to_be_visible(timeout=CELLS_S * 1000)
    assert run_all(page, started=True) == "done", page.inner_text(".jp-Notebook")
    panel = live.element_handle()
    assert page.evaluate(CHART_VALUE, [panel, "GPU util"]) == "90 %"
    assert page.evaluate(CHART_VALUE, [panel, "SMs active"]) == "31 %"
    expect(live.locator(".swift-nb-step").first).to_have_attribute("data-step", "40")
    line = live.locator(".chart", has_text="SMs active").locator("polyline")
    assert len(line.get_attribute("points").split()) >= 3  # a series, not one reading
