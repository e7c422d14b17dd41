"""Helpers shared by the tiers of test_export's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from swift_nb.record import (
    MEMORY_COLUMNS,
    REPORT_FILE,
    STEP_COLUMNS,
    TRACE_FILE,
    Run,
    save,
    summarize,
)


@pytest.fixture
def run(tmp_path) -> Run:
    """A saved run of 30 steps with GPU energy samples, memory by category, a price, and a
    report and trace beside it (the trace's content is not read: it is an artifact here)."""
    return _saved_run(tmp_path, 30)


def _saved_run(tmp_path: Path, n: int) -> Run:
    dur = np.full(n, 0.1)
    dur[20 * n // 30 :] = 0.13
    start = np.concatenate([[0.0], np.cumsum(dur)[:-1]])
    steps = pd.DataFrame(
        {
            "step": range(n),
            "start_s": start,
            "end_s": start + dur,
            "duration_s": dur,
            "phase": "none",
            "trigger": "optimizer",
            "overhead_s": 0.0,
            "peak_tensor_bytes": np.arange(n) * 1e6 + 1e8,
            "reserved_bytes": np.nan,
            "rss_bytes": 1e9,
            "compile_s": 0.0,
        },
        columns=STEP_COLUMNS,
    )
    t = np.linspace(0, start[-1] + dur[-1], 50)
    samples = pd.DataFrame({"t_s": t, "kind": "periodic", "step": 0, "rank": 0, "gpu0_energy_j": 250.0 * t})
    memory = pd.DataFrame([[0.1, 3, 4e7, 0, 4e7, 8e7, 2e8, 0, 1e6]], columns=MEMORY_COLUMNS)
    r = Run(id="20261205-export", label="exported", status="ok", wall_s=float(t[-1]) + 0.5)
    r.steps, r.samples, r.memory = steps, samples, memory
    r.environment = {"device": "cuda", "devices": ["NVIDIA H100 80GB HBM3"], "world_size": 1}
    r.summary.update(summarize(steps, samples))
    r.summary.update(device_idle_pct=25.0, device_compute_pct=70.0)
    from swift_nb.analysis.cost import price

    price(r, price_per_hour=3.0, price_per_kwh=0.2)
    save(r, tmp_path / r.id)
    (r.path / REPORT_FILE).write_text("<html>report</html>")
    (r.path / TRACE_FILE).write_bytes(b"\x1f\x8b not really")
    r.files["trace"] = TRACE_FILE
    save(r)
    return r
