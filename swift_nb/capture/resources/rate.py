"""Rates of cumulative counters over windows long enough to be read: the process's CPU
(the sampler's ``cpu_pct``).

A counter read between two clock readings ``spread_s`` apart is known at their midpoint to
within ``spread_s / 2``, and moves in steps of its ``resolution`` (a clock tick, 10 ms, for
the CPU times in ``/proc``; a nanosecond for ``time.process_time`` on Linux). Over a window
of ``w`` seconds the rate is then off by up to
``(resolution + max_rate × (spread_a + spread_b) / 2) / w``: a window shorter than a tick,
or one whose ends the clock misplaces (a sampler thread descheduled between the counter and
the clock, as a loaded machine does to a thread at the lowest priority), reads several
times what the machine can do (565 % on 2 cores). So each rate is taken over the newest
window at least ``K`` times that long, and at least ``MIN_WINDOW_S``: its error is then at
most ``max_rate / K``. What is left of that error above ``max_rate`` is clipped.
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

#: a window is this many times what its readings' resolution and timing leave uncertain:
#: its rate is within 1 / K of ``max_rate``
K = 20
#: the shortest window a rate is taken over (s), however precise the counter
MIN_WINDOW_S = 0.05
#: readings kept waiting for a window to close (a bound, reached only when every reading
#: for a long time had a badly known moment)
MAX_READINGS = 4096


def allowed_cores() -> int:
    """The cores this process may run on: its CPU affinity where the OS has one, else the
    machine's cores. A process's CPU is at most 100 % of each."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # macOS and Windows have no sched_getaffinity
        return os.cpu_count() or 1


@dataclass(frozen=True)
class _Reading:
    t_s: float  # the midpoint of the clock readings around the counter's
    value: float
    spread_s: float  # the time between those clock readings


class WindowedRate:
    """The rate of one cumulative counter (its units per second) over the newest window
    long enough for the counter's ``resolution`` (its units) and the readings' timing,
    never above ``max_rate`` nor below 0.

    ``read`` and ``add`` return the rate over the window that ends at that reading, or the
    last one while no window that long has ended there (NaN before the first)."""

    def __init__(self, resolution: float, max_rate: float, min_window_s: float = MIN_WINDOW_S) -> None:
        if resolution < 0 or max_rate <= 0:
            raise ValueError(f"resolution must be >= 0 and max_rate > 0; got {resolution}, {max_rate}")
        self.resolution = resolution
        self.max_rate = max_rate
        self.min_window_s = min_window_s
        self.rate = math.nan
        self._readings: deque[_Reading] = deque(maxlen=MAX_READINGS)
        self._lock = threading.Lock()  # a sampler reads from its thread and from the step's

    def window_s(self, spread_start_s: float, spread_end_s: float) -> float:
        """The shortest window (s) between readings whose clock readings were
        ``spread_start_s`` and ``spread_end_s`` apart."""
        uncertain_s = self.resolution / self.max_rate + (spread_start_s + spread_end_s) / 2.0
        return max(self.min_window_s, K * uncertain_s)

    def read(self, clock: Callable[[], float], counter: Callable[[], float]) -> float:
        """Read ``counter`` between two readings of ``clock`` (s), and ``add`` it."""
        before = clock()
        value = counter()
        return self.add(before, value, clock())

    def add(self, before_s: float, value: float, after_s: float) -> float:
        """The counter's ``value``, read between the clock's ``before_s`` and ``after_s``."""
        now = _Reading((before_s + after_s) / 2.0, value, after_s - before_s)
        with self._lock:
            if self._readings and now.t_s <= self._readings[-1].t_s:
                return self.rate  # read before the newest, which another thread added first
            self._readings.append(now)
            for i in range(len(self._readings) - 2, -1, -1):
                start = self._readings[i]
                window = now.t_s - start.t_s
                if window >= self.window_s(start.spread_s, now.spread_s):
                    self.rate = min(max((now.value - start.value) / window, 0.0), self.max_rate)
                    # later windows end later: one from here is longer (one ending at a
                    # reading whose moment is known worse keeps the rate until it closes)
                    for _ in range(i):
                        self._readings.popleft()
                    break
            return self.rate
