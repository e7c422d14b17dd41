"""Resource sampler: one background thread reading psutil, NVML, RAPL and torch's CUDA
allocator; each sample's energy columns are cumulative (``swift_nb.capture.resources.energy``),
its process CPU a rate over a window long enough to be read (``swift_nb.capture.resources.rate``).

It samples every ``interval_s`` and once more soon after each step boundary (the step hook
only sets a flag, so the training thread never pays for a sample). Rows are kept in a
bounded buffer: when it holds ``max_samples`` rows, every second row is dropped and the
periodic stride doubles, so a run of any length keeps at most ``max_samples`` rows spread
evenly over the whole run (decimation, not a ring buffer: the start of a long run stays
visible).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from swift_nb.capture.resources.energy import GpuEnergy, Rapl
from swift_nb.capture.resources.gpm import ClockReasons, Gpm
from swift_nb.capture.resources.rate import WindowedRate, allowed_cores
from swift_nb.capture.resources.rss import RssReader
from swift_nb.record import SAMPLE_COLUMNS

DEFAULT_MAX_SAMPLES = 20_000


class NvmlReader:
    """Per-device GPU metrics through NVML (the ``nvidia-ml-py`` package).

    ``open()`` returns None and a reason when NVML is unavailable, else a reader whose
    ``notes`` say what it cannot read (no energy counter, no GPM, no clock reasons), one
    note each; a reader that fails mid-run is disabled by its owner, with one note, and a
    part of it that fails (GPM, the clock reasons) is left in ``failed`` for its owner to say.
    """

    def __init__(self, nvml: Any, handles: dict[int, Any]) -> None:
        self._nvml = nvml
        self._handles = handles
        self.energy = GpuEnergy(nvml, handles)
        self.notes: list[str] = []  # the parts the driver does not give, said once at open
        self.failed: list[str] = []  # the parts that failed mid-run, for the owner to say once
        self.gpm, note = Gpm.open(nvml, handles)
        self.clocks, note_2 = ClockReasons.open(nvml, handles)
        self.notes += [n for n in (self.energy.note(), note, note_2) if n]

    @classmethod
    def open(cls, cuda_indices: list[int]) -> tuple[NvmlReader | None, str | None]:
        """A reader for torch's CUDA devices ``cuda_indices``, or, when torch sees no
        CUDA device, for every NVML device (columns then use NVML's indices)."""
        try:
            import pynvml

            pynvml.nvmlInit()
            if cuda_indices:
                handles = {i: _nvml_handle(pynvml, i) for i in cuda_indices}
            else:
                handles = {
                    j: pynvml.nvmlDeviceGetHandleByIndex(j) for j in range(pynvml.nvmlDeviceGetCount())
                }
        except Exception as e:  # NVMLError_LibraryNotFound and friends, no driver, no GPU
            return None, (
                f"NVML unavailable ({type(e).__name__}: {e}): GPU utilisation, clocks, "
                "temperature and power are not recorded; CPU and memory are still sampled."
            )
        if not handles:
            pynvml.nvmlShutdown()
            return None, None
        return cls(pynvml, handles), None  # what it cannot read: its ``notes``

    def read(self, t_s: float) -> dict[str, float]:
        """Every device's metrics, and its cumulative energy at ``t_s`` (the sample's time)."""
        nv = self._nvml
        row: dict[str, float] = {}
        for i, h in self._handles.items():
            util = nv.nvmlDeviceGetUtilizationRates(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            row[f"gpu{i}_util_pct"] = float(util.gpu)
            row[f"gpu{i}_mem_util_pct"] = float(util.memory)
            row[f"gpu{i}_mem_used_bytes"] = float(mem.used)
            row[f"gpu{i}_mem_total_bytes"] = float(mem.total)
            row[f"gpu{i}_sm_clock_mhz"] = float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
            row[f"gpu{i}_temp_c"] = float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
            row[f"gpu{i}_power_w"] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        row.update(self.energy.read(t_s, {i: row[f"gpu{i}_power_w"] for i in self._handles}))
        if self.clocks is not None:
            row.update(self._optional("clocks", lambda: self.clocks.read(), t_s))
        if self.gpm is not None:
            row.update(self._optional("gpm", lambda: self.gpm.read(t_s), t_s))
        return row

    def _optional(self, part: str, read: Callable[[], dict[str, float]], t_s: float) -> dict[str, float]:
        """A part that fails mid-run is read no more, with one note; the other columns go on."""
        try:
            return read()
        except Exception as e:
            what = {"gpm": "the GPU performance counters (GPM)", "clocks": "the clocks' throttle reasons"}[
                part
            ]
            self.failed.append(
                f"{what} failed mid-run ({type(e).__name__}: {e}); they stop at t={t_s:.1f}s, "
                "utilisation, clocks and power go on"
            )
            if part == "gpm" and self.gpm is not None:
                self.gpm.close()
            setattr(self, part, None)
            return {}

    def close(self) -> None:
        if self.gpm is not None:
            self.gpm.close()
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass


def _nvml_handle(pynvml: Any, cuda_index: int) -> Any:
    """The NVML handle of torch's CUDA device ``cuda_index`` (matched by UUID: NVML
    ignores CUDA_VISIBLE_DEVICES, so index i in torch is not index i in NVML)."""
    import torch

    uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
    for j in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(j)
        nv_uuid = pynvml.nvmlDeviceGetUUID(h)
        nv_uuid = nv_uuid.decode() if isinstance(nv_uuid, bytes) else nv_uuid
        if nv_uuid.removeprefix("GPU-") == uuid.removeprefix("GPU-"):
            return h
    return pynvml.nvmlDeviceGetHandleByIndex(cuda_index)


def cuda_devices_to_watch() -> list[int]:
    """torch CUDA device indices this process uses: its current device when running as
    one rank of a job, otherwise every visible device."""
    import torch

    if not torch.cuda.is_available():
        return []
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or (
        torch.distributed.is_available() and torch.distributed.is_initialized()
    ):
        return [torch.cuda.current_device()]
    return list(range(torch.cuda.device_count()))


class Sampler:
    """Background sampling of process, machine and device resources.

    ``step_of`` returns the step in progress (called from the sampler thread); ``note``
    receives a message once when a source fails. ``clock`` (s) times the samples; the
    process CPU is ``cpu_s`` (the process's CPU seconds, all threads, counted in steps of
    ``cpu_resolution_s``; default ``time.process_time`` and its clock's resolution) over
    windows of ``clock``, at most ``cores`` (default ``allowed_cores()``) × 100 %.
    """

    def __init__(
        self,
        interval_s: float | None,
        step_of: Callable[[], int],
        rank: int = 0,
        monitor_gpu: bool = True,
        note: Callable[[str], None] = lambda msg: None,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        clock: Callable[[], float] = time.perf_counter,
        cpu_s: Callable[[], float] = time.process_time,
        cpu_resolution_s: float | None = None,
        cores: int | None = None,
    ) -> None:
        if interval_s is not None and interval_s <= 0:
            raise ValueError(f"interval must be positive; got {interval_s}")
        if max_samples < 2:
            raise ValueError(f"max_samples must be at least 2; got {max_samples}")
        self.interval_s = interval_s
        self._step_of = step_of
        self._rank = rank
        self._note = note
        self._max = max_samples
        self._clock = clock
        self._t0 = clock()
        self._rows: list[dict[str, Any]] = []
        self._unjournaled: list[dict[str, Any]] = []  # every sample, until the journal takes it
        self._stride = 1  # keep one periodic sample in `_stride`
        self._tick = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._step_pending = False
        self._thread: threading.Thread | None = None
        self._rss = RssReader()
        self._cpu_s = cpu_s
        if cpu_resolution_s is None:
            cpu_resolution_s = time.get_clock_info("process_time").resolution
        self._cpu = WindowedRate(cpu_resolution_s, float(cores or allowed_cores()))
        self._cuda = cuda_devices_to_watch() if monitor_gpu else []
        self._nvml, reason = NvmlReader.open(self._cuda) if monitor_gpu else (None, None)
        for said in [reason] if reason else self._nvml.notes if self._nvml is not None else []:
            note(said)
        self._rapl, reason = Rapl.open()
        if reason:
            note(reason)

    def start(self, t0: float | None = None) -> None:
        if t0 is not None:
            self._t0 = t0
        self._thread = threading.Thread(target=self._loop, name="swift_nb-sampler", daemon=True)
        self._thread.start()

    def on_step(self, sync: bool = False) -> None:
        """A sample for this step boundary: by default the thread takes it soon after
        (cheap for the caller; boundaries closer together than one sample coalesce);
        ``sync`` takes it now, on the caller's thread."""
        if sync:
            self._sample("step")
            return
        self._step_pending = True
        self._wake.set()

    def stop(self) -> None:
        """Stop the thread, after one final sample. Safe to call twice."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._sample("step")
        self._rss.close()
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._rows)

    def drain(self) -> list[dict[str, Any]]:
        """Samples taken since the last call (for the journal; not thinned)."""
        with self._lock:
            rows, self._unjournaled = self._unjournaled, []
        return rows

    def latest(self) -> dict[str, Any] | None:
        """The newest sample (not a copy: read it, don't change it), or None."""
        with self._lock:
            return self._rows[-1] if self._rows else None

    def _loop(self) -> None:
        # Lowest priority for this thread only (Linux threads are tasks): on a machine
        # whose cores all run the training's intra-op threads, a sample waits for a
        # gap instead of preempting a worker the others spin-wait on.
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        self._sample("periodic")
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._step_pending:
                self._step_pending = False
                self._sample("step")
            else:
                self._tick += 1
                if self._tick % self._stride == 0:
                    self._sample("periodic")

    def _read_counters(self, row: dict[str, Any]) -> None:
        """The energy counters (RAPL's, then NVML's with the GPUs' other metrics) into ``row``;
        a source that fails is noted once and read no more."""
        if self._rapl is not None:
            try:
                row.update(self._rapl.read())
            except (OSError, ValueError) as e:
                self._note(f"RAPL failed mid-run ({e}); cpu_energy_j stops at t={row['t_s']:.1f}s")
                self._rapl = None
        if self._nvml is not None:
            try:
                row.update(self._nvml.read(row["t_s"]))
                while self._nvml.failed:
                    self._note(self._nvml.failed.pop(0))
            except Exception as e:
                self._note(
                    f"NVML failed mid-run ({type(e).__name__}: {e}); GPU metrics stop at "
                    f"t={row['t_s']:.1f}s, the run continues without them"
                )
                self._nvml.close()
                self._nvml = None

    def _sample(self, kind: str) -> None:
        row: dict[str, Any] = dict.fromkeys(SAMPLE_COLUMNS, math.nan)  # missing reads stay NaN
        row.update(t_s=self._clock() - self._t0, kind=kind, step=self._step_of(), rank=self._rank)
        self._read_counters(row)  # next to the timestamp: energy over time is their ratio
        row["cpu_pct"] = 100.0 * self._cpu.read(self._clock, self._cpu_s)
        try:
            row["rss_bytes"] = self._rss()
            vm = psutil.virtual_memory()
            row["sys_mem_used_bytes"] = vm.total - vm.available
            row["sys_mem_pct"] = vm.percent
        except psutil.Error as e:
            self._note(f"psutil sampling failed once ({e}); values missing in that sample")
        if self._cuda:
            import torch

            for i in self._cuda:
                row[f"cuda{i}_allocated_bytes"] = torch.cuda.memory_allocated(i)
                row[f"cuda{i}_reserved_bytes"] = torch.cuda.memory_reserved(i)
        with self._lock:
            self._rows.append(row)
            self._unjournaled.append(row)
            if len(self._rows) >= self._max:
                self._rows = self._rows[::2]
                self._stride *= 2
