"""The browser tier: a real Chromium (Debian's package) driven by Playwright, on report.html
and on a JupyterLab server (``lab``). Every test here is marked ``browser``.

Every wait is for a state the page shows (Playwright's waits on the DOM, never a sleep),
bounded by ``waits.py``'s timeouts: ``ACTION_S`` for what one action leads to,
``SERVER_START_S`` for JupyterLab, ``CELLS_S`` for a notebook's cells. Pages opened through ``new_page`` are watched: when a test fails,
each one's screenshot, HTML and state (``PAGE_STATE``: the timeline viewers' data
attributes, the current tabs, the notebook's kernel and cells, the widgets whose changes the
kernel has not acknowledged) and its console land in the test's folder, and the state is
printed with the failure.

``SWIFT_NB_BROWSER_SLOWDOWN=N`` runs every such page's scripts N times slower (Chromium's
CPU throttling): the tests under the load of a busy CI machine, on purpose.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from support.common import kernel_env
from waits import ACTION_S, SERVER_START_S

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: each capture of a failed test's page: its screenshot, its HTML, its state (s)
CAPTURE_S = 20
#: how many times slower the pages' scripts run (1: as fast as the machine allows)
SLOWDOWN = float(os.environ.get("SWIFT_NB_BROWSER_SLOWDOWN", "1"))

_PAGES = pytest.StashKey[list[tuple[Any, list[str]]]]()
_FOLDER = pytest.StashKey[Path]()

# What a failed test's page shows, as JSON. The widgets' unacknowledged changes are read from
# the ipywidgets manager's models (JupyterLab only, best effort): a model whose change is
# still pending keeps its next changes back, so the kernel acts on an older state.
PAGE_STATE = """async () => {
  const state = {url: location.href, title: document.title};
  state.viewers = [...document.querySelectorAll('.swift-tl')].map((r) => ({
    ...r.dataset, clientWidth: r.clientWidth, visible: r.checkVisibility(),
  }));
  state.currentTabs = [...document.querySelectorAll('.lm-TabBar-tab.lm-mod-current')]
    .map((t) => t.textContent.trim());
  const nb = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  if (nb && nb.content && nb.content.widgets) {
    const kernel = nb.sessionContext && nb.sessionContext.session && nb.sessionContext.session.kernel;
    state.kernel = kernel ? kernel.status : null;
    state.cells = nb.content.widgets.filter((c) => c.model.type === 'code').map((c) => ({
      count: c.model.executionCount,
      errors: c.model.outputs.toJSON().filter((o) => o.output_type === 'error').map((o) => o.ename + ': ' + o.evalue),
    }));
    try {
      const renderer = nb.content.rendermime.createRenderer('application/vnd.jupyter.widget-view+json');
      const manager = await renderer._manager.promise;
      state.unacknowledged = [];
      for (const pending of Object.values(manager._models)) {
        const model = await pending;
        if (model._pending_msgs || model._msg_buffer) {
          state.unacknowledged.push({model: model.get('_model_name'), pending: model._pending_msgs,
                                     held_back: model._msg_buffer});
        }
      }
    } catch (err) {
      state.unacknowledged = 'not read: ' + err;
    }
  }
  return JSON.stringify(state);
}"""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[pytest.TestReport]:
    """A failed test's watched pages, kept while they are still open (before the fixtures'
    teardown closes them), their state added to the failure's report."""
    report = yield
    if report.when == "call" and report.failed and item.stash.get(_PAGES, None):
        report.sections.append(("browser state", _keep_pages(item)))
    return report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(__file__.rsplit("/", 1)[0]):
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium`")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 with a token, serving an empty folder; yields (base
    url, token, folder)."""
    root = tmp_path_factory.mktemp("lab")
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


@pytest.fixture
def new_page(browser, request, tmp_path) -> Iterator[Callable[..., Any]]:
    """``new_page(context=None, **options)``: a page of ``browser`` (or of ``context``) whose
    waits and actions time out after ``ACTION_S``, kept (screenshot, HTML, state, console)
    in the test's folder if the test fails; closed afterwards."""
    pages: list[tuple[Any, list[str]]] = []
    request.node.stash[_PAGES] = pages
    request.node.stash[_FOLDER] = tmp_path

    def make(context: Any = None, **options: Any) -> Any:
        page = (context or browser).new_page(**options)
        page.set_default_timeout(ACTION_S * 1000)
        if SLOWDOWN > 1:
            page.context.new_cdp_session(page).send("Emulation.setCPUThrottlingRate", {"rate": SLOWDOWN})
        console: list[str] = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: console.append(f"page error: {e}"))
        pages.append((page, console))
        return page

    yield make
    for page, _ in pages:
        if not page.is_closed():
            page.close()


def _keep_pages(item: pytest.Item) -> str:
    """Each open watched page's screenshot, HTML, state and console in the test's folder;
    returns the states and where the files are."""
    lines = []
    for i, (page, console) in enumerate(item.stash[_PAGES]):
        if not page.is_closed():
            stem = item.stash[_FOLDER] / f"failed_page{i}"
            lines.append(f"page {i}: {stem}.png, .html, .json, .console.txt")
            lines += _keep_page(page, console, stem)
    return "\n".join(lines)


def _keep_page(page: Any, console: list[str], stem: Path) -> list[str]:
    """One page's captures; a page too far gone for one of them still gets the others."""
    stem.with_suffix(".console.txt").write_text("\n".join(console))
    lines = []
    try:
        page.screenshot(path=stem.with_suffix(".png"), full_page=True, timeout=CAPTURE_S * 1000)
    except Exception as e:
        lines.append(f"  no screenshot: {type(e).__name__}: {e}")
    try:
        stem.with_suffix(".html").write_text(_evaluate(page, "() => document.documentElement.outerHTML"))
    except Exception as e:
        lines.append(f"  no HTML: {type(e).__name__}: {e}")
    try:
        state = json.dumps(json.loads(_evaluate(page, PAGE_STATE)), indent=1)
        stem.with_suffix(".json").write_text(state)
        lines.append(state)
    except Exception as e:
        lines.append(f"  no state: {type(e).__name__}: {e}")
    return lines


def _evaluate(page: Any, function: str) -> str:
    """``function``'s value (a non-empty string) in ``page``, bounded by ``CAPTURE_S``:
    ``page.evaluate`` itself waits without a limit on a page whose script hangs."""
    return page.wait_for_function(function, timeout=CAPTURE_S * 1000).json_value()
