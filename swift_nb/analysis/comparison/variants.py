"""Side-by-side comparison of runs: one row per variant, ratios to the baseline, and the
advisor's predicted effect next to the measured one.

A variant that compiles (``torch_compile``) shows its compile time apart: ``compile_s``,
``recompiles`` and ``graph_breaks`` from its summary, ``step_time_median_s`` over the steps
that did not compile and ``step_time_median_all_s`` over all of them. A variant run on
several ranks (``fsdp``, ``ddp``, ``sequence_parallel``) has each rank's memory by category
in ``rank_memory``, beside the forecast of the baseline with the variant's toggles over
that many ranks.

Predictions come from the baseline's own numbers: its memory by category and its
findings' evidence, plus what each toggle reported it did in the variant's run
(``run.context["toggles"]``). Where a single-toggle variant's measured peak memory differs
from the predicted peak by more than ``DISAGREE`` (relative), the row says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from swift_nb import vocabulary
from swift_nb.analysis import ranks as rank_analysis
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.cost import MONEY_COLUMNS, money_columns
from swift_nb.analysis.effects import Applied, toggle_peak
from swift_nb.analysis.forecast import forecast, parse_toggles
from swift_nb.analysis.memory import memory_footprint
from swift_nb.record import MEMORY_CATEGORIES, Run

DISAGREE = 0.25
COMPARE_COLUMNS = [
    "variant",
    "status",
    "steps",
    "step_time_median_s",
    "step_time_basis",
    "step_time_median_all_s",
    "compile_s",
    "recompiles",
    "graph_breaks",
    "steps_per_s",
    "peak_mem_bytes",
    *[f"{c}_bytes" for c in MEMORY_CATEGORIES],
    "mean_util_pct",
    "mean_sm_active_pct",
    "mean_tensor_active_pct",
    "device_idle_pct",
    "device_compute_pct",
    *MONEY_COLUMNS,
    "ranks",
    "step_time_max_rank_s",
    "peak_mem_max_rank_bytes",
    "collective_share_max_rank",
    "step_time_ratio",
    "peak_mem_ratio",
    "scaling_efficiency",
    "grew",
    "predicted",
    "predicted_peak_bytes",
    "notes",
    "run",
]


def _footprint(run: Run) -> dict[str, float]:
    fp = memory_footprint(run)
    return {f"{r.category}_bytes": float(r.at_peak_bytes) for r in fp.itertuples()}


def _row(name: str, run: Run | None, status: str | None, notes: list[str]) -> dict:
    row: dict = dict.fromkeys(COMPARE_COLUMNS, np.nan)
    row.update(
        variant=name, status=status or (run.status if run else "failed"), notes="; ".join(notes), run=""
    )
    row["predicted"] = ""
    if run is None:
        return row
    s = run.summary
    cats = _footprint(run)
    row.update(cats)
    row.update(
        steps=s.get("steps"),
        step_time_median_s=s.get("step_time_median_s"),
        step_time_basis=s.get("step_time_basis"),
        step_time_median_all_s=s.get("step_time_median_all_s", s.get("step_time_median_s")),
        compile_s=s.get("compile_s", 0.0),
        recompiles=s.get("recompiles", 0),
        graph_breaks=s.get("graph_breaks", 0),
        steps_per_s=(1.0 / s["step_time_median_s"]) if s.get("step_time_median_s") else np.nan,
        peak_mem_bytes=sum(cats.values()) if cats else s.get("peak_mem_bytes"),
        mean_util_pct=s.get("mean_util_pct"),
        mean_sm_active_pct=s.get("mean_sm_active_pct"),
        mean_tensor_active_pct=s.get("mean_tensor_active_pct"),
        device_idle_pct=s.get("device_idle_pct"),
        device_compute_pct=s.get("device_compute_pct"),
        run=str(run.path or ""),
    )
    row.update({k: np.nan if v is None else v for k, v in money_columns(run).items()})
    row.update(_rank_columns(run))
    return row


def _rank_columns(run: Run) -> dict[str, float]:
    """The worst rank of a job (the only one of a single process): its step time, its
    peak tensor bytes and the largest communication share of a step (0..1)."""
    per_rank = rank_analysis.per_rank(run)
    return {
        "ranks": len(per_rank),
        "step_time_max_rank_s": per_rank["step_time_median_s"].max(),
        "peak_mem_max_rank_bytes": per_rank["peak_mem_bytes"].max(),
        "collective_share_max_rank": per_rank["collective_share"].max(),
    }


def scaling(base: dict, row: dict) -> dict[str, object]:
    """A row on another number of ranks than the baseline's: ``scaling_efficiency`` (its
    throughput per rank over the baseline's: the baseline's step ÷ its own, each rank at the
    same batch) and ``grew``, which part of the step grew most from the baseline's — its
    collective time (the step × its largest collective share) or the rest, the compute."""
    step, base_step = row.get("step_time_median_s"), base.get("step_time_median_s")
    ranks, base_ranks = row.get("ranks"), base.get("ranks")
    if not (step and base_step and np.isfinite(step) and np.isfinite(base_step)) or ranks == base_ranks:
        return {}
    comm = step * np.nan_to_num(row.get("collective_share_max_rank") or 0.0)
    base_comm = base_step * np.nan_to_num(base.get("collective_share_max_rank") or 0.0)
    more_comm, more_compute = comm - base_comm, (step - comm) - (base_step - base_comm)
    grew = (
        f"communication +{more_comm * 1e3:.1f} ms"
        if more_comm >= more_compute
        else f"compute +{more_compute * 1e3:.1f} ms"
    )
    return {"scaling_efficiency": base_step / step, "grew": grew}


def predicted_peak(base: dict, toggle: str, details: dict, findings: Sequence[Finding]) -> float | None:
    """Peak tensor bytes the baseline would have with ``toggle`` alone, or None when its
    numbers do not tell (``effects.toggle_peak``). ``base``: the baseline's row; ``details``:
    the toggle's report details in the variant's run; ``findings``: the baseline's."""
    peak = base.get("peak_mem_bytes")
    if not peak or not np.isfinite(peak):
        return None
    return toggle_peak(toggle, peak, base, details, {f.id: f.evidence for f in findings})


def compare_runs(
    runs: Sequence[tuple[str, Run | None, str | None, list[str]]],
    findings: Sequence[Finding] = (),
) -> pd.DataFrame:
    """The comparison table. ``runs``: ``(variant, run or None, status override, notes)``
    with the baseline first; ``findings``: the baseline's advisor findings.

    Columns: step_time_median_s (s, over the steps that did not compile),
    step_time_basis (which of those: the run's summary's, ``record.write.step_durations``),
    step_time_median_all_s (s, over every step), compile_s (s spent compiling, all steps),
    recompiles, graph_breaks (counts), steps_per_s (from the steady median), peak_mem_bytes and ``<category>_bytes``
    (tensor bytes at the step peak; rank 0's in a job of several ranks), mean_util_pct (%),
    device_idle_pct and device_compute_pct (% of the GPU's window; GPU runs only),
    ranks (processes of the run), step_time_max_rank_s (s), peak_mem_max_rank_bytes and
    collective_share_max_rank (0..1 of the step in collectives): the largest over the ranks,
    each rank measuring itself; step_time_ratio and
    peak_mem_ratio (variant / baseline), scaling_efficiency and grew (a run on another
    number of ranks than the baseline's, at the same per-rank batch: throughput per rank
    against the baseline's, and the part of the step that grew most, ``scaling``),
    predicted (the advisor's words for the toggles
    of the variant), predicted_peak_bytes, notes, run (its folder)."""
    rows = [_row(name, run, status, list(notes)) for name, run, status, notes in runs]
    if not rows:
        return pd.DataFrame(columns=COMPARE_COLUMNS)
    base = rows[0]
    for (_, run, _, _), row in zip(runs, rows, strict=True):
        for col, ratio in (("step_time_median_s", "step_time_ratio"), ("peak_mem_bytes", "peak_mem_ratio")):
            b = base.get(col)
            if b and np.isfinite(b) and row.get(col) is not None and np.isfinite(row[col]):
                row[ratio] = row[col] / b
        if run is None or row is base:
            continue
        row.update(scaling(base, row))
        toggles = run.context.get("toggles") or []
        words = [
            f"{f.toggle}: {f.predicted_effect}"
            for f in findings
            if f.toggle in {t["toggle"] for t in toggles}
        ]
        row["predicted"] = "; ".join(words)
        if len(toggles) == 1:
            pred = predicted_peak(base, toggles[0]["toggle"], toggles[0].get("details", {}), findings)
            if pred is not None and pred > 0:
                row["predicted_peak_bytes"] = pred
                measured = row.get("peak_mem_bytes")
                if measured and np.isfinite(measured) and abs(measured - pred) / pred > DISAGREE:
                    note = (
                        f"measured peak differs from the prediction by {100 * (measured - pred) / pred:+.0f} % "
                        "(more than 25 %)"
                    )
                    row["notes"] = "; ".join(filter(None, [row["notes"], note]))
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)


RANK_MEMORY_COLUMNS = [
    "variant",
    "rank",
    "category",
    "measured_bytes",
    "forecast_bytes",
    "held_bytes",
    "forecast_held_bytes",
    "error_pct",
    "expected_error_pct",
]
#: the categories sharding divides, held to the issue's target (within 10 %)
SHARDED_CATEGORIES = ("parameters", "gradients", "optimizer_state")


def rank_memory(runs: Sequence[tuple[str, Run]]) -> pd.DataFrame:
    """Each rank's tensor bytes by category, for the baseline (the first of ``runs``) and
    each variant, against the forecast of the baseline with the variant's toggles over the
    variant's ranks. One row per variant, rank and category; empty when no run recorded
    memory by category.

    measured_bytes: at the rank's step peak; forecast_bytes: the forecast's, per rank, at
    its peak (NaN for the baseline, or when no forecast can be made); held_bytes: the
    category's own maximum in a recorded step, the least over the recorded steps: what a
    rank holds is there in every step, while a copy that outlives its step in some steps
    is not (FSDP's rank once showed twice its gradient shard in the median step);
    forecast_held_bytes (parameters, gradients,
    optimizer state): the baseline's maximum divided as the forecast shards it
    (``effects.Applied.shards``). error_pct (%, + = more measured): held against
    forecast_held for those three categories — the step's peak moves under sharding (it
    falls in another phase of the step, with another share of the gradients alive), while
    what a rank holds of them does not — and measured against forecast for the others.
    expected_error_pct: how far off the forecast said its total may be (±%)."""
    rows: list[dict] = []
    if not runs:
        return pd.DataFrame(columns=RANK_MEMORY_COLUMNS)
    base = runs[0][1]
    base_held = _held(base)
    for i, (name, run) in enumerate(runs):
        records = (
            rank_analysis.rank_records(run)
            if rank_analysis.is_job(run)
            else {int(run.environment.get("rank", 0)): run}
        )
        predicted: dict[str, float] = {}
        held: dict[str, float] = {}
        expected = np.nan
        if i and (rank_analysis.is_job(run) or run.context.get("toggles")):
            toggles = {
                t["toggle"]: t.get("params") or {}
                for t in run.context.get("toggles") or []
                if t.get("toggle") in vocabulary.TOGGLES
            }
            world = max(1, len(records))
            try:
                f = forecast(base, toggles=toggles, world_size=world)
            except (ValueError, KeyError):
                f = None
            if f is not None:
                predicted, expected = dict(f.categories), f.expected_error_pct
                shards = dict(
                    zip(SHARDED_CATEGORIES, Applied(parse_toggles(toggles)).shards(world), strict=True)
                )
                held = {c: base_held[c] / n for c, n in shards.items() if c in base_held}
        for rank, record in sorted(records.items()):
            most = _held(record)
            for r in memory_footprint(record).itertuples():
                want, want_held = predicted.get(r.category, np.nan), held.get(r.category, np.nan)
                most_held = most.get(r.category, float(r.max_bytes))
                sharded = r.category in SHARDED_CATEGORIES
                got, ref = (most_held, want_held) if sharded else (r.at_peak_bytes, want)
                rows.append(
                    {
                        "variant": name,
                        "rank": rank,
                        "category": r.category,
                        "measured_bytes": float(r.at_peak_bytes),
                        "forecast_bytes": want,
                        "held_bytes": most_held,
                        "forecast_held_bytes": want_held,
                        "error_pct": 100.0 * (got - ref) / ref if ref and np.isfinite(ref) else np.nan,
                        "expected_error_pct": expected,
                    }
                )
    return pd.DataFrame(rows, columns=RANK_MEMORY_COLUMNS)


def _held(run: Run) -> dict[str, float]:
    """Each category's own maximum in a recorded step, the least over the recorded steps
    (bytes); the footprint's maximum when the run has no memory timeline."""
    cols = [f"{c}_bytes" for c in MEMORY_CATEGORIES]
    mem = run.memory
    if len(mem) and set(cols) <= set(mem.columns) and "step" in mem:
        per_step = mem.groupby("step")[cols].max().min()
        return {c: float(per_step[f"{c}_bytes"]) for c in MEMORY_CATEGORIES}
    return {r.category: float(r.max_bytes) for r in memory_footprint(run).itertuples()}
