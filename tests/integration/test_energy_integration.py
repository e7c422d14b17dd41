"""Energy (swift_nb.capture.resources.energy, the sampler's energy columns, the summary's energy keys).

This machine has no NVIDIA driver and no RAPL counters, so what it cannot produce is
injected: a fake ``pynvml`` whose counter and power follow a known law, and a powercap
folder in tmp_path. Everything after the readings (the sampler's thread, its decimation,
the summary, the per-step joules) is the real code. The GPU path is unverified on a GPU
here; ``scripts/gpu_check.py``'s energy check covers it on a lent one."""

from __future__ import annotations

import sys

import pandas as pd
import pytest
from support.energy import WATTS, fake_pynvml


def test_a_profiled_run_has_energy_per_step(monkeypatch, runs_dir):
    from support.common import train

    import swift_nb

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    with swift_nb.profile(out_dir=runs_dir, interval_ms=5, price_per_kwh=0.5, report=False) as run:
        train(8)
    s = run.summary
    assert s["energy_j"] > 0 and s["energy_per_step_j"] > 0
    # the sampler reads its clock and the counter at two moments: a thread preempted between
    # them under load skews a run of a fraction of a second (262 W for 300 once in CI)
    assert s["avg_power_w"] == pytest.approx(WATTS, rel=0.25)
    assert s["energy_cost_usd"] == pytest.approx(s["energy_j"] / 3.6e6 * 0.5)
    saved = pd.read_csv(run.path / "samples.csv")
    assert saved["gpu0_energy_j"].is_monotonic_increasing
