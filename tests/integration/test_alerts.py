"""Alerts while a run runs (swift_nb.capture.resources.alerts): a step-time regression raises one
alert — a note in the record, the summary's ``alerts``, the ``on_alert`` callback, a line in
the live panel — and a steady run raises none."""

from __future__ import annotations

import json
import random
import time
import types

import pytest

import swift_nb
from swift_nb.capture import session as session_module
from swift_nb.capture.resources.alerts import StepTimeWatch
from swift_nb.record import load_run


def _row(step: int, duration: float, phase: str = "none", compile_s: float = 0.0) -> tuple:
    return (step, 0.0, step * 0.01, duration, phase, "explicit", 0.0, None, None, 0, compile_s)


def _noisy(n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [0.010 * (1 + rng.uniform(-0.15, 0.15)) for _ in range(n)]


def test_a_steady_run_with_noise_and_outliers_raises_nothing():
    durations = _noisy(5000)
    for k in range(0, 5000, 97):  # a checkpoint, a GC pause: single slow steps
        durations[k] = 0.2
    watch = StepTimeWatch()
    assert watch.feed([_row(k, d) for k, d in enumerate(durations)]) == []


def test_steps_30_pct_slower_for_50_steps_raise_one_alert():
    durations = _noisy(3000)
    for k in range(2000, 2050):
        durations[k] *= 1.3
    watch = StepTimeWatch()
    alerts = watch.feed([_row(k, d) for k, d in enumerate(durations)])
    assert len(alerts) == 1
    a = alerts[0]
    assert 2025 <= a.step < 2050 and a.first_step <= 2025 and a.ratio >= 1.25
    assert a.baseline_s == pytest.approx(0.010, rel=0.05)
    assert f"steps {a.first_step}–{a.step}" in a.message


def test_it_rearms_after_recovering_and_a_lasting_slowdown_becomes_the_baseline():
    durations = _noisy(3000)
    for k in list(range(1000, 1100)) + list(range(2000, 3000)):
        durations[k] *= 2.0
    alerts = StepTimeWatch().feed([_row(k, d) for k, d in enumerate(durations)])
    assert [1000 <= a.step < 1100 for a in alerts] == [True, False]
    assert 2000 <= alerts[1].step < 2100


def test_traced_and_compiling_steps_are_not_steady_steps():
    rows = [_row(k, 0.01) for k in range(300)]
    rows += [_row(300 + k, 0.05, phase="active") for k in range(60)]
    rows += [_row(360 + k, 0.05, compile_s=0.04) for k in range(60)]
    assert StepTimeWatch().feed(rows) == []


class StepClock:
    """The session's clock, moved by the loop: steps last exactly what the test says,
    whatever else the machine is doing (a burst of load would otherwise be a slowdown)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> StepClock:
    c = StepClock()
    monkeypatch.setattr(session_module, "time", types.SimpleNamespace(perf_counter=c.perf_counter))
    return c


def _timed_loop(clock: StepClock, steps: int, slow_from: int | None = None) -> None:
    for k in range(steps):
        clock.now += 0.010 if slow_from is not None and k >= slow_from else 0.004
        swift_nb.step()


def test_an_injected_slowdown_alerts_the_run_the_callback_and_the_panel(runs_dir, clock):
    got = []
    p = swift_nb.profile(out_dir=runs_dir, on_alert=got.append, report=False)
    with p as run:
        _timed_loop(clock, 400, slow_from=300)  # 10 ms steps from step 300 on, 4 ms before
    assert len(got) == 1 and got[0].step >= 300
    assert got[0].message in run.notes
    saved = json.loads((run.path / "run.json").read_text())
    assert saved["summary"]["alerts"][0]["step"] == got[0].step
    assert load_run(run.path).summary["alerts"][0]["message"] == got[0].message
    from swift_nb.notebook.live import LivePanel

    panel = LivePanel(p.session)
    panel._update(time.perf_counter())
    assert "swift-nb-alert" in panel.text.value and f"steps {got[0].first_step}" in panel.text.value
    panel.close(run)
    assert "swift-nb-alert" in panel.text.value


def test_a_steady_monitored_run_raises_nothing(runs_dir, clock):
    got = []
    mon = swift_nb.ResourceMonitor(interval=10, log_dir=runs_dir, on_alert=got.append)
    for k in range(400):
        mon.step_begin(k)
        clock.now += 0.004
        mon.step_end(k)
    run = mon.generate_report().run
    assert got == [] and "alerts" not in run.summary


def test_a_failing_callback_is_noted_and_the_run_goes_on(runs_dir, clock):
    def boom(alert):
        raise RuntimeError("pager down")

    with swift_nb.profile(out_dir=runs_dir, on_alert=boom, report=False) as run:
        _timed_loop(clock, 400, slow_from=300)
    assert run.status == "ok"
    assert any("on_alert failed (RuntimeError: pager down)" in n for n in run.notes)
