"""The trace is digested in a helper process, and the run loses nothing when the helper
cannot start, dies in the middle, or the cell is interrupted: the work falls back to this
process with a note, and no helper is left behind."""

from __future__ import annotations

import _thread
import os
import signal
import threading

import psutil
import pytest
import torch

import swift_nb
from swift_nb.capture import helper
from swift_nb.record import load_run, tables_path


def _train(steps: int, at_step=None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(16, 32)
    for k in range(steps):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if at_step is not None:
            at_step(k)


def _helpers() -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if p.is_running()
        and p.status() != psutil.STATUS_ZOMBIE
        and "swift_nb.capture.helper" in " ".join(p.cmdline())
    ]


def _complete(run) -> None:
    """What a digest gives: the trace, its tables, the memory by category, the report."""
    assert run.trace_path is not None and run.trace_path.exists()
    assert tables_path(run.trace_path).exists()
    assert run.summary["recorded_steps"] == [2, 3, 4]
    assert run.steps.loc[run.steps["step"] == 3, "parameters_bytes"].iloc[0] > 0
    assert (run.path / "report.html").exists()
    assert load_run(run.path).status == run.status
    assert not [p for p in os.listdir(run.path) if p.startswith(".")], "leftover temporary files"


OPTIONS = dict(wait=1, warmup=1, active=3, keep=50)


def test_helper_digests_at_low_priority_and_leaves_with_the_run(tmp_path):
    seen = {}

    def look(k):
        if k == 0:
            pid = prof.session.helper_pid
            seen["pid"], seen["nice"] = pid, psutil.Process(pid).nice()

    prof = swift_nb.profile(out_dir=tmp_path, **OPTIONS)
    with prof as run:
        _train(8, look)
    assert seen["pid"] != os.getpid() and seen["nice"] == 19
    assert prof.session.digested.pid == seen["pid"]  # the digest ran there, not here
    assert not any("helper" in n for n in run.notes), run.notes
    _complete(run)
    assert not psutil.pid_exists(seen["pid"]) or psutil.Process(seen["pid"]).status() == psutil.STATUS_ZOMBIE
    assert _helpers() == []


def test_helper_that_cannot_start_leaves_the_work_to_this_process(tmp_path, monkeypatch):
    monkeypatch.setattr(helper, "PYTHON", str(tmp_path / "no-such-python"))
    prof = swift_nb.profile(out_dir=tmp_path, **OPTIONS)
    with prof as run:
        _train(8)
    assert prof.session.digested.pid == os.getpid()
    (said,) = [n for n in run.notes if "helper process" in n]
    assert "could not start" in said and "digested in this process" in said
    _complete(run)


def test_helper_killed_mid_digest_loses_nothing(tmp_path):
    killed = {}

    def kill_after_the_window(k):
        pending = prof.session._trace._pending
        if pending is not None and not killed:
            # the window closed at the end of step 4: its digest has just been handed over
            killed["unanswered"] = not pending._done.is_set()
            os.kill(prof.session.helper_pid, signal.SIGKILL)
            killed["pid"] = True

    prof = swift_nb.profile(out_dir=tmp_path, **OPTIONS)
    with prof as run:
        _train(8, kill_after_the_window)
    assert killed == {"unanswered": True, "pid": True}
    (said,) = [n for n in run.notes if "helper process" in n]
    assert "killed by signal 9" in said and "digested in this process" in said
    assert prof.session.digested.pid == os.getpid()
    _complete(run)
    assert _helpers() == []


def test_interrupted_cell_leaves_no_helper_and_keeps_the_run(tmp_path):
    def interrupt(k):
        if k == 5:
            raise KeyboardInterrupt

    prof = swift_nb.profile(out_dir=tmp_path, **OPTIONS)
    with pytest.raises(KeyboardInterrupt), prof as run:
        _train(8, interrupt)
    assert run.status == "interrupted"
    _complete(run)
    assert _helpers() == []


def test_interrupted_again_while_the_digest_runs(tmp_path, monkeypatch):
    """A second Ctrl-C while the run waits for its digest waits until the record is saved
    (``Session.stop``): the trace is digested and kept, then the interrupt is raised, and no
    helper is left."""
    waiting = {}
    result = helper.Pending.result

    def interrupted_while_waiting(self):
        waiting["unanswered"] = not self._done.is_set()
        threading.Timer(0.2, _thread.interrupt_main).start()  # the user's second Ctrl-C
        return result(self)

    monkeypatch.setattr(helper.Pending, "result", interrupted_while_waiting)

    def interrupt(k):
        if k == 5:
            raise KeyboardInterrupt

    prof = swift_nb.profile(out_dir=tmp_path, **OPTIONS)
    with pytest.raises(KeyboardInterrupt), prof as run:
        _train(8, interrupt)
    assert waiting == {"unanswered": True}
    assert _helpers() == []
    saved = load_run(run.path)
    assert saved.status == "interrupted" and len(saved.steps) == 6
    assert saved.trace_path is not None and tables_path(saved.trace_path).exists()
    assert saved.summary["recorded_steps"] == [2, 3, 4]
    assert not [p for p in os.listdir(run.path) if p.startswith(".")], "leftover temporary files"
