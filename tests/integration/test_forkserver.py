"""The rerun fork server with real processes: a forked worker is what a fresh one would be
(its own session, the launcher's environment, its own log) and the server is reused while
the environment is the same, then ends when replaced or idle; a server that cannot fork
safely gives way to fresh workers; a worker outliving its server keeps its result."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import types
from pathlib import Path

import psutil
import pytest

from swift_nb.rerun import forkserver, run_variants
from swift_nb.rerun.launcher import Variant, Worker

MLP = (
    "import torch\nmodel = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
)
TRAIN = "for _ in range(4):\n    model(torch.randn(4, 8)).sum().backward()\n    opt.step(); opt.zero_grad()\n"
FLAGS = "--wait 0 --warmup 1 --active 2"
#: a replayed cell that writes down, to the file ``seen``, what process it runs in
LOOK = (
    "import json, os, sys\n"
    "json.dump({'pid': os.getpid(), 'ppid': os.getppid(), 'sid': os.getsid(0),"
    " 'comm': open('/proc/self/comm').read().strip(), 'argv': sys.argv,"
    " 'marker': os.environ.get('SWIFT_NB_TEST_MARKER'), 'worker': os.environ.get('SWIFT_NB_RERUN_WORKER'),"
    " 'stdin': os.readlink('/proc/self/fd/0'), 'stdout': os.readlink('/proc/self/fd/1')},"
    " open(os.environ['SWIFT_NB_TEST_SEEN'], 'a'))\n"
    "open(os.environ['SWIFT_NB_TEST_SEEN'], 'a').write('\\n')\n"
)


@pytest.fixture
def own_server(monkeypatch):
    """This test's servers, apart from those other tests of this process use; ended after.
    They import no training library ahead (this process may have imported transformers):
    what they preload is tested apart."""
    monkeypatch.setattr(forkserver, "_server", None)
    monkeypatch.setattr(forkserver, "LIBRARIES", ())
    monkeypatch.delenv(forkserver.FORK_ENV, raising=False)
    yield
    if forkserver._server is not None:
        forkserver._server.close()


def _seen(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_forked_workers_are_fresh_processes_and_share_one_server_per_environment(
    tmp_path, monkeypatch, own_server
):
    seen = tmp_path / "seen.jsonl"
    monkeypatch.setenv("SWIFT_NB_TEST_SEEN", str(seen))
    monkeypatch.setenv("SWIFT_NB_TEST_MARKER", "first")
    outcomes = run_variants([MLP, LOOK], TRAIN, FLAGS, [Variant("again")], tmp_path / "runs", timeout_s=120)
    assert [o.status for o in outcomes] == ["ok", "ok"], outcomes
    server = forkserver._server
    assert server is not None and server.alive() and server.why_not is None
    first, second = _seen(seen)
    for w in (first, second):
        assert w["sid"] == w["pid"] and w["ppid"] == server.proc.pid, w  # its own session, forked
        assert w["comm"] == forkserver.WORKER_NAME
        assert w["argv"][0].endswith("worker.py") and w["argv"][1].endswith("spec.json")
        assert (w["marker"], w["worker"]) == ("first", "1")
        assert w["stdin"] == os.devnull and w["stdout"].endswith("worker.log")
    assert first["pid"] != second["pid"]
    assert not psutil.Process(server.proc.pid).children(), "a worker outlived its rerun"

    # another environment: another server; the first one ends, having no worker, and the
    # second one when it has been idle for a second
    monkeypatch.setenv("SWIFT_NB_TEST_MARKER", "second")
    monkeypatch.setenv(forkserver.IDLE_ENV, "1")
    seen.unlink()
    outcomes = run_variants([MLP, LOOK], TRAIN, FLAGS, [], tmp_path / "runs", timeout_s=120)
    assert [o.status for o in outcomes] == ["ok"], outcomes
    (third,) = _seen(seen)
    assert third["marker"] == "second" and forkserver._server is not server
    assert third["ppid"] == forkserver._server.proc.pid
    assert server.proc.wait(timeout=10) == 0
    assert forkserver._server.proc.wait(timeout=30) == 0


def test_a_server_that_cannot_fork_safely_gives_way_to_fresh_workers(tmp_path, monkeypatch, own_server):
    """A training library whose import starts a thread: the server says so and does not
    fork; the rerun runs in fresh processes all the same."""
    (tmp_path / "threading_lib.py").write_text(
        "import threading\nthreading.Thread(target=threading.Event().wait, name='lib-pool', daemon=True).start()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "threading_lib", types.ModuleType("threading_lib"))
    monkeypatch.setattr(forkserver, "LIBRARIES", ("threading_lib",))
    seen = tmp_path / "seen.jsonl"
    monkeypatch.setenv("SWIFT_NB_TEST_SEEN", str(seen))
    outcomes = run_variants([MLP, LOOK], TRAIN, FLAGS, [], tmp_path / "runs", timeout_s=120)
    assert [o.status for o in outcomes] == ["ok"], outcomes
    server = forkserver._server
    assert server is not None and not server.ready(timeout=0)
    assert "started a thread (lib-pool)" in str(server.why_not)
    (w,) = _seen(seen)
    assert w["comm"] != forkserver.WORKER_NAME and w["ppid"] == os.getpid()  # started fresh
    assert server.proc.wait(timeout=10) == 0


def test_a_worker_that_outlives_its_server_keeps_its_result(tmp_path, own_server):
    """The server killed while its worker runs: the worker runs on, and its finished
    result is the outcome (its exit status alone is lost)."""
    slow = "import time\ntime.sleep(2)\n" + TRAIN
    worker = Worker([MLP], slow, FLAGS, tmp_path / "runs", Variant("baseline"), timeout_s=120)
    worker.start()
    assert isinstance(worker.proc, forkserver.Forked)
    os.kill(worker.proc.server.proc.pid, signal.SIGKILL)
    started = time.monotonic()
    out = worker.wait()
    assert out.status == "ok" and out.run_path, out
    assert worker.proc.lost and time.monotonic() - started < 60
