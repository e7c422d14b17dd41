"""Energy (swift_nb.capture.resources.energy, the sampler's energy columns, the summary's energy keys).

This machine has no NVIDIA driver and no RAPL counters, so what it cannot produce is
injected: a fake ``pynvml`` whose counter and power follow a known law, and a powercap
folder in tmp_path. Everything after the readings (the sampler's thread, its decimation,
the summary, the per-step joules) is the real code. The GPU path is unverified on a GPU
here; ``scripts/gpu_check.py``'s energy check covers it on a lent one."""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pandas as pd
import pytest
from support.energy import WATTS, fake_pynvml, wait_for_rows

from swift_nb.capture.resources.energy import GpuEnergy, Rapl
from swift_nb.capture.resources.sampler import Sampler
from swift_nb.record import STEP_COLUMNS
from swift_nb.record.write import energy_summary, step_energy_j, summarize


def test_the_counter_gives_joules_since_the_first_read():
    now = [100.0]
    nv = fake_pynvml(clock=lambda: now[0])
    e = GpuEnergy(nv, {0: 0, 1: 1})
    assert e.integrated == [] and e.note() is None
    now[0] += 0.02
    row = e.read(0.0, {})
    assert row["gpu0_energy_j"] == pytest.approx(WATTS * 0.02, rel=1e-9)  # 20 ms of 300 W, not 1 000 J
    assert row["gpu0_energy_j"] < 1000.0 and set(row) == {"gpu0_energy_j", "gpu1_energy_j"}


def test_without_a_counter_power_is_integrated():
    e = GpuEnergy(fake_pynvml(counter=False), {0: 0})
    assert e.integrated == [0] and "integrated" in e.note()
    # the trapezoid rule is exact for power linear in time: 100 W → 300 W over 2 s is 400 J
    assert e.read(10.0, {0: 100.0}) == {"gpu0_energy_j": 0.0}
    assert e.read(11.0, {0: 200.0}) == {"gpu0_energy_j": 150.0}
    assert e.read(12.0, {0: 300.0}) == {"gpu0_energy_j": 400.0}


def _zone(root, name, label, uj, wrap=1e9):
    z = root / name
    z.mkdir()
    (z / "name").write_text(label + "\n")
    (z / "energy_uj").write_text(f"{int(uj)}\n")
    (z / "max_energy_range_uj").write_text(f"{int(wrap)}\n")
    return z


def test_rapl_sums_packages_and_undoes_the_wrap(tmp_path):
    p0 = _zone(tmp_path, "intel-rapl:0", "package-0", 999_000_000)
    p1 = _zone(tmp_path, "intel-rapl:1", "package-1", 5_000_000)
    _zone(tmp_path, "intel-rapl:0:0", "core", 1)  # a subzone: inside package-0's figure
    _zone(tmp_path, "intel-rapl:2", "psys", 1)  # the platform: not a package
    rapl, reason = Rapl.open(tmp_path)
    assert reason is None and rapl is not None
    (p0 / "energy_uj").write_text("2000000\n")  # wrapped at 1e9: 3 J
    (p1 / "energy_uj").write_text("7000000\n")  # 2 J
    assert rapl.read() == {"cpu_energy_j": pytest.approx(5.0)}


def test_rapl_unreadable_or_absent_says_so(tmp_path):
    z = _zone(tmp_path, "intel-rapl:0", "package-0", 1)
    (z / "energy_uj").unlink()
    (z / "energy_uj").mkdir()  # reading it fails as a root-only file fails for a user
    rapl, reason = Rapl.open(tmp_path)
    assert rapl is None and "not readable" in reason and "cpu_energy_j" in reason
    rapl, reason = Rapl.open(tmp_path / "nowhere")
    assert rapl is None and "no RAPL" in reason


def _steps(edges: list[float]) -> pd.DataFrame:
    rows = [
        (k, a, b, b - a, "none", "optimizer", 0.0, np.nan, np.nan, 0, 0.0)
        for k, (a, b) in enumerate(itertools.pairwise(edges))
    ]
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def test_joules_per_step_and_the_summary():
    # two GPUs: 100 W and 200 W, sampled every 0.5 s over 4 s; steps of 1, 1 and 1.5 s
    t = np.arange(0, 4.01, 0.5)
    samples = pd.DataFrame(
        {"t_s": t, "gpu0_energy_j": 100 * t, "gpu1_energy_j": 200 * t, "cpu_energy_j": 50 * t}
    )
    steps = _steps([0.25, 1.25, 2.25, 3.75])
    per_step = step_energy_j(steps, samples)
    assert per_step.tolist() == pytest.approx([300.0, 300.0, 450.0])
    s = energy_summary(steps, samples)
    assert s == {
        "energy_j": pytest.approx(1200.0),
        "avg_power_w": pytest.approx(300.0),
        "energy_per_step_j": pytest.approx(300.0),
        "cpu_energy_j": pytest.approx(200.0),
    }
    # a step outside the sampled span has no figure; a run without energy columns none at all
    assert step_energy_j(_steps([3.5, 4.5]), samples).isna().all()
    assert energy_summary(steps, samples[["t_s"]]) == {}
    assert "energy_j" not in summarize(steps, samples[["t_s"]].assign(kind="periodic"))


def test_the_sampler_records_cumulative_energy(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    notes: list[str] = []
    s = Sampler(0.005, lambda: 0, note=notes.append, max_samples=8)
    # NVML's only note: this device has no GPM (a pre-Hopper GPU); its energy counter is read
    nvml = [n for n in notes if "NVML" in n]
    assert len(nvml) == 1 and "(NVML GPM) unavailable on gpu0" in nvml[0]
    assert not any("gpu0_energy_j" in n or "no total energy counter" in n for n in notes)
    s.start()
    wait_for_rows(s, 4, at_least_s=0.15)
    s.stop()
    rows = pd.DataFrame(s.rows())
    energy = rows["gpu0_energy_j"].to_numpy()
    assert len(rows) <= 8 and np.all(np.diff(energy) >= 0) and energy[-1] > 0
    # decimated samples keep the whole run's joules: the counter is cumulative
    out = energy_summary(_steps([0.0, float(rows["t_s"].iloc[-1])]), rows)
    assert out["avg_power_w"] == pytest.approx(WATTS, rel=0.05)
    assert (rows["gpu0_power_w"] == WATTS).all()


def test_the_sampler_integrates_power_without_a_counter(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(counter=False))
    notes: list[str] = []
    s = Sampler(0.005, lambda: 0, note=notes.append)
    s.start()
    wait_for_rows(s, 3, at_least_s=0.05)
    s.stop()
    rows = pd.DataFrame(s.rows())
    assert any("no total energy counter" in n for n in notes)
    span = rows["t_s"].iloc[-1] - rows["t_s"].iloc[0]
    assert rows["gpu0_energy_j"].iloc[-1] == pytest.approx(WATTS * span, rel=1e-9)


def test_a_jobs_energy_is_every_ranks_gpu_summed():
    from swift_nb.capture.job import job_energy

    t = np.arange(0, 4.01, 0.5)
    steps = _steps([0.0, 1.0, 2.0, 3.0])

    def part(watts):
        return {"steps": steps, "samples": pd.DataFrame({"t_s": t, "gpu0_energy_j": watts * t})}

    out = job_energy(
        {0: part(100.0), 1: part(300.0), 2: {"steps": steps, "samples": pd.DataFrame({"t_s": t})}}
    )
    assert out == {
        "energy_ranks": 2,
        "energy_j": pytest.approx(1600.0),
        "avg_power_w": pytest.approx(400.0),
        "energy_per_step_j": pytest.approx(400.0),
    }
    assert job_energy({0: part(100.0)}) == {}  # one rank: its own figures are the job's


def test_only_the_gpus_the_run_allocated_on_count():
    t = np.arange(0, 2.01, 0.5)
    samples = pd.DataFrame(
        {
            "t_s": t,
            "gpu0_energy_j": 300 * t,
            "gpu1_energy_j": 60 * t,  # an idle GPU of the same machine
            "cuda0_allocated_bytes": 1e9,
            "cuda1_allocated_bytes": 0.0,
        }
    )
    assert energy_summary(_steps([0.0, 1.0]), samples)["avg_power_w"] == pytest.approx(300.0)
