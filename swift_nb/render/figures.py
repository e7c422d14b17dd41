"""Matplotlib figures of a run. Built on ``matplotlib.figure.Figure`` (no pyplot), so
they never touch the user's pyplot state or backend."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from swift_nb.core.units import fmt_bytes, fmt_pct, fmt_seconds
from swift_nb.record import MEMORY_CATEGORIES, Run
from swift_nb.render.fonts import fit_text, shown

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.figure import Figure

PHASE_COLORS = {"warmup": "#f3e3b5", "active": "#c6dbef"}
GIB = 1024**3
MIB = 1024**2
MAX_STEP_LINES = 200  # beyond this, per-step lines are noise
MAX_STEP_LABELS = 20  # beyond this, "step N" labels overlap at notebook width

# Breakdown parts, bottom of the stack first: compute at the bottom, waits on top.
BREAKDOWN_PARTS = {
    "forward_s": ("forward", "#1f77b4"),
    "backward_s": ("backward", "#ff7f0e"),
    "optimizer_s": ("optimizer", "#2ca02c"),
    "comm_s": ("communication", "#d62728"),
    "h2d_s": ("host–device copies", "#e377c2"),
    "data_s": ("data loading", "#9467bd"),
    "other_s": ("other ops", "#8c564b"),
    "untraced_s": ("untraced (Python, waits)", "#c7c7c7"),
}
MEMORY_COLORS = {
    "parameters": "#1f77b4",
    "frozen_parameters": "#aec7e8",
    "gradients": "#ff7f0e",
    "optimizer_state": "#2ca02c",
    "activations": "#d62728",
    "logits": "#ff9896",
    "other": "#9467bd",
}
# The device's time in a step's window, bottom of the stack first: work, then idle by cause.
DEVICE_PARTS = {
    "compute_s": ("compute kernels", "#1f77b4"),
    "non_compute_s": ("non-compute only (communication, copies)", "#d62728"),
    "comm_wait_s": ("idle: waiting on communication", "#f7b6d2"),
    "sync_s": ("idle: synchronisation stalls", "#9edae5"),
    "copy_s": ("idle: copies on the host", "#dbdb8d"),
    "data_s": ("idle: data loading", "#c5b0d5"),
    "host_bound_s": ("idle: host launch gaps", "#ffbb78"),
    "other_s": ("idle: other (host outside its steps)", "#c7c7c7"),
}
OPERATOR_METRICS = {
    "self_time_s": "self time",
    "total_time_s": "total time (incl. children)",
    "self_pct": "share of profiled time",
    "alloc_bytes": "bytes allocated",
    "calls": "calls",
}
OPERATOR_NAME_CHARS = 48
CHAR_IN = 0.06  # mean width of a character of matplotlib's default font at 8 pt (inches)
PNG_OPTIONS = {"compress_level": 1}  # PNG's fastest deflate: ~10 % larger, drawn sooner


def new_figure(width_in: float, height_in: float) -> Figure:
    """An empty figure. matplotlib is imported here, when a figure is drawn: code that
    only records runs (reruns, ``--no-report``) never loads it. No layout engine: each
    figure sets its margins in inches (``_margins``), which saves a layout pass per
    drawing (a third of a figure's time)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in))


def _margins(
    fig: Figure, left: float = 0.8, right: float = 0.25, top: float = 0.4, bottom: float = 0.55, **kw
) -> None:
    """Place the axes ``left`` … ``bottom`` inches from the figure's edges."""
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=left / w, right=1 - right / w, top=1 - top / h, bottom=bottom / h, **kw)


def _legend_margin(labels: list[str]) -> float:
    """Inches a legend of ``labels`` (8 pt) needs to the right of the axes."""
    return 0.85 + CHAR_IN * max((len(t) for t in labels), default=0)


def _side_legend(fig: Figure, handles, labels, top: float = 0.4) -> None:
    """A legend to the right of the axes, top-aligned with them (``_margins`` made room)."""
    w, h = fig.get_size_inches()
    x = 1 - (_legend_margin(labels) - 0.15) / w
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(x, 1 - top / h), fontsize=8, frameon=False)


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
    fig = new_figure(width_in, 4.8)
    _margins(fig, top=0.45, right=0.2, hspace=0.12)
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
        label: str | None = f"profiler {phase}"
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
    # parse_math=False: a label with "$" must show as typed, not as (possibly broken) TeX.
    fig.suptitle(
        f"{shown(run.label, run.id)} — {n} steps, status {run.status} (grey lines: step ends)",
        fontsize=10,
        parse_math=False,
    )
    return fig


def _time_scale(max_s: float) -> tuple[str, float]:
    """Axis unit and multiplier for durations: ms below a second, else s."""
    return ("ms", 1e3) if max_s < 1 else ("s", 1.0)


def _bytes_scale(max_bytes: float) -> tuple[str, float]:
    """Axis unit and divisor for bytes: GiB from 1 GiB up, else MiB."""
    return ("GiB", GIB) if max_bytes >= GIB else ("MiB", MIB)


def _empty_note(text: str, width_in: float) -> Figure:
    """A short figure that says why there is nothing to plot."""
    fig = new_figure(width_in, 1.0)
    ax = fig.subplots()
    ax.set_axis_off()
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=10, color="#555", parse_math=False)
    return fig


#: past this many steps a layer's bars are one collection, not a patch per bar (matplotlib
#: takes about a millisecond per patch: seconds for the hundreds of steps a long trace has)
MANY_BARS = 64


def _bar_layer(
    ax: Any, x: np.ndarray, height: np.ndarray, bottom: np.ndarray, label: str, color: str | None
) -> None:
    """One layer of stacked bars (width 0.7 at ``x``) drawn as a single collection."""
    from matplotlib.collections import PolyCollection

    left, right, top = x - 0.35, x + 0.35, bottom + height
    verts = np.stack(
        [np.column_stack(p) for p in ((left, bottom), (left, top), (right, top), (right, bottom))], axis=1
    )
    ax.add_collection(PolyCollection(list(verts), facecolors=color, edgecolors="none", label=label))
    ax.update_datalim(np.column_stack([np.r_[left, right], np.r_[bottom, top]]))


def _stacked_steps(
    x: pd.Series,
    bars: Sequence[tuple[str, str | None, pd.Series]],
    unit: str,
    scale: float,
    what: str,
    width_in: float,
) -> tuple[Figure, Any]:
    """One stacked bar per profiled step at ``x``, a layer per ``(label, colour, seconds)``,
    the legend beside the axes reading top to bottom like the stack."""
    fig = new_figure(width_in, 3.8)
    ax = fig.subplots()
    bottom = pd.Series(0.0, index=x.index)
    cycled = 0  # the layers without a colour take the property cycle's next, as ax.bar's do
    for label, color, seconds in bars:
        if color is None and len(x) > MANY_BARS:
            color, cycled = f"C{cycled}", cycled + 1
        if len(x) > MANY_BARS:
            _bar_layer(
                ax,
                x.to_numpy(dtype=float),
                (seconds * scale).to_numpy(dtype=float),
                bottom.to_numpy(),
                label,
                color,
            )
        else:
            ax.bar(x, seconds * scale, bottom=bottom, width=0.7, label=label, color=color)
        bottom = bottom + seconds * scale
    if len(x) > MANY_BARS:
        ax.autoscale_view()
    ax.set_xlabel("profiled step")
    ax.set_ylabel(f"{what} ({unit})")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(axis="y", alpha=0.25)
    ax.set_axisbelow(True)
    handles, labels = ax.get_legend_handles_labels()
    _margins(fig, right=_legend_margin(labels))
    _side_legend(fig, handles[::-1], labels[::-1])
    return fig, ax


def breakdown_figure(breakdown: pd.DataFrame, width_in: float = 10.0) -> Figure:
    """Stacked bars, one per profiled step, of where the step's time went (the columns of
    ``step_breakdown``: ``step``, ``step_s`` and the ``*_s`` parts). Parts that are zero
    in every step are left out of the stack and legend."""
    if breakdown is None or breakdown.empty:
        return _empty_note("No step breakdown: the profiler recorded no step (no trace).", width_in)
    parts = [c for c in breakdown.columns if c.endswith("_s") and c != "step_s"]
    parts.sort(key=lambda c: list(BREAKDOWN_PARTS).index(c) if c in BREAKDOWN_PARTS else len(BREAKDOWN_PARTS))
    values = {c: _numeric(breakdown, c).fillna(0.0) for c in parts}
    parts = [c for c in parts if (values[c] > 0).any()]
    total = sum((values[c] for c in parts), start=pd.Series(0.0, index=breakdown.index))
    unit, scale = _time_scale(float(total.max()))
    x = _numeric(breakdown, "step")
    bars = [(*BREAKDOWN_PARTS.get(c, (c.removesuffix("_s"), None)), values[c]) for c in parts]
    fig, ax = _stacked_steps(x, bars, unit, scale, "time per step", width_in)
    median = float(total.median())
    ax.set_title(f"Where each profiled step's time goes (median step {fmt_seconds(median)})", fontsize=10)
    return fig


def device_figure(device_steps: pd.DataFrame, width_in: float = 10.0) -> Figure:
    """Stacked bars, one per profiled step, of the device's time in the step's window
    (``analysis.device.device_steps``): compute, non-compute only, and idle time by cause."""
    if device_steps is None or device_steps.empty:
        return _empty_note("No device time: the trace has no kernels.", width_in)
    window = _numeric(device_steps, "window_s").fillna(0.0)
    values = {
        "compute_s": window * _numeric(device_steps, "compute_pct").fillna(0.0) / 100.0,
        "non_compute_s": window * _numeric(device_steps, "non_compute_pct").fillna(0.0) / 100.0,
        **{c: _numeric(device_steps, c).fillna(0.0) for c in list(DEVICE_PARTS)[2:]},
    }
    unit, scale = _time_scale(float(window.max()))
    x = _numeric(device_steps, "step")
    bars = [(label, color, values[c]) for c, (label, color) in DEVICE_PARTS.items() if (values[c] > 0).any()]
    fig, ax = _stacked_steps(x, bars, unit, scale, "device time per step", width_in)
    idle = float(_numeric(device_steps, "idle_pct").median())
    ax.set_title(f"The GPU's time in each profiled step (median idle {fmt_pct(idle)})", fontsize=10)
    return fig


def memory_figure(timeline: pd.DataFrame, peak_step: int | None = None, width_in: float = 10.0) -> Figure:
    """Stacked area of tensor memory by category (``parameters_bytes`` …
    ``other_bytes``) against time since the run's start (``t_s``), with the start of each
    recorded step marked. ``peak_step``: the step whose peak is the run's memory at the peak
    (``record.write.peak_step``), marked and named in the title; the highest point of the
    timeline is named too where it is elsewhere (another step, or the first recorded step,
    whose earlier tensors the profiler never saw made)."""
    cols = [f"{c}_bytes" for c in MEMORY_CATEGORIES]
    if timeline is None or timeline.empty or not set(cols) <= set(timeline.columns):
        return _empty_note(
            "No memory timeline: categories are recorded only for steps the profiler "
            "recorded with memory profiling on.",
            width_in,
        )
    data = timeline.sort_values("t_s", kind="stable", ignore_index=True)
    t = _numeric(data, "t_s")
    ys = [_numeric(data, c).fillna(0.0) for c in cols]
    total = sum(ys, start=pd.Series(0.0, index=data.index))
    unit, scale = _bytes_scale(float(total.max()))
    fig = new_figure(width_in, 3.8)
    ax = fig.subplots()
    ax.stackplot(
        t,
        [y / scale for y in ys],
        labels=[c.replace("_", " ") for c in MEMORY_CATEGORIES],
        colors=[MEMORY_COLORS[c] for c in MEMORY_CATEGORIES],
        alpha=0.85,
    )
    starts = data.groupby("step", sort=True)["t_s"].min() if "step" in data else pd.Series(dtype=float)
    if len(starts) <= MAX_STEP_LINES:
        ax.vlines(starts, 0, 1, transform=ax.get_xaxis_transform(), colors="#555", lw=0.6, ls="--")
    if len(starts) <= MAX_STEP_LABELS:
        for step, start in starts.items():
            ax.annotate(
                f"step {step}",
                (start, 1),
                xycoords=("data", "axes fraction"),
                xytext=(2, -2),
                textcoords="offset points",
                va="top",
                fontsize=7,
                color="#555",
            )
    highest = total.idxmax()
    of_step = (
        total[data["step"] == peak_step] if peak_step is not None and "step" in data else total.iloc[0:0]
    )
    if len(of_step):
        at = of_step.idxmax()
        ax.plot([float(t[at])], [float(total[at]) / scale], "v", color="#222", ms=6, zorder=5)
        title = f"at the peak (step {peak_step}) {fmt_bytes(total[at])} at {float(t[at]):.3f} s"
        if total[highest] > total[at]:
            title += f"; highest {fmt_bytes(total[highest])} at {float(t[highest]):.3f} s"
    else:
        title = f"highest {fmt_bytes(total[highest])} at {float(t[highest]):.3f} s"
    ax.set_title(f"Tensor memory by category: {title}", fontsize=10)
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel(f"tensor memory ({unit})")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.25)
    handles, labels = ax.get_legend_handles_labels()
    _margins(fig, right=_legend_margin(labels))
    _side_legend(fig, handles[::-1], labels[::-1])
    return fig


def short_name(name: str, limit: int = OPERATOR_NAME_CHARS) -> str:
    """``name`` cut to ``limit`` characters in the middle, keeping both the namespace at
    the front and the op (e.g. ``…AddmmBackward0``) at the end."""
    if len(name) <= limit:
        return name
    head = (limit - 1) // 2
    return f"{name[:head]}…{name[len(name) - (limit - 1 - head) :]}"


def _metric_label(metric: str, value: float, calls) -> str:
    if metric.endswith("_s"):
        text = fmt_seconds(value)
    elif metric.endswith("_bytes"):
        text = fmt_bytes(value)
    elif metric.endswith("_pct"):
        text = fmt_pct(value)
    else:
        return f"{value:.0f}"
    if pd.isna(calls):
        return text
    return f"{text} · {int(calls)} call{'' if int(calls) == 1 else 's'}"


def operators_figure(
    operators: pd.DataFrame, metric: str = "self_time_s", top: int = 15, width_in: float = 10.0
) -> Figure:
    """Horizontal bars of the ``top`` operators by ``metric`` (a column of
    ``top_operators``: self_time_s, total_time_s, self_pct, alloc_bytes or calls),
    largest at the top, each bar labelled with its value and call count."""
    if metric not in OPERATOR_METRICS:
        raise ValueError(f"metric must be one of {', '.join(OPERATOR_METRICS)}; got {metric!r}")
    if operators is None or metric not in operators:
        return _empty_note("No operators: the profiler recorded no step (no trace).", width_in)
    ops = operators.assign(_v=_numeric(operators, metric)).dropna(subset=["_v"])
    if ops.empty:
        return _empty_note("No operators: the profiler recorded no step (no trace).", width_in)
    ops = ops.sort_values("_v", ascending=False, kind="stable").head(top).iloc[::-1]
    names = [short_name(str(n)) for n in ops["name"]]
    fig = new_figure(width_in, 1.2 + 0.3 * len(ops))
    _margins(fig, left=0.3 + CHAR_IN * max(len(n) for n in names), top=0.35, bottom=0.5)
    ax = fig.subplots()
    if metric.endswith("_s"):
        unit, mult = _time_scale(float(ops["_v"].max()))
        scaled = ops["_v"] * mult
    elif metric.endswith("_bytes"):
        unit, div = _bytes_scale(float(ops["_v"].abs().max()))
        scaled = ops["_v"] / div
    else:
        unit, scaled = ("%" if metric.endswith("_pct") else "count"), ops["_v"]
    y = range(len(ops))
    bars = ax.barh(y, scaled, color="#4c72b0", height=0.7)
    calls = ops["calls"] if "calls" in ops else pd.Series(float("nan"), index=ops.index)
    ax.bar_label(
        bars,
        labels=[_metric_label(metric, v, c) for v, c in zip(ops["_v"], calls, strict=True)],
        padding=3,
        fontsize=8,
    )
    # Operator names come from the trace: parse_math=False keeps a "$" from becoming TeX.
    ax.set_yticks(list(y), names, fontsize=8, parse_math=False)
    ax.set_xlabel(f"{OPERATOR_METRICS[metric]} ({unit})")
    ax.margins(x=0.18)
    ax.grid(axis="x", alpha=0.25)
    ax.set_axisbelow(True)
    ax.set_title(f"Top {len(ops)} operators by {OPERATOR_METRICS[metric]}", fontsize=10)
    return fig


def figure_png(fig: Figure, dpi: int = 100) -> bytes:
    """``fig`` as a PNG, each text in a font that has its characters (``fonts.fit_text``)."""
    fit_text(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, pil_kwargs=PNG_OPTIONS)
    return buf.getvalue()


def per_rank_figure(per_rank: pd.DataFrame, width_in: float = 10.0) -> Figure:
    """Per rank (``analysis.ranks.per_rank``): median step time split into work and time inside
    collectives (stragglers in red), and peak tensor memory, side by side, ranks grouped
    by node along the x axis."""
    if per_rank is None or per_rank.empty:
        return _empty_note("No ranks were recorded.", width_in)
    df = per_rank.sort_values(["node_rank", "rank"] if "node_rank" in per_rank else ["rank"])
    labels = [
        f"{int(r)}\nnode {int(n)}" if pd.notna(n) else str(int(r))
        for r, n in zip(df["rank"], df.get("node_rank", pd.Series(index=df.index, dtype=float)), strict=True)
    ]
    x = range(len(df))
    step = _numeric(df, "step_time_median_s").fillna(0.0)
    comm = (step * _numeric(df, "collective_share").fillna(0.0)).clip(upper=step)
    unit, scale = _time_scale(float(step.max()) if len(step) else 0.0)
    fig = new_figure(width_in, 3.4)
    _margins(fig, top=0.35, bottom=1.05, wspace=0.25)
    ax_t, ax_m = fig.subplots(1, 2)
    work_colors = ["#c0392b" if s else "#1f77b4" for s in df.get("straggler", [False] * len(df))]
    ax_t.bar(x, (step - comm) * scale, color=work_colors, label="work (outside collectives)")
    ax_t.bar(x, comm * scale, bottom=(step - comm) * scale, color="#f4a582", label="inside collectives")
    ax_t.set_ylabel(f"median step time ({unit})")
    ax_t.set_title("Step time per rank (red: straggler)", fontsize=10)
    fig.legend(fontsize=8, frameon=False, loc="lower left", ncols=2)
    mem = _numeric(df, "peak_mem_bytes")
    if mem.notna().any():
        munit, div = _bytes_scale(float(mem.max()))
        ax_m.bar(x, mem.fillna(0.0) / div, color="#2ca02c")
        ax_m.set_ylabel(f"peak tensor memory ({munit})")
    else:
        ax_m.text(0.5, 0.5, "peak tensor memory not recorded", ha="center", va="center", color="#555")
    ax_m.set_title("Peak tensor memory per rank", fontsize=10)
    for ax in (ax_t, ax_m):
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.set_xlabel("rank")
        ax.grid(axis="y", alpha=0.25)
        ax.set_axisbelow(True)
    return fig


def rank_timeline_figure(rank_steps: pd.DataFrame, ranks: pd.DataFrame, width_in: float = 10.0) -> Figure:
    """Every rank's steps against time since the first rank started (s), one row per rank
    (node order), coloured by the profiler's phase; stragglers and gaps show as misaligned
    or longer bars. ``rank_steps``: a job's steps with a ``rank`` column; ``ranks``: its
    ranks.csv (``started_at`` aligns the ranks' clocks)."""
    if rank_steps is None or rank_steps.empty or "rank" not in rank_steps:
        return _empty_note("No steps from the ranks.", width_in)
    starts = (
        pd.to_datetime(ranks.get("started_at"), errors="coerce", utc=True) if "started_at" in ranks else None
    )
    offsets: dict[int, float] = {}
    if starts is not None and starts.notna().any():
        first = starts.min()
        offsets = {
            int(r): (t - first).total_seconds()
            for r, t in zip(ranks["rank"], starts, strict=True)
            if pd.notna(t) and pd.notna(r)
        }
    order = (
        ranks.sort_values(["node_rank", "rank"])["rank"].dropna().astype(int).tolist()
        if "node_rank" in ranks
        else sorted(rank_steps["rank"].unique())
    )
    fig = new_figure(width_in, 0.9 + 0.35 * len(order))
    _margins(fig, left=0.9, top=0.35, bottom=0.5)
    ax = fig.subplots()
    colors = {"wait": "#bbbbbb", "none": "#9ecae1", **PHASE_COLORS, "active": "#3182bd"}
    for y, rank in enumerate(order):
        steps = rank_steps[rank_steps["rank"] == rank]
        start = _numeric(steps, "start_s") + offsets.get(rank, 0.0)
        dur = _numeric(steps, "duration_s")
        phase = steps["phase"] if "phase" in steps else pd.Series("none", index=steps.index)
        ax.broken_barh(
            list(zip(start, dur, strict=True)),
            (y - 0.4, 0.8),
            facecolors=[colors.get(p, "#9ecae1") for p in phase],
            edgecolor="white",
            linewidth=0.3,
        )
    ax.set_yticks(range(len(order)), [f"rank {r}" for r in order], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time since the first rank started profiling (s)")
    ax.set_title("Steps of every rank (dark: recorded by the profiler)", fontsize=10)
    ax.grid(axis="x", alpha=0.25)
    return fig
