"""Compile time against the steady-state gain: after how many steps torch.compile pays for
its compiling, or, without an eager baseline, what the compiling cost in steady steps. Where
compiling dominates, it offers ``regional_compile``: the repeated blocks compiled as one code,
about half the compile time of the whole model (``benchmarks/regional_compile.py``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor.evidence import Evidence, Thresholds, applied
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.words import ms, pct
from swift_nb.core.units import fmt_seconds


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    c = ev.compiled
    if c is None or c.compile_s <= 0 or not math.isfinite(c.steady_step_s) or c.steady_step_s <= 0:
        return None
    in_steps = c.compile_s / c.steady_step_s
    evidence: dict[str, Any] = {
        "compile_s": round(c.compile_s, 6),
        "compile_pct_of_steps": pct(c.share),
        "compiling_steps": c.compiling_steps,
        "steady_step_s": round(c.steady_step_s, 6),
        "compile_in_steady_steps": round(in_steps, 1),
    }
    spent = (
        f"Compiling took {fmt_seconds(c.compile_s)} ({pct(c.share)} % of the steps' time, in "
        f"{c.compiling_steps} of {c.steps} steps), the time of {in_steps:,.0f} steady steps "
        f"(median {ms(c.steady_step_s)})"
    )
    eager = c.eager_step_s
    if eager is None:
        return Finding(
            id="compile_time",
            title=f"Compiling took {fmt_seconds(c.compile_s)}: {in_steps:,.0f} steady steps' worth",
            evidence=evidence,
            suggestion=(
                f"{spent}. Whether compile pays for itself depends on the eager step, which this run did not "
                f"measure: it pays after N = compile_s / (eager step − {ms(c.steady_step_s)}) steps. Profile the "
                "loop without compile to know (--compare torch_compile runs both). For short runs, compile less: "
                "torch.compile(mode='default') rather than max-autotune, and no recompiles (see those findings)."
            ),
            predicted_effect=f"pays for itself after compile_s / (t_eager − {ms(c.steady_step_s)}) steps",
            formula="N = t_compile / (t_eager − t_compiled), steps; compile cost in steps = t_compile / t_compiled",
            severity="warning" if c.share >= th.compile_share else "info",
            toggle=_regional(context, c.share >= th.compile_share),
        )
    evidence["eager_step_s"] = round(eager, 6)
    gain = eager - c.steady_step_s
    if gain <= 0:
        return Finding(
            id="compile_time",
            title=f"torch.compile does not pay: compiled steps ({ms(c.steady_step_s)}) are no faster than eager ({ms(eager)})",
            evidence=evidence,
            suggestion=f"{spent}, and saves nothing per step. Run this loop eager, or compile only its heaviest module.",
            predicted_effect=f"−{fmt_seconds(c.compile_s)}: the compiling, with no per-step loss",
            formula="gain per step = t_eager − t_compiled ≤ 0: compile never pays back",
            severity="warning",
            toggle=_regional(context, True),
        )
    n = math.ceil(round(c.compile_s / gain, 6))  # not one more step for a rounding error
    evidence["pays_back_after_steps"] = n
    return Finding(
        id="compile_time",
        title=f"torch.compile pays for itself after {n:,} steps",
        evidence=evidence,
        suggestion=(
            f"{spent}; each compiled step saves {ms(gain)} against eager ({ms(eager)}), so compile pays for itself "
            f"after {n:,} steps. This run took {c.steps}"
            + (": for runs this short, run eager." if c.steps < n else ": it paid.")
        ),
        predicted_effect=f"{'+' if c.steps < n else '−'}{fmt_seconds(abs(c.compile_s - gain * c.steps))} over this run's {c.steps} steps",
        formula="N = ⌈t_compile / (t_eager − t_compiled)⌉",
        severity="info",
        toggle=_regional(context, c.steps < n),
    )


def _regional(context: Mapping[str, Any], dominates: bool) -> str | None:
    """The regional_compile toggle, offered when compiling dominates and the run compiled its
    models whole: the repeated blocks compile once for all of them."""
    if not dominates or applied(context, "regional_compile"):
        return None
    return "regional_compile"
