"""The trace is digested in a helper process, shared by the runs of a process, and the run
loses nothing when the helper cannot start, dies in the middle, or the cell is
interrupted: the work falls back to this process with a note, and no helper is left busy
with work nobody waits for, or behind its process."""

from __future__ import annotations

import _thread
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch

import swift_nb
from swift_nb.capture import helper
from swift_nb.record import load_run, tables_path
from swift_nb.render.sections.timeline import TimelinePart


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
        for p in psutil.Process().children()  # this process's own: a kernel of another test has its own
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


@pytest.fixture(autouse=True)
def fresh_helper():
    """Each test starts without this process's shared helper, and leaves none."""
    helper.stop_shared()
    yield
    helper.stop_shared()


def _idle_or_gone() -> bool:
    """No helper is left working: the shared one, if any, has no job queued."""
    process = helper.shared(start=False)
    return _helpers() == [] or (process is not None and not process.busy and len(_helpers()) == 1)


def test_helper_digests_at_low_priority_and_serves_the_next_run(tmp_path):
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
    assert [p.pid for p in _helpers()] == [seen["pid"]]  # idle, warm, for the next run
    assert not helper.shared(start=False).busy

    again = swift_nb.profile(out_dir=tmp_path, **OPTIONS)
    with again as second:
        _train(8)
    assert again.session.digested.pid == seen["pid"]
    _complete(second)


def _environ_after_exec(pid: int | None) -> dict[str, str]:
    """The environment of the helper ``pid`` once it runs the helper: between fork and exec,
    /proc shows its parent's."""
    assert pid is not None
    p = psutil.Process(pid)
    deadline = time.monotonic() + 30
    while "swift_nb.capture.helper" not in " ".join(p.cmdline()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return p.environ()


def test_a_run_without_a_report_starts_a_helper_that_imports_no_figures(tmp_path, monkeypatch):
    """The helper a run starts imports ahead what the run's work needs: the digest's modules
    alone without a report (a rerun's worker, a script with report=False), the figures' too
    with one; a process's own ``$SWIFT_NB_HELPER_WARM`` decides where set."""
    monkeypatch.delenv(helper.WARM_ENV, raising=False)
    warm = []
    for report in (False, True):
        helper.stop_shared()
        prof = swift_nb.profile(out_dir=tmp_path, report=report, **OPTIONS)
        with prof as run:
            _train(8)
        assert run.summary["recorded_steps"] == [2, 3, 4]
        assert (run.path / "report.html").exists() is report
        warm.append(_environ_after_exec(getattr(helper.shared(start=False), "pid", None)))
    assert [w.get(helper.WARM_ENV) for w in warm] == [",".join(helper.WARM_DIGEST), ",".join(helper.WARM)]
    helper.stop_shared()
    monkeypatch.setenv(helper.WARM_ENV, "swift_nb.capture.digest,json")
    assert helper.shared().warm == ("swift_nb.capture.digest", "json")
    # a rerun's worker runs with no report, and says so to its helper
    from swift_nb.rerun.launcher import Variant, Worker

    worker = Worker([], "pass", "", tmp_path, Variant("baseline"))
    assert worker.options.report is False
    shutil.rmtree(worker.folder)


def test_a_helper_removes_the_jobs_folders_of_processes_gone_with_theirs(tmp_path, monkeypatch):
    """A training process killed with its helper (a process group's SIGKILL) leaves its jobs'
    folder: the next helper to start removes it, and never one whose process is alive."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f"swift_nb-helper-{gone.pid}-abc"
    alive = tmp_path / "swift_nb-helper-1-abc"  # init's: alive as long as the machine is
    other = tmp_path / "swift_nb-helper-notes"
    for folder in (stale, alive, other):
        folder.mkdir()
    process = helper.HelperProcess()
    try:
        assert process.jobs.parent == tmp_path and process.jobs.name.startswith(
            f"swift_nb-helper-{os.getpid()}-"
        )
        assert not stale.exists() and alive.exists() and other.exists()
    finally:
        process.close()
    assert not process.jobs.exists()


@pytest.mark.parametrize("ending", ["exit", "os._exit"])
def test_helper_leaves_with_its_process_and_leaves_nothing(tmp_path, ending):
    """Whether the training process exits (its ``atexit`` ends the helper) or is gone
    without running any (``os._exit``, as a killed rank is), the helper leaves and its jobs'
    folder does not stay behind in the temporary directory."""
    code = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(os.path.dirname(__file__))!r})
        import swift_nb
        from swift_nb.capture import helper
        from test_helper import _train
        prof = swift_nb.profile(out_dir={str(tmp_path)!r}, wait=1, warmup=1, active=3)
        with prof:
            _train(8)
        print(prof.session.digested.pid, helper.shared(start=False).jobs, flush=True)
        if {ending!r} == "os._exit":
            os._exit(0)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    pid_text, jobs = out.stdout.split()[-2:]
    pid = int(pid_text)
    assert pid != os.getpid()
    gone = psutil.wait_procs([psutil.Process(pid)], timeout=10)[0] if psutil.pid_exists(pid) else True
    assert gone, "the helper outlived its process"
    assert not Path(jobs).exists(), "the helper's jobs folder was left behind"


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


def test_interrupted_cell_leaves_no_busy_helper_and_keeps_the_run(tmp_path):
    def interrupt(k):
        if k == 5:
            raise KeyboardInterrupt

    prof = swift_nb.profile(out_dir=tmp_path, **OPTIONS)
    with pytest.raises(KeyboardInterrupt), prof as run:
        _train(8, interrupt)
    assert run.status == "interrupted"
    _complete(run)
    assert _idle_or_gone()


def test_run_ending_with_its_job_unanswered_ends_the_helper(tmp_path, monkeypatch):
    """A job nobody waits for any more (the run ended before taking its answer) ends the
    helper: the next run starts a fresh one rather than queue behind it."""
    h = helper.Helper(tmp_path, lambda said: None)
    h.start()
    pid = h.pid
    pending = h.submit("time:sleep", 30)
    h.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert helper.shared(start=False) is None
    assert not pending.done
    assert list(tmp_path.iterdir()) == [], "the abandoned job's file is left behind"


def test_interrupted_again_while_the_digest_runs(tmp_path, monkeypatch):
    """A second Ctrl-C while the run waits for its digest waits until the record is saved
    (``Session.stop``): the trace is digested and kept, then the interrupt is raised, and no
    helper is left."""
    waiting = {}
    result = helper.Pending.result

    def interrupted_while_waiting(self):
        waiting["unanswered"] = not self._done.is_set()
        # the user's second Ctrl-C, while the digest is awaited: SIGINT's handler runs now,
        # in this (the main) thread, before the wait below, whatever the machine's load
        _thread.interrupt_main()
        return result(self)

    monkeypatch.setattr(helper.Pending, "result", interrupted_while_waiting)

    def interrupt(k):
        if k == 5:
            raise KeyboardInterrupt

    prof = swift_nb.profile(out_dir=tmp_path, **OPTIONS)
    with pytest.raises(KeyboardInterrupt), prof as run:
        _train(8, interrupt)
    assert waiting == {"unanswered": True}
    assert _idle_or_gone()
    saved = load_run(run.path)
    assert saved.status == "interrupted" and len(saved.steps) == 6
    assert saved.trace_path is not None and tables_path(saved.trace_path).exists()
    assert saved.summary["recorded_steps"] == [2, 3, 4]
    assert not [p for p in os.listdir(run.path) if p.startswith(".")], "leftover temporary files"


def test_figures_are_drawn_in_the_helper_not_in_the_training_process(tmp_path):
    """The end of a profiled cell: the training process analyses the run while the helper
    draws every figure of the report, so the training process never imports matplotlib,
    and the report holds the same figures as one drawn in a single process."""
    code = textwrap.dedent(
        f"""
        import re, sys
        sys.path.insert(0, {str(os.path.dirname(__file__))!r})
        import swift_nb
        from test_helper import _train
        with swift_nb.profile(out_dir={str(tmp_path)!r}, wait=1, warmup=1, active=3) as run:
            _train(8)
        print("matplotlib" in sys.modules)
        print(run.path)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    imported, path = out.stdout.split()[-2:]
    assert imported == "False", "the training process drew a figure"
    drawn = (Path(path) / "report.html").read_text(encoding="utf-8")
    keys = sorted(re.findall(r"data-figure='([0-9a-f]{40})'", drawn))
    assert len(keys) >= 5  # the steps' breakdown, operators by time and memory, timeline, memory
    (Path(path) / "report.html").unlink()
    again = swift_nb.report(path).run.path / "report.html"  # drawn here, in one process
    assert sorted(re.findall(r"data-figure='([0-9a-f]{40})'", again.read_text(encoding="utf-8"))) == keys
    assert drawn == again.read_text(encoding="utf-8")


def test_a_notebooks_timeline_png_is_drawn_in_the_helper_too(tmp_path):
    """A notebook shows the trace's timeline as a PNG among its static outputs
    (``finish(timeline_png=True)``, as the magic calls it): the helper draws that one too,
    and it is the PNG this process would draw."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(os.path.dirname(__file__))!r})
        from swift_nb.api import ReportAhead, finish
        from swift_nb.capture.session import Session
        from swift_nb.render.sections.timeline import TimelinePart
        from swift_nb.vocabulary.options import ProfileOptions
        from test_helper import _train
        options = ProfileOptions(out_dir={str(tmp_path)!r}, wait=1, warmup=1, active=3)
        session = Session(options, on_trace=ReportAhead())
        session.start()
        _train(8)
        reported = finish(session, timeline_png=True)
        part = next(p for s in reported.sections for p in s.parts if isinstance(p, TimelinePart))
        handed = part.drawn is not None
        assert "image/png" in part.outputs()[0]
        open({str(tmp_path / "timeline.png")!r}, "wb").write(part.png)
        print(handed, "matplotlib" in sys.modules, reported.run.path)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    handed, imported, path = out.stdout.split()[-3:]
    assert handed == "True", "the helper's PNG was not handed to the timeline"
    assert imported == "False", "the training process drew the timeline"
    here = TimelinePart(swift_nb.load_run(path)).png
    assert (tmp_path / "timeline.png").read_bytes() == here


def test_prewarmed_helper_waits_at_low_priority_for_the_first_run(tmp_path):
    """``%load_ext swift_nb`` starts the helper ahead; it idles at the lowest priority (on
    a machine whose cores the training fills, any of its work in the loop stalls steps:
    benchmarks/never_waits.py), and the first run takes it."""
    helper.prewarm()
    process = helper.shared(start=False)
    assert process is not None and psutil.Process(process.pid).nice() == 19
    prof = swift_nb.profile(out_dir=tmp_path, **OPTIONS)
    with prof as run:
        _train(8)
    assert prof.session.digested.pid == process.pid
    _complete(run)
