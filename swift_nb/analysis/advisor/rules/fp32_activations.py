"""fp32 activations without mixed precision; bf16 autocast halves them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.analysis import effects
from swift_nb.analysis.advisor import frameworks
from swift_nb.analysis.advisor.evidence import FLOATING, Evidence, Thresholds, applied
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.frameworks import Recorded
from swift_nb.analysis.advisor.words import pct
from swift_nb.core.units import fmt_bytes


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    """fp32 weights and a forward without mixed precision keeping a large share of the
    peak in activations: a Trainer or Accelerator whose mixed-precision setting is off, or
    a loop of its own whose matmuls ran on fp32 inputs (the trace's recorded input types);
    not a run with the bf16_autocast toggle applied."""
    rec = frameworks.recorded(context)
    if context.get("dtype", "float32") != "float32" or applied(context, "bf16_autocast"):
        return None
    if rec is not None:
        if rec.mixed_precision() is not False:
            return None
        if rec.is_lightning:
            setting = f"precision={rec.get('precision')!r}"
        elif rec.is_trainer:
            setting = "bf16=False, fp16=False"
        else:
            setting = f"mixed_precision={rec.get('mixed_precision')!r}"
        mixed = f"off ({rec.cls}: {setting})"
    elif ev.matmul_types & FLOATING == {"float"}:  # a loop of its own: its matmuls ran on fp32 inputs
        mixed = "off (the matmuls' inputs in the trace are fp32)"
    else:
        return None
    act = ev.at_peak("activations")
    if not ev.peak_bytes or act / ev.peak_bytes < th.fp32_activation_share:
        return None
    predicted = ev.peak_bytes - act + effects.autocast_activations(act)
    return Finding(
        id="fp32_activations",
        title=f"Activations are kept in fp32: {pct(act / ev.peak_bytes)} % of peak tensor memory",
        evidence={
            "activations_pct": pct(act / ev.peak_bytes),
            "mixed_precision": mixed,
            "weights_dtype": "float32",
            "activations_bytes": act,
            "peak_bytes": ev.peak_bytes,
            "predicted_peak_bytes": predicted,
        },
        suggestion=frameworks.phrased(context, lambda rec: fix(rec, ev.tensors_on))
        or (
            f"Run the forward pass under bf16 autocast (with torch.autocast({ev.tensors_on!r}, "
            "dtype=torch.bfloat16): …); "
            "try it without editing the cell: %%swift_profile --compare bf16_autocast"
        ),
        toggle="bf16_autocast",
        predicted_effect=(
            f"peak tensor memory ≈ {fmt_bytes(predicted)} instead of {fmt_bytes(ev.peak_bytes)}: activations "
            f"≈ {fmt_bytes(effects.autocast_activations(act))} in bfloat16"
        ),
        formula=(
            "peak' ≈ peak − A/2: autocast keeps the activations saved for backward in 16 bits; weights, "
            "gradients and optimizer state stay fp32"
        ),
        severity="info",
    )


def fix(rec: Recorded, tensors_on: str = "cpu") -> str | None:
    """The setting to change, for the device the run's tensors were on (``tensors_on``)."""
    if rec.is_trainer:
        fp16 = "precision='16-mixed'" if rec.is_lightning else "fp16=True"
        gpu = (
            f" ({fp16} instead on GPUs without bfloat16; on GPUs the matrix multiplies also run at the 16-bit rate)"
            if tensors_on == "cuda"
            else ""
        )
        return (
            f"Train in mixed precision: {frameworks.set_arguments(rec, bf16=True)}. The forward then runs under autocast in "
            "bfloat16 and the activations it keeps for backward take half the bytes; weights, gradients and "
            f"optimizer state stay fp32{gpu}."
        )
    return (
        f"Train in mixed precision: {frameworks.call('Accelerator', mixed_precision='bf16')} ({rec.name} has "
        f"mixed_precision={rec.get('mixed_precision', 'no')!r}). accelerator.prepare() then runs the model's "
        "forward under autocast in bfloat16 and the activations it keeps for backward take half the bytes; "
        "weights, gradients and optimizer state stay fp32."
    )
