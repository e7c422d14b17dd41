"""The HTML report opens offline in a real browser, escapes what users and traces wrote,
and its figures draw whatever data they get."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from playwright.sync_api import expect
from support.demo_run import EVIL_LABEL, EVIL_OP
from support.report import (  # noqa: F401 (fixtures)
    report_path,
    run,
)

from swift_nb.record import Run
from swift_nb.render.document import REPORT_FILE, report_html, write_report


def open_page(new_page, path: Path) -> tuple:
    """Load ``path`` and return (page, problems): console errors, page errors, dialogs,
    failed requests and requests for anything but the file itself or data: URLs."""
    page = new_page(viewport={"width": 1100, "height": 900})
    url = path.resolve().as_uri()
    problems: list[str] = []

    def on_console(message):
        if message.type == "error":
            problems.append(f"console error: {message.text}")

    def on_dialog(dialog):
        problems.append(f"dialog: {dialog.message}")
        dialog.dismiss()

    def on_request(request):
        if request.url != url and not request.url.startswith("data:"):
            problems.append(f"request: {request.url}")

    page.on("console", on_console)
    page.on("dialog", on_dialog)
    page.on("request", on_request)
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on(
        "requestfailed", lambda request: problems.append(f"request failed: {request.url} {request.failure}")
    )
    page.goto(url, wait_until="load")
    return page, problems


def test_report_opens_offline_and_escapes_user_strings(new_page, run, report_path):
    assert report_path == run.path / REPORT_FILE and report_path.exists()
    assert run.files["report"] == REPORT_FILE
    page, problems = open_page(new_page, report_path)
    text = page.evaluate("document.body.innerText")
    assert EVIL_LABEL in text
    assert EVIL_OP in text
    assert page.title() == f"swift_nb report — {EVIL_LABEL}"
    # the timeline's viewer and its data, inline; nothing the label or an op name made
    assert page.evaluate("[...document.scripts].map(s => s.type + (s.src ? ' src' : ''))") == [
        "application/json",
        "module",
    ]
    images = page.evaluate(
        "[...document.images].map(i => ({src: i.src.slice(0, 22), ok: i.complete && i.naturalWidth > 0}))"
    )
    # timeline, breakdown, memory, operators by time and by memory; no <img> from EVIL_OP
    assert len(images) == 5
    assert all(i["ok"] and i["src"] == "data:image/png;base64," for i in images), images
    for section in ("Summary", "Verdict", "Findings", "Throughput", "Environment", "Context", "Notes"):
        assert page.get_by_role("heading", name=section, exact=True).count() == 1
    finding = page.locator(".finding").inner_text()
    for expected in ("139.8 KiB", "30 %", "8.5 ms", "galore", "optimizer state −75 %", "rank / d"):
        assert expected in finding
    assert "2.40 GFLOP/s" in text
    # the timeline viewer, the page's last script to run, has drawn its first answer: a late
    # onerror or alert would have landed by then
    expect(page.locator(".swift-tl")).to_have_attribute("data-settled", "1")
    assert problems == []


def test_report_of_a_run_without_trace(new_page, tmp_path):
    run = Run(id="bare", label="no trace", status="failed", notes=[EVIL_LABEL])
    run.path = tmp_path
    path = write_report(run, report_html(run, breakdown=pd.DataFrame(), timeline=pd.DataFrame()))
    page, problems = open_page(new_page, path)
    text = page.evaluate("document.body.innerText")
    assert "No step breakdown" in text and "No memory categories" in text and "No operators" in text
    assert "No verdict" in text and "Throughput was not computed" in text
    assert EVIL_LABEL in text
    # no samples: the timeline says so instead of drawing empty axes
    assert "Utilisation and memory over time were not recorded: no sample was taken during the run." in text
    assert page.evaluate("document.images.length") == 0
    assert problems == []
