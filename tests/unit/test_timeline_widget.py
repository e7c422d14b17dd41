"""The timeline's front: the widget's answers to its viewer (query, detail, search, the
trace for Perfetto), "show on timeline" from the results panel, the diff view, the report's
embedded viewer and its script hash, and the static PNG; on the recorded CPU run in
``tests/data/cost_run``. The viewer itself, in Chromium: ``test_timeline_browser.py``."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

import swift_nb
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.notebook.panel import TABS, results_panel
from swift_nb.notebook.timeline_widget import TimelineWidget, step_window, timeline
from swift_nb.record import load_run
from swift_nb.render.sections.timeline import TimelinePart
from swift_nb.render.timeline import view
from swift_nb.render.timeline.view import DATA_ID, SOURCES, embedded_html, script_sources, viewer_js
from swift_nb.reporting import report

COST_RUN = Path(__file__).parents[1] / "data" / "cost_run"
GPU = Path(__file__).parents[1] / "data" / "gpu"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def run(tmp_path):
    """A copy of the recorded run (a report writes into its folder)."""
    shutil.copytree(COST_RUN, tmp_path / "run")
    return load_run(tmp_path / "run")


@pytest.fixture
def widget(run):
    return TimelineWidget(run, places=[])


def _ask(widget, **content):
    reply, buffers = widget.answer({"id": 7, **content})
    assert reply["id"] == 7 and "error" not in reply, reply
    return reply, buffers


def test_the_first_view_comes_with_the_widget(widget):
    first = widget.initial
    assert first["start_us"] == widget.timeline.start_us and first["end_us"] == widget.timeline.end_us
    kinds = {t["kind"] for t in first["tracks"]}
    assert {"steps", "cpu", "counter"} <= kinds
    assert len(first["items"]["start"]) > 0 and len(first["counters"]["t"]) > 0
    json.dumps(first)  # what the model syncs is plain JSON


def test_a_query_answers_the_window_at_the_width_asked(widget):
    tl = widget.timeline
    wide, _ = _ask(widget, op="query", start_us=None, end_us=None, width_px=2000)
    narrow, _ = _ask(widget, op="query", start_us=None, end_us=None, width_px=50)
    assert len(narrow["payload"]["items"]["start"]) < len(wide["payload"]["items"]["start"])
    mid = (tl.start_us + tl.end_us) / 2
    window, _ = _ask(widget, op="query", start_us=mid, end_us=mid + 1000, width_px=800)
    items = window["payload"]["items"]
    origin = window["payload"]["origin_us"]
    assert all(
        origin + e >= mid and origin + s <= mid + 1000
        for s, e in zip(items["start"], items["end"], strict=True)
    )
    json.dumps(window)


def test_detail_names_an_op_with_its_shapes_and_stack(widget):
    q = widget.timeline.query(width_px=4000)
    op = q[q["name"].str.startswith("aten::") & (q["count"] == 1) & (q["depth"] > 0)].iloc[0]
    reply, _ = _ask(
        widget, op="detail", track=op.track, depth=int(op.depth), t_us=float((op.start_us + op.end_us) / 2)
    )
    detail = reply["detail"]
    assert detail["name"] == op["name"] and detail["dur_us"] > 0
    assert len(detail["stack"]) == op.depth and detail["shapes"].startswith("[")
    json.dumps(reply)


def test_search_and_the_trace_for_perfetto(widget, run):
    reply, _ = _ask(widget, op="search", text="ADDMM")
    assert reply["results"] and all("addmm" in r["name"].lower() for r in reply["results"])
    json.dumps(reply)
    _, buffers = _ask(widget, op="trace")
    assert buffers == [run.trace_path.read_bytes()]


def test_a_failing_request_is_answered_with_its_error(widget):
    reply, buffers = widget.answer({"id": 3, "op": "query", "start_us": 10.0, "end_us": 5.0})
    assert reply["id"] == 3 and "ends after it starts" in reply["error"] and buffers == []
    assert "unknown request" in widget.answer({"id": 4, "op": "zoom"})[0]["error"]


def test_show_on_timeline_from_the_results_panel(run):
    reported = report(run.path)
    panel = results_panel(reported.run, reported.sections)
    tabs = panel.children[1]
    tab = dict(zip(TABS, tabs.children, strict=True))
    (viewer,) = [w for w in tab["Timeline"].children if isinstance(w, TimelineWidget)]
    assert viewer.timeline is _timeline_part(reported.sections).timeline  # read once for report and panel
    assert "slowest_step" in [p["id"] for p in viewer.places]  # a CPU run: no launch gap to show
    buttons = [w for box in tab["Advice"].children if hasattr(box, "children") for w in box.children]
    shown = [b for b in buttons if getattr(b, "description", "").startswith("Show on timeline")]
    assert len(shown) == len(viewer.places)
    tabs.selected_index = 0
    shown[0].click()
    place = viewer.places[0]
    assert tabs.selected_index == TABS.index("Timeline")
    assert (viewer.goto["start_us"], viewer.goto["end_us"]) == (place["start_us"], place["end_us"])


def _timeline_part(sections) -> TimelinePart:
    (part,) = [p for s in sections for p in s.parts if isinstance(p, TimelinePart)]
    return part


#: how much later the diff view's second run starts on its own clock
SHIFT_US = 5_000.25


def _shifted_copy(src: Path, dest: Path, shift_us: float) -> None:
    """A copy of a run folder whose trace's events all happen ``shift_us`` later."""
    shutil.copytree(src, dest)
    doc = json.loads(gzip.decompress((dest / "trace.json.gz").read_bytes()))
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] = float(e["ts"]) + shift_us
    (dest / "trace.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    for cached in dest.glob("*.tables.npz"):
        cached.unlink()


def test_swift_nb_timeline_and_the_diff_view(run, tmp_path):
    finding = Finding("data_loading", "Data loading is slow", {}, "more workers")
    single = swift_nb.timeline(run.path, findings=[finding])
    assert isinstance(single, TimelineWidget)
    assert single.places[0]["title"] == "slowest step"
    _shifted_copy(COST_RUN, tmp_path / "other", SHIFT_US)  # the same steps, later on its clock
    pair = timeline(run, other=tmp_path / "other", step=4, findings=[])
    a, b = [w for w in pair.children if isinstance(w, TimelineWidget)]
    for w in (a, b):
        assert (w.goto["start_us"], w.goto["end_us"]) == step_window(w.timeline, 4)
    # zooming one (its viewer reports the window it asked for) moves the other alike
    start = step_window(a.timeline, 4)[0]
    a.view = {"start_us": start + 100.0, "end_us": start + 300.0}
    other_start = step_window(b.timeline, 4)[0]
    assert other_start - start == pytest.approx(SHIFT_US)  # the diff view has an offset to keep
    assert b.goto["exact"] and (b.goto["start_us"], b.goto["end_us"]) == (
        other_start + 100,
        other_start + 300,
    )
    asked = a.goto
    b.view = {"start_us": b.goto["start_us"], "end_us": b.goto["end_us"]}
    assert a.goto == asked  # a already shows it: the two settle
    with pytest.raises(
        swift_nb.ConfigError, match=r"step must be a profiler step of the trace \(recorded: 3, 4, 5\); got 99"
    ):
        timeline(run, step=99, findings=[])


def test_the_viewer_is_one_module():
    js = viewer_js()
    assert "./timeline_" not in js and "export default { render }" in js
    assert "</script" not in js.lower()  # it is inlined in report.html
    static = {p.name for p in (Path(view.__file__).parent / "static").glob("*.js")}
    assert set(SOURCES) == static and len(SOURCES) == len(static)


def test_the_report_embeds_the_viewer_under_its_hash(run):
    reported = report(run.path)
    html = (run.path / "report.html").read_text("utf-8")
    (module,) = re.findall(r'<script type="module">(.*?)</script>', html, re.DOTALL)
    digest = base64.b64encode(hashlib.sha256(module.encode()).digest()).decode()
    csp = re.search(r"Content-Security-Policy' content=\"([^\"]+)\"", html).group(1)
    assert csp.startswith("default-src 'none'") and f"script-src 'sha256-{digest}'" in csp
    assert "connect-src" not in csp  # default-src 'none' refuses every request, scripts' included
    data = json.loads(re.search(rf"id='{DATA_ID}'>(.*?)</script>", html, re.DOTALL).group(1))
    assert data["places"] and data["title"] == (run.label or run.id)
    assert len(data["items"]["start"]) == _timeline_part(reported.sections).timeline.events
    assert script_sources("<p>no scripts</p>") == ""


def test_names_cannot_end_the_data_block(widget):
    widget.timeline.names[0] = "</script><script>alert(1)</script>"
    html = embedded_html(widget.timeline, [], "t")
    assert html.count("</script>") == 2  # the data block's and the module's own


def test_the_static_png_of_the_timeline(run):
    part = _timeline_part(report(run.path).sections)
    assert part.png.startswith(PNG)
    axes = part.figure.axes
    assert len(axes) == len(part.timeline.tracks)


@pytest.fixture(scope="module")
def gpu_runs(tmp_path_factory):
    """A recorded GPU trace and a job's two ranks, imported."""
    out = tmp_path_factory.mktemp("gpu_runs")
    single = swift_nb.import_trace(GPU / "gpu_1rank_5steps.json.gz", out, report=False)
    ranks = [GPU / f"gpu_128ranks_rank{r}.json.gz" for r in (0, 1)]
    return single, swift_nb.import_trace(ranks, out, report=False)


def test_an_op_and_the_kernels_it_launched(gpu_runs):
    widget = TimelineWidget(gpu_runs[0])
    assert "gpu" in set(widget.timeline.tracks["kind"])
    hits = widget.timeline.search("aten::addmm")
    op = hits.iloc[0]
    reply, _ = _ask(widget, op="detail", track=op.track, depth=int(op.depth), t_us=float(op.start_us) + 0.01)
    launches = reply["detail"]["launches"]
    assert launches and all(k["track"].startswith("gpu:") for k in launches)
    kernel = launches[0]
    back, _ = _ask(
        widget, op="detail", track=kernel["track"], depth=kernel["depth"], t_us=kernel["start_us"] + 0.01
    )
    assert back["detail"]["launched_by"]["track"] == op.track  # the runtime call on the op's thread
    json.dumps([reply, back])


def test_a_job_has_a_rank_selector_and_past_16_ranks_an_overview(gpu_runs):
    job = gpu_runs[1]
    widget = TimelineWidget(job)
    assert widget.ranks == [0, 1] and widget.rank == 0
    reply, _ = _ask(widget, op="rank", rank=1)
    assert reply["rank"] == widget.rank == 1 and reply["initial"]["items"]["start"]
    _, buffers = _ask(widget, op="trace")
    assert buffers == [job.rank_trace_paths()[1].read_bytes()]

    # the same two traces as 18 ranks: a summary track per rank, a rank opens into its detail
    job.files.update({f"trace_rank{r}": job.files["trace_rank1"] for r in range(2, 18)})
    wide = TimelineWidget(job)
    assert wide.overview and wide.rank == -1 and len(wide.ranks) == 18
    assert [t["track"] for t in wide.initial["tracks"]] == [f"rank:{r}" for r in range(18)]
    reply, _ = _ask(wide, op="rank", rank=5)
    assert not wide.overview and {t["kind"] for t in reply["initial"]["tracks"]} >= {"cpu", "gpu"}
    reply, _ = _ask(wide, op="rank", rank=-1)
    assert wide.overview and len(reply["initial"]["tracks"]) == 18


def test_a_damaged_trace_costs_the_timeline_alone(run):
    run.trace_path.write_bytes(b"\x1f\x8b not a gzip stream")
    reported = report(run.path)
    why = "The trace&#x27;s timeline could not be drawn"
    assert why in (run.path / "report.html").read_text("utf-8")
    part = _timeline_part(reported.sections)
    (output,) = part.outputs()
    assert "could not be drawn" in output["text/plain"]
    tab = dict(zip(TABS, results_panel(reported.run, reported.sections).children[1].children, strict=True))
    assert any(why in getattr(w, "value", "") for w in tab["Timeline"].children)
    assert not any(isinstance(w, TimelineWidget) for w in tab["Timeline"].children)


def test_a_jobs_report_carries_its_ranks_overview(gpu_runs, tmp_path):
    job = load_run(shutil.copytree(gpu_runs[1].path, tmp_path / "job"))
    report(job.path)
    html = (job.path / "report.html").read_text("utf-8")
    data = json.loads(re.search(rf"id='{DATA_ID}'>(.*?)</script>", html, re.DOTALL).group(1))
    assert data["rank"] == 0 and {t["kind"] for t in data["tracks"]} >= {"cpu", "gpu"}
    assert [t["track"] for t in data["overview"]["tracks"]] == ["rank:0", "rank:1"]
