"""Jobs of many ranks: import_trace reads the ranks in worker processes, and the Ranks
section (render/rank_figures.py's ranks × steps figure, the slowest ranks) stays one
section of one figure however many ranks there are. Jobs are built from the two real
ranks of the 128-rank GPU job, renumbered; one rank's clock stretched makes a straggler."""

from __future__ import annotations

import html
import os
import re
import signal
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import psutil
import pytest
from support.jobs import write_job

import swift_nb
from swift_nb.analysis.ranks import per_rank, rank_step_metrics, slowest_ranks
from swift_nb.importing import assembly, pool
from swift_nb.importing.pool import RanksNotReadError
from swift_nb.importing.rank import reduce_rank
from swift_nb.render.rank_figures import rank_step_heatmap
from swift_nb.render.sections import ranks as ranks_section
from swift_nb.render.sections.base import FigurePart, ReportInputs
from swift_nb.render.value_text import pct_text


def _text(fragment: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", fragment)))


def test_a_job_is_read_by_worker_processes_as_in_one_process(tmp_path):
    job = write_job(tmp_path / "job", 3, slow={1: 1.3})
    pooled = swift_nb.import_trace(job, tmp_path / "runs", report=False, workers=2)
    alone = swift_nb.import_trace(job, tmp_path / "runs", report=False, workers=1)
    assert list(pooled.ranks["rank"]) == [0, 1, 2]
    cols = ["rank", "steps", "step_time_median_s", "collective_share", "device_idle_pct"]
    assert pooled.ranks[cols].equals(alone.ranks[cols])
    for r in range(3):
        assert (pooled.path / f"trace.rank{r}.json.gz").exists()
        assert (pooled.path / f"trace.rank{r}.tables.npz").exists()
        assert (pooled.path / f"rank{r}" / "run.json").exists()
    assert not list(pooled.path.glob(".staged-*"))
    assert sorted(pooled.rank_steps["rank"].unique()) == [0, 1, 2]


def _dies_on(name: str, path: Path, staged: Path, max_bytes: int, analyze: bool):
    """``reduce_rank``, except that the worker given the trace called ``name`` is killed
    first, as the OOM killer would (sent to the workers by reference to this module)."""
    if Path(path).name == name:
        os.kill(os.getpid(), signal.SIGKILL)
    return reduce_rank(path, staged, max_bytes, analyze)


def _pool_workers() -> list[psutil.Process]:
    """This process's live pool workers: the children of multiprocessing's forkserver."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            parent = p.parent()
            forked = parent is not None and "forkserver" in " ".join(parent.cmdline())
            if forked and p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize(("victim", "workers"), [(0, 2), (4, 2), (7, 2), (1, 4)])
def test_a_worker_that_dies_is_an_error_naming_the_unread_traces(
    tmp_path, monkeypatch, capfd, victim, workers
):
    """The worker reading trace ``victim`` dies before (0), while (4) or after (7) the other
    ranks are read; with 4 workers, as soon as they start. The import raises
    ``RanksNotReadError`` naming it, leaves no run folder and no worker, and multiprocessing
    says nothing on the user's stderr."""
    job = write_job(tmp_path / "job", 8)
    name = sorted(job.iterdir())[victim].name
    out = tmp_path / "runs"
    monkeypatch.setattr(
        assembly, "reduce_in_workers", partial(pool.reduce_in_workers, reduce=partial(_dies_on, name))
    )
    with pytest.raises(RanksNotReadError) as caught:
        swift_nb.import_trace(job, out, report=False, workers=workers)
    error = caught.value
    assert job / name in error.unread
    assert "worker process reading the traces died" in str(error) and "rank" in str(error)
    assert "workers=1" in str(error)
    assert not [p for p in out.iterdir() if not p.name.startswith(".")]
    assert _pool_workers() == []
    assert not [t for t in threading.enumerate() if "QueueManager" in type(t).__name__ and t.is_alive()]
    err = capfd.readouterr().err
    assert "Traceback" not in err and "KeyError" not in err, err


@pytest.fixture(scope="module")
def many_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("many")
    job = write_job(tmp / "job", 40, slow={7: 1.5})
    return swift_nb.import_trace(job, tmp / "runs", report=False)


def test_the_ranks_section_at_many_ranks_is_one_figure_and_the_slowest_ranks(many_ranks):
    section = ranks_section.SECTION.section(ReportInputs(run=many_ranks))
    figures = [p for p in section.parts if isinstance(p, FigurePart)]
    assert [f.alt for f in figures] == ["Ranks by steps: step time, exposed communication and GPU idle"]
    text = _text(section.html())
    assert "1 of 40 ranks straggle" in text
    assert "Every rank's row: ranks.csv in the run folder (40 ranks)" in text
    ranks = per_rank(many_ranks).set_index("rank")
    slow = slowest_ranks(ranks.reset_index())
    assert len(slow) == 10 and int(slow.loc[0, "rank"]) == 7 and bool(slow.loc[0, "straggler"])
    # rank 7 is rank 5's trace (the same real rank) with its clock 1.5× slower
    assert slow.loc[0, "work_s"] == pytest.approx(1.5 * ranks.loc[5, "busy_s"], rel=1e-6)
    excess = 100.0 * (slow.loc[0, "work_s"] / ranks["busy_s"].median() - 1.0)
    assert slow.loc[0, "work_over_median_pct"] == pytest.approx(excess) and 45 < excess < 60
    assert not slow["straggler"].iloc[1:].any()
    # the table's first row as a reader sees it: rank, step time, work, work over the median
    assert re.search(
        rf"Work over the median .* Straggler 7 [\d.]+ ms [\d.]+ ms {pct_text(excess)} .*? yes 1 ", text
    )


def test_the_figure_has_a_row_per_rank_and_a_column_per_step(many_ranks):
    metrics = rank_step_metrics(many_ranks)
    assert sorted(metrics["rank"].unique()) == list(range(40))
    steps = metrics["step"].nunique()
    fig = rank_step_heatmap(metrics)
    images = [im for ax in fig.axes for im in ax.get_images()]
    assert len(images) == 3
    assert all(im.get_array().shape == (40, steps) for im in images)
    assert fig.get_size_inches()[1] == pytest.approx(rank_step_heatmap(metrics.head(4)).get_size_inches()[1])
    slow = metrics[metrics["rank"] == 7]["step_s"].median()
    assert slow == pytest.approx(1.5 * metrics[metrics["rank"] != 7]["step_s"].median(), rel=0.1)


def test_a_few_ranks_keep_their_bars_table_and_timeline(tmp_path):
    run = swift_nb.import_trace(write_job(tmp_path / "job", 3), tmp_path / "runs", report=False)
    section = ranks_section.SECTION.section(ReportInputs(run=run))
    alts = [p.alt for p in section.parts if isinstance(p, FigurePart)]
    assert alts == ["Bars of each rank's step time and peak memory", "Each rank's steps against time"]
    assert "no straggler among 3 ranks" in _text(section.html())


def test_a_script_without_a_main_guard_imports_a_job_with_workers(tmp_path):
    """Worker processes start without running the caller's script again: a plain script
    calling import_trace at its top level (no ``if __name__ == "__main__":``) works."""
    job = write_job(tmp_path / "job", 3)
    script = tmp_path / "analyze.py"
    script.write_text(
        "import swift_nb\n"
        f"run = swift_nb.import_trace({str(job)!r}, {str(tmp_path / 'runs')!r}, report=False, workers=2)\n"
        "print('ranks', len(run.ranks))\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ranks 3"
