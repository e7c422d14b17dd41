"""NVML's GPU performance counters and clock reasons (swift_nb.capture.resources.gpm), read
through an injected NVML (tests/support/nvml.py: this machine has no driver) whose GPM
requests are the real ``pynvml`` ctypes structures the code fills for a real driver."""

from __future__ import annotations

import pytest
from support.nvml import MIB, fake_gpm_nvml

from swift_nb.capture.resources.gpm import MIN_WINDOW_S, ClockReasons, Gpm


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _open(**kw):
    clock = Clock()
    nv = fake_gpm_nvml(clock=clock, **kw)
    gpm, note = Gpm.open(nv, {0: 0})
    return nv, gpm, note, clock


def test_a_metric_is_read_over_the_window_since_the_anchor_and_never_repeated():
    nv, gpm, note, clock = _open()
    assert note is None and gpm is not None
    assert gpm.read(0.0) == {}  # the first sample is the anchor
    clock.t += 0.05
    assert gpm.read(MIN_WINDOW_S / 2) == {}  # too close: empty, not the last value again
    clock.t += 0.15
    row = gpm.read(0.2)
    assert row["gpu0_sm_active_pct"] == 31.0 and row["gpu0_tensor_active_pct"] == 4.0
    assert row["gpu0_sm_occupancy_pct"] == 18.0 and row["gpu0_dram_bw_pct"] == 12.0
    assert row["gpu0_pcie_rx_bytes_per_s"] == 2000.0 * MIB and row["gpu0_pcie_tx_bytes_per_s"] == 100.0 * MIB
    assert row["gpu0_pcie_max_bytes_per_s"] == pytest.approx(16 * 3.938e9)
    assert not any("nvlink" in c for c in row)  # no NVLink on this card: no columns
    assert nv.gpm.windows == [(100.0, 100.2)]  # from the anchor (t=0) to now, not from t=0.05
    clock.t += 0.3
    gpm.read(0.5)
    assert nv.gpm.windows[-1] == (100.2, 100.5)  # the new sample became the anchor


def test_nvlink_columns_where_a_link_is_up_and_a_metric_the_card_lacks_stays_empty():
    counters = {2: 50.0, 5: 60.0, 60: 1.0, 61: 2.0}  # no occupancy, DRAM or PCIe
    _, gpm, _, clock = _open(nvlink=True, counters=counters)
    gpm.read(0.0)
    clock.t += 0.2
    row = gpm.read(0.2)
    assert row["gpu0_nvlink_tx_bytes_per_s"] == 2.0 * MIB and row["gpu0_nvlink_rx_bytes_per_s"] == 1.0 * MIB
    assert row["gpu0_sm_active_pct"] == 50.0
    assert "gpu0_dram_bw_pct" not in row and "gpu0_sm_occupancy_pct" not in row


@pytest.mark.parametrize("gpm", [False, "raises"])
def test_without_gpm_one_note_says_which_device_and_why(gpm):
    _, reader, note, _ = _open(gpm=gpm)
    assert reader is None
    assert "gpu0" in note and "SM activity" in note and "utilisation, clocks and power still are" in note
    assert ("Hopper" in note) if gpm is False else ("Not Supported" in note)


def test_a_mig_device_is_sampled_through_its_gpu_instance():
    nv, gpm, _, clock = _open(mig=True)
    gpm.read(0.0)
    clock.t += 0.2
    assert gpm.read(0.2)["gpu0_sm_active_pct"] == 31.0
    assert nv.gpm.mig == 2


def test_clock_reasons_and_the_maximum_clock():
    nv = fake_gpm_nvml(reasons=lambda t: 0x4 | 0x1)
    clocks, note = ClockReasons.open(nv, {0: 0, 1: 1})
    assert note is None
    assert clocks.read() == {
        "gpu0_clock_reasons": 5.0,
        "gpu0_sm_clock_max_mhz": 1980.0,
        "gpu1_clock_reasons": 5.0,
        "gpu1_sm_clock_max_mhz": 1980.0,
    }


def test_an_old_driver_falls_back_to_the_throttle_reasons_and_none_gives_a_note():
    nv = fake_gpm_nvml()
    del nv.nvmlDeviceGetCurrentClocksEventReasons
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x40
    clocks, _ = ClockReasons.open(nv, {0: 0})
    assert clocks.read()["gpu0_clock_reasons"] == 0x40
    del nv.nvmlDeviceGetCurrentClocksThrottleReasons
    clocks, note = ClockReasons.open(nv, {0: 0})
    assert clocks is None and "throttling is not recorded" in note
