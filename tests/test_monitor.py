"""ResourceMonitor: the seed's step_begin/step_end/generate_report API on the same machinery."""

from __future__ import annotations

import pytest
import torch

import swift_nb

pytestmark = pytest.mark.slow  # profiles a training loop


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
    assert "Steps" in report.summary and "Peak resident memory (RSS)" in report.summary and "mon" in report.summary
