"""Nothing measured is lost: a run is journaled while it runs, SIGTERM/SIGHUP save it in
full before the signal takes its course, SIGKILL leaves a ``crashed`` record with the
steps flushed until then. Real processes, real signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import swift_nb

JOB = Path(__file__).parents[1] / "workloads" / "durable_job.py"


def _default_signals() -> None:
    # the job starts as from a terminal: a test runner started under nohup ignores SIGHUP,
    # and a signal ignored before the run stays ignored (swift_nb leaves it so)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def _start(out: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(JOB), str(out), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_signals,
    )


def _wait_for_steps(proc: subprocess.Popen, n: int) -> list[str]:
    """Lines printed until step ``n`` (the child prints one per optimizer step)."""
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.strip())
        if line.startswith(f"step {n} "):
            return lines
    raise AssertionError(f"the job ended before step {n}: {proc.stderr.read() if proc.stderr else ''}")


def _only_run(out: Path) -> swift_nb.Run:
    table = swift_nb.runs(out)
    assert len(table) == 1, table
    return swift_nb.load_run(table.path[0])


@pytest.mark.parametrize(("signum", "name"), [(signal.SIGTERM, "SIGTERM"), (signal.SIGHUP, "SIGHUP")])
def test_terminating_signal_saves_the_run_in_full_then_exits_as_usual(tmp_path, signum, name):
    proc = _start(tmp_path)
    seen = _wait_for_steps(proc, 8)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    printed = [ln for ln in [*seen, *out.splitlines()] if ln.startswith("step ")]
    assert proc.returncode == -signum, err[-2000:]  # the default action still ends it (143 for SIGTERM)
    assert "finished" not in out
    run = _only_run(tmp_path)
    assert run.status == "terminated"
    assert swift_nb.runs(tmp_path).status[0] == "terminated"
    # every step the loop completed is in the record (the signal may land inside the next)
    assert len(run.steps) >= len(printed) >= 8
    assert run.steps["step"].tolist() == list(range(len(run.steps)))
    assert any(n.startswith(f"terminated by {name}: the run was saved") for n in run.notes), run.notes
    assert run.trace_path is not None and run.trace_path.is_file()  # the trace was written too
    assert len(run.samples) > 0


def test_the_users_own_sigterm_handler_still_runs_after_the_save(tmp_path):
    proc = _start(tmp_path, "--handler")
    _wait_for_steps(proc, 5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert "user handler ran" in out
    assert proc.returncode == 7, err[-2000:]
    run = _only_run(tmp_path)
    assert run.status == "terminated" and len(run.steps) >= 5


def test_sigkill_leaves_a_crashed_record_with_the_steps_flushed_until_then(tmp_path):
    proc = _start(tmp_path, "--sleep", "0.02")
    _wait_for_steps(proc, 10)
    time.sleep(2.5)  # more than the journal's interval: the first steps are on disk by now
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    run = _only_run(tmp_path)
    assert run.status == "crashed"  # the same status in load_run and in runs()
    assert swift_nb.runs(tmp_path).status[0] == "crashed"
    assert len(run.steps) >= 10
    assert run.steps["step"].tolist() == list(range(len(run.steps)))
    assert run.steps["duration_s"].notna().all()
    assert run.summary["steps"] >= 10  # run.json follows the journal
    assert len(run.samples) > 0 and run.samples["t_s"].is_monotonic_increasing


def test_a_finished_run_rewrites_the_journal_whole(tmp_path):
    proc = _start(tmp_path, "--steps", "12", "--sleep", "0.1")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    run = _only_run(tmp_path)
    assert run.status == "ok" and len(run.steps) == 12
    assert run.summary["journal_flushes"] >= 1
    text = (run.path / "steps.csv").read_text()
    assert text.count("\n") == 13  # the header and one line per step: nothing appended twice
