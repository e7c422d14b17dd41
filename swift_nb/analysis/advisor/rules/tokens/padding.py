"""Padding: a share of the tokens the model computes are pads (``capture.tokens`` counts
them from the attention mask, the labels or packed rows). Packing the samples (or grouping
them by length) computes only real tokens; the step's work that grows with tokens shrinks
with them.

The prediction: the forward and backward grow with the tokens computed (the linear layers,
the MLPs; the attention's [T, T] part grows faster, so this is the conservative side), the
optimizer and the data loading do not. The step after packing is
``step × (1 − padding × (forward + backward share))``; real tokens per second rise by the
inverse of that factor."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor import frameworks
from swift_nb.analysis.advisor.evidence import Evidence, Thresholds, applied
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.frameworks import Recorded
from swift_nb.analysis.advisor.words import pct
from swift_nb.core.units import fmt_seconds


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    tok = ev.tokens
    if tok is None or tok.padding_pct / 100.0 < th.padding_share or applied(context, "packing"):
        return None
    padding = tok.padding_pct / 100.0
    grows = ev.shares.get("forward", 0.0) + ev.shares.get("backward", 0.0)
    factor = max(0.05, 1.0 - padding * grows)
    step_after = ev.step_s * factor
    evidence = {
        "padding_pct": round(tok.padding_pct, 1),
        "tokens_per_step": round(tok.per_step),
        "real_tokens_per_step": round(tok.real_per_step),
        "counted_from": tok.source,
        "forward_backward_pct": pct(grows),
        "step_s": ev.step_s,
        "predicted_step_s": step_after,
        "real_tokens_per_s": tok.real_per_s,
        "predicted_real_tokens_per_s": tok.real_per_s / factor if tok.real_per_s else None,
    }
    plain = (
        "Pack the samples into rows without padding: concatenate each batch's samples into one row and pass "
        "position_ids that restart at 0 for each sample (transformers' DataCollatorWithFlattening), with an "
        "attention that keeps the samples apart (attn_implementation='flash_attention_2' on CUDA; elsewhere a "
        "block-diagonal mask). Or batch samples of similar length together (a sampler that sorts by length), "
        "which leaves less to pad."
    )
    return Finding(
        id="padding",
        title=f"{pct(padding)} % of the tokens computed are padding",
        evidence=evidence,
        suggestion=frameworks.phrased(context, fix) or plain,
        toggle="packing",
        predicted_effect=(
            f"step ≈ {fmt_seconds(step_after)} instead of {fmt_seconds(ev.step_s)} for the same samples; real "
            f"tokens per second × {1 / factor:.2f}"
        ),
        formula=(
            "step' ≈ step × (1 − padding × (forward + backward share)): the forward and backward grow with the "
            "tokens computed (attention's [T, T] part faster), the optimizer and the loading do not"
        ),
        severity="warning",
        time_cut=1.0 - factor,
    )


def fix(rec: Recorded) -> str | None:
    """The Trainer's setting that drops the padding."""
    if rec.arguments_class == "SFTConfig":
        return (
            f"Train without padding: {frameworks.set_arguments(rec, padding_free=True)} and load the model with "
            "attn_implementation='flash_attention_2' (TRL then packs each batch's samples into one row and "
            "FlashAttention keeps them apart); or "
            f"{frameworks.set_arguments(rec, group_by_length=True)} to batch samples of similar length."
        )
    if rec.is_trainer and not rec.is_lightning:
        return (
            "Train without padding: pass data_collator=DataCollatorWithFlattening() to the Trainer and load the "
            "model with attn_implementation='flash_attention_2' (each batch's samples in one row, kept apart by "
            f"FlashAttention); or {frameworks.set_arguments(rec, group_by_length=True)} to batch samples of "
            "similar length."
        )
    return None
