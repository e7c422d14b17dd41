"""What the energy columns cost a sample: the sampler's own part of reading energy.

A sample is taken on the sampler's thread, never on the step hook; this measures how much
longer one sample (``Sampler._sample``) takes with energy than without, per source:

- ``none``: psutil only (this machine's sample with no NVML and no RAPL);
- ``nvml counter``: an NVML whose calls return at once (a stand-in: this machine has no
  driver) for one GPU: its seven columns, the counter read and differenced among them —
  swift_nb's own part; a real ``nvmlDeviceGetTotalEnergyConsumption`` adds the driver's
  call on top, as each of the six metrics NVML already reads per sample does (unmeasured
  here); ``GpuEnergy.read alone`` is the energy's share of that;
- ``nvml power integrated``: the same GPU without a counter, its power integrated;
- ``rapl``: two CPU packages' ``energy_uj`` files read (a powercap folder written in a
  temporary folder: the files' reads, not the kernel's RAPL MSR reads behind sysfs).

    python benchmarks/energy_reads.py [--samples 5000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from unittest import mock

import torch  # noqa: F401 - imported before sys.modules is patched: a C extension imports once

from swift_nb.capture.resources import energy
from swift_nb.capture.resources.sampler import Sampler


def fake_nvml(counter: bool) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    nv.nvmlInit = nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda j: j
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=90, memory=40)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=1 << 30, total=80 << 30)
    nv.NVML_CLOCK_SM = nv.NVML_TEMPERATURE_GPU = 0
    nv.nvmlDeviceGetClockInfo = lambda h, kind: 1980
    nv.nvmlDeviceGetTemperature = lambda h, kind: 60
    nv.nvmlDeviceGetPowerUsage = lambda h: 300_000

    def total_energy(h):
        if not counter:
            raise RuntimeError("Not Supported")
        return time.perf_counter_ns() // 1000

    nv.nvmlDeviceGetTotalEnergyConsumption = total_energy
    return nv


def powercap(root: Path) -> Path:
    for k in range(2):
        zone = root / f"intel-rapl:{k}"
        zone.mkdir()
        (zone / "name").write_text(f"package-{k}\n")
        (zone / "energy_uj").write_text("123456789\n")
        (zone / "max_energy_range_uj").write_text("262143328850\n")
    return root


def sample_us(n: int) -> float:
    """Median µs of one ``Sampler._sample`` (the thread not started: called here, n times)."""
    s = Sampler(None, lambda: 0)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        s._sample("periodic")
        times.append(time.perf_counter() - t0)
        if len(s._rows) > 1000:  # keep the buffer's decimation out of the figure
            s._rows.clear()
            s._unjournaled.clear()
    s.stop()
    return 1e6 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=5000)
    args = ap.parse_args()
    rows, alone = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = powercap(Path(tmp))
        nowhere = Path(tmp) / "nowhere"
        cases = [
            ("none", None, nowhere),
            ("nvml counter", fake_nvml(True), nowhere),
            ("nvml power integrated", fake_nvml(False), nowhere),
            ("rapl", None, root),
        ]
        for name, nv, cap in cases:
            modules = {"pynvml": nv} if nv is not None else {}
            # without a stand-in, the real pynvml: no driver here, so no NVML at all
            with mock.patch.dict(sys.modules, modules), mock.patch.object(energy, "POWERCAP", cap):
                rows.append((name, sample_us(args.samples)))
    for name, counter in (
        ("GpuEnergy.read alone, counter", True),
        ("GpuEnergy.read alone, integrated", False),
    ):
        reader = energy.GpuEnergy(fake_nvml(counter), {0: 0})
        times = []
        for k in range(args.samples):
            t0 = time.perf_counter()
            reader.read(float(k), {0: 300.0})
            times.append(time.perf_counter() - t0)
        alone.append((name, 1e6 * statistics.median(times)))
    base = rows[0][1]
    print(f"one sample, median of {args.samples} (µs); the last column: more than 'none'\n")
    print("source | µs per sample | more than 'none' (µs)")
    print("--- | --- | ---")
    for name, us in rows:
        print(f"{name} | {us:.1f} | {us - base:+.1f}")
    for name, us in alone:
        print(f"{name} | {us:.1f} | {us:+.1f}")


if __name__ == "__main__":
    main()
