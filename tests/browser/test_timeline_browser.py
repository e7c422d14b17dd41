"""The timeline viewer in Debian's Chromium through Playwright: report.html with every
request refused paints its timeline and zooms; in JupyterLab a profiled cell's Timeline tab
paints, a wheel zoom asks the kernel again, hovering names an ``aten::`` op and "Show on
timeline" moves the view. The viewer's state is read from its root's data attributes
(data-start-us, data-end-us, data-queries, data-hover), the canvas only for not being blank.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from test_browser import ALL_CELLS_RAN, SERVER_START_S, browser, lab  # noqa: F401 (fixtures)

import swift_nb
from swift_nb.reporting import report

COST_RUN = Path(__file__).parents[1] / "data" / "cost_run"
GPU = Path(__file__).parents[1] / "data" / "gpu"
NOTEBOOK = "timeline.ipynb"
RANKS = [str(GPU / f"gpu_128ranks_rank{r}.json.gz") for r in (0, 1)]
CELLS = [
    "%load_ext swift_nb",
    "import torch\n"
    "torch.manual_seed(0)\n"
    "model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))\n"
    "opt = torch.optim.AdamW(model.parameters())\n"
    "data = [(torch.randn(32, 64), torch.randint(0, 8, (32,))) for _ in range(8)]",
    "%%swift_profile --steps 8 --wait 1 --warmup 1 --active 3\n"
    "for x, y in data:\n"
    "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
    "    loss.backward()\n"
    "    opt.step()\n"
    "    opt.zero_grad()",
    # a job's two ranks, and the same traces as 18 ranks (past 16: the overview)
    "import swift_nb\n"
    f"job = swift_nb.import_trace({RANKS!r}, 'job_runs', report=False)\n"
    "swift_nb.timeline(job, findings=[])",
    "job.files.update({f'trace_rank{r}': job.files['trace_rank1'] for r in range(2, 18)})\n"
    "swift_nb.timeline(job, findings=[])",
]
STATE = "root => ({start: Number(root.dataset.startUs), end: Number(root.dataset.endUs), queries: Number(root.dataset.queries), hover: root.dataset.hover, items: Number(root.dataset.items)})"
# Pixels of the canvas that are neither white nor the background stripes' grey.
INKED = """canvas => {
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let n = 0;
  for (let i = 0; i < data.length; i += 4) if (Math.min(data[i], data[i + 1], data[i + 2]) < 235) n++;
  return n;
}"""


def _state(root) -> dict:
    return root.evaluate(STATE)


def _hover_an_op(page, root, prefix: str) -> str:
    """Move over the canvas, row by row in a few columns, until the hover names an op
    starting with ``prefix``; returns that name (or the last hover). Three passes, a
    moment apart: a pass may cross the canvas while it is being redrawn."""
    hovered = ""
    for attempt in range(3):
        if attempt:
            page.wait_for_timeout(500)
        box = _still_box(page, root)
        for fraction in (0.5, 0.35, 0.65, 0.2, 0.8, 0.1, 0.9):
            x = box["x"] + 160 + (box["width"] - 160) * fraction
            for dy in range(20, int(min(box["height"], 400)), 7):
                page.mouse.move(x, box["y"] + dy)
                hovered = root.get_attribute("data-hover") or ""
                if hovered.startswith(prefix):
                    return hovered
    return hovered


def _still_box(page, root) -> dict:
    """The canvas's box once it has stopped moving: the viewers painted below it, and the
    outputs of the cells after it, may still shift the page for a moment."""
    root.scroll_into_view_if_needed()
    box = root.locator("canvas").bounding_box()
    for _ in range(20):
        page.wait_for_timeout(100)
        root.scroll_into_view_if_needed()
        again = root.locator("canvas").bounding_box()
        if again == box:
            break
        box = again
    return box


def _index(page, root) -> int:
    """``root``'s position among the page's viewers."""
    return root.evaluate("r => [...document.querySelectorAll('.swift-tl')].indexOf(r)")


def test_report_timeline_paints_offline(browser, tmp_path):
    shutil.copytree(COST_RUN, tmp_path / "run")
    report(tmp_path / "run")
    path = tmp_path / "run" / "report.html"
    url = path.as_uri()
    attempted: list[str] = []
    problems: list[str] = []

    def refuse(route):
        if route.request.url == url:
            route.continue_()
        else:
            attempted.append(route.request.url)
            route.abort()

    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.route("**/*", refuse)
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(url, wait_until="load")
    root = page.locator(".swift-tl")
    page.wait_for_function("() => document.querySelector('.swift-tl')?.dataset.painted === '1'")
    root.scroll_into_view_if_needed()
    before = _state(root)
    assert before["items"] > 100 and root.locator("canvas").evaluate(INKED) > 1000

    box = root.locator("canvas").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 60)
    page.mouse.wheel(0, -300)
    page.wait_for_function(
        f"() => Number(document.querySelector('.swift-tl').dataset.queries) > {before['queries']}"
    )
    zoomed = _state(root)
    assert before["start"] < zoomed["start"] < zoomed["end"] < before["end"]
    assert _hover_an_op(page, root, "aten::").startswith("aten::")

    root.focus()
    page.keyboard.press("d")  # pan right, as in Perfetto
    panned = _state(root)
    assert panned["start"] > zoomed["start"]
    assert panned["end"] - panned["start"] == pytest.approx(zoomed["end"] - zoomed["start"])
    page.keyboard.press("w")  # zoom in
    assert _state(root)["end"] - _state(root)["start"] < panned["end"] - panned["start"]

    search = root.locator(".swift-tl-search")
    search.fill("aten::mm")
    page.wait_for_function("() => /found/.test(document.querySelector('.swift-tl-found').textContent)")
    search.press("Enter")  # the first match, in view
    hit = _state(root)
    assert _hover_an_op(page, root, "aten::mm") == "aten::mm"

    assert page.locator(".finding").count() > 0
    assert page.locator("a.show-on-timeline").count() == 0  # none of this CPU run's findings has a place
    place = root.locator(".swift-tl-place").first  # the slowest step
    place.click()
    page.wait_for_timeout(300)
    moved = _state(root)
    assert (moved["start"], moved["end"]) != (hit["start"], hit["end"])
    page.screenshot(path=tmp_path / "report_timeline.png")
    assert attempted == [] and problems == []
    page.close()


def test_a_jobs_report_switches_to_its_ranks_overview(browser, tmp_path):
    job = swift_nb.import_trace([Path(r) for r in RANKS], tmp_path, report=False)
    report(job)
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.route(
        "**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else route.abort()
    )
    page.goto((job.path / "report.html").as_uri())
    page.wait_for_function("() => document.querySelector('.swift-tl')?.dataset.painted === '1'")
    root = page.locator(".swift-tl")
    root.scroll_into_view_if_needed()
    assert root.get_attribute("data-rank") == "0"
    answered = int(root.get_attribute("data-answers") or 0)
    root.locator(".swift-tl-rank").select_option("-1")  # all ranks
    page.wait_for_function(f"() => Number(document.querySelector('.swift-tl').dataset.answers) > {answered}")
    assert root.get_attribute("data-rank") == "-1" and _state(root)["items"] > 0
    box = root.locator("canvas").bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + 18 + 4 + 7)  # rank 0's summary track
    page.wait_for_function("() => document.querySelector('.swift-tl').dataset.rank === '0'")

    # the findings with a place in time (launch gaps, exposed communication) link to it
    links = page.locator(".finding[data-finding] a.show-on-timeline")
    assert sorted(links.evaluate_all("ls => ls.map(a => a.closest('.finding').dataset.finding)")) == [
        "communication",
        "overhead",
    ]
    before = _state(root)
    page.locator(".finding[data-finding='communication'] a.show-on-timeline").click()
    page.wait_for_function(
        f"() => Number(document.querySelector('.swift-tl').dataset.startUs) !== {before['start']}"
    )
    moved = _state(root)
    assert moved["end"] - moved["start"] < before["end"] - before["start"]
    page.close()


# Stands in for ui.perfetto.dev (served by Playwright's router: no network): answers PING
# with PONG, as Perfetto does, and shows what it was posted.
FAKE_PERFETTO = """<!DOCTYPE html><title>waiting</title><script>
addEventListener('message', (ev) => {
  if (ev.data === 'PING') { ev.source.postMessage('PONG', '*'); return; }
  const p = ev.data && ev.data.perfetto;
  if (p) document.title = `trace ${p.buffer.byteLength} ${p.fileName}`;
});
</script>"""


def test_open_in_perfetto_posts_the_trace_after_pong(browser, tmp_path):
    shutil.copytree(COST_RUN, tmp_path / "run")
    report(tmp_path / "run")
    context = browser.new_context()
    context.route(
        "https://ui.perfetto.dev/**",
        lambda route: route.fulfill(status=200, content_type="text/html", body=FAKE_PERFETTO),
    )
    page = context.new_page()
    page.goto((tmp_path / "run" / "report.html").as_uri())
    page.wait_for_function("() => document.querySelector('.swift-tl')?.dataset.painted === '1'")
    with context.expect_page() as opened:
        page.locator(".swift-tl-perfetto").click()
    perfetto = opened.value
    perfetto.wait_for_function("() => document.title.startsWith('trace ')", timeout=20_000)
    size = int(perfetto.title().split()[1])
    assert size > 1000  # the report's events as a Chrome trace
    context.close()


def test_timeline_in_jupyterlab(lab, browser, tmp_path):
    base, token, root_dir = lab
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(c) for c in CELLS],
        metadata={"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    )
    nbformat.write(nb, root_dir / NOTEBOOK)
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.set_default_timeout(600_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{base}/lab/tree/{NOTEBOOK}?token={token}")
    page.wait_for_function(
        f"""() => {{
          const nb = window.jupyterapp && window.jupyterapp.shell.currentWidget;
          const kernel = nb && nb.sessionContext && nb.sessionContext.session && nb.sessionContext.session.kernel;
          return !!(kernel && nb.context.path.endsWith('{NOTEBOOK}') && kernel.status === 'idle'
                    && nb.content.widgets.length > 0);
        }}""",
        timeout=SERVER_START_S * 1000,
        polling=250,
    )
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    outcome = page.wait_for_function(ALL_CELLS_RAN, polling=500).json_value()
    page.screenshot(path=tmp_path / "notebook.png", full_page=True)
    assert outcome == "done", page.inner_text(".jp-Notebook")

    results = page.locator(".swift-nb-results").first
    tabs = results.locator(".lm-TabBar-tab")
    tabs.filter(has_text="Timeline").click()
    root = results.locator(".swift-tl")
    root.wait_for()
    page.wait_for_function(
        "() => document.querySelector('.swift-nb-results .swift-tl')?.dataset.painted === '1'"
    )
    root.scroll_into_view_if_needed()
    first = _state(root)
    assert first["items"] > 50 and root.locator("canvas").evaluate(INKED) > 1000

    box = root.locator("canvas").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 60)
    page.mouse.wheel(0, -300)
    answered = int(root.get_attribute("data-answers") or 0)
    page.wait_for_function(
        f"() => Number(document.querySelector('.swift-nb-results .swift-tl').dataset.answers) > {answered}"
    )  # the kernel answered the zoomed window's query, and it was drawn
    zoomed = _state(root)
    assert zoomed["queries"] > first["queries"]
    assert first["start"] < zoomed["start"] < zoomed["end"] < first["end"]
    assert zoomed["items"] > 0
    op = _hover_an_op(page, root, "aten::")
    if not op.startswith("aten::"):
        page.screenshot(path=tmp_path / "no_op_hovered.png", full_page=True)
    assert op.startswith("aten::"), (op, _state(root), root.locator("canvas").bounding_box(), tmp_path)
    page.mouse.down()  # a click: the kernel's detail of the op
    page.mouse.up()
    page.wait_for_function(
        "() => document.querySelector('.swift-nb-results .swift-tl').dataset.selected !== undefined"
    )
    assert root.get_attribute("data-selected") == op
    assert "shapes: [[" in root.locator(".swift-tl-detail").inner_text()

    search = root.locator(".swift-tl-search")  # the kernel's search
    search.fill("addmm")
    page.wait_for_function(
        "() => /\\d+\\+? found/.test(document.querySelector('.swift-nb-results .swift-tl-found').textContent)"
    )
    search.press("Enter")
    assert _hover_an_op(page, root, "aten::addmm") == "aten::addmm"
    results.screenshot(path=tmp_path / "timeline_tab.png")

    cells = "() => window.jupyterapp.shell.currentWidget.content.widgets.length"
    before = page.evaluate(cells)
    root.click(position={"x": 300, "y": 40})
    for key in ("d", "d", "a", "s"):  # the viewer's keys, not the notebook's (delete cell, insert, save)
        page.keyboard.press(key)
    assert page.evaluate(cells) == before
    assert _state(root)["start"] != zoomed["start"]
    zoomed = _state(root)

    tabs.filter(has_text="Advice").click()
    results.locator(".swift-nb-show-on-timeline").first.click()
    page.wait_for_function(
        f"() => Number(document.querySelector('.swift-nb-results .swift-tl').dataset.startUs) !== {zoomed['start']}"
    )
    assert root.is_visible()  # the button brought the Timeline tab forward

    job, wide = page.locator(".swift-tl").all()[-2:]  # the last two cells' timelines
    job.scroll_into_view_if_needed()
    assert job.get_attribute("data-rank") == "0"
    answered = int(job.get_attribute("data-answers") or 0)
    job.locator(".swift-tl-rank").select_option("1")
    job_answered = (
        f"Number(document.querySelectorAll('.swift-tl')[{_index(page, job)}].dataset.answers) > {answered}"
    )
    page.wait_for_function(f"() => {job_answered}")
    assert job.get_attribute("data-rank") == "1"

    wide.scroll_into_view_if_needed()
    assert wide.get_attribute("data-rank") == "-1"  # the overview: one summary track per rank
    box = wide.locator("canvas").bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + 18 + 4 + 5 * 22 + 7)  # rank 5's track
    page.wait_for_function(
        f"() => document.querySelectorAll('.swift-tl')[{_index(page, wide)}].dataset.rank !== '-1'"
    )
    assert wide.get_attribute("data-rank") == "5"
    assert errors == [], errors
    page.close()
