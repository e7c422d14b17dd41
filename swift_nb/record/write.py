"""Writing a run folder: where it goes, atomic writes, the summary."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from swift_nb.core.errors import ConfigError, RunDirError
from swift_nb.record.counters import counter_summary, step_counters
from swift_nb.record.layout import (
    DEFAULT_KEEP,
    ENV_DIR,
    ENV_KEEP,
    MEMORY_CATEGORIES,
    MEMORY_FILE,
    MODULES_FILE,
    RUN_FILE,
    SAMPLES_FILE,
    STEPS_FILE,
)
from swift_nb.record.run import RANK_TABLES, Run


def default_root() -> Path:
    """Where run folders go: ``$SWIFT_NB_DIR`` or ``./swift_nb_runs``."""
    return Path(os.environ.get(ENV_DIR) or "swift_nb_runs")


def default_keep() -> int:
    raw = os.environ.get(ENV_KEEP)
    if raw is None:
        return DEFAULT_KEEP
    try:
        keep = int(raw)
    except ValueError:
        keep = 0
    if keep < 1:
        raise ConfigError(ENV_KEEP, "must be a whole number of runs to keep, at least 1", raw)
    return keep


def ensure_writable(root: Path) -> Path:
    """Create ``root`` if needed and prove it is writable; raise ``RunDirError`` if not."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".probe-"):
            pass
    except OSError as e:
        raise RunDirError(
            f"swift_nb cannot write run records to {str(root)!r} ({e.strerror or e}). "
            f"Pass a writable folder (out_dir=... or --out DIR) or set {ENV_DIR}."
        ) from None
    return root


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_csv(path: Path, df: pd.DataFrame) -> None:
    """``df`` as CSV (no index) at ``path``, atomically; written straight to the file, not
    built as one string first (a 100 000-step run's steps.csv would be ~10 MB of it, twice)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            df.to_csv(f, index=False)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def save(run: Run, path: Path | str | None = None) -> Path:
    """Write ``run`` into its folder and return the folder.

    Args:
        run: the Run to write: its tables, then run.json.
        path: the folder (default ``run.path``); created if missing, and set as ``run.path``.

    Returns:
        The folder written.
    """
    folder = Path(path) if path is not None else run.path
    if folder is None:
        raise ValueError("save() needs a folder: pass path=... or set run.path")
    folder.mkdir(parents=True, exist_ok=True)
    run.path = folder
    run.files.setdefault("steps", STEPS_FILE)
    run.files.setdefault("samples", SAMPLES_FILE)
    atomic_write_csv(folder / STEPS_FILE, run.steps)
    atomic_write_csv(folder / SAMPLES_FILE, run.samples)
    if len(run.memory):
        run.files.setdefault("memory", MEMORY_FILE)
        atomic_write_csv(folder / MEMORY_FILE, run.memory)
    save_modules(run)
    for name, file in RANK_TABLES.items():
        table = getattr(run, name)
        if len(table):
            run.files.setdefault(name, file)
            atomic_write_csv(folder / file, table)
    # run.json last: its presence means the tables it names are complete.
    return save_meta(run)


def save_modules(run: Run) -> None:
    """modules.csv, when the run has its table (``swift_nb.analysis.modules``)."""
    if len(run.modules) and run.path is not None:
        run.files["modules"] = MODULES_FILE
        atomic_write_csv(Path(run.path) / MODULES_FILE, run.modules)


def save_meta(run: Run) -> Path:
    """Write only ``run.json`` of a saved run (its tables stay as they are on disk: a
    report must not rewrite, or invent, the tables it read)."""
    if run.path is None:
        raise ValueError("save_meta() needs a saved run (run.path is None)")
    atomic_write_text(run.path / RUN_FILE, json.dumps(run.meta(), indent=2, default=str))
    return run.path


def _max_or_none(values: pd.Series) -> float | None:
    values = pd.to_numeric(values, errors="coerce").dropna()
    return float(values.max()) if len(values) else None


#: the profiler's schedule phases in which it runs (warmup and active): its cost is in their steps
TRACED_PHASES = ("warmup", "active")
#: what a run's step time is the median of (``step_durations``)
PROFILER_OFF = "profiler off"
EVERY_STEP = "every step (fewer than 3 ran with the profiler off)"
#: the fewest profiler-off steps a step time is the median of; fewer: every step's
MIN_OFF_STEPS = 3


def step_durations(steps: pd.DataFrame) -> tuple[pd.Series, str]:
    """The durations a run's step time is the median of, and what they are: the steps an
    optimizer (or ``swift_nb.step()``) ended that did not compile and ran with the profiler
    off, the run's first step left out (it pays lazy initialisation) (``PROFILER_OFF``); in a
    run with fewer than ``MIN_OFF_STEPS`` of those, every such step, traced ones included
    (``EVERY_STEP``). One definition for the Summary, the Throughput section, the comparison,
    ``swift-nb list`` and the exports."""
    if steps.empty or "duration_s" not in steps:
        return pd.Series(dtype=float), PROFILER_OFF
    rows = steps[steps["trigger"] != "end"] if "trigger" in steps else steps
    compiling = pd.to_numeric(
        rows.get("compile_s", pd.Series(0.0, index=rows.index)), errors="coerce"
    ).fillna(0.0)
    steady = rows[compiling <= 0] if (compiling <= 0).any() else rows
    phase = steady["phase"].astype(str) if "phase" in steady else pd.Series("none", index=steady.index)
    first = steady.index == steady.index.min()
    off = steady[~phase.isin(TRACED_PHASES) & ~first]
    chosen, basis = (off, PROFILER_OFF) if len(off) >= MIN_OFF_STEPS else (steady, EVERY_STEP)
    return pd.to_numeric(chosen["duration_s"], errors="coerce").dropna(), basis


#: steps.csv's bytes by memory category at each recorded step's peak
CATEGORY_COLUMNS = [f"{c}_bytes" for c in MEMORY_CATEGORIES]


def memory_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The recorded steps a run's memory at the peak is read from: those with memory
    categories, and of them the ones that follow another recorded step where there are such
    (the profiler saw every allocation alive in those; the first step of a recording also
    holds tensors whose allocation it never saw)."""
    cols = [c for c in CATEGORY_COLUMNS if c in steps]
    if not cols or "step" not in steps:
        return steps.iloc[0:0]
    recorded = steps.dropna(subset=cols, how="all")
    followers = recorded[recorded["step"].isin(recorded["step"] + 1)]
    return followers if len(followers) else recorded


def peak_step(steps: pd.DataFrame) -> int | None:
    """The step whose peak is the run's memory "at the peak": of ``memory_steps``, the one
    whose peak (its categories' sum at its peak moment) is the median; of two in the middle,
    the larger (memory errs high). None when no step recorded memory categories.

    One definition of "at the peak" (which step, which moment) for the summary's
    ``memory_categories_at_peak``, the Memory section's table and figure, the forecast's
    measured categories and the advisor: each reads this step's categories at its peak
    moment, never a mix of steps (a median per category can take each from another step)."""
    chosen = memory_steps(steps)
    if chosen.empty:
        return None
    cols = [c for c in CATEGORY_COLUMNS if c in chosen]
    order = pd.DataFrame({"total": chosen[cols].sum(axis=1), "step": chosen["step"]})
    order = order.sort_values(["total", "step"], kind="stable")
    return int(order["step"].iloc[len(order) // 2])


def summarize(steps: pd.DataFrame, samples: pd.DataFrame) -> dict[str, Any]:
    """Headline metrics of a run from its tables (seconds, bytes, percent)."""
    out: dict[str, Any] = {"steps": int((steps["trigger"] != "end").sum()) if len(steps) else 0}
    dur = pd.to_numeric(steps["duration_s"], errors="coerce").dropna()
    # The step time: the median over the steady steps (not compiling) that ran with the
    # profiler off (step_durations); the traced steps' and every step's keep their own names.
    timed, basis = step_durations(steps)
    out["step_time_median_s"] = float(timed.median()) if len(timed) else None
    out["step_time_p90_s"] = float(timed.quantile(0.9)) if len(timed) else None
    out["step_time_basis"] = basis
    out["step_time_median_all_s"] = float(dur.median()) if len(dur) else None
    out["step_time_p90_all_s"] = float(dur.quantile(0.9)) if len(dur) else None
    traced = (
        steps[steps["phase"].astype(str) == "active"] if "phase" in steps and len(steps) else steps.iloc[0:0]
    )
    traced_dur = pd.to_numeric(traced.get("duration_s", pd.Series(dtype=float)), errors="coerce").dropna()
    out["step_time_traced_median_s"] = float(traced_dur.median()) if len(traced_dur) else None
    median = out["step_time_median_s"]
    out["steps_per_s"] = 1.0 / median if median else None
    total = float(dur.sum())
    out["wall_steps_per_s"] = out["steps"] / total if out["steps"] and total > 0 else None
    out["peak_mem_bytes"] = _max_or_none(steps["peak_tensor_bytes"]) if len(steps) else None
    rss = [_max_or_none(t["rss_bytes"]) for t in (steps, samples) if "rss_bytes" in t and len(t)]
    out["peak_rss_bytes"] = max((r for r in rss if r is not None), default=None)
    gpu_cols = [
        c for c in samples.columns if c.startswith("gpu") and c.endswith("_util_pct") and "mem" not in c
    ]
    if gpu_cols:
        util = samples[gpu_cols].apply(pd.to_numeric, errors="coerce").mean(axis=1).dropna()
        out["util_source"] = "gpu"
    elif "cpu_pct" in samples and len(samples):
        util = pd.to_numeric(samples["cpu_pct"], errors="coerce").dropna()
        out["util_source"] = "cpu"
    else:
        util = pd.Series(dtype="float64")
        out["util_source"] = None
    out["mean_util_pct"] = float(util.mean()) if len(util) else None
    out["peak_util_pct"] = float(util.max()) if len(util) else None
    out.update(energy_summary(steps, samples))
    out.update(token_summary(steps))
    out.update(counter_summary(steps, samples))
    return out


def token_summary(steps: pd.DataFrame) -> dict[str, Any]:
    """Tokens of the steps that counted them (steps.csv's ``tokens``, ``real_tokens``):
    ``tokens_per_step`` and ``real_tokens_per_step`` (means over those steps, so that their
    ratio is the real share of all the tokens computed), ``padding_pct`` (the share of the
    computed tokens that are padding: 100 × (1 − real_tokens_per_step / tokens_per_step))
    and ``real_tokens_per_s`` (real tokens per step × steps per second, 1 / the run's step
    time: ``step_durations``). One definition for the Summary, the Throughput section
    (``analysis.throughput``), the advisor and the forecast. Empty when no step counted
    tokens."""
    if "tokens" not in steps or "real_tokens" not in steps:
        return {}
    table = steps[["tokens", "real_tokens"]].apply(pd.to_numeric, errors="coerce")
    table = table[(steps["trigger"] != "end") & table["tokens"].gt(0) & table["real_tokens"].notna()]
    if not len(table):
        return {}
    tokens, real = float(table["tokens"].mean()), float(table["real_tokens"].mean())
    timed, _ = step_durations(steps)
    step_s = float(timed.median()) if len(timed) else 0.0
    return {
        "tokens_per_step": tokens,
        "real_tokens_per_step": real,
        "padding_pct": 100.0 * (1.0 - real / tokens),
        "real_tokens_per_s": real * (1.0 / step_s) if step_s > 0 else None,
    }


def _energy_columns(samples: pd.DataFrame) -> list[str]:
    """The GPUs' energy columns of the devices the run used: where the samples have torch's
    allocator bytes (``cuda{i}_allocated_bytes``, the same index i), those it allocated on,
    so the idle GPUs of a machine whose process trains on one are not counted."""
    energy = [c for c in samples.columns if c.startswith("gpu") and c.endswith("_energy_j")]

    def used(column: str) -> bool:
        allocated = column.replace("gpu", "cuda", 1).replace("_energy_j", "_allocated_bytes")
        if allocated not in samples.columns:
            return True
        return bool(pd.to_numeric(samples[allocated], errors="coerce").fillna(0).max() > 0)

    return [c for c in energy if used(c)]


def _cumulative(samples: pd.DataFrame, columns: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(t_s, joules since the first sample, summed over ``columns``) of the samples that
    read every column, in time order."""
    table = samples[["t_s", *columns]].apply(pd.to_numeric, errors="coerce").dropna().sort_values("t_s")
    t = table["t_s"].to_numpy(dtype=float)
    total = table[columns].sum(axis=1).to_numpy(dtype=float)
    return t, total - total[0] if len(total) else total


def step_energy_j(steps: pd.DataFrame, samples: pd.DataFrame) -> pd.Series:
    """Joules the GPUs took in each step (summed over the devices sampled), the cumulative
    ``gpu{i}_energy_j`` read at the step's start and end (linear between samples: a step
    shorter than the sampling period gets the power around it × its duration); NaN for a
    step outside the sampled span, and for every step of a run without energy columns."""
    nan = pd.Series(np.nan, index=steps.index, dtype="float64")
    columns = _energy_columns(samples) if len(samples) else []
    if not columns or not len(steps):
        return nan
    t, energy = _cumulative(samples, columns)
    if len(t) < 2:
        return nan
    start = pd.to_numeric(steps["start_s"], errors="coerce").to_numpy(dtype=float)
    end = pd.to_numeric(steps["end_s"], errors="coerce").to_numpy(dtype=float)
    per_step = np.interp(end, t, energy) - np.interp(start, t, energy)
    inside = (start >= t[0]) & (end <= t[-1])
    return pd.Series(np.where(inside, per_step, np.nan), index=steps.index)


def energy_summary(steps: pd.DataFrame, samples: pd.DataFrame) -> dict[str, Any]:
    """``energy_j`` (the GPUs' joules from the first sample to the last, every device),
    ``avg_power_w`` (over that span), ``energy_per_step_j`` (the median step's joules,
    ``step_energy_j``), and ``cpu_energy_j`` (the CPU packages', RAPL) where sampled."""
    out: dict[str, Any] = {}
    columns = _energy_columns(samples) if len(samples) else []
    if columns:
        t, energy = _cumulative(samples, columns)
        if len(t) >= 2 and t[-1] > t[0]:
            out["energy_j"] = float(energy[-1])
            out["avg_power_w"] = float(energy[-1] / (t[-1] - t[0]))
            per_step = step_energy_j(steps, samples).dropna()
            if len(per_step):
                out["energy_per_step_j"] = float(per_step.median())
    if "cpu_energy_j" in samples.columns and len(samples):
        t, energy = _cumulative(samples, ["cpu_energy_j"])
        if len(t) >= 2:
            out["cpu_energy_j"] = float(energy[-1])
    return out


def tabulate(run: Any, steps: pd.DataFrame, samples: pd.DataFrame, status: str, wall_s: float) -> None:
    """A finished run's steps (with the samples' per-step counters), samples, status, wall
    time and summary (``summarize``)."""
    run.samples = samples
    run.steps = pd.concat([steps, step_counters(steps, samples)], axis=1)
    run.status = status
    run.wall_s = wall_s
    run.summary.update(summarize(run.steps, run.samples))
