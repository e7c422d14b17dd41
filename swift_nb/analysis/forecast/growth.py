"""How a run's activations and other tensors grow with the batch B and the sequence T:
linear in B·T, plus the [.., T, T] tensors of an eager attention (B·T² per sample, T² for a
batch-free mask), read from one run's trace or fitted to two runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from swift_nb.analysis.forecast.measure import Measured


@dataclass
class Growth:
    """Bytes of one category (activations or other) at the step's peak for B samples of T
    tokens: ``constant + per_token·B·T + per_score·B·T² + per_mask·T²``; ``how`` says how
    the coefficients were found."""

    constant: float
    per_token: float
    per_score: float
    per_mask: float
    how: str

    def parts(self, batch: float, seq: float) -> tuple[float, float, float, float]:
        return (
            self.constant,
            self.per_token * batch * seq,
            self.per_score * batch * seq**2,
            self.per_mask * seq**2,
        )


def growth(m: Measured, calibration: Measured | None = None) -> dict[str, Growth]:
    """How ``m``'s activations and other tensors grow with batch and sequence: from its
    [.., T, T] tensors and the rest linear in tokens, or fitted to a second run."""
    out = {}
    b, t = m.shape
    for cat in ("activations", "other"):
        value = m.categories[cat]
        per_sample, batch_free = m.scores.of(cat)
        rest = max(0.0, value - per_sample - batch_free)
        single = Growth(0.0, rest / (b * t), per_sample / (b * t * t), batch_free / (t * t), "one run")
        out[cat] = single if calibration is None else _fit(single, m, calibration, cat)
    return out


def _fit(single: Growth, m: Measured, cal: Measured, cat: str) -> Growth:
    """Coefficients from two runs: with [.., T, T] tensors in the trace, the rest is fitted as
    constant + per token (two points, two unknowns); without, the whole category as per token
    + per B·T² when the sequence differs, or constant + per token when only the batch does."""
    (b1, t1), (b2, t2) = m.shape, cal.shape
    v1, v2 = m.categories[cat], cal.categories[cat]
    s1, f1 = m.scores.of(cat)
    s2, f2 = cal.scores.of(cat)
    if s1 + f1 + s2 + f2 > 0 or t1 == t2:
        r1, r2 = v1 - s1 - f1, v2 - s2 - f2
        x1, x2 = b1 * t1, b2 * t2
        if x1 == x2:
            return replace(single, how="one run (the calibration run has as many tokens)")
        per_token = max(0.0, (r2 - r1) / (x2 - x1))
        return replace(single, constant=r1 - per_token * x1, per_token=per_token, how="fitted to two runs")
    # no score tensors seen: B·T and B·T² from the two totals
    a = np.array([[b1 * t1, b1 * t1 * t1], [b2 * t2, b2 * t2 * t2]], dtype=float)
    per_token, per_score = np.linalg.solve(a, np.array([v1, v2]))
    if per_token < 0 or per_score < 0:  # noise on a purely linear or purely quadratic part
        per_token, per_score = (max(0.0, per_token), 0.0) if per_score < 0 else (0.0, v1 / (b1 * t1 * t1))
    return Growth(0.0, float(per_token), float(per_score), 0.0, "fitted to two runs (no score tensors seen)")
