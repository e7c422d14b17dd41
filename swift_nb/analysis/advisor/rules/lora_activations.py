"""Activations on a LoRA run without checkpointing: the adapters save for backward what the
frozen layers alone would not (peft issue #2196, LoRA using more activation memory than a
full fine-tune): each adapted layer keeps its input for the gradient of A, a dropped-out
copy of it when ``lora_dropout`` > 0, and x·A, on top of what the frozen model around them
keeps for the gradient to flow through. A full fine-tune of the same model cannot be
measured from this run, so the rule reads what it can: the activations dominate the peak
(``LORA_ACTIVATION_SHARE``, lower than the activations rule's threshold, since the frozen
base leaves gradients and optimizer state little room) and checkpointing is off (the run's
toggles, the Trainer's switch and its model's state).

This rule extends the activations rule (``rules/activations.py``) and takes its place in
the registry, so that one cause gives one finding: on such a run the finding is this one,
with the activations rule's evidence and predicted effect (``effects.checkpointed_peak``)
and the change a peft model needs (non-reentrant checkpointing and inputs that require
grad); every other run gets the activations rule's finding unchanged."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor import frameworks
from swift_nb.analysis.advisor.evidence import LORA_METHODS, Evidence, Thresholds, finetune
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.frameworks import Recorded
from swift_nb.analysis.advisor.rules import activations
from swift_nb.analysis.advisor.words import pct

#: activations at least this share of the peak on a LoRA run without checkpointing
LORA_ACTIVATION_SHARE = 0.40
TOGGLE = "grad_checkpointing"
PLAIN = (
    'model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}) '
    "(from transformers 5: activation_checkpointing_enable(activation_checkpointing_kwargs=…)), then "
    "model.enable_input_require_grads()"
)


def _checkpointing(context: Mapping[str, Any], rec: Recorded | None) -> bool:
    """Whether the run checkpointed: the toggle applied, or the Trainer's switch or its model's state."""
    toggled = any(isinstance(t, dict) and t.get("toggle") == TOGGLE for t in context.get("toggles") or [])
    return toggled or (rec is not None and rec.checkpointing())


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    ft = finetune(context)
    rec = frameworks.recorded(context)
    act = ev.at_peak("activations")
    if (
        ft.get("method") not in LORA_METHODS
        or _checkpointing(context, rec)
        or not ev.peak_bytes
        or not act / ev.peak_bytes >= LORA_ACTIVATION_SHARE  # NaN: unknown
    ):
        return activations.rule(ev, th, context)
    share = min(th.activation_share, LORA_ACTIVATION_SHARE)
    base = activations.rule(ev, dataclasses.replace(th, activation_share=share), context)
    assert base is not None  # its threshold is met: act / peak ≥ share
    dropout = ft.get("dropout") or 0.0
    evidence = {**base.evidence, "method": ft["method"], "checkpointing": "off", "lora_dropout": dropout}
    return Finding(
        id="lora_activations",
        title=f"Activations are {pct(act / ev.peak_bytes)} % of peak tensor memory on a {ft['method']} run "
        "without checkpointing",
        evidence=evidence,
        suggestion=(
            "The adapters keep activations of their own for backward (each adapted layer's input for the "
            "gradient of A, which the frozen layer alone would not keep, and x·A) besides those the frozen "
            "layers keep for the gradient to flow through: recompute them in backward instead. "
            + (
                frameworks.phrased(context, _trainer_fix)
                or f"Checkpoint the blocks without reentrancy: {PLAIN}."
            )
            + " Non-reentrant checkpointing gives the adapters their gradients even when no input of a block "
            "requires grad (the embeddings are frozen); enable_input_require_grads() makes the embeddings' "
            "output require grad, which the reentrant variant needs."
            + (
                f" lora_dropout={dropout} also keeps a dropped-out copy of every adapted layer's input (and "
                "its mask): lora_dropout=0 keeps none."
                if dropout
                else ""
            )
        ),
        toggle=TOGGLE,
        predicted_effect=base.predicted_effect,
        formula=base.formula,
    )


def _trainer_fix(rec: Recorded) -> str | None:
    if not rec.is_trainer:
        return None
    field = rec.checkpointing_field
    fields = {field: True, f"{field}_kwargs": {"use_reentrant": False}}
    return f"{frameworks.set_arguments(rec, **fields)} (the Trainer calls the model's own {field}_enable() with those kwargs)."
