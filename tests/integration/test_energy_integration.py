"""Energy (swift_nb.capture.resources.energy, the sampler's energy columns, the summary's energy keys).

This machine has no NVIDIA driver and no RAPL counters, so what it cannot produce is
injected: a fake ``pynvml`` whose counter and power follow a known law, and a powercap
folder in tmp_path. Everything after the readings (the sampler's thread, its decimation,
the summary, the per-step joules) is the real code. The GPU path is unverified on a GPU
here; ``scripts/gpu_check.py``'s energy check covers it on a lent one."""

from __future__ import annotations

import functools
import sys

import pandas as pd
import pytest
from support.energy import WATTS, SamplerClock, fake_pynvml


def test_a_profiled_run_has_energy_per_step(monkeypatch, runs_dir):
    from support.common import train

    import swift_nb
    from swift_nb.capture import session
    from swift_nb.capture.resources.sampler import Sampler

    # the counter counts up to each sample's own timestamp (the sampler reads its counters
    # next to it): the run's average power is then exact, however loaded the machine
    clock = SamplerClock()
    monkeypatch.setattr(session, "Sampler", functools.partial(Sampler, clock=clock))
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(clock=clock.last))
    with swift_nb.profile(out_dir=runs_dir, interval_ms=5, price_per_kwh=0.5, report=False) as run:
        train(8)
    s = run.summary
    assert s["energy_j"] > 0 and s["energy_per_step_j"] > 0
    assert s["avg_power_w"] == pytest.approx(WATTS, rel=1e-9)
    assert s["energy_cost_usd"] == pytest.approx(s["energy_j"] / 3.6e6 * 0.5)
    saved = pd.read_csv(run.path / "samples.csv")
    assert saved["gpu0_energy_j"].is_monotonic_increasing
