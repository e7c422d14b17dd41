"""Helpers shared by the tiers of test_energy's tests."""

from __future__ import annotations

import time
import types

WATTS = 300.0


class _NotSupportedError(Exception):
    pass


def fake_pynvml(counter: bool = True, devices: int = 1) -> types.ModuleType:
    """NVML for ``devices`` GPUs each drawing ``WATTS``: the total energy counter (mJ since
    "driver load", 1 000 J before the run) where ``counter``, else NotSupported."""
    nv = types.ModuleType("pynvml")
    t0 = time.perf_counter()

    def energy_mj(h):
        if not counter:
            raise _NotSupportedError("Not Supported")
        return 1e6 + WATTS * (time.perf_counter() - t0) * 1000.0

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
    return nv
