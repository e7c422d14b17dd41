"""The GPU's own counters in a real profiled run: the real sampler thread, session, record,
analysis and report, with only NVML injected (tests/support/nvml.py: GPM on a busy GPU
whose SMs are mostly idle, the clocks' event reasons, faults on request). The GPU path
itself is checked by scripts/gpu_check.sh's ``gpm`` check on a lent GPU."""

from __future__ import annotations

import sys
import time

import pandas as pd
import pytest
from support.common import train
from support.nvml import fake_gpm_nvml

import swift_nb

GPM_COLUMNS = ["gpu0_sm_active_pct", "gpu0_sm_occupancy_pct", "gpu0_tensor_active_pct", "gpu0_dram_bw_pct"]


def _profile(monkeypatch, runs_dir, nvml, steps: int = 10, step_s: float = 0.06, before_step=None):
    """``steps`` training steps of ``step_s`` each (GPM reads windows of 100 ms and more);
    ``before_step(i)`` runs before step i."""
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    model = train(1)
    opt = __import__("torch").optim.SGD(model.parameters(), lr=1e-3)
    with swift_nb.profile(out_dir=runs_dir, interval_ms=20, report=False) as run:
        for i in range(steps):
            if before_step is not None:
                before_step(i)
            train(1, model, opt)
            time.sleep(step_s)
    return run


def test_the_counters_per_step_in_the_summary_and_the_finding(monkeypatch, runs_dir):
    run = _profile(monkeypatch, runs_dir, fake_gpm_nvml())
    samples = pd.read_csv(run.path / "samples.csv")
    for column in GPM_COLUMNS:
        values = samples[column].dropna()
        assert len(values) >= 3, column  # one per window of 100 ms or more, the rest empty
    assert samples["gpu0_sm_active_pct"].isna().any()  # never repeated within a window
    steps = pd.read_csv(run.path / "steps.csv")
    timed = steps[steps["trigger"] != "end"]
    assert (
        timed["gpu0_sm_active_pct"].dropna().eq(31.0).all() and timed["gpu0_sm_active_pct"].notna().sum() >= 6
    )
    assert timed["gpu0_util_pct"].dropna().eq(90.0).all()
    s = run.summary
    assert s["mean_sm_active_pct"] == pytest.approx(31.0) and s["mean_tensor_active_pct"] == pytest.approx(
        4.0
    )
    assert s["mean_step_util_pct"] == pytest.approx(90.0) and s["throttled_steps_pct"] == 0.0
    assert not [n for n in run.notes if "GPM" in n or "throttle" in n]
    report = swift_nb.report(run)
    found = {f.id: f for f in report.analysis.findings}
    assert found["idle_sms"].evidence["sm_active_pct"] == pytest.approx(31.0)
    evidence = report.analysis.verdict.evidence
    assert evidence["sm_active_pct"] == 31.0 and evidence["tensor_active_pct"] == 4.0
    html = (run.path / "report.html").read_text()
    assert "GPU busy 90 % · SMs active 31 % · warps occupied 18 % · tensor cores 4 %" in html
    assert "not throttled in any step" in html
    # the GPU section, which a CPU trace alone would not have
    assert "the GPU&#x27;s own counters (NVML GPM) read: busy 90" in html
    assert "its SMs were active 31" in html and "Its clocks were not throttled in any step." in html


@pytest.mark.parametrize("fault", ["unsupported", "mid-run"])
def test_gpm_that_fails_leaves_one_note_and_every_other_column(monkeypatch, runs_dir, fault):
    nvml = fake_gpm_nvml(gpm=False) if fault == "unsupported" else fake_gpm_nvml(fail_from_read=3)
    run = _profile(monkeypatch, runs_dir, nvml)
    notes = [n for n in run.notes if "GPM" in n]
    assert len(notes) == 1, run.notes
    samples = pd.read_csv(run.path / "samples.csv")
    for column in ("gpu0_util_pct", "gpu0_power_w", "gpu0_energy_j", "gpu0_clock_reasons"):
        assert samples[column].notna().all(), column  # every sample, before and after the fault
    if fault == "unsupported":
        assert "Hopper" in notes[0] and "gpu0_sm_active_pct" not in samples
    else:
        assert "failed mid-run" in notes[0] and nvml.gpm.reads == 3  # read no more after it
        assert samples["gpu0_sm_active_pct"].notna().sum() == 2  # what it measured is kept
        assert samples["t_s"].max() > samples.loc[samples["gpu0_sm_active_pct"].notna(), "t_s"].max()


def test_throttling_in_words_with_the_share_of_steps_and_the_clock_lost(monkeypatch, runs_dir):
    """The power cap holds the clocks from the fifth step on (by step, not by time: a slow
    start on a loaded machine must not put every step after the cap)."""
    held = {"on": False}
    nvml = fake_gpm_nvml(reasons=lambda t: 0x4 if held["on"] else 0x0)
    run = _profile(monkeypatch, runs_dir, nvml, steps=12, before_step=lambda i: held.update(on=i >= 4))
    s = run.summary
    assert 20.0 <= s["throttled_steps_pct"] < 100.0
    # 1 400 MHz while held; a step held only part of its time (the one the cap begins in)
    # runs part of it at 1 980 MHz: the mean clock lost over the held steps is at most 580
    lost = s["clock_lost_mhz"]
    assert s["throttle_reasons"] == ["power cap"] and 290.0 <= lost <= 580.0 + 1e-9
    found = {f.id: f for f in swift_nb.report(run).analysis.findings}
    assert "power cap" in found["throttled"].title and f"{lost:.0f} MHz" in found["throttled"].title
    html = (run.path / "report.html").read_text()
    assert f"of the steps (power cap), {lost:.0f} MHz below their 1980 MHz" in html
