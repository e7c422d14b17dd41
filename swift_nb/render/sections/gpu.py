"""The GPU's time (``analysis.device``; a job's from rank 0's trace): HTA's shares, idle
time by cause, time by kind of kernel, per step. A trace without device work (a CPU run)
has no such section."""

from __future__ import annotations

import re
from html import escape
from typing import Any

import pandas as pd

from swift_nb.core.units import fmt_seconds
from swift_nb.render.figure_cache import figure_key
from swift_nb.render.figures import DEVICE_PARTS, device_figure
from swift_nb.render.html import frame_table, is_missing, pct1
from swift_nb.render.sections.base import FigurePart, Part, ReportInputs, SectionKind, has_rows
from swift_nb.render.tables import throttle_text

KIND_WORDS = {
    "gemm": "matrix multiplication (GEMM)",
    "convolution": "convolution",
    "attention": "fused attention",
    "embedding": "embedding",
    "elementwise/reduction": "elementwise and reduction",
    "communication": "communication (NCCL)",
    "memcpy": "memory copy",
    "memset": "memory set",
    "other": "other",
}


def _share(part: float, whole: float) -> str:
    return pct1(100.0 * part / whole) if whole > 0 else "–"


def _device_sentences(device: dict, gpu: str) -> str:
    scope = (
        "the device work launched before the last profiled step (HolisticTraceAnalysis's window: "
        "the last step's work may be cut off where the profiler stopped)"
        if device.get("last_step_left_out")
        else "all the device work in the trace"
    )
    text = (
        f"Over {fmt_seconds(device['window_s'])} from the first to the last kernel, copy or memset of "
        f"{scope}, {gpu} was idle {pct1(device['device_idle_pct'])} of the time, ran compute kernels "
        f"{pct1(device['device_compute_pct'])} of it and ran only non-compute work (communication, "
        f"memory copies and sets) {pct1(device['device_non_compute_pct'])} of it."
    )
    overlap = device.get("comm_compute_overlap_pct")
    if is_missing(overlap):
        text += (
            " No communication kernel ran, so there is no overlap of communication with compute to measure."
        )
    else:
        text += (
            f" Communication kernels ran alongside compute kernels for {pct1(overlap)} of their running time."
        )
    fill = []  # analysis.kernels: how much of the GPU the kernels used while it was busy
    if not is_missing(device.get("kernel_occupancy_pct")):
        fill.append(
            f"reached an achieved occupancy of {pct1(device['kernel_occupancy_pct'])} (by kernel time)"
        )
    if not is_missing(device.get("kernel_under_filled_pct")):
        fill.append(
            f"spent {pct1(device['kernel_under_filled_pct'])} of their time launching fewer blocks than "
            "the GPU has SMs"
        )
    if not is_missing(device.get("tensor_core_gemm_pct")):
        fill.append(f"ran {pct1(device['tensor_core_gemm_pct'])} of their GEMM time on the tensor cores")
    if fill:
        text += (
            " In the recorded steps, its kernels "
            + ", ".join(fill[:-1])
            + (" and " if len(fill) > 1 else "")
            + fill[-1]
            + "."
        )
    return f"<p>{escape(text)}</p>"


#: each cause of idle time (``analysis.device.CAUSES``) in the report's words
CAUSE_WORDS = {
    "comm_wait_s": "went to waiting on communication (a collective issued and not yet running, or the host "
    "inside a collective or a wait)",
    "sync_s": "to synchronisation stalls (the host blocked until the GPU drained, then launching again)",
    "copy_s": "to the host inside copy calls",
    "data_s": "to the host loading data",
    "host_bound_s": "were host launch gaps (the host busy in operators, CUDA calls or untraced Python inside "
    "the step)",
    "other_s": "had no traced cause (the host outside its steps)",
}


def _idle_sentences(idle_causes: pd.DataFrame, gpu: str) -> str:
    row = idle_causes.iloc[0]
    idle = float(row["idle_s"])
    if not idle > 0:
        return f"<p>{escape(gpu[:1].upper() + gpu[1:])} was never idle in this window.</p>"
    parts = [
        f"{fmt_seconds(float(row[c]))} ({_share(float(row[c]), idle)}) {words}"
        for c, words in CAUSE_WORDS.items()
        if c in row and float(row[c]) > 0
    ]
    listed = ", ".join(parts[:-1]) + (", and " if len(parts) > 1 else "") + parts[-1] if parts else ""
    text = f"Of the {fmt_seconds(idle)} {gpu} was idle, {listed}."
    return f"<p>{escape(text)}</p>"


def _kinds_part(kinds: pd.DataFrame) -> list[Part]:
    top = kinds.iloc[0]
    words = KIND_WORDS.get(str(top["kind"]), str(top["kind"]))
    count = int(top["count"])
    text = (
        f"{words[:1].upper() + words[1:]} took the most device time: {fmt_seconds(top['time_s'])} in "
        f"{count} kernel{'s' if count != 1 else ''}, {pct1(top['time_pct'])} of the summed time of all "
        "device work."
    )
    table = pd.DataFrame(
        {
            "kind": kinds["kind"].astype(str),
            "count": kinds["count"].astype(int),
            "device_time_s": kinds["time_s"].astype(float),
            "share of device time": [pct1(v) for v in kinds["time_pct"]],
        }
    )
    return [f"<h3>Device time by kind of kernel</h3><p>{escape(text)}</p>", frame_table(table)]


#: the GPU's counters per step (steps.csv, ``swift_nb.record.counters``) beside the trace's
#: figures of the same steps, where the run sampled them
STEP_COUNTERS = {
    "sm_active_pct": "SMs active",
    "tensor_active_pct": "tensor cores",
    "dram_bw_pct": "DRAM bandwidth",
    "throttled_pct": "clocks held down",
}


def _step_counters(device_steps: pd.DataFrame, steps: pd.DataFrame) -> dict[str, list[str]]:
    """Each counter's per-step mean over the devices, for the rows of ``device_steps``."""
    out = {}
    for suffix, head in STEP_COUNTERS.items():
        cols = [c for c in steps.columns if re.fullmatch(rf"gpu\d+_{suffix}", c)]
        if not cols or "step" not in steps:
            continue
        means = steps[cols].apply(pd.to_numeric, errors="coerce").mean(axis=1)
        by_step = pd.Series(means.to_numpy(), index=pd.to_numeric(steps["step"], errors="coerce"))
        by_step = by_step[~by_step.index.duplicated(keep="last")]
        values = by_step.reindex(device_steps["step"].astype(int)).to_numpy()
        if pd.notna(values).any():
            out[head] = [pct1(v) for v in values]
    return out


def _device_steps_part(device_steps: pd.DataFrame, steps: pd.DataFrame | None = None) -> list[Part]:
    counted = _step_counters(device_steps, steps) if steps is not None and len(steps) else {}
    table = pd.DataFrame(
        {
            "step": device_steps["step"].astype(int),
            "window_s": device_steps["window_s"].astype(float),
            "idle": [pct1(v) for v in device_steps["idle_pct"]],
            "compute": [pct1(v) for v in device_steps["compute_pct"]],
            "non-compute": [pct1(v) for v in device_steps["non_compute_pct"]],
            "comm/compute overlap": [pct1(v) for v in device_steps["comm_compute_overlap_pct"]],
            **{
                f"idle: {DEVICE_PARTS[c][0].removeprefix('idle: ')}": [
                    fmt_seconds(v) for v in device_steps[c]
                ]
                for c in CAUSE_WORDS
                if c in device_steps
            },
            **counted,
        }
    )
    return [
        "<h3>Per step</h3>",
        FigurePart(
            lambda: device_figure(device_steps),
            "Stacked bars of the GPU's time in each profiled step",
            "Each bar is one profiled step's window on the GPU, from its first kernel to the next step's "
            "first: compute, non-compute work alone, and idle time by cause.",
            figure_key("device", device_steps),
        ),
        frame_table(table),
    ]


def _counter_sentences(s: dict, gpu: str) -> str:
    """What the GPU's own counters say over the steps (``swift_nb.record.counters``); empty
    on a run that sampled none."""
    if is_missing(s.get("mean_sm_active_pct")) and is_missing(s.get("throttled_steps_pct")):
        return ""
    text = ""
    if not is_missing(s.get("mean_sm_active_pct")):
        counted = [f"its SMs were active {pct1(s['mean_sm_active_pct'])} of the time"]
        for key, words in (
            ("mean_sm_occupancy_pct", "their warp slots {} occupied"),
            ("mean_tensor_active_pct", "its tensor cores active {}"),
            ("mean_dram_bw_pct", "its DRAM bandwidth {} used"),
        ):
            if not is_missing(s.get(key)):
                counted.append(words.format(pct1(s[key])))
        text = (
            f"Over the steps, {gpu}'s own counters (NVML GPM) read: busy {pct1(s.get('mean_step_util_pct'))} "
            "of the time (any kernel running, the figure called utilisation), "
            + ", ".join(counted[:-1])
            + (" and " if len(counted) > 1 else "")
            + counted[-1]
            + "."
        )
    if not is_missing(s.get("throttled_steps_pct")):
        text += " Its clocks were " + throttle_text(s).replace("held down", "held down by a limit", 1) + "."
    return f"<p>{escape(text.strip())}</p>"


def build(inputs: ReportInputs) -> list[Part] | None:
    device: dict[str, Any] | None = inputs.device
    gpu = "rank 0's GPU" if len(inputs.run.ranks) > 1 else "the GPU"
    counted = _counter_sentences(inputs.run.summary, gpu)
    if not device or is_missing(device.get("device_idle_pct")):
        return [counted] if counted else None
    parts: list[Part] = [_device_sentences(device, gpu)]
    if counted:
        parts.append(counted)
    if inputs.idle_causes is not None and has_rows(inputs.idle_causes):
        parts.append(_idle_sentences(inputs.idle_causes, gpu))
    if inputs.kernel_kinds is not None and has_rows(inputs.kernel_kinds):
        parts += _kinds_part(inputs.kernel_kinds)
    if inputs.device_steps is not None and has_rows(inputs.device_steps):
        parts += _device_steps_part(inputs.device_steps, inputs.run.steps)
    return parts


SECTION = SectionKind("GPU", tab="Timeline", build=build)
