"""Memory footprint by category: parameters, gradients, optimizer state, activations and
other/temporary tensors, at the run's peak (``record.write.peak_step``) and over time
(from the run's memory replay, see ``swift_nb.capture.memory.categories``)."""

from __future__ import annotations

import pandas as pd

from swift_nb.record import MEMORY_CATEGORIES, Run
from swift_nb.record.write import memory_steps, peak_step

FOOTPRINT_COLUMNS = ["category", "at_peak_bytes", "max_bytes", "share_pct"]


#: a category added after runs were recorded without it (their logits are among their
#: activations and other tensors): a table that lacks it is still one with categories
LATER = "logits_bytes"


def memory_footprint(run: Run) -> pd.DataFrame:
    """One row per category: bytes at the run's peak (``at_peak_bytes``: the categories of
    ``record.write.peak_step``, the recorded step whose peak is the median, at its peak
    moment), the category's own maximum over the recorded steps (``max_bytes``: each at its
    own moment, so they do not add up to a peak), and its share of the peak (%). Empty when
    the profiler recorded no step with memory profiling on.

    The recorded steps are ``record.write.memory_steps``: where a recorded step follows
    another, only such steps. A category the run did not record (a run from before
    ``frozen_parameters`` existed) is NaN: unknown, not 0."""
    cols = [f"{c}_bytes" for c in MEMORY_CATEGORIES]
    steps = run.steps
    if not set(cols) - {LATER} <= set(steps.columns):
        return pd.DataFrame(columns=FOOTPRINT_COLUMNS)
    steps = steps.reindex(columns=[*steps.columns, *(c for c in cols if c not in steps)])
    step = peak_step(steps)
    if step is None:
        return pd.DataFrame(columns=FOOTPRINT_COLUMNS)
    recorded = memory_steps(steps)
    at_peak = steps.loc[steps["step"] == step, cols].iloc[0]
    timeline = run.memory[run.memory["step"].isin(recorded["step"])] if len(run.memory) else run.memory
    timeline = timeline.reindex(columns=[*timeline.columns, *(c for c in cols if c not in timeline)])
    maxima = timeline[cols].max() if len(timeline) else recorded[cols].max()
    total = float(at_peak.sum(min_count=1)) or 1.0
    return pd.DataFrame(
        {
            "category": MEMORY_CATEGORIES,
            "at_peak_bytes": at_peak.to_numpy(dtype=float),
            "max_bytes": maxima.to_numpy(dtype=float),
            "share_pct": 100.0 * at_peak.to_numpy(dtype=float) / total,
        }
    )


def memory_timeline(run: Run) -> pd.DataFrame:
    """Category bytes over time during the recorded steps: ``t_s``, ``step`` and one
    ``<category>_bytes`` column per category."""
    return run.memory


def memory_growth(run: Run) -> tuple[float, str]:
    """How much live tensor memory grows per step, in bytes, and what measured it.

    Best: what each recorded step allocated and did not free (the replay's live bytes at
    the step's end minus at its start; median over the recorded steps that follow another
    recorded step, whose allocations the profiler saw from the start); then the per-step
    tensor peak where every step has one (CUDA); then the slope of RSS over all steps
    (coarse: the allocator caches)."""
    cols = [f"{c}_bytes" for c in MEMORY_CATEGORIES]
    if len(run.memory) and set(cols) <= set(run.memory.columns):
        totals = run.memory[cols].sum(axis=1).groupby(run.memory["step"])
        net = (totals.last() - totals.first()).sort_index()
        followers = net[pd.Series(net.index, index=net.index).diff() == 1]
        chosen = followers if len(followers) else net
        return float(chosen.median()), "tensors each recorded step allocated and kept"
    steps = run.steps[run.steps["trigger"] != "end"] if "trigger" in run.steps else run.steps
    # RSS also moves as the allocator warms up and caches: only a long, steady climb counts.
    for col, source, minimum, min_corr in (
        ("peak_tensor_bytes", "per-step tensor peak", max(4, len(steps) // 2), 0.0),
        ("rss_bytes", "process RSS over steps", 20, 0.95),
    ):
        series = (
            pd.to_numeric(steps[col], errors="coerce").dropna() if col in steps else pd.Series(dtype=float)
        )
        if len(series) >= minimum:
            x = steps.loc[series.index, "step"].astype(float)
            if min_corr and not series.corr(x) >= min_corr:
                continue
            return float(series.cov(x) / x.var()), source
    return 0.0, "not enough steps"
