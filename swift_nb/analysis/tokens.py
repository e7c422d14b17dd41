"""The tokens a run's model received per step, as the run recorded them
(``swift_nb.capture.tokens`` counts them; ``record.write.token_summary`` sums them up)."""

from __future__ import annotations

from dataclasses import dataclass

from swift_nb.record import Run


@dataclass
class Tokens:
    """What the model received per step (``swift_nb.capture.tokens``; the run's summary):
    tokens computed and real ones (medians), padding in percent of those computed, real
    tokens per second, ``packed``: times ``position_ids`` restarted inside a row (samples
    packed into one row), ``source``: where the real count came from; ``vocab``: the
    language model's vocabulary (0: not a language model)."""

    per_step: float
    real_per_step: float
    padding_pct: float
    real_per_s: float | None
    packed: int = 0
    source: str = ""
    vocab: int = 0

    @classmethod
    def of(cls, run: Run) -> Tokens | None:
        """What ``run`` recorded of its tokens (None: its model received no token ids)."""
        s, ctx = run.summary, run.context
        if not s.get("tokens_per_step") or s.get("padding_pct") is None:
            return None
        return cls(
            per_step=float(s["tokens_per_step"]),
            real_per_step=float(s.get("real_tokens_per_step") or 0.0),
            padding_pct=float(s["padding_pct"]),
            real_per_s=s.get("real_tokens_per_s"),
            packed=int(s.get("packed_restarts") or 0),
            source=str(ctx.get("tokens_from") or ""),
            vocab=int(ctx.get("vocab_size") or 0),
        )
