"""The quickstart notebook in a real JupyterLab, driven by Debian's Chromium through
Playwright: the live panel renders and reaches the last step, the results tabs render and
the Memory tab shows its figure, and our outputs log no JavaScript errors. Then a 40-step
cell added to it, without ``--steps``, ends with a full bar: the panel learns the total
only as the steps come, and sends the bound before the value.

Screenshots of both panels land in the test's folder; with ``SWIFT_NB_SCREENSHOTS=1`` they
are also copied to ``docs/live_panel.png`` and ``docs/results_panel.png``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from support.common import kernel_env, quickstart_steps

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "notebooks" / "01_quickstart.ipynb"
DOCS = ROOT / "docs"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"]
TABS = ["Summary", "Timeline", "Memory", "Operators", "Advice", "Files"]
STEPS = quickstart_steps()  # its --steps hint, equal to its loader's length
SERVER_START_S = 120
RUN_ALL_S = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> list[int]:
    """Stop the server's process group and every process it started (kernels run in
    their own sessions); return the pids still alive afterwards."""
    family = [proc.pid]
    try:
        family += [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        pass
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # the server shuts its kernels down on SIGTERM
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    alive = []
    for pid in family:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                p.kill()
                p.wait(timeout=10)
        except psutil.NoSuchProcess:
            continue
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            alive.append(pid)
    return alive


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 with a token, serving a folder that holds a copy
    of the quickstart notebook; yields (base url, token, folder)."""
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(QUICKSTART, root)
    state = tmp_path_factory.mktemp("jupyter_state")
    token, port = secrets.token_hex(16), _free_port()
    env = {
        **kernel_env(),
        # Nothing read from or written to the user's Jupyter config, settings or workspaces.
        "JUPYTER_CONFIG_DIR": str(state / "config"),
        "JUPYTER_RUNTIME_DIR": str(state / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(state / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(state / "workspaces"),
    }
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    # No "Jupyter news?" toast over the screenshots (and no request for news).
    labconfig = state / "config" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
    )
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = (state / "server.log").open("wb")
    proc = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited ({proc.returncode}):\n{(state / 'server.log').read_text()}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"JupyterLab did not answer in {SERVER_START_S}s:\n{(state / 'server.log').read_text()}"
                )
            time.sleep(0.5)
        yield base, token, root
    finally:
        leftovers = _stop(proc)
        log.close()
        assert not leftovers, f"processes left running: {leftovers}"


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium`")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


NOTEBOOK_READY = """() => {
  const app = window.jupyterapp;
  const nb = app && app.shell.currentWidget;
  const kernel = nb && nb.sessionContext && nb.sessionContext.session && nb.sessionContext.session.kernel;
  return !!(kernel && nb.context.path.endsWith('01_quickstart.ipynb') && kernel.status === 'idle'
            && nb.content.widgets.length > 0);
}"""

# Done when every code cell has run and the kernel is idle, or as soon as a cell failed.
ALL_CELLS_RAN = """() => {
  const nb = window.jupyterapp.shell.currentWidget;
  const cells = nb.content.widgets.filter(c => c.model.type === 'code');
  if (cells.some(c => c.model.outputs.toJSON().some(o => o.output_type === 'error'))) {
    return 'error';
  }
  const done = cells.every(c => c.model.executionCount !== null);
  return done && nb.sessionContext.session.kernel.status === 'idle' ? 'done' : false;
}"""


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
    page.wait_for_function(LAST_CELL_RAN, polling=250)
    last = page.locator(".jp-Notebook .jp-CodeCell").last
    step = last.locator(".swift-nb-live .swift-nb-step").first
    step.wait_for()
    assert step.get_attribute("data-step") == "40" == step.get_attribute("data-total")
    bar = last.locator(".swift-nb-live .widget-hprogress .progress-bar")
    assert bar.evaluate("b => b.style.width") == "100%"


def test_quickstart_in_jupyterlab(lab, browser, tmp_path):
    base, token, _root = lab
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.set_default_timeout(RUN_ALL_S * 1000)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))

    page.goto(f"{base}/lab/tree/01_quickstart.ipynb?token={token}")
    page.wait_for_function(NOTEBOOK_READY, timeout=SERVER_START_S * 1000, polling=250)
    before_run = len(errors)  # JupyterLab's own start-up (no network here, ...) is not ours to judge
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

    live = page.locator(".swift-nb-live").first
    live.locator(".widget-hprogress").wait_for()
    page.wait_for_function(
        "() => Number(document.querySelector('.swift-nb-live .swift-nb-step')?.dataset.step) > 0", polling=100
    )
    live.screenshot(path=tmp_path / "live_panel_running.png")

    outcome = page.wait_for_function(ALL_CELLS_RAN, polling=500).json_value()
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
    image.wait_for()
    assert image.evaluate("img => img.complete && img.naturalWidth") > 100
    results.screenshot(path=tmp_path / "results_panel.png")

    tabs.filter(has_text="Files").click()
    files = results.locator(".widget-tab-contents .widget-vbox:visible").first
    assert "ui.perfetto.dev" in files.inner_text() and "report.html" in files.inner_text()
    tabs.filter(has_text="Advice").click()
    results.screenshot(path=tmp_path / "results_advice.png")
    tabs.filter(has_text="Memory").click()

    _forty_steps_without_a_hint(page)
    ours = errors[before_run:]
    assert not ours, "\n".join(ours)

    if os.environ.get("SWIFT_NB_SCREENSHOTS") == "1":
        DOCS.mkdir(exist_ok=True)
        shutil.copy(tmp_path / "live_panel.png", DOCS / "live_panel.png")
        shutil.copy(tmp_path / "results_panel.png", DOCS / "results_panel.png")
    page.close()
