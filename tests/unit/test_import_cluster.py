"""import_trace(executor=…) and `swift-nb import --scheduler`: a job's ranks read by any
concurrent.futures executor, a Dask cluster's among them, make the run the local import
makes; a rank's work lost with its worker is an error naming the traces not read, and
leaves no run. Jobs are test_rank_figures.write_job's: the two real ranks of the 128-rank
GPU job, renumbered."""

from __future__ import annotations

import sys
from concurrent.futures import CancelledError, Executor, Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest
from support.import_cluster import RANKS, _report_text, assert_same_run, job, local_run  # noqa: F401 (fixtures)

import swift_nb
from swift_nb import cli
from swift_nb.core.errors import ConfigError, RecordError
from swift_nb.importing.pool import RanksNotReadError


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
