"""Eager attention: [.., T, T] score matrices materialised; fused attention (the
flash_attention toggle) never makes them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.analysis import effects
from swift_nb.analysis.advisor import frameworks
from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.frameworks import Recorded
from swift_nb.core.units import fmt_bytes


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    t = ev.attention_seq
    if t < th.attention_seq:
        return None
    shape = ev.attention_shape
    per_matrix = effects.score_matrix_bytes(shape)
    evidence = {
        "seq_len": t,
        "score_shape": shape,
        "attention_calls_per_step": ev.attention_layers,
        "score_matrix_bytes": per_matrix,
    }
    sc = ev.scores
    if sc is not None:
        saved = sc.saved_bytes
        evidence.update(
            score_bytes_at_peak=sc.at_peak_bytes,
            score_tensors_kept_at_peak=sc.kept,
            score_temporaries_at_peak=sc.temporaries,
            peak_saved_bytes=saved,
        )
        which = (
            f"no [.., {t}, {t}] score or mask tensor is ever made ({sc.kept + sc.temporaries} of them, "
            f"{fmt_bytes(sc.at_peak_bytes)}, are alive at the peak now: {sc.kept} kept for backward, "
            f"{sc.temporaries} made in it)"
        )
        if saved < 0.99 * sc.at_peak_bytes:
            which += "; without them the step peaks elsewhere"
        formula = (
            "peak' ≈ the step's peak of (live bytes − bytes of [.., T, T] tensors), replayed from the trace's "
            "allocations: scores, probabilities, masks and their gradients are never materialised; flash keeps "
            "O(B·H·T)"
        )
    else:
        # no allocation events: probabilities saved by each layer and two gradient buffers
        # of the backward of one, as eager attention allocates them
        saved = effects.eager_score_bytes(shape, ev.attention_layers)
        evidence["peak_saved_bytes"] = saved
        which = (
            f"no [.., {t}, {t}] score matrix is ever made ({max(1, ev.attention_layers)} probability matrices "
            f"kept for backward and 2 temporaries in it, {fmt_bytes(saved)}; the trace has no allocations)"
        )
        formula = "saved ≈ (L + 2) × B·H × T² × 4 bytes: L probability matrices kept for backward, two gradient buffers in it"
    predicted = effects.without_scores(ev.peak_bytes, saved)
    evidence["predicted_peak_bytes"] = predicted
    effect = (
        f"peak tensor memory ≈ {fmt_bytes(predicted)} instead of {fmt_bytes(ev.peak_bytes)}: {which}"
        if ev.peak_bytes
        else f"≈ {fmt_bytes(saved)} less tensor memory at the peak: {which}"
    )
    return Finding(
        id="eager_attention",
        title=f"Explicit attention at sequence length {t}: score matrices grow as T²",
        evidence=evidence,
        suggestion="Use fused attention: "
        + (
            frameworks.phrased(context, lambda rec: fix(rec, ev.tensors_on))
            or "F.scaled_dot_product_attention (flash backend) instead of softmax(q @ k.T) @ v; for Hugging "
            f"Face models attn_implementation={_implementations(ev.tensors_on)}."
        ),
        toggle="flash_attention",
        predicted_effect=effect,
        formula=formula,
        severity="critical" if t >= 4 * th.attention_seq else "warning",
    )


def _implementations(tensors_on: str) -> str:
    """The fused implementations a Hugging Face model can take on the run's device:
    flash-attn's kernels run on CUDA only."""
    return "'sdpa' or 'flash_attention_2' (with flash-attn)" if tensors_on == "cuda" else "'sdpa'"


def fix(rec: Recorded, tensors_on: str = "cpu") -> str | None:
    """The Trainer's model's setting, for the device the run's tensors were on."""
    if not rec.is_trainer:
        return None
    impl = (rec.model or {}).get("attn_implementation")
    model = f"`{rec.variable}.model`" if rec.variable else "the Trainer's model"
    now = f" (it runs {impl!r})" if impl else ""
    flash = " ('flash_attention_2' with flash-attn)" if tensors_on == "cuda" else ""
    return (
        f"{model}{now}: call {model.strip('`')}.set_attn_implementation('sdpa') before training, or load it "
        f"with from_pretrained(..., attn_implementation='sdpa'){flash}."
    )
