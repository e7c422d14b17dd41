"""An NVML with the GPU performance counters (GPM) and the clocks' event reasons, for a
machine without an NVIDIA driver: ``fake_pynvml``'s device (tests/support/energy.py) plus
GPM built on the real ``pynvml`` package's ctypes structures, so that the code under test
fills and reads the very request it sends a real driver.

What it injects, per device: GPM's metrics by id (``COUNTERS``: a busy GPU whose SMs are
mostly idle: utilisation 90 %, SM activity 31 %, tensor cores 4 %), each metric's window
recorded (``Gpm.windows``); a clocks-event bitmask from ``reasons(t)``; and, on request,
GPM unsupported, an error from the n-th GPM read on, or a MIG device."""

from __future__ import annotations

import ctypes
import time
import types
from collections.abc import Callable

import pynvml as real

from support.energy import fake_pynvml

MIB = 1024.0**2
#: GPM metric id → value (% or MiB/s)
COUNTERS = {
    real.NVML_GPM_METRIC_SM_UTIL: 31.0,
    real.NVML_GPM_METRIC_SM_OCCUPANCY: 18.0,
    real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 4.0,
    real.NVML_GPM_METRIC_DRAM_BW_UTIL: 12.0,
    real.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 100.0,
    real.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 2000.0,
    real.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 5000.0,
    real.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 6000.0,
}
NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED, a metric's own return code


class NVMLError(Exception):
    pass


class Gpm:
    """The fake GPM's state: each sample's time by address, and the windows read."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.taken: dict[int, float] = {}
        self.windows: list[tuple[float, float]] = []
        self.reads = 0
        self.mig = 0  # samples taken through nvmlGpmMigSampleGet
        self._keep: list[ctypes.c_int] = []

    def alloc(self) -> object:
        cell = ctypes.c_int(len(self._keep))
        self._keep.append(cell)
        return ctypes.cast(ctypes.pointer(cell), real.c_nvmlGpmSample_t)

    @staticmethod
    def address(sample: object) -> int:
        return int(ctypes.cast(sample, ctypes.c_void_p).value or 0)


def fake_gpm_nvml(
    gpm: bool = True,
    fail_from_read: int | None = None,
    reasons: Callable[[float], int] = lambda t: 0,
    nvlink: bool = False,
    mig: bool = False,
    counters: dict[int, float] | None = None,
    devices: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> types.ModuleType:
    """``fake_pynvml`` with GPM (``gpm``: supported; ``fail_from_read``: GPM's n-th metrics
    read and those after raise), the clocks' ``reasons`` at time t (s since the fake was
    made), NVLink up or not and MIG devices or not; ``nv.gpm`` holds GPM's state."""
    nv = fake_pynvml(devices=devices, clock=clock)
    state = Gpm(clock)
    t0 = clock()
    values = dict(COUNTERS if counters is None else counters)
    nv.gpm = state
    nv.NVMLError = NVMLError
    nv.NVML_SUCCESS = real.NVML_SUCCESS
    nv.NVML_FEATURE_ENABLED = real.NVML_FEATURE_ENABLED
    nv.NVML_NVLINK_MAX_LINKS = real.NVML_NVLINK_MAX_LINKS
    nv.c_nvmlGpmMetricsGet_t = real.c_nvmlGpmMetricsGet_t
    nv.NVML_GPM_METRICS_GET_VERSION = real.NVML_GPM_METRICS_GET_VERSION
    for name in dir(real):
        if name.startswith("NVML_GPM_METRIC_"):
            setattr(nv, name, getattr(real, name))
    nv.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    nv.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980
    nv.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5
    nv.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    # the SMs run at 1 400 MHz while a limiting reason holds them down
    nv.nvmlDeviceGetClockInfo = lambda h, kind: 1400 if reasons(clock() - t0) & 0xFC else 1980
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: int(reasons(clock() - t0))

    def support(h):
        if gpm == "raises":
            raise NVMLError("Not Supported")
        return types.SimpleNamespace(isSupportedDevice=int(bool(gpm)))

    def sample_get(h, sample):
        state.taken[Gpm.address(sample)] = clock()
        return sample

    def metrics_get(request):
        state.reads += 1
        if fail_from_read is not None and state.reads >= fail_from_read:
            raise NVMLError("GPU is lost")
        a, b = state.taken[Gpm.address(request.sample1)], state.taken[Gpm.address(request.sample2)]
        state.windows.append((a, b))
        for k in range(request.numMetrics):
            m = request.metrics[k]
            if m.metricId in values and (nvlink or m.metricId not in (60, 61)):
                m.value, m.nvmlReturn = values[m.metricId], real.NVML_SUCCESS
            else:
                m.nvmlReturn = NOT_SUPPORTED
        return request

    def nvlink_state(h, link):
        if not nvlink:
            raise NVMLError("Not Supported")
        return real.NVML_FEATURE_ENABLED

    nv.nvmlGpmQueryDeviceSupport = support
    nv.nvmlGpmSampleAlloc = state.alloc
    nv.nvmlGpmSampleFree = lambda sample: None
    nv.nvmlGpmSampleGet = sample_get
    nv.nvmlGpmMigSampleGet = lambda h, gi, sample: (
        setattr(state, "mig", state.mig + 1),
        sample_get(h, sample),
    )[1]
    nv.nvmlGpmMetricsGet = metrics_get
    nv.nvmlDeviceGetNvLinkState = nvlink_state
    nv.nvmlDeviceIsMigDeviceHandle = lambda h: mig
    nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle = lambda h: h
    nv.nvmlDeviceGetGpuInstanceId = lambda h: 1
    return nv
