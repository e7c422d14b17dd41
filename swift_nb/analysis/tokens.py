"""The tokens a run's model received per step, as the run recorded them
(``swift_nb.capture.tokens`` counts them; ``record.write.token_summary`` sums them up:
one padding share and one rate of real tokens for every figure that shows them)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from swift_nb.record import Run
from swift_nb.record.write import peak_step


@dataclass
class Tokens:
    """What the model received per step (``swift_nb.capture.tokens``; the run's summary,
    ``record.write.token_summary``): tokens computed and real ones (means over the steps
    that counted them), padding in percent of those computed (1 − their ratio), real
    tokens per second (real tokens per step × steps per second), ``packed``: times
    ``position_ids`` restarted inside a row (samples packed into one row), ``source``:
    where the real count came from; ``vocab``: the language model's vocabulary (0: not a
    language model); ``at_peak`` and ``real_at_peak``: the tokens computed and the real
    ones in the step whose memory is the run's at the peak (``record.write.peak_step``;
    the means where no step recorded memory categories or counted its tokens), those the
    memory at the peak (the logits) was made from."""

    per_step: float
    real_per_step: float
    padding_pct: float
    real_per_s: float | None
    packed: int = 0
    source: str = ""
    vocab: int = 0
    at_peak: float = 0.0
    real_at_peak: float = 0.0

    @classmethod
    def of(cls, run: Run) -> Tokens | None:
        """What ``run`` recorded of its tokens (None: its model received no token ids)."""
        s, ctx = run.summary, run.context
        if not s.get("tokens_per_step") or s.get("padding_pct") is None:
            return None
        per_step, real = float(s["tokens_per_step"]), float(s.get("real_tokens_per_step") or 0.0)
        at_peak, real_at_peak = _at_peak(run.steps) or (per_step, real)
        return cls(
            per_step=per_step,
            real_per_step=real,
            padding_pct=float(s["padding_pct"]),
            real_per_s=s.get("real_tokens_per_s"),
            packed=int(s.get("packed_restarts") or 0),
            source=str(ctx.get("tokens_from") or ""),
            vocab=int(ctx.get("vocab_size") or 0),
            at_peak=at_peak,
            real_at_peak=real_at_peak,
        )


def _at_peak(steps: pd.DataFrame) -> tuple[float, float] | None:
    """(tokens computed, real tokens) of the step at the memory peak; None where unknown."""
    step = peak_step(steps)
    if step is None or "tokens" not in steps or "real_tokens" not in steps:
        return None
    row = steps.loc[steps["step"] == step, ["tokens", "real_tokens"]].apply(pd.to_numeric, errors="coerce")
    if not len(row) or row.iloc[0].isna().any() or not row.iloc[0]["tokens"] > 0:
        return None
    return float(row.iloc[0]["tokens"]), float(row.iloc[0]["real_tokens"])
