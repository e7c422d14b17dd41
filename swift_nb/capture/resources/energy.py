"""Energy, read by the sampler's thread (never on the step hook): each sample carries the
joules each GPU and the CPU packages took since the run's first sample, as cumulative
columns, so thinning the samples (``Sampler``'s decimation) loses no energy and a step's
joules are the column's difference across it (``swift_nb.record.write.step_energy_j``).

- ``gpu{i}_energy_j``: NVML's total energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
  millijoules since the driver loaded; Volta and later), read at each sample; a GPU without
  it (older, or a driver that refuses) gets its power (``gpu{i}_power_w``) integrated over
  the sampler's own readings instead, by the trapezoid rule, at the full sampling rate
  (before decimation).
- ``cpu_energy_j``: the CPU packages' RAPL counters (``/sys/class/powercap/intel-rapl:N``,
  microjoules, wrapping at ``max_energy_range_uj``), where this process may read them (root
  only on most kernels since 2020); otherwise the run's notes say so once.

Zeus (ml-energy) reads the same NVML counter, but per window on the caller's thread (with a
CUDA synchronize at each window's edges by default): per step, that is work on the training
thread the step hook does not do. Reading the counter from the sampler's thread gives the
same joules per step, interpolated between samples, at no cost to the step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

POWERCAP = Path("/sys/class/powercap")


class GpuEnergy:
    """Cumulative joules per GPU since the first ``read``: NVML's counter where the device
    has it, else its power integrated. ``handles``: NVML handles by the column's index."""

    def __init__(self, nvml: Any, handles: dict[int, Any]) -> None:
        self._nvml = nvml
        self._handles = handles
        self._start_mj: dict[int, float] = {}
        self._integrated: dict[int, tuple[float, float, float]] = {}  # i: (t_s, power_w, joules)
        for i, h in handles.items():
            try:
                self._start_mj[i] = float(nvml.nvmlDeviceGetTotalEnergyConsumption(h))
            except Exception:  # NVMLError_NotSupported before Volta, or a driver that refuses
                continue

    @property
    def integrated(self) -> list[int]:
        """The devices whose energy is their power integrated (no counter)."""
        return [i for i in self._handles if i not in self._start_mj]

    def note(self) -> str | None:
        """What the run's notes say about how its GPU energy is measured (None: every device
        has NVML's counter)."""
        if not self.integrated:
            return None
        which = ", ".join(f"gpu{i}" for i in self.integrated)
        return (
            f"{which}: NVML has no total energy counter here (it needs a Volta or later GPU); "
            "energy is the sampled power integrated over time, as exact as the sampling period"
        )

    def read(self, t_s: float, power_w: dict[int, float]) -> dict[str, float]:
        """``gpu{i}_energy_j`` at ``t_s`` (the sample's time, s) given the power just read."""
        out: dict[str, float] = {}
        for i, h in self._handles.items():
            if i in self._start_mj:
                now = float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h))
                out[f"gpu{i}_energy_j"] = (now - self._start_mj[i]) / 1000.0
                continue
            p = power_w.get(i)
            if p is None:
                continue
            last = self._integrated.get(i)
            joules = 0.0 if last is None else last[2] + (t_s - last[0]) * (p + last[1]) / 2.0
            self._integrated[i] = (t_s, p, joules)
            out[f"gpu{i}_energy_j"] = joules
        return out


class Rapl:
    """The CPU packages' cumulative joules since the first ``read``, from RAPL's counters
    (each package's ``energy_uj``, its wrap-around at ``max_energy_range_uj`` undone)."""

    def __init__(self, zones: list[tuple[Path, float]]) -> None:
        self._zones = zones  # (energy_uj file, its range in µJ)
        self._last = [self._uj(f) for f, _ in zones]
        self._total_uj = 0.0

    @classmethod
    def open(cls, root: Path | None = None) -> tuple[Rapl | None, str | None]:
        """A reader of every CPU package under ``root`` (default ``POWERCAP``); None and why
        where none is readable."""
        root = POWERCAP if root is None else root
        zones = []
        for zone in sorted(Path(root).glob("intel-rapl:*")):
            if zone.name.count(":") != 1:  # a package's subzones (core, uncore, dram) are inside it
                continue
            try:
                if not (zone / "name").read_text().startswith("package"):
                    continue
                (zone / "energy_uj").read_text()
                zones.append((zone / "energy_uj", float((zone / "max_energy_range_uj").read_text())))
            except (OSError, ValueError):
                return None, (
                    f"the CPU's energy (RAPL, {zone}/energy_uj) is not readable by this process "
                    "(root only on most kernels): cpu_energy_j is not recorded"
                )
        if not zones:
            return (
                None,
                "this machine exposes no RAPL counters (/sys/class/powercap): cpu_energy_j is not recorded",
            )
        return cls(zones), None

    @staticmethod
    def _uj(path: Path) -> float:
        return float(path.read_text())

    def read(self) -> dict[str, float]:
        """``cpu_energy_j``: joules of every package since the first read."""
        for k, (path, wrap) in enumerate(self._zones):
            now = self._uj(path)
            delta = now - self._last[k]
            self._total_uj += delta if delta >= 0 else delta + wrap
            self._last[k] = now
        return {"cpu_energy_j": self._total_uj / 1e6}
