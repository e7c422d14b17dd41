"""import_trace(executor=…) and `swift-nb import --scheduler`: a job's ranks read by any
concurrent.futures executor, a Dask cluster's among them, make the run the local import
makes; a rank's work lost with its worker is an error naming the traces not read, and
leaves no run. Jobs are test_rank_figures.write_job's: the two real ranks of the 128-rank
GPU job, renumbered."""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import sys
from concurrent.futures import CancelledError, Executor, Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import dask
import distributed
import numpy as np
import pytest
from test_rank_figures import write_job

import swift_nb
from swift_nb import cli
from swift_nb.core.errors import ConfigError, RecordError
from swift_nb.importing.pool import RanksNotReadError
from swift_nb.record import load_run, rank_folder

RANKS = 4
#: seconds an import on the cluster may take before the test says it hangs
LIMIT_S = 180


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    return write_job(tmp_path_factory.mktemp("job") / "job", RANKS, slow={1: 1.3})


@pytest.fixture(scope="module")
def local_run(job, tmp_path_factory):
    return swift_nb.import_trace(job, tmp_path_factory.mktemp("local"), label="job")


@pytest.fixture(scope="module")
def client():
    """Two worker processes of one thread; a task whose worker dies fails at once (no
    rerun elsewhere), so a killed worker is an error, not a retry. Dask sets
    OMP_NUM_THREADS, MALLOC_TRIM_THRESHOLD_ and others in this process's environment for
    its workers: they are put back after, so later tests' subprocesses do not inherit them."""
    saved = dict(os.environ)
    try:
        yield from _cluster_client()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _cluster_client():
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


class Inline(Executor):
    """Runs each call as it is submitted; ``fail``: trace file name → the error its
    future ends with instead (a CancelledError leaves it cancelled)."""

    def __init__(self, fail: dict[str, BaseException] | None = None) -> None:
        self.fail = fail or {}

    def submit(self, fn, /, *args, **kwargs):
        future: Future = Future()
        error = self.fail.get(Path(args[0]).name)
        if isinstance(error, CancelledError):
            future.cancel()
            future.set_running_or_notify_cancel()  # as an executor does, to wake wait()
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(fn(*args, **kwargs))
        return future


def _dies_on(name: str, fn, path: Path, *args):
    """``fn(path, *args)``; the worker process reading the trace called ``name`` kills
    itself first (sent to the workers by reference to this module)."""
    if Path(path).name == name:
        os.kill(os.getpid(), signal.SIGKILL)
    return fn(path, *args)


class KillsOneWorker(Executor):
    """``inner``, except that the worker reading the trace called ``name`` dies."""

    def __init__(self, inner: Executor, name: str) -> None:
        self.inner, self.name = inner, name

    def submit(self, fn, /, *args, **kwargs):
        return self.inner.submit(_dies_on, self.name, fn, *args, **kwargs)


def _report_text(run) -> str:
    page = (run.path / "report.html").read_text().replace(str(run.path), "DIR").replace(run.id, "ID")
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


def assert_same_run(a, b) -> None:
    """Two imports of one job hold the same figures, tables and traces."""
    a, b = load_run(a.path), load_run(b.path)
    assert a.summary == b.summary and a.context == b.context and a.environment == b.environment
    assert a.steps.equals(b.steps) and a.rank_steps.equals(b.rank_steps)
    assert a.ranks.drop(columns="record").equals(b.ranks.drop(columns="record"))
    assert a.source["imported_from"] == b.source["imported_from"]
    for r in range(RANKS):
        ra, rb = load_run(rank_folder(a.path, r)), load_run(rank_folder(b.path, r))
        assert ra.summary == rb.summary and ra.steps.equals(rb.steps)
        name = f"trace.rank{r}"
        assert (a.path / f"{name}.json.gz").read_bytes() == (b.path / f"{name}.json.gz").read_bytes()
        with np.load(a.path / f"{name}.tables.npz") as ta, np.load(b.path / f"{name}.tables.npz") as tb:
            assert sorted(ta.files) == sorted(tb.files)
            assert all(np.array_equal(ta[k], tb[k], equal_nan=ta[k].dtype.kind == "f") for k in ta.files)
    assert sorted(p.relative_to(a.path) for p in a.path.rglob("*")) == sorted(
        p.relative_to(b.path) for p in b.path.rglob("*")
    )


def _import_in_time(*args, **kwargs):
    """import_trace, failed if it takes more than LIMIT_S (a wait on a dead worker)."""
    with ThreadPoolExecutor(1) as waiter:
        return waiter.submit(swift_nb.import_trace, *args, **kwargs).result(timeout=LIMIT_S)


# -- any executor -----------------------------------------------------------------------


def test_any_executor_reads_the_ranks_as_the_local_import(job, local_run, tmp_path):
    with ThreadPoolExecutor(2) as pool:
        run = swift_nb.import_trace(job, tmp_path, label="job", executor=pool)
    assert_same_run(local_run, run)
    assert _report_text(run) == _report_text(local_run)
    assert [p.name for p in tmp_path.iterdir()] == [run.path.name]  # no staging folder left


@pytest.mark.parametrize(
    "error",
    [CancelledError(), BrokenProcessPool("a child process terminated"), ConnectionResetError("lost")],
    ids=["cancelled", "broken-pool", "lost"],
)
def test_a_failed_future_is_an_error_naming_the_traces_not_read(job, tmp_path, error):
    with pytest.raises(RanksNotReadError) as raised:
        swift_nb.import_trace(job, tmp_path, executor=Inline({"rank2.json.gz": error}))
    e = raised.value
    assert e.unread == [job / "rank2.json.gz"] and e.ranks == [2]
    message = str(e)
    assert f"1 of {RANKS} traces were not read: {job / 'rank2.json.gz'} (ranks not read: 2)" in message
    assert type(error).__name__ in message and "same paths" in message
    assert isinstance(e.__cause__, type(error))
    assert list(tmp_path.iterdir()) == []  # neither the run's folder nor its staging folder


def test_a_damaged_trace_keeps_its_own_error(job, tmp_path):
    damaged = RecordError(job / "rank1.json.gz", "no profiler step in it")
    with pytest.raises(RecordError) as raised:
        swift_nb.import_trace(job, tmp_path, executor=Inline({"rank1.json.gz": damaged}))
    assert raised.value is damaged
    assert list(tmp_path.iterdir()) == []


def test_an_executor_is_checked_before_any_folder_is_made(job, tmp_path):
    with pytest.raises(ConfigError, match=r"concurrent\.futures\.Executor"):
        swift_nb.import_trace(job, tmp_path, executor="tcp://scheduler:8786")
    with pytest.raises(ConfigError, match="give workers= or executor="), ThreadPoolExecutor(1) as pool:
        swift_nb.import_trace(job, tmp_path, workers=2, executor=pool)
    assert list(tmp_path.iterdir()) == []


def test_cli_scheduler_without_dask_names_the_extra(job, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    assert cli.main(["import", str(job), "-o", str(tmp_path), "--scheduler", "tcp://127.0.0.1:8786"]) == 2
    assert "pip install 'swift_nb[cluster]'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# -- a Dask cluster ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_dask_cluster_reads_the_ranks_as_the_local_import(client, job, local_run, tmp_path):
    run = _import_in_time(job, tmp_path, label="job", executor=client.get_executor())
    assert_same_run(local_run, run)
    assert _report_text(run) == _report_text(local_run)
    assert [p.name for p in tmp_path.iterdir()] == [run.path.name]


@pytest.mark.slow
def test_cli_import_on_a_scheduler(client, job, local_run, tmp_path, capsys):
    address = client.scheduler.address
    assert cli.main(["import", str(job), "-o", str(tmp_path), "--label", "job", "--scheduler", address]) == 0
    (folder,) = tmp_path.iterdir()
    assert f"imported {RANKS} trace(s) as {folder}" in capsys.readouterr().out
    assert_same_run(local_run, load_run(folder))


@pytest.mark.slow
def test_a_damaged_trace_read_on_a_worker_is_named(client, job, tmp_path):
    """The trace's own error comes back from the worker as raised there."""
    traces = tmp_path / "traces"
    shutil.copytree(job, traces)
    (traces / "bad.json").write_text(
        '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2, '
        '"pid": 1, "tid": 1}]}'
    )
    with pytest.raises(RecordError, match="no profiler step") as raised:
        _import_in_time(traces, tmp_path / "runs", executor=client.get_executor())
    assert raised.value.path == traces / "bad.json"
    assert not [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]


@pytest.mark.slow
def test_a_worker_killed_mid_import_names_the_traces_not_read(client, job, tmp_path):
    out = tmp_path / "runs"
    try:
        with pytest.raises(RanksNotReadError) as raised:
            _import_in_time(job, out, executor=KillsOneWorker(client.get_executor(), "rank2.json.gz"))
    finally:
        client.wait_for_workers(2, timeout=LIMIT_S)  # the nanny restarts it, for the tests after
    e = raised.value
    assert job / "rank2.json.gz" in e.unread and 2 in (e.ranks or [2])
    assert "KilledWorker" in str(e) and str(job / "rank2.json.gz") in str(e)
    assert isinstance(e.__cause__, distributed.KilledWorker)
    # no half-written run: the run's folder is gone (a worker still writing writes only
    # into the hidden staging folder beside it)
    assert not [p for p in out.iterdir() if not p.name.startswith(".")]
