"""Alerts while a run runs: a step-time regression (the steps turning slower and staying so).

``StepTimeWatch`` is fed the step rows the journal's thread appends to steps.csv (once a
second, never on the step hook): it keeps the last ``window`` steady steps and the
``baseline`` steady steps before them, and alerts when the window's median is at least
``1 + threshold_pct / 100`` times the baseline's. Steady steps leave out what is slow for a
known reason: the steps the profiler traces (its warmup and active phases) and the steps
that compiled. Medians, so a few slow steps (a checkpoint, a garbage collection, the
helper's work after the trace) raise nothing: half the window must be slow. Once raised it
stays quiet until the window's median is back under half the threshold; a lasting slowdown
becomes the new baseline as the baseline's steps move on.

Memory is bounded: ``window + baseline`` durations, whatever the run's length.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import median

DEFAULT_WINDOW = 50
DEFAULT_BASELINE = 200
DEFAULT_THRESHOLD_PCT = 25.0
#: steps after which the window is compared again (a median per new step would cost the
#: journal's thread ~20 µs a step on a fast loop for no earlier answer than a second)
CHECK_EVERY = 5
#: phases the profiler records in (steps slowed by tracing, not by the training)
TRACED_PHASES = ("warmup", "active")


@dataclass(frozen=True)
class Alert:
    """A step-time regression: steps ``first_step``..``step`` had a median of ``median_s``,
    ``ratio`` times the ``baseline_s`` of the steady steps before them; ``t_s``: the run's
    clock at the end of step ``step``."""

    kind: str
    step: int
    first_step: int
    median_s: float
    baseline_s: float
    ratio: float
    t_s: float

    @property
    def message(self) -> str:
        return (
            f"step time regressed: steps {self.first_step}–{self.step} ran {self.ratio:.2f}× the steady "
            f"steps before them (median {self.median_s * 1e3:.3g} ms against "
            f"{self.baseline_s * 1e3:.3g} ms; at t={self.t_s:.0f} s)"
        )

    def to_dict(self) -> dict[str, float | int | str]:
        return {
            "kind": self.kind,
            "step": self.step,
            "first_step": self.first_step,
            "median_s": self.median_s,
            "baseline_s": self.baseline_s,
            "ratio": self.ratio,
            "t_s": self.t_s,
            "message": self.message,
        }


class StepTimeWatch:
    """Alerts on a lasting step-time regression (see the module's docstring)."""

    def __init__(
        self,
        window: int = DEFAULT_WINDOW,
        baseline: int = DEFAULT_BASELINE,
        threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    ) -> None:
        if window < 3 or baseline < window:
            raise ValueError(f"need window ≥ 3 and baseline ≥ window; got {window}, {baseline}")
        self.window, self.baseline, self.threshold = window, baseline, threshold_pct / 100.0
        self._recent: deque[tuple[int, float]] = deque(maxlen=window)  # (step, duration_s)
        self._before: deque[float] = deque(maxlen=baseline)
        self._since_check = 0
        self._raised = False
        self.alerts: list[Alert] = []

    def add(self, step: int, duration_s: float, end_s: float) -> Alert | None:
        """One steady step; the alert it completes, if any."""
        if len(self._recent) == self.window:
            self._before.append(self._recent[0][1])
        self._recent.append((step, duration_s))
        self._since_check += 1
        if len(self._before) < self.window or self._since_check < CHECK_EVERY:
            return None
        self._since_check = 0
        base = median(self._before)
        now = median(d for _, d in self._recent)
        ratio = now / base if base > 0 else 1.0
        if self._raised:
            self._raised = ratio >= 1.0 + self.threshold / 2
            return None
        if ratio < 1.0 + self.threshold:
            return None
        self._raised = True
        alert = Alert("slow_steps", step, self._recent[0][0], now, base, ratio, end_s)
        self.alerts.append(alert)
        return alert

    def feed(self, rows: Sequence[Sequence]) -> list[Alert]:
        """Steps as steps.csv's rows (``STEP_COLUMNS`` order: step, start_s, end_s,
        duration_s, phase, trigger, …, compile_s last); the alerts they raise."""
        raised = []
        for row in rows:
            if row[4] in TRACED_PHASES or (row[-1] or 0.0) > 0:
                continue
            alert = self.add(int(row[0]), float(row[3]), float(row[2]))
            if alert is not None:
                raised.append(alert)
        return raised


OnAlert = Callable[[Alert], None]
