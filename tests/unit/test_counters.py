"""The GPU's counters per step and the run's figures from them (swift_nb.record.counters),
and the findings only they make (swift_nb.analysis.counters), on sample tables built by
hand so that every mean is known exactly."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.counters import counter_findings
from swift_nb.record.counters import LIMITING, counter_summary, step_counters, throttle_words


def _steps(bounds):
    return pd.DataFrame(
        {
            "step": range(len(bounds)),
            "start_s": [a for a, _ in bounds],
            "end_s": [b for _, b in bounds],
            "duration_s": [b - a for a, b in bounds],
            "trigger": "optimizer",
        }
    )


def _samples(t, **columns):
    return pd.DataFrame({"t_s": t, "kind": "periodic", **columns})


def test_a_step_mean_weighs_each_window_by_its_overlap():
    # windows (0,1]=10, (1,2]=20, (2,3]=30; the first sample is GPM's anchor (no value)
    samples = _samples(
        [0.0, 1.0, 2.0, 3.0], gpu0_util_pct=[90.0] * 4, gpu0_sm_active_pct=[np.nan, 10, 20, 30]
    )
    steps = _steps([(0.5, 1.5), (1.0, 3.0), (2.5, 2.75), (3.5, 4.0)])
    got = step_counters(steps, samples)["gpu0_sm_active_pct"].tolist()
    assert got[:3] == pytest.approx([15.0, 25.0, 30.0])
    assert math.isnan(got[3])  # after the last sample: unknown, not extrapolated


def test_gpm_windows_stay_exact_after_the_samples_are_thinned():
    """GPM's window (``gpu{i}_gpm_window_s``) is its own: a thinned-out row leaves a gap,
    not a longer window for the value after it."""
    samples = _samples(
        [0.0, 0.4, 0.6],  # the reading at t=0.2 was thinned out
        gpu0_util_pct=[90.0] * 3,
        gpu0_sm_active_pct=[np.nan, 20.0, 30.0],
        gpu0_gpm_window_s=[np.nan, 0.2, 0.2],
    )
    got = step_counters(_steps([(0.0, 0.2), (0.1, 0.5), (0.3, 0.6)]), samples)["gpu0_sm_active_pct"].tolist()
    assert math.isnan(got[0])  # no window covers it: unknown, not the 20 measured after it
    assert got[1:] == pytest.approx([(0.2 * 20 + 0.1 * 30) / 0.3, (0.1 * 20 + 0.2 * 30) / 0.3])


def test_the_idle_gpus_of_the_machine_are_left_out():
    samples = _samples(
        [0.0, 1.0, 2.0],
        gpu0_util_pct=[90.0] * 3,
        gpu1_util_pct=[0.0] * 3,
        cuda0_allocated_bytes=[1e9] * 3,
        cuda1_allocated_bytes=[0.0] * 3,
    )
    assert list(step_counters(_steps([(0.0, 2.0)]), samples).columns) == ["gpu0_util_pct"]


def test_throttling_in_words_and_the_steps_it_held_down():
    assert throttle_words(0x4 | 0x40) == ["power cap", "thermal (hardware)"]
    assert throttle_words(0x1) == ["idle"] and not 0x1 & LIMITING  # idle is no throttle
    assert throttle_words(0x4 | 0x8000) == ["power cap", "0x8000"]
    # the power cap from t=2 on; the SMs at 1 400 MHz while it holds
    t = [0.0, 1.0, 2.0, 3.0, 4.0]
    samples = _samples(
        t,
        gpu0_util_pct=[95.0] * 5,
        gpu0_clock_reasons=[0, 0, 0, 4, 4],
        gpu0_sm_clock_mhz=[1980, 1980, 1980, 1400, 1400],
        gpu0_sm_clock_max_mhz=[1980.0] * 5,
    )
    steps = _steps([(0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.0)])
    per_step = step_counters(steps, samples)
    assert per_step["gpu0_throttled_pct"].tolist() == [0.0, 0.0, 100.0, 100.0]
    s = counter_summary(steps, samples)
    assert s["throttled_steps_pct"] == 50.0
    assert s["throttle_reasons"] == ["power cap"]
    assert s["clock_lost_mhz"] == 580.0 and s["clock_max_mhz"] == 1980.0
    assert s["mean_step_util_pct"] == 95.0


def test_the_summary_weighs_steps_by_their_time_and_leaves_the_end_span_out():
    samples = _samples(
        [0.0, 1.0, 3.0, 4.0], gpu0_util_pct=[90.0] * 4, gpu0_sm_active_pct=[np.nan, 10, 40, 99]
    )
    steps = _steps([(0.0, 1.0), (1.0, 3.0), (3.0, 4.0)])
    steps.loc[2, "trigger"] = "end"
    assert counter_summary(steps, samples)["mean_sm_active_pct"] == pytest.approx((10 * 1 + 40 * 2) / 3)


def test_pcie_peak_against_the_link():
    samples = _samples(
        [0.0, 1.0, 2.0],
        gpu0_util_pct=[90.0] * 3,
        gpu0_pcie_tx_bytes_per_s=[np.nan, 1e9, 1e9],
        gpu0_pcie_rx_bytes_per_s=[np.nan, 2e9, 20e9],
        gpu0_pcie_max_bytes_per_s=[np.nan, 25e9, 25e9],
    )
    s = counter_summary(_steps([(0.0, 1.0), (1.0, 2.0)]), samples)
    assert s["pcie_peak_pct"] == pytest.approx(80.0) and s["pcie_max_bytes_per_s"] == 25e9


def test_no_gpu_counters_no_figures():
    samples = _samples([0.0, 1.0], cpu_pct=[100.0, 100.0])
    assert counter_summary(_steps([(0.0, 1.0)]), samples) == {}
    assert step_counters(_steps([(0.0, 1.0)]), samples).columns.empty


def _ids(findings):
    return [f.id for f in findings]


def test_busy_but_idle_sms_from_the_counters_or_added_to_the_traces_finding():
    summary = {"mean_step_util_pct": 96.0, "mean_sm_active_pct": 31.0, "mean_tensor_active_pct": 40.0}
    (found,) = counter_findings(summary, {}, [])
    assert found.id == "idle_sms" and "96 %" in found.title and "31 %" in found.title
    assert found.evidence["sm_active_pct"] == 31.0
    assert counter_findings({**summary, "mean_sm_active_pct": 80.0}, {}, []) == []
    # the trace made it already: one finding, with both evidences
    traced = Finding(id="idle_sms", title="t", evidence={"kernel_occupancy_pct": 12.0}, suggestion="s")
    assert counter_findings(summary, {}, [traced]) == []
    assert traced.evidence["sm_active_pct"] == 31.0 and traced.evidence["kernel_occupancy_pct"] == 12.0


def test_tensor_cores_idle_while_gemms_dominate_is_priced():
    summary = {"mean_step_util_pct": 100.0, "mean_sm_active_pct": 90.0, "mean_tensor_active_pct": 2.0}
    (found,) = counter_findings(summary, {"gemm_kernel_pct": 60.0}, [])
    assert found.id == "tensor_cores_idle" and found.toggle == "bf16_autocast"
    assert found.time_cut == pytest.approx(0.6 * 0.5)
    assert counter_findings(summary, {"gemm_kernel_pct": 20.0}, []) == []  # GEMMs do not dominate
    assert counter_findings(summary, {}, []) == []  # no trace: not known that they do


def test_dram_bound_throttled_and_pcie():
    summary = {
        "mean_step_util_pct": 99.0,
        "mean_sm_active_pct": 90.0,
        "mean_tensor_active_pct": 5.0,
        "mean_dram_bw_pct": 85.0,
        "throttled_steps_pct": 40.0,
        "throttle_reasons": ["power cap"],
        "clock_lost_mhz": 495.0,
        "clock_max_mhz": 1980.0,
        "pcie_peak_pct": 75.0,
        "pcie_max_bytes_per_s": 63e9,
    }
    found = {f.id: f for f in counter_findings(summary, {}, [])}
    assert set(found) == {"dram_bound", "throttled", "pcie_saturated"}
    throttled = found["throttled"]
    assert "power cap" in throttled.title and "40 %" in throttled.title and "495 MHz" in throttled.title
    assert "nvidia-smi -pl" in throttled.suggestion
    assert throttled.time_cut == pytest.approx(0.4 * 0.25) and throttled.time_cut_bound


def test_the_gpu_sections_per_step_table_shows_each_steps_counters(tmp_path):
    """A real CUDA trace's run (tests/data/gpu) whose steps.csv carries counters, as a
    sampled GPU run's does: the GPU section's per-step table shows them beside the trace's
    figures of the same steps."""
    from pathlib import Path

    import swift_nb
    from swift_nb.record import save

    trace = Path(__file__).parents[1] / "data" / "gpu" / "gpu_1rank_5steps.json.gz"
    run = swift_nb.import_trace(trace, tmp_path / "run", report=False)
    steps = run.steps
    steps["gpu0_sm_active_pct"] = 30.0 + steps["step"].astype(float)
    steps["gpu0_tensor_active_pct"] = 4.0
    save(run)
    reported = swift_nb.report(run)
    table = reported.analysis.device_steps
    assert len(table)
    html = (run.path / "report.html").read_text()
    assert "<th>SMs active</th>" in html and "<th>tensor cores</th>" in html
    for step in table["step"].astype(int):
        assert f"{30 + step:.1f} %" in html
