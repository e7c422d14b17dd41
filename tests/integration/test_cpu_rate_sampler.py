"""The sampler's process CPU on a real run: threads that keep every allowed core busy,
sampled about every 2 ms (shorter than the CPU times' 10 ms tick) both from the sampler's
thread, at the lowest priority, and at each "step" on the caller's (as ``monitor`` does),
read through ``time.process_time`` and through the tick-counted times of ``/proc``
(psutil). No sample is above what the process's cores can do, and the samples' mean
agrees with the CPU time the process took over the same span."""

from __future__ import annotations

import hashlib
import math
import os
import statistics
import threading
import time

import psutil
import pytest
from support.energy import wait_for_rows

from swift_nb.capture.resources.rate import allowed_cores
from swift_nb.capture.resources.sampler import Sampler


def _busy(threads: int, seconds: float, sampler: Sampler) -> None:
    """``threads`` threads hashing (hashlib lets go of the GIL on large buffers) while this
    one takes a sample every 2 ms."""
    data = os.urandom(1 << 20)
    end = time.perf_counter() + seconds

    def work() -> None:
        while time.perf_counter() < end:
            hashlib.sha256(data).digest()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    while time.perf_counter() < end:
        sampler.on_step(sync=True)
        time.sleep(0.002)
    for w in workers:
        w.join()


def _tick_counted() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


@pytest.mark.parametrize(
    "counter",
    [
        {},
        # user and system each count whole ticks: their sum is off by up to two
        {"cpu_s": _tick_counted, "cpu_resolution_s": 2 / os.sysconf("SC_CLK_TCK")},
    ],
    ids=["process_time", "proc_ticks"],
)
def test_cpu_never_exceeds_the_cores_and_averages_what_the_process_took(counter):
    cores = allowed_cores()
    s = Sampler(0.002, lambda: 0, monitor_gpu=False, **counter)
    origin = time.perf_counter()
    s.start(origin)
    wait_for_rows(s, 2)
    t0, cpu0 = time.perf_counter(), time.process_time()
    _busy(cores + 1, 1.0, s)
    t1, cpu1 = time.perf_counter(), time.process_time()
    s.stop()
    rows = s.rows()
    cpu = [r["cpu_pct"] for r in rows if not math.isnan(r["cpu_pct"])]
    assert len(cpu) > 50
    assert max(cpu) <= 100.0 * cores
    assert min(cpu) >= 0.0
    # the samples whose window lay within the busy span (windows last at least 50 ms)
    start, end = t0 - origin + 0.25, t1 - origin
    busy = [r["cpu_pct"] for r in rows if start <= r["t_s"] <= end and not math.isnan(r["cpu_pct"])]
    took = 100.0 * (cpu1 - cpu0) / (t1 - t0)
    assert len(busy) >= 20
    assert statistics.fmean(busy) == pytest.approx(took, abs=0.15 * 100.0 * cores)
