"""Rules that turn a run's evidence into a bottleneck verdict and concrete advice.

``evidence.gather`` reads the numbers the other analyses computed (breakdown shares,
memory by category, attention shapes in the trace, memory growth) once; ``verdict.bottleneck``
names the step's dominant limit; each rule (``rules/<id>.py``, listed in ``registry.RULES``)
returns a Finding when its threshold is crossed, with those numbers, the change to make,
the swift_nb toggle that applies it, and the predicted effect with the formula behind it
(``swift_nb.analysis.effects``). When the run's context recorded a Hugging Face Trainer or
an accelerate Accelerator driving the loop, the change is phrased as the setting to edit
(``frameworks``); otherwise as plain PyTorch.
"""

from __future__ import annotations

import pandas as pd

from swift_nb.analysis.advisor.evidence import Evidence, Loader, Thresholds, gather
from swift_nb.analysis.advisor.findings import Finding, Verdict
from swift_nb.analysis.advisor.registry import RULES, Rule
from swift_nb.analysis.advisor.verdict import bottleneck, priced, priced_findings
from swift_nb.analysis.run_data import RunData
from swift_nb.analysis.trace.tables import Trace
from swift_nb.record import Run

__all__ = [
    "RULES",
    "Evidence",
    "Loader",
    "Rule",
    "Thresholds",
    "advise",
    "advise_with_evidence",
    "bottleneck",
    "findings",
    "gather",
]


def findings(ev: Evidence, th: Thresholds, context: dict) -> list[Finding]:
    """Every finding whose rule fires on ``ev``, ranked (``ranked``)."""
    return ranked([f for rule in RULES if (f := rule(ev, th, context)) is not None], ev.peak_bytes)


def ranked(found: list[Finding], peak_bytes: float) -> list[Finding]:
    """Findings by what they save, the largest first: a critical one (a wrong result) leads;
    then those that cut time, by the share of the step they cut; then those that cut memory,
    by the share of the peak they free; then the rest, in the registry's order (the sort is
    stable)."""

    def key(f: Finding) -> tuple[int, float]:
        if f.severity == "critical":
            return (0, 0.0)
        if f.time_cut:
            return (1, -float(f.time_cut))
        predicted = f.evidence.get("predicted_peak_bytes")
        if isinstance(predicted, (int, float)) and peak_bytes and predicted < peak_bytes:
            return (2, -(peak_bytes - float(predicted)) / peak_bytes)
        return (3, 0.0)

    return sorted(found, key=key)


def advise(
    run: Run,
    trace: Trace | None = None,
    thresholds: Thresholds | None = None,
    breakdown: pd.DataFrame | None = None,
) -> tuple[Verdict, list[Finding]]:
    """The verdict and every finding whose rule fires for this run."""
    _, verdict, found = advise_with_evidence(run, trace, thresholds, breakdown)
    return verdict, found


def advise_with_evidence(
    run: Run,
    trace: Trace | None = None,
    thresholds: Thresholds | None = None,
    breakdown: pd.DataFrame | None = None,
    data: RunData | None = None,
) -> tuple[Evidence, Verdict, list[Finding]]:
    """``advise`` and the evidence its rules read (``data``: see ``gather``)."""
    th = thresholds or Thresholds()
    ev = gather(run, trace, th, breakdown, data)
    # with their money where the run has a price (analysis.cost)
    return ev, priced(bottleneck(ev, th), run), priced_findings(findings(ev, th, run.context), run)
