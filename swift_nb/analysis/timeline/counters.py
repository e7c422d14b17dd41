"""The timeline's counter tracks: memory by category (memory.csv) and the sampler's series
(samples.csv), moved from the run's clock (seconds from its start) onto the trace's (µs)
through the steps both saw: steps.csv's ``start_s`` of step k against the start of the
trace's ``ProfilerStep#k``."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from swift_nb.analysis.trace.tables import Trace

COUNTER_COLUMNS = ["track", "t_us", "value"]
#: samples.csv columns drawn as counters → their track's name and unit
SERIES = {"cpu_pct": ("CPU", "%"), "rss_bytes": ("Process memory (RSS)", "bytes")}
_GPU_SERIES = re.compile(
    r"^gpu(\d+)_(util_pct|sm_active_pct|tensor_active_pct|dram_bw_pct|sm_clock_mhz|mem_used_bytes|power_w)$"
)
_GPU_LABELS = {
    "util_pct": ("GPU {} utilisation", "%"),
    "sm_active_pct": ("GPU {} SMs active", "%"),
    "tensor_active_pct": ("GPU {} tensor cores active", "%"),
    "dram_bw_pct": ("GPU {} DRAM bandwidth", "%"),
    "sm_clock_mhz": ("GPU {} SM clock", "MHz"),
    "mem_used_bytes": ("GPU {} memory used", "bytes"),
    "power_w": ("GPU {} power", "W"),
}
_CATEGORY = re.compile(r"^(\w+)_bytes$")


def clock_offset_us(trace: Trace, steps_csv: pd.DataFrame | None) -> float | None:
    """µs to add to a run-clock time (s × 1e6) to put it on the trace's clock, from the
    steps both recorded (their median difference); None when they share no step."""
    if steps_csv is None or steps_csv.empty or trace.steps.empty or "start_s" not in steps_csv:
        return None
    both = trace.steps.merge(steps_csv[["step", "start_s"]], on="step")
    both = both[pd.to_numeric(both["start_s"], errors="coerce").notna()]
    if both.empty:
        return None
    return float(
        np.median(both["start_us"].to_numpy(dtype=float) - both["start_s"].to_numpy(dtype=float) * 1e6)
    )


def counter_series(
    trace: Trace,
    samples: pd.DataFrame | None,
    memory: pd.DataFrame | None,
    steps_csv: pd.DataFrame | None,
) -> pd.DataFrame:
    """The counters of a run on the trace's clock: ``track``, ``t_us``, ``value`` and
    ``unit`` (``bytes``, ``%``, ``W``). A series that is zero throughout (no frozen
    weights, a GPU drawing nothing) is left out: a flat line says nothing."""
    offset = clock_offset_us(trace, steps_csv)
    if offset is None:
        return pd.DataFrame(columns=COUNTER_COLUMNS)
    parts = []
    for frame, labels in ((memory, _memory_labels), (samples, _sample_labels)):
        if frame is None or frame.empty or "t_s" not in frame:
            continue
        t_us = pd.to_numeric(frame["t_s"], errors="coerce").to_numpy(dtype=float) * 1e6 + offset
        for column, (label, unit) in labels(frame.columns):
            value = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
            ok = np.isfinite(value) & np.isfinite(t_us)
            if ok.any() and (value[ok] != 0).any():
                parts.append(
                    pd.DataFrame({"track": label, "t_us": t_us[ok], "value": value[ok], "unit": unit})
                )
    parts += _token_series(steps_csv, offset)
    if not parts:
        return pd.DataFrame(columns=COUNTER_COLUMNS)
    return pd.concat(parts, ignore_index=True)


#: the tokens of each step (steps.csv's ``tokens``, ``real_tokens``), drawn under the steps
TOKEN_SERIES = {"tokens": "Tokens per step: computed", "real_tokens": "Tokens per step: real"}


def _token_series(steps_csv: pd.DataFrame, offset: float) -> list[pd.DataFrame]:
    """A step-wise series per token count: each step's value from its start to its end."""
    out = []
    for column, label in TOKEN_SERIES.items():
        if column not in steps_csv or "end_s" not in steps_csv:
            continue
        rows = steps_csv[pd.to_numeric(steps_csv[column], errors="coerce").notna()]
        if rows.empty:
            continue
        start = pd.to_numeric(rows["start_s"], errors="coerce").to_numpy(dtype=float) * 1e6 + offset
        end = pd.to_numeric(rows["end_s"], errors="coerce").to_numpy(dtype=float) * 1e6 + offset
        value = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=float)
        t = np.column_stack([start, end]).ravel()
        out.append(pd.DataFrame({"track": label, "t_us": t, "value": np.repeat(value, 2), "unit": "tokens"}))
    return out


def _memory_labels(columns) -> list[tuple[str, tuple[str, str]]]:
    return [
        (c, ("Memory: " + m.group(1).replace("_", " "), "bytes"))
        for c in columns
        if (m := _CATEGORY.match(str(c)))
    ]


def _sample_labels(columns) -> list[tuple[str, tuple[str, str]]]:
    out = [(c, SERIES[c]) for c in columns if c in SERIES]
    for c in columns:
        if m := _GPU_SERIES.match(str(c)):
            label, unit = _GPU_LABELS[m.group(2)]
            out.append((c, (label.format(m.group(1)), unit)))
    return out


def downsample(counters: pd.DataFrame, t0: float, t1: float, width: int) -> pd.DataFrame:
    """Each counter track between ``t0`` and ``t1`` (µs), sorted by track and time: at most
    each pixel column's lowest and highest value, plus the values in force at both edges."""
    px = max(t1 - t0, 1e-6) / width
    out = []
    for track, series in counters.groupby("track", sort=False):
        t, v = series["t_us"].to_numpy(dtype=float), series["value"].to_numpy(dtype=float)
        lo = max(int(np.searchsorted(t, t0, side="left")) - 1, 0)
        hi = int(np.searchsorted(t, t1, side="right")) + 1
        t, v = t[lo:hi], v[lo:hi]
        if len(t) > 2 * width:
            col = np.clip(np.floor((t - t0) / px), -1, width).astype(np.int64)
            frame = pd.DataFrame({"col": col, "v": v})
            keep = np.zeros(len(t), dtype=bool)
            keep[frame.groupby("col")["v"].idxmin().to_numpy()] = True
            keep[frame.groupby("col")["v"].idxmax().to_numpy()] = True
            t, v = t[keep], v[keep]
        out.append(pd.DataFrame({"track": track, "t_us": t, "value": v}))
    if not out:
        return pd.DataFrame(columns=COUNTER_COLUMNS)
    return pd.concat(out, ignore_index=True)[COUNTER_COLUMNS]
