"""Analysis layer: pure functions over Run records, returning DataFrames or dataclasses.

``analyze(run)`` runs them all over one parse of the trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from swift_nb.analysis.advisor import Thresholds, advise
from swift_nb.analysis.breakdown import device_busy, step_breakdown
from swift_nb.analysis.findings import Finding, Verdict
from swift_nb.analysis.memory import memory_footprint, memory_timeline
from swift_nb.analysis.operators import top_operators
from swift_nb.analysis.throughput import Throughput, throughput
from swift_nb.analysis.trace import load_trace
from swift_nb.record import Run


@dataclass
class Analysis:
    """Everything the analyses say about one run (see each function for the columns)."""

    breakdown: pd.DataFrame
    device_busy: pd.DataFrame
    footprint: pd.DataFrame
    timeline: pd.DataFrame
    operators_time: pd.DataFrame
    operators_memory: pd.DataFrame
    throughput: Throughput
    verdict: Verdict
    findings: list[Finding]


def analyze(run: Run, thresholds: Thresholds | None = None, top_n: int = 15) -> Analysis:
    trace = load_trace(run)
    breakdown = step_breakdown(run, trace)
    verdict, findings = advise(run, trace, thresholds, breakdown)
    return Analysis(
        breakdown=breakdown,
        device_busy=device_busy(run, trace),
        footprint=memory_footprint(run),
        timeline=memory_timeline(run),
        operators_time=top_operators(run, by="self_time", n=top_n, trace=trace),
        operators_memory=top_operators(run, by="memory", n=top_n, trace=trace),
        throughput=throughput(run, trace),
        verdict=verdict,
        findings=findings,
    )


__all__ = ["Analysis", "Finding", "Thresholds", "Verdict", "analyze"]
