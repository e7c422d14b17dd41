"""What the GPU itself counts, through NVML: GPM's SM, tensor-core, DRAM, PCIe and NVLink
activity (Hopper and newer) and the clocks' event reasons (every NVML GPU).

NVML's "utilisation" is the share of time in which any kernel ran: a loop of tiny kernels
on one SM reads 100 %. GPM (GPU Performance Monitoring) reads the counters DCGM's
``DCGM_FI_PROF_SM_ACTIVE``, ``PIPE_TENSOR_ACTIVE`` and ``DRAM_ACTIVE`` come from: a metric
is the difference of two samples of them, so ``Gpm`` keeps one sample per device as the
anchor and reads each metric over (anchor, now] once at least ``MIN_WINDOW_S`` has passed;
reads closer together leave the columns empty (NaN), never repeated. The sampler's own
thread takes the samples: the training thread never waits on them.

Columns (``i``: the device's index as the sampler names it): ``gpu{i}_sm_active_pct``,
``gpu{i}_sm_occupancy_pct``, ``gpu{i}_tensor_active_pct``, ``gpu{i}_dram_bw_pct``,
``gpu{i}_pcie_tx_bytes_per_s``, ``gpu{i}_pcie_rx_bytes_per_s`` and, on a device with an
NVLink, ``gpu{i}_nvlink_tx_bytes_per_s``, ``gpu{i}_nvlink_rx_bytes_per_s``: each the mean
over the window that ends at the sample, ``gpu{i}_gpm_window_s`` wide; ``gpu{i}_pcie_max_bytes_per_s``, the PCIe link's
bytes per second each way at its generation and width. ``gpu{i}_clock_reasons``: the bitmask of
``nvmlDeviceGetCurrentClocksEventReasons`` at the sample (``swift_nb.record.counters`` says
it in words) and ``gpu{i}_sm_clock_max_mhz``, the clock the SMs could run at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MIN_WINDOW_S = 0.1  # NVML's floor for a GPM window
MIB = 1024.0**2

#: column suffix → (NVML's GPM metric constant, scale into the column's unit)
METRICS: dict[str, tuple[str, float]] = {
    "sm_active_pct": ("NVML_GPM_METRIC_SM_UTIL", 1.0),
    "sm_occupancy_pct": ("NVML_GPM_METRIC_SM_OCCUPANCY", 1.0),
    "tensor_active_pct": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 1.0),
    "dram_bw_pct": ("NVML_GPM_METRIC_DRAM_BW_UTIL", 1.0),
    "pcie_tx_bytes_per_s": ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", MIB),
    "pcie_rx_bytes_per_s": ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", MIB),
}
NVLINK_METRICS: dict[str, tuple[str, float]] = {
    "nvlink_tx_bytes_per_s": ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", MIB),
    "nvlink_rx_bytes_per_s": ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", MIB),
}
#: every GPM column suffix, the NVLink ones last
GPM_SUFFIXES = (*METRICS, *NVLINK_METRICS)


@dataclass
class _Device:
    """One device's GPM state: where its samples come from and the anchor sample."""

    index: int
    handle: Any  # the handle to sample (a MIG device's parent GPU)
    gpu_instance: int | None  # a MIG device's GPU instance, sampled with nvmlGpmMigSampleGet
    metrics: dict[str, tuple[int, float]]  # column → (metric id, scale)
    anchor: Any
    spare: Any
    anchor_t: float | None = None
    pcie_max: float | None = None  # the link's bytes per second each way


class Gpm:
    """GPM metrics of the devices that support them (``open``), read by the sampler."""

    def __init__(self, nvml: Any, devices: list[_Device]) -> None:
        self._nvml = nvml
        self._devices = devices

    @classmethod
    def open(cls, nvml: Any, handles: dict[int, Any]) -> tuple[Gpm | None, str | None]:
        """A reader for the devices of ``handles`` whose driver supports GPM, and one note
        naming those that do not and why (None when every device does)."""
        devices, missing = [], []
        for i, h in handles.items():
            try:
                device, why = _open_device(nvml, i, h)
            except Exception as e:  # NotSupported on a vGPU, NoPermission under MIG, FunctionNotFound
                device, why = None, f"{type(e).__name__}: {e}"
            if device is None:
                missing.append(f"gpu{i} ({why})")
            else:
                devices.append(device)
        note = None
        if missing:
            note = (
                f"GPU performance counters (NVML GPM) unavailable on {', '.join(missing)}: SM activity, "
                "tensor-core activity, DRAM and PCIe bandwidth are not recorded there (GPM needs a Hopper or "
                "newer GPU and a driver that exposes it); utilisation, clocks and power still are"
            )
        return (cls(nvml, devices) if devices else None), note

    def read(self, t_s: float) -> dict[str, float]:
        """Each device's metrics over (its anchor, ``t_s``], where that window is long enough;
        raises what NVML raises (the sampler turns GPM off, with one note)."""
        row: dict[str, float] = {}
        for d in self._devices:
            if d.anchor_t is not None and t_s - d.anchor_t < MIN_WINDOW_S:
                continue
            self._sample(d, d.spare)
            if d.anchor_t is not None:
                row.update(self._metrics(d, d.anchor, d.spare))
                row[f"gpu{d.index}_gpm_window_s"] = t_s - d.anchor_t
                if d.pcie_max:
                    row[f"gpu{d.index}_pcie_max_bytes_per_s"] = d.pcie_max
            d.anchor, d.spare, d.anchor_t = d.spare, d.anchor, t_s
        return row

    def _sample(self, d: _Device, sample: Any) -> None:
        if d.gpu_instance is None:
            self._nvml.nvmlGpmSampleGet(d.handle, sample)
        else:
            self._nvml.nvmlGpmMigSampleGet(d.handle, d.gpu_instance, sample)

    def _metrics(self, d: _Device, first: Any, second: Any) -> dict[str, float]:
        nv = self._nvml
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(d.metrics)
        request.sample1, request.sample2 = first, second
        for k, (metric, _) in enumerate(d.metrics.values()):
            request.metrics[k].metricId = metric
        nv.nvmlGpmMetricsGet(request)
        out = {}
        for k, (column, (_, scale)) in enumerate(d.metrics.items()):
            m = request.metrics[k]
            if m.nvmlReturn == nv.NVML_SUCCESS:  # a metric this device lacks stays empty
                out[column] = float(m.value) * scale
        return out

    def close(self) -> None:
        for d in self._devices:
            for sample in (d.anchor, d.spare):
                try:
                    self._nvml.nvmlGpmSampleFree(sample)
                except Exception:
                    pass
        self._devices = []


def _open_device(nv: Any, index: int, handle: Any) -> tuple[_Device | None, str]:
    """GPM's state for one device, or (None, why not)."""
    parent, gpu_instance = handle, None
    if _is_mig(nv, handle):
        parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        gpu_instance = int(nv.nvmlDeviceGetGpuInstanceId(handle))
    if not nv.nvmlGpmQueryDeviceSupport(parent).isSupportedDevice:
        return None, f"{_name(nv, parent)} has no GPM: it needs a Hopper or newer GPU"
    metrics = {f"gpu{index}_{c}": (int(getattr(nv, m)), s) for c, (m, s) in METRICS.items()}
    if _has_nvlink(nv, parent):
        metrics.update({f"gpu{index}_{c}": (int(getattr(nv, m)), s) for c, (m, s) in NVLINK_METRICS.items()})
    pcie = _pcie_bytes_per_s(nv, parent)
    samples = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    return _Device(index, parent, gpu_instance, metrics, *samples, pcie_max=pcie), ""


#: PCIe's usable bytes per second per lane, by generation (128b/130b from gen 3 on)
PCIE_LANE_BYTES_PER_S = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}


def _pcie_bytes_per_s(nv: Any, handle: Any) -> float | None:
    """The device's PCIe link at its best, in bytes per second each way (None: unknown)."""
    try:
        gen = int(nv.nvmlDeviceGetMaxPcieLinkGeneration(handle))
        width = int(nv.nvmlDeviceGetMaxPcieLinkWidth(handle))
    except Exception:
        return None
    lane = PCIE_LANE_BYTES_PER_S.get(gen)
    return lane * width if lane and width > 0 else None


def _is_mig(nv: Any, handle: Any) -> bool:
    try:
        return bool(nv.nvmlDeviceIsMigDeviceHandle(handle))
    except Exception:  # a driver without MIG
        return False


def _has_nvlink(nv: Any, handle: Any) -> bool:
    """Whether any of the device's NVLinks is up (NotSupported on a card without them)."""
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if nv.nvmlDeviceGetNvLinkState(handle, link) == getattr(nv, "NVML_FEATURE_ENABLED", 1):
                return True
        except Exception:
            return False
    return False


def _name(nv: Any, handle: Any) -> str:
    try:
        name = nv.nvmlDeviceGetName(handle)
    except Exception:
        return "this GPU"
    return name.decode() if isinstance(name, bytes) else str(name)


class ClockReasons:
    """Why the clocks are where they are (power cap, thermal, HW slowdown, sync boost…),
    as NVML's bitmask, and the SM clock the device could run at; ``open`` returns None with
    a note where the driver gives neither."""

    def __init__(self, nvml: Any, handles: dict[int, Any], read: Any) -> None:
        self._nvml = nvml
        self._handles = handles
        self._read = read
        self._max_mhz: dict[int, float] = {}
        for i, h in handles.items():
            try:
                self._max_mhz[i] = float(nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM))
            except Exception:
                pass

    @classmethod
    def open(cls, nvml: Any, handles: dict[int, Any]) -> tuple[ClockReasons | None, str | None]:
        last = "no such function in this nvidia-ml-py"
        # the newer name first; drivers before 535 have only the older one
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            read = getattr(nvml, name, None)
            if read is None:
                continue
            try:
                for h in handles.values():
                    read(h)
            except Exception as e:
                last = f"{type(e).__name__}: {e}"
                continue
            return cls(nvml, handles, read), None
        return None, f"the clocks' throttle reasons are not readable ({last}); throttling is not recorded"

    def read(self) -> dict[str, float]:
        row: dict[str, float] = {}
        for i, h in self._handles.items():
            row[f"gpu{i}_clock_reasons"] = float(self._read(h))
            if i in self._max_mhz:
                row[f"gpu{i}_sm_clock_max_mhz"] = self._max_mhz[i]
        return row
