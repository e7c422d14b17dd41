"""import_trace(executor=…) and `swift-nb import --scheduler`: a job's ranks read by any
concurrent.futures executor, a Dask cluster's among them, make the run the local import
makes; a rank's work lost with its worker is an error naming the traces not read, and
leaves no run. Jobs are test_rank_figures.write_job's: the two real ranks of the 128-rank
GPU job, renumbered."""

from __future__ import annotations

import os
import shutil
import signal
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

import dask
import distributed
import pytest
from support.import_cluster import RANKS, _report_text, assert_same_run, job, local_run  # noqa: F401 (fixtures)

import swift_nb
from swift_nb import cli
from swift_nb.core.errors import RecordError
from swift_nb.importing.pool import RanksNotReadError
from swift_nb.record import load_run

#: seconds an import on the cluster may take before the test says it hangs
LIMIT_S = 180


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


def _import_in_time(*args, **kwargs):
    """import_trace, failed if it takes more than LIMIT_S (a wait on a dead worker)."""
    with ThreadPoolExecutor(1) as waiter:
        return waiter.submit(swift_nb.import_trace, *args, **kwargs).result(timeout=LIMIT_S)


def test_a_dask_cluster_reads_the_ranks_as_the_local_import(client, job, local_run, tmp_path):
    run = _import_in_time(job, tmp_path, label="job", executor=client.get_executor())
    assert_same_run(local_run, run)
    assert _report_text(run) == _report_text(local_run)
    assert [p.name for p in tmp_path.iterdir()] == [run.path.name]


def test_cli_import_on_a_scheduler(client, job, local_run, tmp_path, capsys):
    address = client.scheduler.address
    assert cli.main(["import", str(job), "-o", str(tmp_path), "--label", "job", "--scheduler", address]) == 0
    (folder,) = tmp_path.iterdir()
    assert f"imported {RANKS} trace(s) as {folder}" in capsys.readouterr().out
    assert_same_run(local_run, load_run(folder))


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
