"""Matplotlib figures of a run. Built on ``matplotlib.figure.Figure`` (no pyplot), so
they never touch the user's pyplot state or backend."""

from __future__ import annotations

import io

import pandas as pd
from matplotlib.figure import Figure

from swift_nb.record import Run

PHASE_COLORS = {"warmup": "#f3e3b5", "active": "#c6dbef"}
GIB = 1024**3
MAX_STEP_LINES = 200  # beyond this, per-step lines are noise


def _numeric(df: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(df[col], errors="coerce") if col in df else pd.Series(dtype="float64")


def phase_spans(steps: pd.DataFrame) -> list[tuple[str, float, float]]:
    """(phase, start_s, end_s) of each stretch of consecutive warmup or active steps."""
    spans: list[tuple[str, float, float]] = []
    if "phase" not in steps:
        return spans
    for phase, start, end in zip(
        steps["phase"], _numeric(steps, "start_s"), _numeric(steps, "end_s"), strict=True
    ):
        if phase not in PHASE_COLORS:
            continue
        if spans and spans[-1][0] == phase:
            spans[-1] = (phase, spans[-1][1], end)
        else:
            spans.append((phase, start, end))
    return spans


def timeline_figure(run: Run, width_in: float = 10.0) -> Figure:
    """Utilisation and memory against time (s), with step boundaries and the profiler's
    warmup/active steps shaded."""
    fig = Figure(figsize=(width_in, 4.8), layout="constrained")
    ax_util, ax_mem = fig.subplots(2, 1, sharex=True)
    samples, steps = run.samples, run.steps
    t = _numeric(samples, "t_s")

    gpu_util = [
        c for c in samples.columns if c.startswith("gpu") and c.endswith("_util_pct") and "mem" not in c
    ]
    if gpu_util:
        for c in gpu_util:
            ax_util.plot(t, _numeric(samples, c), lw=1.2, label=c.removesuffix("_util_pct").upper() + " util")
        ax_util.set_ylabel("GPU util (%)")
    if "cpu_pct" in samples:
        ax_util.plot(t, _numeric(samples, "cpu_pct"), lw=1.2, color="#555", label="process CPU")
    if not gpu_util:
        ax_util.set_ylabel("CPU (%, 100 = 1 core)")
    ax_util.set_ylim(bottom=0)

    if "rss_bytes" in samples:
        ax_mem.plot(t, _numeric(samples, "rss_bytes") / GIB, lw=1.2, color="#555", label="process RSS")
    for c in samples.columns:
        if c.startswith("cuda") and c.endswith("_allocated_bytes"):
            ax_mem.plot(t, _numeric(samples, c) / GIB, lw=1.2, label=c.split("_")[0] + " allocated")
    peak = _numeric(steps, "peak_tensor_bytes")
    if peak.notna().any():
        ax_mem.scatter(
            _numeric(steps, "end_s"), peak / GIB, s=14, color="#d62728", zorder=3, label="step peak tensors"
        )
    ax_mem.set_ylabel("memory (GiB)")
    ax_mem.set_ylim(bottom=0)
    ax_mem.set_xlabel("time since start (s)")

    for phase, start, end in phase_spans(steps):
        label = f"profiler {phase}"
        for ax in (ax_util, ax_mem):
            ax.axvspan(
                start, end, color=PHASE_COLORS[phase], alpha=0.6, lw=0, label=label if ax is ax_util else None
            )
            label = None
    ends = _numeric(steps, "end_s")
    if len(ends) <= MAX_STEP_LINES:
        for ax in (ax_util, ax_mem):
            ax.vlines(ends, 0, 1, transform=ax.get_xaxis_transform(), colors="#999", lw=0.6, alpha=0.7)
    for ax in (ax_util, ax_mem):
        ax.grid(alpha=0.25)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=8, ncols=4, framealpha=0.8)
    n = run.summary.get("steps", 0)
    fig.suptitle(
        f"{run.label or run.id} — {n} steps, status {run.status} (grey lines: step ends)", fontsize=10
    )
    return fig


def figure_png(fig: Figure, dpi: int = 100) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
