"""A leak: tensor memory grows every step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.core.units import fmt_bytes


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    g = ev.growth_bytes_per_step
    if g < th.leak_bytes_per_step or (ev.peak_bytes and g < th.leak_share_per_step * ev.peak_bytes):
        return None
    return Finding(
        id="leak",
        title=f"Memory grows by {fmt_bytes(g)} every step",
        evidence={"growth_bytes_per_step": g, "measured_by": ev.growth_source, "peak_bytes": ev.peak_bytes},
        suggestion=(
            "Something keeps tensors of every step alive: accumulate Python numbers (loss.item()) not "
            "tensors, detach() what you log or store, and do not append outputs with their graph to lists."
        ),
        predicted_effect=f"out of memory after ≈ {_steps_to_limit(ev):,} more steps"
        if ev.limit_bytes
        else "",
        formula="steps_left ≈ (limit − peak) / growth per step",
        severity="critical",
    )


def _steps_to_limit(ev: Evidence) -> int:
    assert ev.limit_bytes is not None  # called only when the limit is known
    return max(0, int((ev.limit_bytes - ev.peak_bytes) / ev.growth_bytes_per_step))
