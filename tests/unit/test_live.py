"""The live panel's updates (swift_nb.notebook.live), without a kernel: what each message
sets on its widgets."""

from __future__ import annotations

import ipywidgets as widgets

from swift_nb.notebook.live import LivePanel


def test_a_finished_run_fills_its_bar_whatever_the_schedule_said():
    """A cell run without --steps: the bar's max was the profiler's schedule (6 steps); the
    run ends at step 40 of 40, and the bar is full, not clamped to 6 of 40."""
    bar = widgets.IntProgress(value=5, min=0, max=6)
    LivePanel._send(bar, value=40, max=40)
    assert (bar.value, bar.max) == (40, 40)
    LivePanel._send(bar, value=3, max=4)  # a smaller max: the value still lands
    assert (bar.value, bar.max) == (3, 4)


class _Session:
    """What the panel reads of a session: its steps, newest sample and run."""

    def __init__(self) -> None:
        self.steps_done = 12
        self.profiler_cfg = None
        self.alerts: list = []
        self.run = type("Run", (), {"summary": {}})()

    def latest_sample(self):
        return None


def test_while_the_run_is_saved_the_phase_line_counts_its_seconds_and_the_traces_events():
    """A large trace takes a while to digest after the cell's code returned: the panel's
    phase line says so, with the seconds since and the trace's events once counted, and
    stops when the run is shown; the step, its rate and the elapsed time stay as the cell
    ended."""
    import time

    session = _Session()
    panel = LivePanel(session)
    panel.start()
    panel.stop()
    assert "saving and analyzing…" in panel.text.value and "step <b>12</b>" in panel.text.value
    session.run.summary["trace_events"] = 1_234_567
    deadline = time.monotonic() + 20
    while "1,234,567 events" not in panel.text.value and time.monotonic() < deadline:
        time.sleep(0.05)
    text = panel.text.value
    assert "(the trace&#x27;s 1,234,567 events)" in text and "step <b>12</b>" in text, text
    assert "saving and analyzing… " in text and " s (the trace" in text  # its seconds
    panel.end_saving()
    after = panel.text.value
    time.sleep(1.2)
    assert panel.text.value == after  # no more ticks
