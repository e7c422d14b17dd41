"""The GPU's own counters per step: the samples' GPM metrics, utilisation, SM clock and
throttling (``swift_nb.capture.resources.gpm``) aligned with the steps, and the run's figures
from them.

A sample's value stands for the window that ends at it (GPM's metrics are means over it;
an instantaneous read is taken as the state since the sample before), so a step's mean is
the time-weighted mean of the windows it overlaps: exact for GPM, and for a step shorter
than the sampling period, the window around it. Devices whose allocator bytes were sampled
count only where the run allocated on them (the idle GPUs of a machine are not averaged in).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

#: per-device column suffixes averaged per step, in steps.csv's order
STEP_SUFFIXES = (
    "util_pct",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "dram_bw_pct",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
    "sm_clock_mhz",
)
#: the suffixes GPM reads over a window of its own (``gpu{i}_gpm_window_s`` wide)
GPM_SUFFIXES = frozenset(STEP_SUFFIXES[1:-1])
#: summary key of each suffix's mean over the steps (``mean_step_util_pct``: NVML's
#: utilisation over the same steps as the counters, beside ``mean_util_pct``'s whole run)
SUMMARY_KEYS = {s: ("mean_step_util_pct" if s == "util_pct" else f"mean_{s}") for s in STEP_SUFFIXES[:-1]}

#: NVML's clocks event reasons (nvmlClocksEventReason*): bit → words, limiting or not
REASONS: dict[int, tuple[str, bool]] = {
    0x1: ("idle", False),
    0x2: ("application clocks setting", False),
    0x4: ("power cap", True),
    0x8: ("hardware slowdown", True),
    0x10: ("sync boost", True),
    0x20: ("thermal (software)", True),
    0x40: ("thermal (hardware)", True),
    0x80: ("power brake", True),
    0x100: ("display clock setting", False),
}
LIMITING = sum(bit for bit, (_, limits) in REASONS.items() if limits)
THROTTLED_STEP_SHARE = 0.5  # a step is throttled when its clocks were held down this much of it


def throttle_words(mask: int | float) -> list[str]:
    """The reasons a clocks-event bitmask names, in words (unknown bits as hex)."""
    if mask is None or (isinstance(mask, float) and np.isnan(mask)):
        return []
    mask = int(mask)
    words = [word for bit, (word, _) in REASONS.items() if mask & bit]
    rest = mask & ~sum(REASONS)
    return [*words, f"0x{rest:x}"] if rest else words


def devices(samples: pd.DataFrame) -> list[int]:
    """The GPUs the run used among those sampled (``gpu{i}_util_pct``): where torch's allocator
    bytes were sampled (``cuda{i}_allocated_bytes``), those allocated on."""
    found = sorted(int(m.group(1)) for c in samples.columns if (m := re.fullmatch(r"gpu(\d+)_util_pct", c)))

    def used(i: int) -> bool:
        allocated = f"cuda{i}_allocated_bytes"
        if allocated not in samples.columns:
            return True
        return bool(pd.to_numeric(samples[allocated], errors="coerce").fillna(0).max() > 0)

    return [i for i in found if used(i)]


def _windows(
    t: np.ndarray, v: np.ndarray, width: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, values) of the windows a column's values stand for: each value's own
    window where the sampler recorded its width (GPM's, exact even after the samples were
    thinned), else from the sample before it with a value (for the first value, the sample
    just before it) to its own time."""
    valid = np.flatnonzero(~np.isnan(v))
    if width is not None:
        w = width[valid]
        keep = ~np.isnan(w)
        valid = valid[keep]
        return t[valid] - w[keep], t[valid], v[valid]
    if not len(valid):
        return np.empty(0), np.empty(0), np.empty(0)
    if valid[0] > 0:
        starts = np.concatenate([[t[valid[0] - 1]], t[valid][:-1]])
        return starts, t[valid], v[valid]
    return t[valid][:-1], t[valid][1:], v[valid][1:]


def _window_means(
    t: np.ndarray, v: np.ndarray, start: np.ndarray, end: np.ndarray, width: np.ndarray | None = None
) -> np.ndarray:
    """Each [start, end]'s time-weighted mean of the values over the parts of it their
    windows (``_windows``: disjoint, in time order) cover; NaN where none does."""
    a, b, values = _windows(t, v, width)
    if not len(a):
        return np.full(len(start), np.nan)
    # the integral of the values, and of 1, from the first window's start: linear inside
    # each window, flat in the gaps between them
    knots = np.empty(2 * len(a))
    knots[0::2], knots[1::2] = a, np.maximum(b, a)
    rise = np.zeros(2 * len(a))
    rise[1::2] = values * (knots[1::2] - knots[0::2])
    covered = np.zeros(2 * len(a))
    covered[1::2] = knots[1::2] - knots[0::2]
    area, cover = np.cumsum(rise), np.cumsum(covered)
    span = np.interp(end, knots, cover) - np.interp(start, knots, cover)
    out = (np.interp(end, knots, area) - np.interp(start, knots, area)) / np.where(span > 0, span, 1.0)
    return np.where(span > 0, out, np.nan)


def step_counters(steps: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """Per step, each used device's mean of each counter sampled (``gpu{i}_<suffix>``, the
    suffixes of ``STEP_SUFFIXES``) and ``gpu{i}_throttled_pct``, the share of the step its
    clocks were held down (``LIMITING``); indexed like ``steps``, no columns when the run
    sampled no GPU counter."""
    out = pd.DataFrame(index=steps.index)
    if not len(steps) or "t_s" not in samples or not len(samples):
        return out
    ordered = samples.sort_values("t_s", kind="stable")
    t = pd.to_numeric(ordered["t_s"], errors="coerce").to_numpy(dtype=float)
    start = pd.to_numeric(steps["start_s"], errors="coerce").to_numpy(dtype=float)
    end = pd.to_numeric(steps["end_s"], errors="coerce").to_numpy(dtype=float)
    for i in devices(samples):
        width = None
        if f"gpu{i}_gpm_window_s" in ordered:
            width = pd.to_numeric(ordered[f"gpu{i}_gpm_window_s"], errors="coerce").to_numpy(dtype=float)
        for suffix in STEP_SUFFIXES:
            column = f"gpu{i}_{suffix}"
            if column in ordered:
                v = pd.to_numeric(ordered[column], errors="coerce").to_numpy(dtype=float)
                out[column] = _window_means(t, v, start, end, width if suffix in GPM_SUFFIXES else None)
        reasons = f"gpu{i}_clock_reasons"
        if reasons in ordered:
            mask = pd.to_numeric(ordered[reasons], errors="coerce")
            limited = np.where(mask.isna(), np.nan, (mask.fillna(0).astype("int64") & LIMITING) > 0)
            out[f"gpu{i}_throttled_pct"] = 100.0 * _window_means(t, limited.astype(float), start, end)
    return out


def _over_steps(table: pd.DataFrame, weights: pd.Series, suffix: str) -> float | None:
    """The mean of ``gpu*_<suffix>`` over the steps (weighted by their time) and devices."""
    cols = [c for c in table.columns if re.fullmatch(rf"gpu\d+_{suffix}", c)]
    if not cols:
        return None
    per_step = table[cols].mean(axis=1)
    ok = per_step.notna() & (weights > 0)
    if not ok.any():
        return None
    return float(np.average(per_step[ok], weights=weights[ok]))


def counter_summary(steps: pd.DataFrame, samples: pd.DataFrame) -> dict[str, Any]:
    """The run's counters over its steps (``SUMMARY_KEYS``: the step-time-weighted means),
    and its throttling: ``throttled_steps_pct`` (steps whose clocks were held down at least
    ``THROTTLED_STEP_SHARE`` of their time, of the steps with the reasons sampled),
    ``throttle_reasons`` (the limiting reasons seen in them, in words, the most seen first)
    and ``clock_lost_mhz`` (the SMs' maximum clock less their mean clock in those steps);
    ``pcie_peak_pct``, the busiest step's PCIe traffic over the link's bandwidth."""
    table = step_counters(steps, samples)
    if table.empty or not len(table.columns):
        return {}
    timed = steps["trigger"].astype(str) != "end"
    weights = pd.to_numeric(steps["duration_s"], errors="coerce").fillna(0).where(timed, 0)
    out: dict[str, Any] = {}
    for suffix, key in SUMMARY_KEYS.items():
        value = _over_steps(table, weights, suffix)
        if value is not None:
            out[key] = value
    out.update(_pcie_peak(table[timed], samples))
    throttled = table[[c for c in table.columns if c.endswith("_throttled_pct")]].max(axis=1)[timed]
    if throttled.notna().any():
        held = throttled >= 100 * THROTTLED_STEP_SHARE
        out["throttled_steps_pct"] = float(100.0 * held.sum() / throttled.notna().sum())
        out["throttle_reasons"] = _reasons_seen(
            steps[timed & held.reindex(steps.index, fill_value=False)], samples
        )
        out.update(_clock_lost(table[timed & held.reindex(steps.index, fill_value=False)], samples))
    return out


def _reasons_seen(held: pd.DataFrame, samples: pd.DataFrame) -> list[str]:
    """The limiting reasons of the samples whose windows overlap the steps ``held`` (a
    sample's window ends at it: the first sample after a step's end closes its last one),
    the most often seen first."""
    if not len(held):
        return []
    ordered = samples.sort_values("t_s", kind="stable")
    t = pd.to_numeric(ordered["t_s"], errors="coerce").to_numpy(dtype=float)
    first = np.searchsorted(t, held["start_s"].astype(float).to_numpy(), side="right")
    last = np.searchsorted(t, held["end_s"].astype(float).to_numpy(), side="left")
    rows = sorted({k for a, b in zip(first, last, strict=True) for k in range(a, min(b, len(t) - 1) + 1)})
    counts: dict[str, int] = {}
    for column in [c for c in samples.columns if re.fullmatch(r"gpu\d+_clock_reasons", c)]:
        for mask in pd.to_numeric(ordered[column].iloc[rows], errors="coerce").dropna():
            for word in throttle_words(int(mask) & LIMITING):
                counts[word] = counts.get(word, 0) + 1
    return sorted(counts, key=lambda w: -counts[w])


def _pcie_peak(table: pd.DataFrame, samples: pd.DataFrame) -> dict[str, float]:
    """``pcie_peak_pct``: the busiest step's PCIe traffic (either way, the busier device)
    over its link's bandwidth (``gpu{i}_pcie_max_bytes_per_s``), and that bandwidth."""
    shares, links = [], []
    for column in [c for c in samples.columns if re.fullmatch(r"gpu\d+_pcie_max_bytes_per_s", c)]:
        link = float(pd.to_numeric(samples[column], errors="coerce").max())
        ways = [column.replace("_max_", f"_{way}_") for way in ("tx", "rx")]
        if not link > 0 or not all(w in table for w in ways):
            continue
        shares.append(table[ways].max(axis=1) / link)
        links.append(link)
    if not shares:
        return {}
    peak = pd.concat(shares, axis=1).max(axis=1).max()
    if pd.isna(peak):
        return {}
    return {"pcie_peak_pct": float(100.0 * peak), "pcie_max_bytes_per_s": max(links)}


def _clock_lost(held: pd.DataFrame, samples: pd.DataFrame) -> dict[str, float]:
    cols = [c for c in held.columns if re.fullmatch(r"gpu\d+_sm_clock_mhz", c)]
    top = [c.replace("_sm_clock_mhz", "_sm_clock_max_mhz") for c in cols]
    if not len(held) or not cols or not all(c in samples for c in top):
        return {}
    clock = float(held[cols].mean(axis=1).mean())
    peak = float(samples[top].apply(pd.to_numeric, errors="coerce").max().mean())
    if np.isnan(clock) or np.isnan(peak):
        return {}
    return {"clock_lost_mhz": max(0.0, peak - clock), "clock_max_mhz": peak}
