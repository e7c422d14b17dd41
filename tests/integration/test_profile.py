"""swift_nb.profile() from plain Python: steps, schedule, statuses, faults."""

from __future__ import annotations

import gc
import pickle
import subprocess
import sys
import textwrap
import threading
from dataclasses import replace

import pytest
import torch
from support.common import train

import swift_nb
from swift_nb.capture.session import PREVIEW_NOTE, Session
from swift_nb.capture.torch_profiler import TraceRecorder
from swift_nb.vocabulary.options import ProfileOptions


def test_plain_script_without_ipython(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, sys
            import torch, swift_nb
            from swift_nb.demo import make_model
            model = make_model(seq_len=32, n_layer=1, d_model=32, n_head=2, vocab_size=128)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x = torch.randint(0, 128, (2, 32))
            with swift_nb.profile(out_dir={str(tmp_path / "runs")!r}, label="script") as run:
                for _ in range(8):
                    model(x, x).backward()
                    opt.step()
                    opt.zero_grad()
                os.write(2, b"user stderr\\n")
            print(run.path)
            print("IPython" in sys.modules)
            """
        )
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    path, ipython_loaded = proc.stdout.split()
    assert ipython_loaded == "False"
    assert "user stderr" in proc.stderr
    assert "USDT" not in proc.stderr and "CPUAllocator" not in proc.stderr
    run = swift_nb.load_run(path)
    assert run.status == "ok" and run.label == "script"
    assert run.summary["steps"] == 8
    assert run.trace_path is not None and run.trace_path.exists()


def test_steps_equal_optimizer_steps_and_phases_follow_schedule(runs_dir):
    with swift_nb.profile(wait=1, warmup=1, active=2, out_dir=runs_dir) as run:
        train(7)
    assert run.status == "ok"
    assert list(run.steps["step"]) == list(range(7))
    assert list(run.steps["phase"]) == ["wait", "warmup", "active", "active", "none", "none", "none"]
    assert (run.steps["trigger"] == "optimizer").all()
    assert run.summary["recorded_steps"] == [2, 3]
    assert run.steps["peak_tensor_bytes"].notna().tolist() == [False, False, True, True, False, False, False]


def test_the_run_the_helper_draws_from_unpickles_without_importing_torch(runs_dir):
    """The finished run goes to the helper, which never imports torch, for its figures
    (``api._draw_elsewhere``): a torch object in the record (``torch.__version__`` is a
    TorchVersion) would make it import torch first, a second at the end of a first run."""
    with swift_nb.profile(out_dir=runs_dir, report=False) as run:
        train(6)
    assert type(run.environment["torch"]) is str
    code = "import pickle, sys; pickle.loads(sys.stdin.buffer.read()); print(sorted(m for m in sys.modules if m == 'torch'))"
    out = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(replace(run)), capture_output=True, check=True
    )
    assert out.stdout.decode().strip() == "[]", out.stdout


def test_the_collector_is_paused_while_the_run_is_reported_then_back_on(runs_dir, monkeypatch):
    from swift_nb import api

    seen = []

    def spied(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    real = api.report
    monkeypatch.setattr(api, "report", spied)
    with swift_nb.profile(out_dir=runs_dir) as run:
        train(6)
    assert run.status == "ok" and seen == [False] and gc.isenabled()


def test_repeat_cycles_are_merged_into_one_trace(runs_dir):
    with swift_nb.profile(wait=0, warmup=1, active=1, repeat=2, out_dir=runs_dir) as run:
        train(5)
    assert run.summary["recorded_steps"] == [1, 3]


def test_second_optimizer_does_not_double_count(runs_dir):
    torch.manual_seed(0)
    g, d = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    og, od = torch.optim.SGD(g.parameters(), lr=0.1), torch.optim.SGD(d.parameters(), lr=0.1)
    with swift_nb.profile(out_dir=runs_dir) as run:
        for _ in range(5):
            d(g(torch.randn(2, 4))).sum().backward()
            od.step()
            og.step()
    assert run.summary["steps"] == 5


def test_explicit_steps_without_optimizer(runs_dir):
    m = torch.nn.Linear(8, 8)
    with swift_nb.profile(wait=0, warmup=0, active=2, out_dir=runs_dir) as run, torch.no_grad():
        for _ in range(4):
            m(torch.randn(2, 8))
            swift_nb.step()
    assert run.summary["steps"] == 4
    assert (run.steps["trigger"] == "explicit").all()
    assert run.summary["recorded_steps"] == [0, 1]


def test_explicit_steps_switch_off_optimizer_counting(runs_dir):
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with swift_nb.profile(out_dir=runs_dir) as run:
        for _ in range(3):
            for _ in range(2):  # two optimizer steps per marked step
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
            swift_nb.step()
    # two optimizer steps before the first swift_nb.step(), then three explicit ones
    assert run.summary["steps"] == 5


def test_a_cell_without_steps_is_one_span(runs_dir):
    with swift_nb.profile(out_dir=runs_dir) as run:
        torch.randn(64, 64) @ torch.randn(64, 64)
    assert run.summary["steps"] == 0
    assert len(run.steps) == 1 and run.steps["trigger"].iloc[0] == "end"
    assert any("one span" in n for n in run.notes)


def test_failure_saves_partial_run_and_stops_threads(runs_dir):
    before = set(threading.enumerate())
    with pytest.raises(RuntimeError, match="boom"), swift_nb.profile(out_dir=runs_dir) as run:
        train(4)
        raise RuntimeError("boom")
    assert set(threading.enumerate()) == before
    loaded = swift_nb.load_run(run.path)
    assert loaded.status == "failed"
    assert loaded.summary["steps"] == 4
    assert any("RuntimeError: boom" in n for n in loaded.notes)
    assert loaded.trace_path.exists()


def test_keyboard_interrupt_saves_interrupted_run(runs_dir):
    with pytest.raises(KeyboardInterrupt), swift_nb.profile(out_dir=runs_dir) as run:
        train(3)
        raise KeyboardInterrupt
    loaded = swift_nb.load_run(run.path)
    assert loaded.status == "interrupted"
    assert loaded.summary["steps"] == 3
    assert len(loaded.samples) >= 1


def test_hooks_are_removed_after_the_run(runs_dir):
    with swift_nb.profile(out_dir=runs_dir) as run:
        train(2)
    train(3)
    swift_nb.step()
    assert swift_nb.load_run(run.path).summary["steps"] == 2


def test_nested_profiles_are_refused(runs_dir):
    with swift_nb.profile(out_dir=runs_dir):
        with pytest.raises(RuntimeError, match="already active"), swift_nb.profile(out_dir=runs_dir):
            pass
        train(1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"active": 0}, "active must be a whole number ≥ 1; got 0"),
        ({"wait": -1}, "wait must be a whole number ≥ 0; got -1"),
        ({"interval_ms": -5}, "interval_ms must be a positive number of milliseconds; got -5"),
        ({"interval_ms": "fast"}, "interval_ms must be a positive number of milliseconds; got 'fast'"),
        ({"keep": 0}, "keep must be a whole number of runs, at least 1; got 0"),
    ],
)
def test_bad_arguments_fail_before_any_work(runs_dir, kwargs, message):
    with pytest.raises(swift_nb.ConfigError) as err:
        swift_nb.profile(out_dir=runs_dir, **kwargs)
    assert str(err.value) == message
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def test_unwritable_out_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(swift_nb.RunDirError, match="cannot write run records"):
        swift_nb.profile(out_dir=blocker / "runs")


def test_resource_only_session_records_samples_and_steps(runs_dir):
    session = Session(ProfileOptions(interval_ms=10, out_dir=runs_dir), trace=False)
    session.start()
    train(3)
    run = session.stop()
    assert run.summary["steps"] == 3
    assert run.trace_path is None
    assert {"cpu_pct", "rss_bytes", "sys_mem_used_bytes"} <= set(run.samples.columns)


def test_steps_after_the_schedule_pay_no_profiler(runs_dir):
    """Once the schedule's last cycle is exported, torch's profiler is stopped: the steps
    after it run without its callbacks and the trace keeps the recorded steps only."""
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    session = Session(ProfileOptions(out_dir=runs_dir, wait=0, warmup=1, active=2, report=False))
    session.start()
    enabled = []
    for _ in range(6):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        enabled.append(torch.autograd.profiler._is_profiler_enabled)
    prof = session._trace._prof
    # torch's profiler saw the schedule's steps only: no ProfilerStep span opened after it
    assert (prof.step_num, prof.step_rec_fn) == (3, None)
    run = session.stop()
    assert enabled == [True, True, False, False, False, False]
    assert run.status == "ok" and run.summary["recorded_steps"] == [1, 2]
    assert len(run.steps) == 6 and run.steps["rss_bytes"].gt(0).all()


def test_rss_reader_reads_what_psutil_reads():
    import psutil

    from swift_nb.capture.resources.rss import RssReader

    reader = RssReader()
    try:
        assert abs(reader() - psutil.Process().memory_info().rss) < 4 * 2**20
    finally:
        reader.close()
    assert abs(reader() - psutil.Process().memory_info().rss) < 4 * 2**20  # closed: through psutil


def test_profile_with_run_id_writes_that_folder(tmp_path):
    import torch

    m = torch.nn.Linear(4, 4)
    o = torch.optim.SGD(m.parameters(), lr=0.1)
    with swift_nb.profile(
        out_dir=tmp_path, run_id="fixed-id", wait=0, warmup=0, active=1, report=False
    ) as run:
        for _ in range(2):
            m(torch.randn(2, 4)).sum().backward()
            o.step()
    assert run.path == (tmp_path / "fixed-id").resolve()
    with pytest.raises(OSError, match="exists already"):
        swift_nb.profile(out_dir=tmp_path, run_id="fixed-id")


def _finished_with_early_results(runs_dir, digest_ready) -> tuple[list[dict], swift_nb.Run]:
    """A run finished as a notebook finishes it (``api.finish`` with ``on_analysed``),
    its trace's digest ``digest_ready`` (``TraceRecorder.ready``); what ``on_analysed``
    saw each time it was called, and the run."""
    from swift_nb.api import ReportAhead, finish

    seen: list[dict] = []

    def on_analysed(run, sections):
        seen.append(
            {
                "notes": list(run.notes),
                "files": dict(run.files),
                "steps": len(run.steps),
                "step_time": run.summary.get("step_time_median_s"),
                "kinds": [s.kind.title for s in sections],
                "report_written": (run.path / "report.html").exists(),
            }
        )

    original = TraceRecorder.ready
    TraceRecorder.ready = digest_ready
    try:
        session = Session(ProfileOptions(out_dir=runs_dir), on_trace=ReportAhead())
        session.start()
        train(8)
        reported = finish(session, on_analysed=on_analysed)
    finally:
        TraceRecorder.ready = original
    return seen, reported.run


def test_a_notebooks_summary_comes_from_the_record_while_the_trace_is_still_digested(runs_dir):
    # a digest that outlasts any wait (a fault injected): the record's own analysis first
    seen, run = _finished_with_early_results(runs_dir, lambda self, within: False)
    assert len(seen) == 2, "the preview's Summary, then the run's"
    preview, full = seen
    assert PREVIEW_NOTE in preview["notes"] and "trace" not in preview["files"]
    assert preview["steps"] == 8 and preview["step_time"] == run.summary["step_time_median_s"]
    assert "Verdict" in preview["kinds"] and not preview["report_written"]
    assert PREVIEW_NOTE not in full["notes"] and "trace" in full["files"]
    assert PREVIEW_NOTE not in run.notes and run.trace_path is not None and run.trace_path.exists()
    assert PREVIEW_NOTE not in swift_nb.load_run(run.path).notes, "the preview is never saved"


def test_a_digest_done_in_time_gives_one_summary(runs_dir):
    seen, _ = _finished_with_early_results(runs_dir, lambda self, within: True)
    assert len(seen) == 1 and "trace" in seen[0]["files"] and PREVIEW_NOTE not in seen[0]["notes"]
