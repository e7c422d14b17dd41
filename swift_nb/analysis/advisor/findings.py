"""What the advisor says: a bottleneck verdict and findings with their evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VERDICTS = (
    "data-bound",
    "overhead-bound",
    "compute-bound",
    "memory-bound",
    "communication-bound",
    "compile-bound",
    "unknown",
)


@dataclass
class Verdict:
    """The step's dominant limit (one of ``VERDICTS``), a one-line reason and the
    numbers behind it (names carry units: ``data_pct``, ``peak_mem_bytes`` …)."""

    kind: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class Finding:
    """One piece of advice.

    id: stable rule id (``data_loading``, ``leak`` …); title: one line; evidence: the
    numbers from this run that triggered it; suggestion: the change to make (as the
    setting to edit when the run recorded a Trainer or an Accelerator: see
    ``swift_nb.analysis.advisor.frameworks``); toggle: the
    swift_nb toggle that applies it, if any (an id of ``swift_nb.vocabulary.TOGGLES``); predicted_effect: what
    it should change, with ``formula`` saying how that was estimated; time_cut: the share
    (0–1) of the step's time (of the GPU's window, on a GPU run) that change is predicted
    to save, None when it predicts no time (memory, a one-off compile) — what its price
    per 1 000 steps is read from; time_cut_bound: that share is an upper bound ("up to");
    also: other toggles that apply the same advice another way (8-bit moments beside
    GaLore), offered beside ``toggle``.
    """

    id: str
    title: str
    evidence: dict[str, Any]
    suggestion: str
    toggle: str | None = None
    predicted_effect: str = ""
    formula: str = ""
    severity: str = "warning"  # info | warning | critical
    time_cut: float | None = None
    time_cut_bound: bool = False
    also: tuple[str, ...] = ()

    @property
    def toggles(self) -> tuple[str, ...]:
        """Every toggle the finding offers, its own first."""
        return ((self.toggle,) if self.toggle else ()) + tuple(t for t in self.also if t != self.toggle)
