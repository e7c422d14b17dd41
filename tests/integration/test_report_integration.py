"""The HTML report opens offline in a real browser, escapes what users and traces wrote,
and its figures draw whatever data they get."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pandas as pd
from support.report import (  # noqa: F401 (fixtures)
    GLUED,
    reader_text,
    report_path,
    run,
)

from swift_nb.render.document import REPORT_FILE


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


def test_whole_report_text_glues_no_label_to_a_number(report_path):
    text = reader_text(report_path.read_text("utf-8"))
    assert "compute-bound — forward, backward and optimizer fill the step" in text
    assert GLUED.search(text) is None and re.search(r"[a-z]-bound\d", text) is None
    for label in ("Suggestion:", "Toggle:", "Predicted effect:", "Estimated by:"):
        assert re.search(re.escape(label) + r" \S", text), label
    assert "warning · optimizer_state Optimizer state is large" in text


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
