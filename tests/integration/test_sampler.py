"""The resource sampler: NVML absent or failing, bounded memory, step tags."""

from __future__ import annotations

import time

import pynvml
import pytest
from support.common import train

import swift_nb
from swift_nb.capture.resources import sampler as sampler_mod
from swift_nb.capture.resources.sampler import Sampler


def test_nvml_absent_is_noted_once_and_cpu_series_remain(runs_dir):
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()  # this machine has no NVIDIA driver
    with swift_nb.profile(out_dir=runs_dir, interval_ms=10) as run:
        train(5)
        time.sleep(0.05)
    nvml_notes = [n for n in run.notes if "NVML" in n]
    assert len(nvml_notes) == 1
    assert nvml_notes[0].startswith("NVML unavailable (NVMLError_LibraryNotFound")
    assert nvml_notes[0].endswith(
        "GPU utilisation, clocks, temperature and power are not recorded; CPU and memory are still sampled."
    )
    assert run.samples["cpu_pct"].notna().sum() >= 2
    assert run.samples["rss_bytes"].notna().all()
    assert not any(c.startswith("gpu") for c in run.samples.columns)


class _FailingNvml:
    """Fault injection: an NVML reader that works twice, then errors."""

    def __init__(self) -> None:
        self.calls = 0
        self.notes: list[str] = []  # what NvmlReader could not read at open: nothing
        self.failed: list[str] = []  # NvmlReader's parts that failed (none: the whole reader fails)

    def read(self, t_s):
        self.calls += 1
        if self.calls > 2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return {"gpu0_util_pct": 50.0}

    def close(self) -> None:
        pass


def test_nvml_failing_mid_run_is_noted_and_sampling_continues(monkeypatch):
    monkeypatch.setattr(sampler_mod.NvmlReader, "open", classmethod(lambda cls, idx: (_FailingNvml(), None)))
    notes = []
    s = Sampler(0.005, lambda: 0, note=notes.append)
    s.start()
    # rows from a thread at the lowest priority: wait for them, not for a fixed time
    deadline = time.monotonic() + 30
    while len(s.rows()) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    s.stop()
    rows = s.rows()
    nvml = [n for n in notes if "NVML" in n]
    assert len(nvml) == 1 and "NVML failed mid-run" in nvml[0]
    assert sum(r.get("gpu0_util_pct") == 50.0 for r in rows) == 2
    assert len(rows) > 4 and all(r["rss_bytes"] for r in rows)


def test_memory_stays_bounded_and_covers_the_whole_run():
    step = [0]
    s = Sampler(0.0005, lambda: step[0], max_samples=64)
    s.start()
    t_end = time.perf_counter() + 0.6
    while time.perf_counter() < t_end:
        step[0] += 1
        s.on_step()
        time.sleep(0.0002)
    s.stop()
    rows = s.rows()
    assert len(rows) <= 64
    t = [r["t_s"] for r in rows]
    assert t == sorted(t)
    assert t[0] < 0.05 and t[-1] > 0.5, "decimation must keep the start and the end of the run"
    steps = [r["step"] for r in rows]
    assert steps == sorted(steps) and steps[-1] > 0


def test_every_sample_carries_a_step_and_a_rank(runs_dir):
    with swift_nb.profile(out_dir=runs_dir, interval_ms=5) as run:
        train(6)
    assert run.samples["step"].notna().all() and run.samples["rank"].eq(0).all()
    assert set(run.samples["kind"]) <= {"periodic", "step"}
    assert (run.samples["kind"] == "step").any()
