"""What changed between two runs: their environments, their step time and peak memory,
and time per step by kind of device kernel, by kernel and by operator.

Per-step figures are taken over each run's recorded steps (the profiler steps of its
trace): an operator's self time (``operators.top_operators``) or a kind's device time
(``device.kernels_by_kind``, per step that launched the work) summed over them, divided
by their number, in milliseconds. Captured and imported runs are read alike; a job's
figures are its lowest rank's, as its record keeps them.

``diff(run_a, run_b)`` reads the two records and returns a ``RunDiff``; it changes
neither (but for the trace tables every analysis caches beside a trace). ``gate`` checks B
against regression limits, as ``swift-nb diff --max-…-regression-pct`` does for CI.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from swift_nb.analysis.cost import MONEY_COLUMNS, fmt_usd, money_columns
from swift_nb.analysis.device import kernels_by_kind
from swift_nb.analysis.operators import top_operators
from swift_nb.analysis.trace.tables import Trace, cat_in, load_trace
from swift_nb.core.units import fmt_bytes
from swift_nb.record import Run, load_run

CHANGE_COLUMNS = [
    "kind",
    "name",
    "a_ms_per_step",
    "b_ms_per_step",
    "delta_ms_per_step",
    "status",
]
ENVIRONMENT_COLUMNS = ["field", "a", "b"]
#: ``RunDiff.money``: one row per energy or money figure (``cost.MONEY_COLUMNS``)
MONEY_DIFF_COLUMNS = ["field", "a", "b"]
#: row kinds of ``RunDiff.changes``
KERNEL_KIND, KERNEL, OPERATOR = "kernel_kind", "kernel", "operator"
BOTH, ONLY_A, ONLY_B = "both", "only_a", "only_b"
#: outcomes of ``gate``
REGRESSION, WITHIN, NOT_CHECKED = "regression", "within", "not checked"
#: changes smaller than this share of run A's step are not worded (they stay in the table)
MIN_WORDED_SHARE = 0.005
#: sentences about kinds of kernels, at most; about kernels and operators gone, new, and
#: in both runs
TOP_KINDS = 3
TOP_NAMES = {ONLY_A: 3, ONLY_B: 3, BOTH: 4}

# Traces of a torch.compile'd model: the compiled graph's autograd function, its region
# annotation and call, and the Triton kernels Inductor generates.
COMPILED = re.compile(r"CompiledFunction|Torch-Compiled Region|CompiledFxGraph|^triton_")


MODULE_CHANGE_COLUMNS = [
    "path",
    "class",
    "a_total_s",
    "b_total_s",
    "delta_total_s",
    "a_saved_bytes",
    "b_saved_bytes",
    "delta_saved_bytes",
    "status",
]
#: the module changes worded: the largest by saved activations, then by time
TOP_MODULES = 3


@dataclass
class RunDiff:
    """Run B against run A.

    a_name, b_name: how the runs are called (variant, label or id);
    a_steps, b_steps: the recorded steps each run's per-step figures are taken over;
    environment: one row per fact that differs (``field``, ``a``, ``b``; None where a run
    does not record it): device, GPU, torch, CUDA, Python, NCCL, world size, parameter
    dtype, mixed precision, compiled or not, toggles, optimizer;
    changes: one row per kind of kernel, kernel and operator (``CHANGE_COLUMNS``):
    ``kind`` (``kernel_kind``, ``kernel``, ``operator``), ``name``, ``a_ms_per_step`` and
    ``b_ms_per_step`` (ms per recorded step: the device time of a kind of kernel or of a
    kernel, the host self time of an operator; 0 in a run that does not have it),
    ``delta_ms_per_step`` (B − A, ms), ``status`` (``both``, ``only_a``, ``only_b``: in
    both runs or in one only); ranked by |delta_ms_per_step|, largest first;
    a_step_s, b_step_s: median step time (s, ``run.summary``'s, over all the run's steps);
    step_regression_pct: how much slower B's step is than A's (%, negative when faster;
    None when either is unknown); a_peak_bytes, b_peak_bytes: peak tensor memory (bytes,
    ``run.summary``'s; None when not recorded, as in a trace recorded without
    ``profile_memory``); memory_regression_pct: how much larger B's is (%);
    sentences: the changes in words: the environment's, step time and peak memory, then
    the largest by kind of kernel (``TOP_KINDS``), then the largest kernels and operators
    gone, new and changed (``TOP_NAMES`` of each, ranked together), leaving out changes
    under ``MIN_WORDED_SHARE`` of A's step;
    notes: what could not be compared, and why (a run without a profiled step);
    money: one row per energy and money figure either run has (``MONEY_DIFF_COLUMNS``:
    ``field`` from ``cost.MONEY_COLUMNS``, ``a``, ``b``; None where a run has none), each
    run priced as ``cost.cost_summary`` prices it (J, W, USD);
    modules: one row per module either run recorded (``MODULE_CHANGE_COLUMNS``: ``path``,
    ``class``, each run's ``total_s`` and ``saved_bytes`` per step, B − A of both, ``status``
    as for ``changes``), ranked by how much what their own ops keep for backward changed,
    then their own time (a change shows where it happens, before the ancestors that sum
    it); empty when either run has no ``modules`` table.
    """

    a_name: str
    b_name: str
    a_steps: int
    b_steps: int
    environment: pd.DataFrame
    changes: pd.DataFrame
    a_step_s: float | None
    b_step_s: float | None
    step_regression_pct: float | None
    a_peak_bytes: float | None
    b_peak_bytes: float | None
    memory_regression_pct: float | None
    sentences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    money: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=MONEY_DIFF_COLUMNS))
    modules: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=MODULE_CHANGE_COLUMNS))


def diff(run_a: Run | Path | str, run_b: Run | Path | str, names: tuple[str, str] | None = None) -> RunDiff:
    """What changed from ``run_a`` to ``run_b``.

    Args:
        run_a: the run compared from (a Run or its folder).
        run_b: the run compared to (a Run or its folder).
        names: what to call them, ``(a, b)`` (default: each run's variant, label or id).

    Returns:
        A ``RunDiff``: what differs in their environments, step times, peak memories and
        money, and per step in their kernels and operators, with the changes in words.
    """
    a, b = (r if isinstance(r, Run) else load_run(r) for r in (run_a, run_b))
    a_name, b_name = names if names is not None else (run_name(a), run_name(b))
    trace_a, trace_b = load_trace(a), load_trace(b)
    notes = [
        f"{name} has no profiled step in its trace: its kernels and operators are not compared"
        for name, trace in ((a_name, trace_a), (b_name, trace_b))
        if trace.steps.empty
    ]
    changes = _changes(_per_step(a, trace_a), _per_step(b, trace_b))
    a_step, b_step = (
        _positive(a.summary.get("step_time_median_s")),
        _positive(b.summary.get("step_time_median_s")),
    )
    a_peak, b_peak = _positive(a.summary.get("peak_mem_bytes")), _positive(b.summary.get("peak_mem_bytes"))
    environment = environment_changes(a, b, trace_a, trace_b)
    out = RunDiff(
        a_name=a_name,
        b_name=b_name,
        a_steps=len(trace_a.steps),
        b_steps=len(trace_b.steps),
        environment=environment,
        changes=changes,
        a_step_s=a_step,
        b_step_s=b_step,
        step_regression_pct=_pct_change(a_step, b_step),
        a_peak_bytes=a_peak,
        b_peak_bytes=b_peak,
        memory_regression_pct=_pct_change(a_peak, b_peak),
        notes=notes,
        money=_money(a, b),
        modules=module_changes(a.modules, b.modules),
    )
    out.sentences = _sentences(out)
    return out


def module_changes(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Each module's time and saved activations in both runs (see ``RunDiff.modules``)."""
    if a.empty or b.empty:
        return pd.DataFrame(columns=MODULE_CHANGE_COLUMNS)
    keep = [
        "path",
        "class",
        "total_s",
        "saved_bytes",
        "saved_self_bytes",
        "forward_self_s",
        "backward_self_s",
    ]
    both = a[keep].merge(b[keep], on="path", how="outer", suffixes=("_a", "_b"), indicator=True)
    # ranked where the change happens (a module's own ops), not in every ancestor that sums it
    own_saved = both["saved_self_bytes_b"].fillna(0.0) - both["saved_self_bytes_a"].fillna(0.0)
    own_time = (both["forward_self_s_b"] + both["backward_self_s_b"]).fillna(0.0) - (
        both["forward_self_s_a"] + both["backward_self_s_a"]
    ).fillna(0.0)
    out = pd.DataFrame(
        {
            "path": both["path"],
            "class": both["class_a"].fillna(both["class_b"]),
            "a_total_s": both["total_s_a"].fillna(0.0),
            "b_total_s": both["total_s_b"].fillna(0.0),
            "a_saved_bytes": both["saved_bytes_a"].fillna(0.0),
            "b_saved_bytes": both["saved_bytes_b"].fillna(0.0),
            "status": both["_merge"].map({"both": "both", "left_only": "only_a", "right_only": "only_b"}),
        }
    )
    out["delta_total_s"] = out["b_total_s"] - out["a_total_s"]
    out["delta_saved_bytes"] = out["b_saved_bytes"] - out["a_saved_bytes"]
    order = pd.DataFrame({"saved": -own_saved.abs(), "time": -own_time.abs()}).sort_values(["saved", "time"])
    return out.loc[order.index, MODULE_CHANGE_COLUMNS].reset_index(drop=True)


def _module_sentences(modules: pd.DataFrame) -> list[str]:
    shown = modules[(modules["status"] == "both") & (modules["delta_saved_bytes"] != 0)].head(TOP_MODULES)
    return [
        f"{r.path} ({r[2]}): activations kept {fmt_bytes(r.a_saved_bytes)} → {fmt_bytes(r.b_saved_bytes)} "
        f"({_relative(r.a_saved_bytes, r.b_saved_bytes) if r.a_saved_bytes > 0 else 'new'}), "
        f"time {_ms(1e3 * r.a_total_s)} → {_ms(1e3 * r.b_total_s)} ms per step"
        for r in shown.itertuples()
    ]


def run_name(run: Run) -> str:
    """What a run is called in a comparison: its variant, else its label, else its id."""
    return str(run.context.get("variant") or run.label or run.id)


def gate(
    d: RunDiff, max_step_pct: float | None = None, max_memory_pct: float | None = None
) -> list[tuple[str, str]]:
    """Each limit given, checked against B: ``(outcome, words)``, the outcome
    ``regression`` (B's median step time is more than ``max_step_pct`` % above A's, or its
    peak memory more than ``max_memory_pct`` % above), ``within``, or ``not checked`` (a
    run does not record the figure)."""
    out = []
    for what, a, b, pct, limit in (
        ("step time", d.a_step_s, d.b_step_s, d.step_regression_pct, max_step_pct),
        ("peak memory", d.a_peak_bytes, d.b_peak_bytes, d.memory_regression_pct, max_memory_pct),
    ):
        if limit is None:
            continue
        missing = [name for name, value in ((d.a_name, a), (d.b_name, b)) if value is None]
        if missing or pct is None:
            who = f"{missing[0]} records" if len(missing) == 1 else f"{' and '.join(missing)} record"
            out.append((NOT_CHECKED, f"{what}: {who} none"))
        elif pct > limit:
            out.append((REGRESSION, f"{what} {_percent(pct)}, more than the {limit:g} % allowed"))
        else:
            out.append((WITHIN, f"{what} {_percent(pct)}, within the {limit:g} % allowed"))
    return out


# -- per step ---------------------------------------------------------------------------------


def _per_step(run: Run, trace: Trace) -> pd.DataFrame:
    """One row per kind of kernel, kernel and operator of the run: ``kind``, ``name`` and
    ``ms``, its time per recorded step."""
    steps = len(trace.steps)
    columns = ["kind", "name", "ms"]
    if not steps:
        return pd.DataFrame(columns=columns)
    per_ms = 1e3 / steps
    ops = top_operators(run, n=None, trace=trace)
    kernels = set(trace.events.loc[cat_in(trace.events, "kernel"), "name"])
    ops_rows = pd.DataFrame(
        {
            "kind": np.where(ops["name"].isin(kernels), KERNEL, OPERATOR),
            "name": ops["name"].astype(str),
            "ms": ops["self_time_s"].astype(float) * per_ms,
        }
    )
    kinds = kernels_by_kind(trace, by_step=True)
    kind_time = kinds.groupby("kind", sort=False)["time_s"].sum() if len(kinds) else pd.Series(dtype=float)
    kind_rows = pd.DataFrame(
        {
            "kind": KERNEL_KIND,
            "name": kind_time.index.astype(str),
            "ms": kind_time.to_numpy(float) * per_ms,
        }
    )
    frames = [f for f in (kind_rows, ops_rows) if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def _changes(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    merged = a.merge(b, on=["kind", "name"], how="outer", suffixes=("_a", "_b"), indicator=True)
    if merged.empty:
        return pd.DataFrame(columns=CHANGE_COLUMNS)
    status = merged["_merge"].map({"both": BOTH, "left_only": ONLY_A, "right_only": ONLY_B}).astype(str)
    a_ms, b_ms = merged["ms_a"].fillna(0.0).astype(float), merged["ms_b"].fillna(0.0).astype(float)
    out = pd.DataFrame(
        {
            "kind": merged["kind"].astype(str),
            "name": merged["name"].astype(str),
            "a_ms_per_step": a_ms,
            "b_ms_per_step": b_ms,
            "delta_ms_per_step": b_ms - a_ms,
            "status": status,
        }
    )
    order = np.lexsort((out["name"].to_numpy(), -out["delta_ms_per_step"].abs().to_numpy()))
    return out.iloc[order].reset_index(drop=True)[CHANGE_COLUMNS]


# -- environment ------------------------------------------------------------------------------


def _joined(value: Any) -> str | None:
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, (list, tuple)):
        return ", ".join(dict.fromkeys(str(v) for v in value))
    return str(value)


def _gpu(run: Run) -> str | None:
    env = run.environment
    return _joined(env.get("devices")) if env.get("device") == "cuda" else None


def _cuda(run: Run) -> str | None:
    env = run.environment
    return _joined(env.get("cuda") or env.get("cuda_runtime"))


def _mixed_precision(run: Run) -> str | None:
    """What a Trainer's or an Accelerator's settings say (``bf16``, ``fp16``, ``no``)."""
    trainer = run.context.get("trainer")
    args = (trainer.get("arguments") or {}) if isinstance(trainer, dict) else {}
    if "mixed_precision" in args:
        return _joined(args["mixed_precision"])
    if "bf16" in args or "fp16" in args:
        return "bf16" if args.get("bf16") else "fp16" if args.get("fp16") else "no"
    return None


def _toggles(run: Run) -> str | None:
    toggles = run.context.get("toggles")
    if toggles is None:
        return None
    ids = [str(t.get("toggle")) for t in toggles if isinstance(t, dict)]
    return ", ".join(ids) if ids else "none"


def _compiled(trace: Trace) -> str | None:
    """Whether the trace shows torch.compile's work (None without a trace)."""
    if trace.steps.empty:
        return None
    names = pd.Series(trace.events["name"].unique(), dtype=object).astype(str)
    return "yes" if names.str.contains(COMPILED).any() else "no"


#: (field, what the run records of it); the trace's facts come in ``environment_changes``
FACTS: tuple[tuple[str, Callable[[Run], str | None]], ...] = (
    ("device", lambda r: _joined(r.environment.get("device"))),
    ("GPU", _gpu),
    ("world size", lambda r: _joined(r.context.get("world_size") or r.environment.get("world_size"))),
    ("torch", lambda r: _joined(r.environment.get("torch"))),
    ("CUDA", _cuda),
    ("NCCL", lambda r: _joined(r.environment.get("nccl"))),
    ("Python", lambda r: _joined(r.environment.get("python"))),
    ("parameter dtype", lambda r: _joined(r.context.get("dtype"))),
    ("mixed precision", _mixed_precision),
    ("toggles", _toggles),
    ("optimizer", lambda r: _joined(r.context.get("optimizer"))),
)


def environment_changes(
    a: Run, b: Run, trace_a: Trace | None = None, trace_b: Trace | None = None
) -> pd.DataFrame:
    """The facts of the two runs' environments that differ (``field``, ``a``, ``b``; None
    where a run does not record it); ``compiled`` is read from the traces when given."""
    rows = [(name, fact(a), fact(b)) for name, fact in FACTS]
    if trace_a is not None and trace_b is not None:
        rows.append(("compiled", _compiled(trace_a), _compiled(trace_b)))
    return pd.DataFrame([r for r in rows if r[1] != r[2]], columns=ENVIRONMENT_COLUMNS, dtype=object)


# -- in words ---------------------------------------------------------------------------------


def _positive(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


def _pct_change(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else 100.0 * (b - a) / a


def _ms(x: float) -> str:
    return f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}" if abs(x) < 1000 else f"{x:.0f}"


def _minus(text: str) -> str:
    return text.replace("-", "−")


def _percent(pct: float) -> str:
    return _minus(f"{pct:+.1f} %")


def _relative(a: float, b: float) -> str:
    """B against A: ``+12.3 %``, or ``×7.1`` when B is more than twice A."""
    return f"×{b / a:.1f}" if b > 2 * a else _percent(100.0 * (b - a) / a)


def short_name(name: str, width: int = 100) -> str:
    """A kernel's or an operator's name as worded: without its return type, anonymous
    namespaces, parameters and the namespaces inside its template arguments
    (``void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<…>>(int, …)``
    → ``at::native::elementwise_kernel<128, 2, gpu_kernel_impl<…>>``), cut to ``width``
    characters."""
    text = re.sub(r"^void\s+", "", name.strip()).replace("(anonymous namespace)::", "")
    depth = 0
    for i, ch in enumerate(text):
        if ch == "(" and depth == 0 and i > 0 and not text[:i].endswith("operator"):
            text = text[:i]
            break
        depth += (ch == "<") - (ch == ">")
    head, angle, rest = text.partition("<")
    short = (head + angle + re.sub(r"\b(?:\w+::)+", "", rest)).replace("> >", ">>").strip() or name
    return short if len(short) <= width else short[: width - 1] + "…"


def row_sentence(row: Any, on_host: bool = False) -> str:
    """One row of ``RunDiff.changes`` in words (``on_host``: say that an operator's time
    is the host's, as in a diff of GPU runs)."""
    if row.kind == KERNEL_KIND:
        what = f"{row.name} kernels"
    else:
        what = short_name(row.name) + (" (host)" if on_host and row.kind == OPERATOR else "")
    if row.status == ONLY_A:
        return f"{what}: {_ms(row.a_ms_per_step)} ms per step → gone"
    if row.status == ONLY_B:
        return (
            f"{what} {'are' if row.kind == KERNEL_KIND else 'is'} new: {_ms(row.b_ms_per_step)} ms per step"
        )
    a, b = row.a_ms_per_step, row.b_ms_per_step
    relative = f", {_relative(a, b)}" if a > 0 else ""
    return f"{what}: {_ms(a)} → {_ms(b)} ms per step ({_minus(f'{b - a:+.2f}')} ms{relative})"


def _money(a: Run, b: Run) -> pd.DataFrame:
    ma, mb = money_columns(a), money_columns(b)
    rows = [(c, ma[c], mb[c]) for c in MONEY_COLUMNS if ma[c] is not None or mb[c] is not None]
    return pd.DataFrame(rows, columns=MONEY_DIFF_COLUMNS, dtype=object)


def _sentences(d: RunDiff) -> list[str]:
    out = [
        f"{r.field}: {r.a} → {r.b}" for r in d.environment.itertuples() if r.a is not None and r.b is not None
    ]
    if d.a_step_s is not None and d.b_step_s is not None:
        out.append(
            f"step time: {_ms(1e3 * d.a_step_s)} → {_ms(1e3 * d.b_step_s)} ms "
            f"({_relative(d.a_step_s, d.b_step_s)})"
        )
    if d.a_peak_bytes is not None and d.b_peak_bytes is not None:
        out.append(
            f"peak memory: {fmt_bytes(d.a_peak_bytes)} → {fmt_bytes(d.b_peak_bytes)} "
            f"({_relative(d.a_peak_bytes, d.b_peak_bytes)})"
        )
    money = d.money.set_index("field")
    if "cost_per_1k_steps_usd" in money.index:
        a_usd, b_usd = money.loc["cost_per_1k_steps_usd", ["a", "b"]]
        if a_usd is not None and b_usd is not None:
            out.append(f"1 000 steps cost: {fmt_usd(a_usd)} → {fmt_usd(b_usd)} ({_relative(a_usd, b_usd)})")
    changes = d.changes
    floor = MIN_WORDED_SHARE * 1e3 * d.a_step_s if d.a_step_s is not None else 0.0
    large = changes[(changes["delta_ms_per_step"].abs() > floor) & (changes["delta_ms_per_step"] != 0)]
    on_host = bool((changes["kind"] != OPERATOR).any())
    kinds = large[large["kind"] == KERNEL_KIND].head(TOP_KINDS)
    names = large[large["kind"] != KERNEL_KIND]
    # what appears or disappears is worded even when timing noise moves shared operators more
    picked = pd.concat([names[names["status"] == status].head(TOP_NAMES[status]) for status in TOP_NAMES])
    out += [row_sentence(r, on_host) for r in kinds.itertuples()]
    out += [row_sentence(r, on_host) for r in picked.sort_index().itertuples()]
    out += _module_sentences(d.modules)
    return out
