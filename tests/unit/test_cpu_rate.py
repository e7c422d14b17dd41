"""The process CPU rate (``swift_nb.capture.resources.rate``, the sampler's ``cpu_pct``):
never above what the process's cores can do, and right on average, when its counter moves
in clock ticks and samples come closer together than a tick.

The process and its clock are simulated: a process busy on a known number of cores whose
CPU time is read in 10 ms ticks, and, as fault injection, a sampler thread descheduled
between reading the counter and reading the clock (what a loaded machine does to a thread
at the lowest priority). The demo that showed "565 %" on 2 cores had both."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from swift_nb.capture.resources.rate import WindowedRate, allowed_cores
from swift_nb.capture.resources.sampler import Sampler

TICK_S = 0.01


class Process:
    """A process busy on ``busy`` cores from t = 0, its CPU time counted in whole ticks;
    ``slip_s``: how long the reader is descheduled after reading the counter, on every
    ``slip_every``-th read (0: never)."""

    def __init__(self, busy: float, slip_every: int = 0, slip_s: float = 0.0) -> None:
        self.t = 0.0
        self.busy = busy
        self.slip_every = slip_every
        self.slip_s = slip_s
        self.reads = 0

    def clock(self) -> float:
        return self.t

    def cpu_s(self) -> float:
        value = math.floor(self.busy * self.t / TICK_S + 1e-9) * TICK_S
        self.reads += 1
        if self.slip_every and self.reads % self.slip_every == 0:
            self.t += self.slip_s
        return value


def _gaps(n: int, seed: int = 0) -> list[float]:
    """Intervals between samples: mostly shorter than a tick (5.8 ms as in the demo), some longer."""
    rng = random.Random(seed)
    return [rng.choice([0.0058, 0.0058, 0.001, 0.003, 0.012, 0.1]) for _ in range(n)]


@pytest.mark.parametrize("busy", [0.3, 1.5, 2.0])
def test_tick_counted_cpu_at_short_intervals_stays_within_the_cores_and_right_on_average(busy):
    proc = Process(busy)
    rate = WindowedRate(resolution=TICK_S, max_rate=2.0)
    values = []
    for gap in _gaps(3000):
        proc.t += gap
        values.append(rate.read(proc.clock, proc.cpu_s))
    read = [v for v in values if not math.isnan(v)]
    assert len(read) > 0.95 * len(values)
    assert max(read) <= 2.0
    # each window is long enough that a tick is at most 5 % of what 2 cores can do
    assert all(abs(v - busy) <= 0.05 * 2.0 + 1e-9 for v in read)
    assert statistics.fmean(read) == pytest.approx(busy, abs=0.02)


def test_a_reader_descheduled_between_counter_and_clock_reads_no_spike():
    # every 7th read, the reader loses 200 ms between the counter and the clock: the
    # counter's moment is then known only to within 200 ms
    proc = Process(busy=1.5, slip_every=7, slip_s=0.2)
    rate = WindowedRate(resolution=TICK_S, max_rate=2.0)
    values = []
    for gap in _gaps(2000, seed=1):
        proc.t += gap
        values.append(rate.read(proc.clock, proc.cpu_s))
    read = [v for v in values if not math.isnan(v)]
    assert max(read) <= 2.0
    assert all(abs(v - 1.5) <= 0.05 * 2.0 + 1e-9 for v in read)
    assert statistics.fmean(read) == pytest.approx(1.5, abs=0.02)


def test_the_windows_are_long_enough_for_the_counters_resolution():
    rate = WindowedRate(resolution=TICK_S, max_rate=2.0)
    assert rate.window_s(0.0, 0.0) == pytest.approx(20 * TICK_S / 2.0)  # a tick: 5 % of 2 cores
    assert rate.window_s(0.0, 0.2) == pytest.approx(20 * (TICK_S / 2.0 + 0.1))
    exact = WindowedRate(resolution=1e-9, max_rate=2.0)
    assert exact.window_s(0.0, 0.0) == pytest.approx(0.05)  # never shorter than MIN_WINDOW_S


def test_readings_out_of_order_change_nothing():
    rate = WindowedRate(resolution=1e-9, max_rate=4.0)
    assert math.isnan(rate.add(0.0, 0.0, 0.0))
    assert rate.add(0.1, 0.1, 0.1) == pytest.approx(1.0)
    # another thread's reading, taken before the last one, lands after it
    assert rate.add(0.05, 0.9, 0.05) == pytest.approx(1.0)
    assert rate.add(0.2, 0.2, 0.2) == pytest.approx(1.0)


def test_the_sampler_cpu_column_with_a_tick_counter_and_a_descheduled_thread():
    """The sampler's own reads (the injected clock and counter), sampled at each step as a
    ``monitor`` does (``on_step(sync=True)``), every 5th counter read descheduled 150 ms."""
    proc = Process(busy=1.8, slip_every=5, slip_s=0.15)
    s = Sampler(
        None,
        lambda: 0,
        monitor_gpu=False,
        clock=proc.clock,
        cpu_s=proc.cpu_s,
        cpu_resolution_s=TICK_S,
        cores=2,
    )
    for gap in _gaps(1500, seed=2):
        proc.t += gap
        s.on_step(sync=True)
    s.stop()
    cpu = [r["cpu_pct"] for r in s.rows() if not math.isnan(r["cpu_pct"])]
    assert len(cpu) > 1400
    assert max(cpu) <= 200.0
    assert statistics.fmean(cpu) == pytest.approx(180.0, abs=2.0)


def test_allowed_cores_is_the_affinity_where_there_is_one():
    import os

    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert allowed_cores() == expected
