"""End to end: the quickstart notebook executed through nbclient/ipykernel, headless on CPU,
and its nbconvert HTML: a complete run, the widget views, static outputs that show every
result without a kernel, and the story its text tells (explicit attention found, the
toggles' comparison confirming it)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbconvert import HTMLExporter
from support.common import kernel_env, quickstart_steps

import swift_nb

QUICKSTART = Path(__file__).resolve().parents[2] / "notebooks" / "01_quickstart.ipynb"
STEPS = quickstart_steps()  # its --steps hint, equal to its loader's length
SCHEDULE = {"wait": 1, "warmup": 2, "active": 3}  # the magic's defaults
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
SECTIONS = ("Verdict", "Findings", "Step time breakdown", "Memory by category", "Top operators")


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> tuple[nbformat.NotebookNode, Path]:
    """The quickstart notebook executed in a fresh folder (its runs land in ./swift_nb_runs)."""
    folder = tmp_path_factory.mktemp("quickstart")
    shutil.copy(QUICKSTART, folder)
    nb = nbformat.read(folder / QUICKSTART.name, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    )
    client.execute(env=kernel_env())
    return nb, folder


def _profiled_cell(nb, flags: str = "--label quickstart") -> nbformat.NotebookNode:
    (cell,) = [
        c for c in nb.cells if c.cell_type == "code" and c.source.startswith(f"%%swift_profile {flags}")
    ]
    return cell


def test_quickstart_records_a_complete_run(executed):
    nb, folder = executed
    outputs = _profiled_cell(nb).outputs
    assert any(o.get("name") == "stdout" and "final loss" in o["text"] for o in outputs)
    assert not any("USDT" in o.get("text", "") for o in outputs), "profiler noise reached the cell"

    (run_folder,) = [
        p for p in (folder / "swift_nb_runs").iterdir() if swift_nb.load_run(p).label == "quickstart"
    ]
    for name in ("run.json", "steps.csv", "samples.csv", "memory.csv", "trace.json.gz", "report.html"):
        assert (run_folder / name).is_file(), name
    run = swift_nb.load_run(run_folder)
    assert run.status == "ok" and run.label == "quickstart"
    assert run.summary["steps"] == STEPS == len(run.steps)
    assert list(run.steps["step"]) == list(range(STEPS))
    assert run.samples["step"].notna().all()
    assert run.context["dtype"] == "float32"
    assert run.summary["peak_mem_bytes"] >= 4 * run.context["params"]

    with gzip.open(run_folder / "trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    recorded = sorted(
        int(m.group(1)) for e in events if (m := re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", "")))
    )
    first_active = SCHEDULE["wait"] + SCHEDULE["warmup"]
    assert recorded == list(range(first_active, first_active + SCHEDULE["active"]))
    assert list(run.steps.loc[run.steps["phase"] == "active", "step"]) == recorded


def test_quickstart_has_widget_views_and_static_fallbacks(executed):
    nb, _ = executed
    outputs = _profiled_cell(nb).outputs
    views = [o for o in outputs if WIDGET_VIEW in o.get("data", {})]
    assert len(views) == 2, "the live panel and the results panel"
    assert all(o["data"]["text/plain"].startswith("swift_nb") for o in views)
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert all(o["data"][WIDGET_VIEW]["model_id"] in state for o in views), "widget state saved"

    static = [o for o in outputs if o.get("output_type") == "display_data" and WIDGET_VIEW not in o["data"]]
    assert all("text/plain" in o["data"] for o in static), "a text twin for terminals"
    assert sum("image/png" in o["data"] for o in static) >= 4  # timeline, breakdown, memory, operators
    html = "".join(o["data"].get("text/html", "") for o in static)
    assert "swift-nb-summary" in html
    for section in SECTIONS:
        assert section in html, section
    listing = next(c for c in nb.cells if c.source.strip() == "%swift_profile --list")
    assert "quickstart" in listing.outputs[0]["data"]["text/html"]


def test_nbconvert_html_shows_figures_and_summary_without_a_kernel(executed):
    nb, _ = executed
    html, _ = HTMLExporter().from_notebook_node(nb)
    figures = re.findall(r"<img [^>]*src=\"data:image/png;base64,[A-Za-z0-9+/=]{100,}", html)
    assert len(figures) >= 4
    assert "swift-nb-summary" in html and ">quickstart<" in html
    for section in SECTIONS:
        assert section in html, section


def test_quickstart_compares_toggles_in_reruns(executed):
    nb, folder = executed
    outputs = _profiled_cell(nb, "--compare").outputs
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "Comparison" in html
    for variant in ("baseline", "flash_attention", "grad_checkpointing"):
        assert f"<td class='text'>{variant}</td>" in html, variant
    assert html.count("<td class='text'>ok</td>") == 3
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2  # step times, memory
    tagged = {
        swift_nb.load_run(p).context.get("variant") for p in swift_nb.runs(folder / "swift_nb_runs").path
    }
    assert {"baseline", "flash_attention", "grad_checkpointing"} <= tagged


class _Tables(HTMLParser):
    """The text of every table cell in an HTML document: tables → rows → cells."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self.tables and self.tables[-1]:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _comparison(html: str) -> dict[str, dict[str, str]]:
    """The comparison table as the reader sees it: variant → column → text; the ratio to
    the baseline after a measured column is named `<that column> × base`."""
    parser = _Tables()
    parser.feed(html)
    (rows,) = [t for t in parser.tables if t and t[0] and t[0][0] == "variant"]
    header: list[str] = []
    for name in rows[0]:
        header.append(f"{header[-1]} × base" if "× base" in name else name)
    return {row[0]: dict(zip(header, row, strict=True)) for row in rows[1:]}


def test_quickstart_finds_explicit_attention_and_the_comparison_confirms_it(executed):
    """What the notebook's text tells the reader to look at: the memory-bound verdict, the
    eager-attention finding naming flash_attention, and the peak-memory ratios."""
    nb, _ = executed
    report = "".join(o.get("data", {}).get("text/html", "") for o in _profiled_cell(nb).outputs)
    assert "memory-bound" in report
    finding = report[report.index("eager_attention") :]
    assert "1024" in finding[: finding.index("Toggle")]
    assert "flash_attention" in finding[finding.index("Toggle") : finding.index("Predicted effect")]

    compared = "".join(
        o.get("data", {}).get("text/html", "") for o in _profiled_cell(nb, "--compare").outputs
    )
    table = _comparison(compared)
    peak_ratio = {v: float(row["peak memory × base"].rstrip("×")) for v, row in table.items()}
    assert peak_ratio["baseline"] == 1.0
    assert peak_ratio["flash_attention"] < 0.7, table["flash_attention"]
    assert peak_ratio["grad_checkpointing"] < 1.0, table["grad_checkpointing"]
    # the advisor predicted what each toggle then did: the peaks agree within 25 %, unflagged
    for variant in ("flash_attention", "grad_checkpointing"):
        said = re.fullmatch(r"predicted .+ · measured .+ · [+−](\d+\.\d) %", table[variant]["peak predicted"])
        assert said is not None and float(said.group(1)) < 25, table[variant]
        assert f"{variant} — peak tensor memory ≈" in compared  # how, under the table
    assert "differs from the prediction" not in compared
