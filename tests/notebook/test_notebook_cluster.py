"""End to end: notebooks/03_cluster_traces.ipynb executed through nbclient/ipykernel,
headless on CPU, and its nbconvert HTML: every shared GPU trace imported, the device-first
verdict and the findings as the reader sees them, the GPU and Ranks sections as static
outputs, the diff of two ranks, and HTML that reads the same without a kernel."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from support.common import kernel_env

import swift_nb

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "03_cluster_traces.ipynb"
GPU_TRACES = ROOT / "tests" / "data" / "gpu"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
LICENSE = "MIT License, Copyright (c) Meta Platforms, Inc. and affiliates"

# What the notebook prints as each trace's verdict, labelled from its device figures
# (test_gpu_traces.VERDICTS holds the same labels, with the analysis' own numbers):
VERDICTS = {
    # the GPU runs compute kernels 97.4 % of the window and idles 1.7 %: nothing outside it
    # holds it back, so the verdict names the kernels that compute
    "gpu_1rank_5steps": (
        "compute-bound",
        "the GPU computes 97.4 % of the window (convolution 38.4 %",
    ),
    # the GPU idles 77.2 % of the window and 96 % of that idle time the host is inside its
    # step, launching ~900 kernels of median 16 µs per step: the host sets the pace; priced
    # at the price table's A100 rate
    "gpu_nccl_2ranks_rank0": (
        "overhead-bound",
        "the GPU idles 77.2 % of the window: $0.124 of every $0.161 per 1 000 steps; for 328.7 ms of its "
        "336.4 ms idle it waits for the host to launch work",
    ),
    # rank 0 of 128: NCCL kernels run with no compute under them for 172 ms (overlap 11.8 %)
    # and the GPU idles 80 ms more waiting for collectives: 42 % of the window, more than
    # the host's launch gaps (40 %) and far more than compute (17.7 %)
    "gpu_128ranks_rank0": (
        "communication-bound",
        "the GPU waits on communication 42.0 % of the window: 172.3 ms of communication kernels no "
        "compute hides",
    ),
    # rank 1 of the same job: 38.8 % communication against 36 % launch gaps, 22.6 % compute
    "gpu_128ranks_rank1": (
        "communication-bound",
        "the GPU waits on communication 38.8 % of the window",
    ),
}


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> tuple[nbformat.NotebookNode, Path]:
    """The notebook executed where it lives, in a copy: <tmp>/notebooks/ beside
    <tmp>/tests/data/gpu (the notebook reads ../tests/data/gpu); its imported runs land in
    <tmp>/notebooks/swift_nb_runs."""
    root = tmp_path_factory.mktemp("cluster")
    (root / "notebooks").mkdir()
    traces = root / "tests" / "data" / "gpu"
    traces.mkdir(parents=True)
    for name in VERDICTS:
        shutil.copy(GPU_TRACES / f"{name}.json.gz", traces)
    shutil.copy(NOTEBOOK, root / "notebooks")
    nb = nbformat.read(root / "notebooks" / NOTEBOOK.name, as_version=4)
    client = NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(root / "notebooks")}}
    )
    client.execute(env=kernel_env())
    return nb, root / "notebooks"


def _cell(nb: nbformat.NotebookNode, starts: str) -> nbformat.NotebookNode:
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(starts)]
    return cell


def _stdout(cell: nbformat.NotebookNode) -> str:
    return "".join(o["text"] for o in cell.outputs if o.get("name") == "stdout")


def _html(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)


def _pngs(cell: nbformat.NotebookNode) -> int:
    return sum("image/png" in o.get("data", {}) for o in cell.outputs)


def test_the_notebook_is_committed_without_outputs_and_its_runs_are_ignored():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert "widgets" not in nb.metadata
    text = "".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert LICENSE in text and "HolisticTraceAnalysis" in text, "the traces' license line"
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "notebooks/swift_nb_runs/some-run/run.json"], cwd=ROOT, check=False
    )
    assert ignored.returncode == 0, "the runs the notebook imports must be git-ignored"


def test_every_trace_is_imported_with_its_verdict(executed):
    nb, folder = executed
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    printed = _stdout(_cell(nb, "for name, r in reported.items()"))
    verdicts = dict(re.findall(r"^(gpu_\w+): (.+)$", printed, flags=re.MULTILINE))
    assert set(verdicts) == set(VERDICTS)
    for name, (kind, reason) in VERDICTS.items():
        assert verdicts[name].startswith(f"{kind} — {reason}"), (name, verdicts[name])

    overview = _html(_cell(nb, "reported = {}"))
    for name, (kind, _) in VERDICTS.items():
        assert name in overview and kind in overview, name
    assert "Tesla V100-SXM2-32GB" in overview and "NVIDIA A100-PG509-200" in overview

    found = swift_nb.runs(folder / "swift_nb_runs")
    assert sorted(found["label"]) == sorted([*VERDICTS, "job_128ranks"])
    for path in found["path"]:
        assert (Path(path) / "report.html").is_file(), path


def test_each_trace_shows_its_findings_and_gpu_section(executed):
    nb, _ = executed
    single = _cell(nb, 'show(reported["gpu_1rank_5steps"])')
    printed = _stdout(single)
    assert "verdict: compute-bound" in printed
    assert "finding [fp32_gemm] fp32 matrix multiplies on the CUDA cores" in printed
    assert "predicted effect: ≈ 47.0 ms less GPU time in the window" in printed
    html = _html(single)
    assert "<h4>GPU</h4>" in html and "Convolution took the most device time" in html
    assert "swift-nb-summary" in html and "Tesla V100-SXM2-32GB" in html
    assert _pngs(single) == 1  # the GPU's time per step

    nccl = _cell(nb, 'show(reported["gpu_nccl_2ranks_rank0"])')
    printed = _stdout(nccl)
    assert "verdict: overhead-bound" in printed
    assert "finding [overhead] Host launch gaps: the GPU idles 74.3 % of the window" in printed
    html = _html(nccl)
    assert "<h4>GPU</h4>" in html and "(96.2 %) were host launch gaps" in unescape(html)
    assert "<h4>Ranks</h4>" not in html  # one rank's trace of the job: nothing to set beside it
    assert _pngs(nccl) == 1


def test_the_128_rank_job_shows_its_ranks(executed):
    nb, folder = executed
    cell = _cell(nb, "job = swift_nb.report(")
    printed = _stdout(cell)
    assert "2 of 128 ranks imported" in printed
    assert f"verdict: communication-bound — {VERDICTS['gpu_128ranks_rank0'][1]}" in printed
    assert (
        "finding [communication] Exposed communication takes 42.0 % of the GPU's window (ranks 0, 1)"
        in printed
    )
    assert "finding [overhead] Host launch gaps" in printed
    html = unescape(_html(cell))
    for heading in ("<h4>Ranks</h4>", "<h4>GPU</h4>", "Collectives per step"):
        assert heading in html, heading
    assert "rank 0's GPU was idle 53.6 % of the time" in html
    assert "all_to_all" in html and "missing: 2–127" in html
    assert _pngs(cell) == 3  # per rank, steps of every rank, the GPU per step

    (job,) = [p for p in swift_nb.runs(folder / "swift_nb_runs").path if "job_128ranks" in str(p)]
    run = swift_nb.load_run(job)
    assert list(run.ranks["rank"]) == [0, 1] and run.summary["world_size"] == 128

    both = _stdout(_cell(nb, 'for name in ("gpu_128ranks_rank0", "gpu_128ranks_rank1")'))
    assert both.count(": communication-bound — ") == 2


def test_the_diff_of_two_ranks(executed):
    nb, _ = executed
    cell = _cell(nb, "d = swift_nb.diff(")
    printed = _stdout(cell)
    assert printed.startswith("- step time: 615.1 → 619.3 ms")
    assert "- embedding kernels: 42.0 → 68.8 ms per step (+26.77 ms" in printed
    table = _html(cell)
    assert "delta_ms_per_step" in table and "embedding" in table and "only_a" in table


def test_nbconvert_html_reads_the_same_without_a_kernel(executed, tmp_path):
    nb, _ = executed
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if WIDGET_VIEW in o.get("data", {})], "no widget-only output"
    assert "widgets" not in nb.metadata
    shown = [o for o in outputs if o.output_type in ("display_data", "execute_result")]
    assert all("text/plain" in o["data"] and ({"text/html", "image/png"} & set(o["data"])) for o in shown)

    path = tmp_path / "executed.ipynb"
    nbformat.write(nb, path)
    subprocess.run(
        [sys.executable, "-m", "nbconvert", "--to", "html", str(path)], check=True, capture_output=True
    )
    html = unescape((tmp_path / "executed.html").read_text(encoding="utf-8"))
    figures = re.findall(r"<img [^>]*src=\"data:image/png;base64,[A-Za-z0-9+/=]{100,}", html)
    assert len(figures) == 5
    for name, (kind, reason) in VERDICTS.items():
        assert f"{name}: {kind} — {reason}" in html, name
    for words in ("Collectives per step", "Device time by kind of kernel", "embedding kernels: 42.0 → 68.8"):
        assert words in html, words
