"""A long sequence near the device's capacity: sequence parallelism splits it over ranks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.analysis import effects
from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.words import pct
from swift_nb.core.units import fmt_bytes


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    seq = int(context.get("seq_len") or ev.attention_seq or 0)
    if seq < th.long_seq or not ev.limit_bytes or ev.peak_bytes < th.near_limit * ev.limit_bytes:
        return None
    act = ev.at_peak("activations")
    return Finding(
        id="sequence_parallel",
        title=f"Sequence length {seq} with memory at {pct(ev.peak_bytes / ev.limit_bytes)} % of the device",
        evidence={
            "seq_len": seq,
            "peak_bytes": ev.peak_bytes,
            "limit_bytes": ev.limit_bytes,
            "activations_bytes": act,
        },
        suggestion=(
            "Split the sequence across ranks: Ulysses (all-to-all over heads, P ≤ 8) or Ring attention "
            "(K/V blocks passed around a ring, P ≤ 16, chunks of 512–1024 tokens)."
        ),
        toggle="sequence_parallel",
        predicted_effect=f"activations per rank ≈ {fmt_bytes(effects.sequence_parallel_activations(act, 4))} with P = 4",
        formula="A' ≈ A / P per rank; adds 4 all-to-alls per layer (Ulysses) or P−1 K/V transfers (Ring)",
        severity="critical",
    )
