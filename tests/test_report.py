"""The HTML report opens offline in a real browser, escapes what users and traces wrote,
and its figures draw whatever data they get."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

import swift_nb
from swift_nb.analysis.advisor.findings import VERDICTS, Finding, Verdict
from swift_nb.analysis.breakdown import step_breakdown
from swift_nb.analysis.memory import memory_footprint, memory_timeline
from swift_nb.demo import make_model
from swift_nb.record import MEMORY_CATEGORIES, MEMORY_COLUMNS, Run
from swift_nb.render.comparison.page import STEP_TIMES_ALT, compare_html
from swift_nb.render.document import REPORT_FILE, report_html, write_report
from swift_nb.render.figures import (
    breakdown_figure,
    figure_png,
    memory_figure,
    operators_figure,
    short_name,
)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
EVIL_LABEL = "<script>alert(1)</script>"
EVIL_OP = "<img src=x onerror=alert(1)>"
OPERATOR_COLUMNS = ["name", "calls", "self_time_s", "total_time_s", "self_pct", "alloc_bytes", "input_shapes"]


def operators(n: int = 4) -> pd.DataFrame:
    names = [EVIL_OP, "aten::addmm", "autograd::engine::evaluate_function: AddmmBackward0", "aten::$x$"]
    rows = [
        (names[i % len(names)] + ("" if i < len(names) else f"_{i}"), 10 - i, 1e-3 / (i + 1), 2e-3 / (i + 1),
         40.0 / (i + 1), 2**20 * (i + 1), "[[2, 32], [32, 32]]")
        for i in range(n)
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=OPERATOR_COLUMNS)


def findings() -> list[Finding]:
    return [
        Finding(
            id="optimizer_state",
            title=f"Optimizer state is large for {EVIL_OP}",
            evidence={"optimizer_state_bytes": 143168, "optimizer_pct": 30.0, "step_s": 0.0085},
            suggestion="Project gradients to low rank with GaLore.",
            toggle="galore",
            predicted_effect="optimizer state −75 %",
            formula="state_bytes × (1 − rank / d)",
            severity="warning",
        )
    ]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    """A real profiled run of the demo GPT: 4 optimizer steps, 2 recorded by the profiler."""
    torch.manual_seed(0)
    model = make_model(seq_len=32, n_layer=1, d_model=32, n_head=2, vocab_size=128)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 128, (2, 32))
    out_dir = tmp_path_factory.mktemp("runs")
    with swift_nb.profile(
        out_dir=out_dir, wait=0, warmup=1, active=2, label=EVIL_LABEL, context={"note": EVIL_OP}
    ) as run:
        for _ in range(4):
            model(x, x).backward()
            opt.step()
            opt.zero_grad()
    assert run.status == "ok" and run.trace_path is not None
    return run


@pytest.fixture(scope="module")
def report_path(run: Run) -> Path:
    html = report_html(
        run,
        breakdown=step_breakdown(run),
        footprint=memory_footprint(run),
        timeline=memory_timeline(run),
        operators_time=operators(),
        operators_memory=operators(),
        throughput=SimpleNamespace(
            steps_per_s=100.0,
            samples_per_s=200.0,
            tokens_per_s=6400.0,
            flops_per_step=2.4e7,
            achieved_flops_per_s=2.4e9,
            mfu_pct=None,
        ),
        verdict=Verdict(
            "compute-bound", "forward, backward and optimizer fill the step", {"compute_pct": 70.0}
        ),
        findings=findings(),
    )
    return write_report(run, html)


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium`")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def open_page(browser, path: Path) -> tuple:
    """Load ``path`` and return (page, problems): console errors, page errors, dialogs,
    failed requests and requests for anything but the file itself or data: URLs."""
    page = browser.new_page(viewport={"width": 1100, "height": 900})
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


def test_report_opens_offline_and_escapes_user_strings(browser, run, report_path):
    assert report_path == run.path / REPORT_FILE and report_path.exists()
    assert run.files["report"] == REPORT_FILE
    page, problems = open_page(browser, report_path)
    try:
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
        page.wait_for_timeout(200)  # a late onerror or alert would land here
        assert problems == []
    finally:
        page.close()


class _Assets(HTMLParser):
    """Tags that could load something: scripts, links, sources, and CSS text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.css: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.css.append(data)


def test_report_references_no_remote_assets(report_path):
    parser = _Assets()
    parser.feed(report_path.read_text("utf-8"))
    names = [t for t, _ in parser.tags]
    assert "link" not in names and "iframe" not in names
    assert [a.get("type") for t, a in parser.tags if t == "script"] == ["application/json", "module"]
    for tag, attrs in parser.tags:
        for attr in ("src", "href", "srcset", "data"):
            value = attrs.get(attr) or ""
            assert not value.lower().startswith(("http:", "https:", "//")), (tag, attr, value[:80])
        if tag == "img":
            assert attrs["src"].startswith("data:image/png;base64,")
    css = "".join(parser.css).lower()
    assert "@import" not in css and "@font-face" not in css and "url(" not in css


APART = frozenset(
    ["p", "div", "h1", "h2", "h3", "h4", "li", "ul", "tr", "th", "td", "table", "figure", "figcaption", "br"]
)


class _Text(HTMLParser):
    """The text a reader sees with no CSS at all: inline elements (span, strong, code …)
    run on with their neighbours, block elements and table cells are set apart; style
    and title text are not shown."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag, attrs):
        self._hidden += tag in ("style", "title")
        if tag in APART:
            self.parts.append(" ")

    def handle_endtag(self, tag):
        self._hidden -= tag in ("style", "title")
        if tag in APART:
            self.parts.append(" ")

    def handle_data(self, data):
        if not self._hidden:
            self.parts.append(data)


def reader_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    return re.sub(r"\s+", " ", "".join(parser.parts)).strip()


GLUED = re.compile("(?:" + "|".join(map(re.escape, VERDICTS)) + r")[\w(]")


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


def test_whole_report_text_glues_no_label_to_a_number(report_path):
    text = reader_text(report_path.read_text("utf-8"))
    assert "compute-bound — forward, backward and optimizer fill the step" in text
    assert GLUED.search(text) is None and re.search(r"[a-z]-bound\d", text) is None
    for label in ("Suggestion:", "Toggle:", "Predicted effect:", "Estimated by:"):
        assert re.search(re.escape(label) + r" \S", text), label
    assert "warning · optimizer_state Optimizer state is large" in text


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


def test_report_of_a_run_without_trace(browser, tmp_path):
    run = Run(id="bare", label="no trace", status="failed", notes=[EVIL_LABEL])
    run.path = tmp_path
    path = write_report(run, report_html(run, breakdown=pd.DataFrame(), timeline=pd.DataFrame()))
    page, problems = open_page(browser, path)
    try:
        text = page.evaluate("document.body.innerText")
        assert "No step breakdown" in text and "No memory categories" in text and "No operators" in text
        assert "No verdict" in text and "Throughput was not computed" in text
        assert EVIL_LABEL in text
        # no samples: the timeline says so instead of drawing empty axes
        assert (
            "Utilisation and memory over time were not recorded: no sample was taken during the run." in text
        )
        assert page.evaluate("document.images.length") == 0
        assert problems == []
    finally:
        page.close()


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


def test_memory_figure_stacks_six_categories():
    mib = 2**20
    tl = pd.DataFrame(
        [
            (0.10, 1, mib, 4 * mib, 0, 2 * mib, 0, 0),
            (0.11, 1, mib, 4 * mib, mib, 2 * mib, 3 * mib, 0),
            (0.20, 2, mib, 4 * mib, mib, 2 * mib, 0, mib),
        ],
        columns=MEMORY_COLUMNS,
    )
    fig = memory_figure(tl)
    ax = fig.axes[0]
    assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 6
    assert "frozen parameters" in ax.get_legend_handles_labels()[1]
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


def test_report_written_again_draws_only_what_changed(tmp_path, run, monkeypatch):
    """``swift-nb report`` of a run folder reuses the figures of the report it replaces
    that show the same data, and draws again the one whose data changed."""
    import shutil

    from swift_nb.api import report
    from swift_nb.record import load_run
    from swift_nb.render.sections import base as sections_base

    folder = tmp_path / "run"
    shutil.copytree(run.path, folder)
    first = report(load_run(folder))
    first_html = (folder / REPORT_FILE).read_text()
    keyed = re.findall(r"data-figure='([0-9a-f]{40})'", first_html)
    assert (
        len(keyed)
        == sum(isinstance(p, sections_base.FigurePart) for s in first.sections for p in s.parts)
        >= 4
    )

    drawn: list[object] = []
    real = sections_base.figure_png
    monkeypatch.setattr(sections_base, "figure_png", lambda fig: drawn.append(fig) or real(fig))
    report(load_run(folder))  # its figures come from the earlier report alone
    assert drawn == []
    assert (folder / REPORT_FILE).read_text() == first_html

    samples = pd.read_csv(folder / "samples.csv")
    samples["rss_bytes"] = samples["rss_bytes"] * 2
    samples.to_csv(folder / "samples.csv", index=False)
    again = report(load_run(folder))
    assert len(drawn) == 1  # the timeline alone
    timeline = next(p for s in again.sections for p in s.parts if isinstance(p, sections_base.FigurePart))
    assert timeline.alt == "Utilisation and memory over time" and timeline.key not in keyed
