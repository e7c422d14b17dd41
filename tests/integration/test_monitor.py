"""ResourceMonitor: the seed's step_begin/step_end/generate_report API on the same machinery."""

from __future__ import annotations

import torch

import swift_nb


def test_monitor_report(runs_dir):
    mon = swift_nb.ResourceMonitor(interval=2, log_dir=runs_dir, label="mon")
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        mon.step_begin(step)
        model(torch.randn(2, 8)).sum().backward()
        opt.step()  # explicit hooks only: optimizer steps do not add boundaries
        mon.step_end(step)
    report = mon.generate_report()
    assert report is mon.generate_report()
    run = swift_nb.load_run(report.path)
    assert run.summary["steps"] == 6 and run.status == "ok"
    assert run.trace_path is None
    assert (run.samples["kind"] == "step").sum() == 4  # steps 1, 3, 5, plus the final sample
    assert (
        "Steps" in report.summary
        and "Peak resident memory (RSS)" in report.summary
        and "mon" in report.summary
    )


def test_a_long_run_keeps_a_bounded_number_of_step_rows(runs_dir, monkeypatch):
    """Steps written to steps.csv leave memory but the newest journal.KEEP_STEPS (here 200);
    the run's end reads them back: every step, exactly as measured, once."""
    import time

    import pandas as pd

    from swift_nb.capture import journal

    monkeypatch.setattr(journal, "KEEP_STEPS", 200)
    monkeypatch.setattr(journal, "FLUSH_INTERVAL_S", 0.05)
    mon = swift_nb.ResourceMonitor(interval=50, log_dir=runs_dir)
    held = []
    for step in range(3000):
        mon.step_begin(step)
        time.sleep(0.0003)  # the journal flushes every 50 ms meanwhile
        mon.step_end(step)
        if step % 100 == 99:
            held.append(len(mon._session._rows))
    run = mon.generate_report().run
    assert mon._session._journal.dropped > 2000
    assert max(held) < 200 + 2000  # the newest rows, and those since the last flush
    assert list(run.steps["step"]) == list(range(3000))
    on_disk = pd.read_csv(run.path / "steps.csv")
    assert len(on_disk) == run.summary["steps"] == 3000
    assert (on_disk["duration_s"] == on_disk["end_s"] - on_disk["start_s"]).all()


def test_rows_that_cannot_be_read_back_are_said_and_the_run_is_saved(runs_dir, monkeypatch):
    import time

    from swift_nb.capture import journal

    monkeypatch.setattr(journal, "KEEP_STEPS", 100)
    monkeypatch.setattr(journal, "FLUSH_INTERVAL_S", 0.05)
    mon = swift_nb.ResourceMonitor(interval=50, log_dir=runs_dir)
    for step in range(1500):
        mon.step_begin(step)
        time.sleep(0.0003)
        mon.step_end(step)
        if step == 1000:
            (mon.run.path / "steps.csv").unlink()  # a cleanup script took it
    run = mon.generate_report().run
    assert run.status == "ok" and 0 < len(run.steps) < 1500
    assert any("could not be read back from steps.csv" in n for n in run.notes)
