"""The loss's logits: a language model's output layer makes B·T × V logits, and the
cross-entropy keeps them for backward with their log-softmax and, in backward, their
gradient, each as large (fp32 when the loss upcasts them). With a vocabulary of 128k–152k
they are often the step's peak. A fused linear cross-entropy computes the loss from the
hidden states in chunks and never holds the whole logits.

The replay counts the allocations the LM head's output and the loss made from it as their
own category, known by where they come from (``capture.memory.logits``); the copies are
that size over one fp32 copy of the real tokens computed × V."""

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

FP32 = 4


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    logits = ev.at_peak("logits")
    if not ev.peak_bytes or not logits > 0 or logits / ev.peak_bytes < th.logits_share:  # NaN: not recorded
        return None
    if applied(context, "fused_ce") or applied(context, "liger"):
        return None
    tok = ev.tokens
    vocab = tok.vocab if tok is not None else int(context.get("vocab_size") or 0)
    tokens = tok.at_peak if tok is not None else 0.0  # those of the step the logits at the peak are from
    one_copy = tokens * vocab * FP32
    copies = logits / one_copy if one_copy else None
    real = tok.real_at_peak if tok is not None and tok.real_at_peak else tokens
    hidden = context.get("lm_hidden_size")
    kept = effects.fused_ce_logits(real, vocab, hidden, ev.tensors_on == "cuda") if vocab and real else 0.0
    predicted = ev.peak_bytes - logits + kept
    shape = f"{int(tokens):,} tokens × {vocab:,} × 4 B" if one_copy else "B × T × V"
    times = f", kept {copies:.1f} times" if copies else ""
    evidence = {
        "logits_bytes": logits,
        "logits_pct": pct(logits / ev.peak_bytes),
        "vocab_size": vocab or None,
        "tokens_at_peak": round(tokens) or None,
        "copies": round(copies, 2) if copies else None,
        "peak_bytes": ev.peak_bytes,
        "predicted_peak_bytes": predicted,
    }
    plain = (
        "Compute the loss without materialising the logits: a fused linear cross-entropy (Liger-Kernel's "
        "LigerFusedLinearCrossEntropyLoss on CUDA; cut-cross-entropy's linear_cross_entropy elsewhere) takes "
        "the last hidden states and the output layer's weight and chunks over the tokens. At evaluation, ask "
        "the model for the logits you use only (logits_to_keep=1 when generating)."
    )
    return Finding(
        id="logits",
        title=f"The loss's logits hold {fmt_bytes(logits)} of the peak: {shape}{times}",
        evidence=evidence,
        suggestion=frameworks.phrased(context, fix) or plain,
        toggle="fused_ce",
        predicted_effect=(
            f"peak tensor memory ≈ {fmt_bytes(predicted)} instead of {fmt_bytes(ev.peak_bytes)}: the logits' "
            f"{fmt_bytes(logits)} are never held whole ({fmt_bytes(kept)} of them at a time)"
        ),
        formula=(
            "peak' ≈ peak − logits + what the fused loss holds: on CUDA (Liger) one chunk of tokens and its "
            "gradient; elsewhere (cut-cross-entropy, torch.compile) one fp32 copy of the real tokens' logits"
        ),
        severity="warning",
    )


def fix(rec: Recorded) -> str | None:
    """Liger's fused linear cross-entropy through the Trainer's own setting."""
    if rec.is_trainer and not rec.is_lightning:
        return (
            f"Fuse the output layer with the loss: {frameworks.set_arguments(rec, use_liger_kernel=True)} "
            "(Liger-Kernel, CUDA): its fused linear cross-entropy never holds the whole logits; its RMSNorm, "
            "RoPE and SwiGLU kernels come with it."
        )
    return None
