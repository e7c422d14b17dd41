"""LoRA with a small batch is launch- or overhead-bound: each adapted layer adds two tiny
GEMMs (x·A, then ·B, with rank r columns), a scale and an add to its forward and about
twice that to its backward, so a small batch spends its step launching and dispatching
small operators rather than computing.

This rule extends the overhead rule (``rules/overhead.py``) and takes its place in the
registry, so that one cause gives one finding: on a LoRA, QLoRA or DoRA run with a small
batch (at most ``SMALL_BATCH`` samples) whose overhead finding is raised from the operators
(many tiny ops per step on the CPU, launch gaps on a GPU), the finding is this one, with the
overhead evidence and the adapters' own remedies (a larger batch, and whether it fits;
fewer target modules; torch.compile); every other run gets the overhead rule's finding
unchanged, the tiny step whose loading dominates included (its cause is the loader's fixed
cost, not the adapters)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor import frameworks
from swift_nb.analysis.advisor.evidence import LORA_METHODS, Evidence, Thresholds, finetune
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.frameworks import Recorded
from swift_nb.analysis.advisor.rules import overhead
from swift_nb.analysis.advisor.verdict import tiny_step
from swift_nb.analysis.advisor.words import pct
from swift_nb.core.units import fmt_bytes

#: samples per micro-batch up to which a LoRA step counts as a small batch
SMALL_BATCH = 8
#: the batch multiples whose peak the finding predicts
SCALES = (2, 4)
#: the categories that do not grow with the batch (the rest, activations and other
#: tensors, grow linearly with it, as the forecast scales them)
FIXED = ("parameters", "frozen_parameters", "gradients", "optimizer_state")


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    base = overhead.rule(ev, th, context)
    ft = finetune(context)
    if base is None or ft.get("method") not in LORA_METHODS or (ev.device is None and tiny_step(ev, th)):
        return base
    rec = frameworks.recorded(context)
    batch = rec.micro_batch if rec is not None and rec.is_trainer else ev.batch
    if not 0 < batch <= SMALL_BATCH:
        return base
    evidence: dict[str, Any] = {
        **base.evidence,
        "method": ft["method"],
        "batch": batch,
        "target_modules": ft.get("target_modules"),
        "rank": ft.get("rank"),
    }
    if ev.attention_calls > 1 and isinstance(ft.get("target_modules"), list):
        evidence["adapted_layers"] = ev.attention_calls * len(ft["target_modules"])
    # the peaks at larger batches, where the run measured memory by category
    measured = ev.at_peak("activations") > 0
    fits = _larger_batches(ev, th, evidence) if measured else 0
    room = _room(batch, fits, th)
    return Finding(
        id="lora_small_batch",
        title=f"LoRA with a small batch ({batch} per micro-batch) is overhead-bound — {base.title}",
        evidence=evidence,
        suggestion=(
            f"The adapters' GEMMs are tiny (rank {ft.get('rank', 'r')}) and a batch of {batch} leaves each "
            "operator little work: the step pays for launching and dispatching them. "
            + (
                frameworks.phrased(context, lambda r: _trainer_fix(r, fits, room))
                or _plain_fix(ev, batch, room)
            )
            + " "
            + _targets_text(ft.get("target_modules"), evidence.get("adapted_layers"))
        ),
        toggle=base.toggle,
        predicted_effect=base.predicted_effect + ("; " + _fits_text(ev, batch, evidence) if measured else ""),
        formula=(
            base.formula
            + "; peak at k× the batch ≈ parameters + frozen weights + gradients + optimizer state + k × "
            "(activations + other tensors)"
        ),
        severity=base.severity,
    )


def scaled_peak(ev: Evidence, k: float) -> float:
    """Peak tensor bytes at ``k`` times the batch: the weights, gradients and optimizer state
    as measured, the activations and other tensors ``k`` times theirs."""
    fixed = sum(b for c in FIXED if math.isfinite(b := ev.at_peak(c)))
    return fixed + k * (ev.peak_bytes - fixed)


def _larger_batches(ev: Evidence, th: Thresholds, evidence: dict[str, Any]) -> int:
    """Adds the predicted peaks at ``SCALES`` times the batch to ``evidence``; returns the
    largest multiple whose peak stays under ``th.near_limit`` of the device's capacity (1:
    none, 0: capacity unknown)."""
    fits = 0 if not ev.limit_bytes else 1
    for k in SCALES:
        peak = scaled_peak(ev, k)
        evidence[f"peak_at_{k}x_batch_bytes"] = peak
        if ev.limit_bytes and peak <= th.near_limit * ev.limit_bytes:
            fits = k
    if ev.limit_bytes:
        evidence["limit_bytes"] = ev.limit_bytes
    return fits


def _fits_text(ev: Evidence, batch: int, evidence: Mapping[str, Any]) -> str:
    parts = []
    for k in SCALES:
        peak = evidence[f"peak_at_{k}x_batch_bytes"]
        where = (
            f", {pct(peak / ev.limit_bytes)} % of the device's {fmt_bytes(ev.limit_bytes)}"
            if ev.limit_bytes
            else ""
        )
        parts.append(f"batch {k * batch}: peak ≈ {fmt_bytes(peak)}{where}")
    return "; ".join(parts) + " (activations and other tensors grow with the batch, the frozen base does not)"


def _plain_fix(ev: Evidence, batch: int, room: str) -> str:
    text = f"Raise the batch {room}"
    if ev.compiled is None:
        text += " and compile the model (torch.compile(model)) to fuse the adapters' small ops"
        if ev.tensors_on == "cuda":
            text += "; mode='reduce-overhead' also replays the step's launches as CUDA graphs"
    return text + "."


def _room(batch: int, fits: int, th: Thresholds) -> str:
    """How far the batch can grow, in words (``fits``: see ``_larger_batches``)."""
    near = f"{pct(th.near_limit):g} % of the device's memory"
    if fits == 0:
        return f"to {SCALES[-1] * batch} or more, as far as memory allows"
    if fits == 1:
        return f"only as far as memory allows: even {SCALES[0] * batch} would pass {near}"
    return f"to {fits * batch}: its predicted peak stays under {near}"


def _trainer_fix(rec: Recorded, fits: int, room: str) -> str | None:
    if not rec.is_trainer:
        return None
    k = max(2, fits)
    fields: dict[str, Any] = {"per_device_train_batch_size": k * rec.micro_batch}
    if rec.accumulation >= k:
        fields["gradient_accumulation_steps"] = rec.accumulation // k
    if not rec.get("torch_compile", False):
        fields["torch_compile"] = True
    samples = (
        f"the same {rec.micro_batch * rec.accumulation} samples per optimizer step"
        if rec.accumulation >= k
        else f"{k}× the samples per optimizer step: retune the learning rate"
    )
    return (
        f"{frameworks.set_arguments(rec, **fields)}: larger micro-batches give each adapter GEMM more rows "
        f"({samples}); the micro-batch can grow {room}."
    )


def _targets_text(targets: Any, adapted: int | None) -> str:
    if not targets:
        return ""
    names = ", ".join(map(str, targets)) if isinstance(targets, list) else repr(targets)
    count = f" ({adapted} adapted layers per forward)" if adapted else ""
    if isinstance(targets, list) and len(targets) <= 2:
        return f"Its adapters are on {names} only{count}: few already."
    return (
        f"Or adapt fewer modules: each of target_modules=[{names}]{count} adds two GEMMs to every block's "
        "forward and their gradients to its backward; the adapters' operators shrink in proportion to the "
        "modules kept."
    )
