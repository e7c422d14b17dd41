"""Helpers shared by the tiers of test_energy's tests."""

from __future__ import annotations

import threading
import time
import types

WATTS = 300.0


class _NotSupportedError(Exception):
    pass


def fake_pynvml(counter: bool = True, devices: int = 1, clock=time.perf_counter) -> types.ModuleType:
    """NVML for ``devices`` GPUs each drawing ``WATTS``: the total energy counter (mJ since
    "driver load", 1 000 J before the run) where ``counter``, else NotSupported; its time is
    ``clock``'s (a test's own clock makes the joules exact)."""
    nv = types.ModuleType("pynvml")
    t0 = clock()

    def energy_mj(h):
        if not counter:
            raise _NotSupportedError("Not Supported")
        return 1e6 + WATTS * (clock() - t0) * 1000.0

    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: devices
    nv.nvmlDeviceGetHandleByIndex = lambda j: j
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=90, memory=40)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=1 << 30, total=80 << 30)
    nv.NVML_CLOCK_SM, nv.NVML_TEMPERATURE_GPU = 0, 0
    nv.nvmlDeviceGetClockInfo = lambda h, kind: 1980
    nv.nvmlDeviceGetTemperature = lambda h, kind: 60
    nv.nvmlDeviceGetPowerUsage = lambda h: int(WATTS * 1000)
    nv.nvmlDeviceGetTotalEnergyConsumption = energy_mj
    # a GPU before Hopper: no GPM (tests/support/nvml.py has one with it); clocks unthrottled
    nv.nvmlDeviceGetName = lambda h: "NVIDIA A100-SXM4-80GB"
    nv.nvmlGpmQueryDeviceSupport = lambda h: types.SimpleNamespace(isSupportedDevice=0)
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0
    nv.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980
    return nv


class SamplerClock:
    """``time.perf_counter`` for a sampler (``Sampler(clock=...)``) that remembers, per thread,
    the moment it last returned: ``fake_pynvml(clock=c.last)`` then counts joules up to the
    sample's own timestamp, so that a thread preempted between its clock and the counter (a
    loaded machine) cannot skew the power the run computes."""

    def __init__(self) -> None:
        self._seen = threading.local()

    def __call__(self) -> float:
        self._seen.t = time.perf_counter()
        return self._seen.t

    def last(self) -> float:
        return getattr(self._seen, "t", None) or time.perf_counter()


def wait_for_rows(sampler, n: int, at_least_s: float = 0.0, limit_s: float = 30.0) -> None:
    """Until ``sampler`` holds ``n`` rows and ``at_least_s`` has passed: its thread runs at
    the lowest priority, so a loaded machine gives it no fixed number of rows per second."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        if len(sampler.rows()) >= n and time.monotonic() - start >= at_least_s:
            return
        time.sleep(0.005)
