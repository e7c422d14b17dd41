"""The live panel and the results panel in a real kernel: what reaches the frontend over
iopub (widget messages, their number, the final state), interrupts, and the text-only
fallback of a terminal IPython."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from support.common import train
from support.widgets import _newest

import swift_nb
from swift_nb.api import report
from swift_nb.notebook.panel import TABS, results_panel
from swift_nb.notebook.timeline_widget import TimelineWidget
from swift_nb.render.sections.timeline import TimelinePart


def test_results_panel_tabs_reuse_the_report_sections(tmp_path):
    with swift_nb.profile(out_dir=tmp_path, wait=0, warmup=1, active=2) as run:
        train(4)
    reported = report(run.path)
    panel = results_panel(reported.run, reported.sections)
    (tabs,) = [w for w in panel.children if hasattr(w, "titles")]
    assert tabs.titles == TABS
    tab = dict(zip(TABS, tabs.children, strict=True))

    # the trace's timeline is the widget in the panel, its image only in static outputs
    figures = {p.png for s in reported.sections for p in s.parts if not isinstance(p, (str, TimelinePart))}
    assert any(isinstance(w, TimelineWidget) for w in tab["Timeline"].children)
    images = [w.value for w in tab["Memory"].children if hasattr(w, "format")]
    assert images and set(images) <= figures, "the Memory tab shows the report's own figure"
    shown = {w.value for t in tab.values() for w in t.children if hasattr(w, "format")}
    assert shown == figures, "every figure of the report is in some tab"

    def text(name):
        return "".join(w.value for w in tab[name].children if isinstance(getattr(w, "value", None), str))

    assert "Verdict" in text("Advice") and "Findings" in text("Advice")
    assert "Top operators by self time" in text("Operators")
    files = text("Files")
    assert "trace.json.gz" in files and "ui.perfetto.dev" in files and "report.html" in files
    assert str(run.path) in files
    assert "swift-nb-summary" in text("Summary") and "Steps per second" in text("Summary")


def test_a_registered_section_reaches_the_report_the_panel_and_the_static_outputs(monkeypatch):
    """One SectionKind added to the registry, and nothing else, puts the section in
    report.html, in the panel's tab it names and in the static outputs."""
    from swift_nb.notebook import panel
    from swift_nb.record import Run
    from swift_nb.render import sections
    from swift_nb.render.document import report_html, report_sections
    from swift_nb.render.sections import SectionKind

    extra = SectionKind(
        "Throwaway", tab="Memory", build=lambda inputs: [f"<p>throwaway of {inputs.run.id}</p>"]
    )
    monkeypatch.setattr(sections, "SECTIONS", [*sections.SECTIONS, extra])
    run = Run(id="reg")
    assert "<h2>Throwaway</h2><p>throwaway of reg</p>" in report_html(run)
    built = report_sections(run)
    panel_tabs = results_panel(run, built).children[1]
    memory = dict(zip(TABS, panel_tabs.children, strict=True))["Memory"]
    assert any("throwaway of reg" in getattr(w, "value", "") for w in memory.children)

    shown: list[dict] = []
    monkeypatch.setattr(panel, "display", lambda bundle, raw=False: shown.append(bundle))
    panel.show_static(run, built)
    assert any("throwaway of reg" in b.get("text/html", "") for b in shown)


def test_terminal_ipython_gets_text_only(tmp_path):
    script = tmp_path / "train.ipy"
    script.write_text(
        textwrap.dedent(
            f"""\
            %load_ext swift_nb
            import torch
            m = torch.nn.Linear(8, 8)
            o = torch.optim.SGD(m.parameters(), lr=0.1)
            def loop():
                for _ in range(3):
                    m(torch.randn(2, 8)).sum().backward(); o.step(); o.zero_grad()
            get_ipython().run_cell_magic("swift_profile", "--out {tmp_path / "runs"} --label term", "loop()")
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "IPython", "--no-banner", "--colors=nocolor", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Status" in out and "ok" in out and "term" in out  # the summary as text
    assert "[Utilisation and memory over time]" in out  # figures name themselves
    assert "live panel" not in out and "Tab(" not in out and "IntProgress" not in out
    assert _newest(tmp_path / "runs").status == "ok"
