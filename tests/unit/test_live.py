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
