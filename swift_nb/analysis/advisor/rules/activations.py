"""Activations: a large share of the peak; gradient checkpointing recomputes them in
backward instead."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.analysis import effects
from swift_nb.analysis.advisor import frameworks
from swift_nb.analysis.advisor.evidence import Evidence, Thresholds, applied
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.frameworks import Recorded
from swift_nb.analysis.advisor.words import pct
from swift_nb.core.units import fmt_bytes
from swift_nb.record import repeated_blocks as repeated


def _blocks(ev: Evidence, context: Mapping[str, Any]) -> tuple[int, str]:
    """How many blocks repeat, and what says so: the model's own repeated modules as the
    capture recorded them, else the attention calls per step in the trace (one per
    transformer block, though a layer may call attention more than once), else the run's
    context; 0 when nothing tells."""
    found = repeated(context)
    if found is not None:
        return found
    if ev.attention_calls > 1:
        return ev.attention_calls, "attention layers per step in the trace"
    for key in ("n_layer", "num_hidden_layers"):
        if context.get(key):
            return int(context[key]), f"run context {key}"
    return 0, ""


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    act = ev.at_peak("activations")
    # checkpointing applied already: what the finding would propose is what the run does
    if (
        not ev.peak_bytes
        or act / ev.peak_bytes < th.activation_share
        or applied(context, "grad_checkpointing")
    ):
        return None
    evidence: dict[str, float | str] = {
        "activations_pct": pct(act / ev.peak_bytes),
        "activations_bytes": act,
        "peak_bytes": ev.peak_bytes,
    }
    blocks, source = _blocks(ev, context)
    if blocks > 1:
        predicted = effects.checkpointed_peak(ev.peak_bytes, act, blocks)
        evidence.update(blocks=blocks, blocks_from=source, predicted_peak_bytes=predicted)
        effect = (
            f"peak tensor memory ≈ {fmt_bytes(predicted)} instead of {fmt_bytes(ev.peak_bytes)}: activations "
            f"≈ {fmt_bytes(act / blocks)} instead of {fmt_bytes(act)}, one of {blocks} blocks ({source}) "
            "recomputed at a time in backward (≈ +33 % compute)"
        )
    else:
        effect = (
            f"activations ≈ A/L instead of A = {fmt_bytes(act)} for L checkpointed blocks, one recomputed at "
            "a time in backward (≈ +33 % compute); the trace does not show how many blocks repeat"
        )
    formula = (
        "peak' ≈ peak − A + A/L: the L blocks keep only their inputs (small); backward recomputes one block at a "
        "time, its ≈ A/L activations alive again with its backward temporaries (already in the peak's other tensors)"
    )
    return Finding(
        id="activations",
        title=f"Activations are {pct(act / ev.peak_bytes)} % of peak tensor memory",
        evidence=evidence,
        suggestion=frameworks.phrased(context, fix)
        or (
            "Recompute activations in backward instead of keeping them: activation checkpointing on "
            "the repeated blocks (model.gradient_checkpointing_enable() for Hugging Face); free "
            "tensors you keep across steps (e.g. vision features)."
        ),
        toggle="grad_checkpointing",
        predicted_effect=effect,
        formula=formula,
        # on a GPU, the saved tensors can wait in host memory instead (PCIe copies, no recompute)
        also=("activation_offload",) if ev.tensors_on == "cuda" else (),
    )


def fix(rec: Recorded) -> str | None:
    if not rec.is_trainer:
        return None
    micro, accumulation = rec.micro_batch, rec.accumulation
    smaller = (
        f"halve the micro-batch and accumulate twice as many: "
        f"{frameworks.set_arguments(rec, per_device_train_batch_size=micro // 2, gradient_accumulation_steps=2 * accumulation)} "
        "— activations scale with the micro-batch, the samples per optimizer step stay the same"
        if micro >= 2
        else ""
    )
    if rec.checkpointing():
        return "Checkpointing is on already: " + (smaller or "free tensors you keep across steps") + "."
    field = rec.checkpointing_field
    checkpoint = (
        f"Recompute activations in backward instead of keeping them (the Trainer calls the model's own "
        f"{field}_enable()): {frameworks.set_arguments(rec, **{field: True})}"
    )
    return checkpoint + (f"; or {smaller}" if smaller else "") + "."
