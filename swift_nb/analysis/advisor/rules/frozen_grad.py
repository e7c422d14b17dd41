"""A frozen module run with grad enabled: autograd records its forward and keeps its
activations for a backward that trains nothing in it (the seeds' OOM case: a multimodal
model whose frozen vision encoder's features were never freed).

What the run records, and how far it goes:
- certain: parameters of the trained model that require grad but no optimizer holds — the
  fine-tuning's ``trainable_params`` (parameters with ``requires_grad``) exceed what the
  optimizers hold (the ``parameters`` category at the peak, in elements of the run's dtype).
  Backward computes their gradients and keeps the activations of the layers that use them
  to do so; ``optimizer.zero_grad()`` never frees those gradients. Single-process runs only:
  a sharded rank holds a part of the parameters.
- indirect: another model beside the trained one that nothing trains
  (``finetune.frozen_models``: an encoder, a teacher, a reference) and a peak that
  activations dominate. Its forward keeps activations only if its parameters still require
  grad or its input does, which the run does not record: the finding says "likely" and how
  to confirm it. A teacher already run under ``torch.no_grad()`` reads the same, hence
  ``info``.
The trace holds no module hierarchy (the profiler runs without ``with_modules``), so the
activations cannot be split by module."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor.evidence import Evidence, Thresholds, finetune
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.words import pct
from swift_nb.core.units import fmt_bytes
from swift_nb.vocabulary.forecast_spec import DTYPE_BYTES

#: parameters requiring grad that no optimizer holds, as a share of those requiring grad
UNTRAINED_SHARE = 0.05
#: activations at least this share of the peak beside a frozen model
FROZEN_ACTIVATION_SHARE = 0.40


def _no_grad(module: str) -> str:
    """How to run a frozen ``module`` that runs before every trained one."""
    return (
        f"run it under torch.no_grad() (or torch.inference_mode()) — `with torch.no_grad(): feats = {module}(x)` — "
        "so that nothing of its forward is kept, and drop the features once the trained part has used them "
        "(`del feats`, or pass feats.detach() where they are kept across steps). Only for a module that runs "
        "before every trained one: gradients must still flow through a frozen module that trained ones feed."
    )


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    ft = finetune(context)
    if not ft or not ev.peak_bytes:
        return None
    return _untrained(ev, ft, context) or _frozen_models(ev, ft)


def _untrained(ev: Evidence, ft: Mapping[str, Any], context: Mapping[str, Any]) -> Finding | None:
    """Parameters that require grad and no optimizer holds (certain)."""
    trainable = ft.get("trainable_params")
    held_bytes = ev.at_peak("parameters")
    if ev.world_size > 1 or not trainable or not held_bytes > 0:
        return None
    element = DTYPE_BYTES.get(str(context.get("dtype")), 4)
    untrained = trainable - held_bytes / element
    if untrained < UNTRAINED_SHARE * trainable:
        return None
    act = ev.at_peak("activations")
    model = ft.get("model_variable") or "model"
    grads = untrained * element
    return Finding(
        id="frozen_grad",
        title=(
            f"{untrained:,.0f} parameters of `{model}` require grad but no optimizer holds them: backward "
            "computes their gradients for nothing"
        ),
        evidence={
            "model": model,
            "requires_grad_params": trainable,
            "optimized_params": round(held_bytes / element),
            "untrained_params": round(untrained),
            "untrained_gradient_bytes": grads,
            "activations_bytes": act,
            "activations_pct": pct(act / ev.peak_bytes),
            "confidence": "certain: finetune.trainable_params exceeds the parameters the optimizers hold",
        },
        suggestion=(
            f"Freeze them for autograd, not only for the optimizer. Find the modules: held = {{id(p) for g in "
            f"opt.param_groups for p in g['params']}}; {{n.rsplit('.', 1)[0] for n, p in {model}.named_parameters() "
            "if p.requires_grad and id(p) not in held}. Then module.requires_grad_(False), and for a frozen "
            f"encoder {_no_grad(f'{model}.<module>')}"
        ),
        predicted_effect=(
            f"≈ {fmt_bytes(grads)} of gradients no longer made ({round(untrained):,} × {element} B; "
            "optimizer.zero_grad() does not free them, so they stay alive), and the activations those layers' "
            f"backward needed no longer kept: part of the {fmt_bytes(act)} of activations at the peak (the trace "
            "does not say which part)"
        ),
        formula="gradients freed = (parameters requiring grad − parameters the optimizers hold) × bytes per element",
    )


def _frozen_models(ev: Evidence, ft: Mapping[str, Any]) -> Finding | None:
    """A model beside the trained one that nothing trains, and activations dominating (likely)."""
    frozen = [m for m in ft.get("frozen_models") or [] if isinstance(m, Mapping)]
    act = ev.at_peak("activations")
    if not frozen or not act / ev.peak_bytes >= FROZEN_ACTIVATION_SHARE:  # NaN: unknown
        return None
    names = ", ".join(
        f"`{m.get('variable')}` ({m.get('class')}, {m.get('params', 0):,} parameters)" for m in frozen
    )
    first = frozen[0].get("variable") or "encoder"
    return Finding(
        id="frozen_grad",
        title=(
            f"Activations are {pct(act / ev.peak_bytes)} % of peak tensor memory beside frozen {names}: its "
            "forward may keep activations for nothing"
        ),
        evidence={
            "frozen_models": [dict(m) for m in frozen],
            "activations_bytes": act,
            "peak_bytes": ev.peak_bytes,
            "activations_pct": pct(act / ev.peak_bytes),
            "confidence": (
                "indirect: the run records a model nothing trains and activations dominating, not whether its "
                "forward recorded a graph"
            ),
        },
        suggestion=(
            f"Likely when {first}'s parameters still require grad (left out of the optimizer rather than frozen) "
            "or its input requires grad: autograd then records its forward and keeps its activations. Confirm: "
            f"{first}'s output has a grad_fn (out = {first}(x); out.grad_fn is not None) — None means nothing of its "
            f"forward is kept and this does not apply. If so, {first}.requires_grad_(False) and {_no_grad(first)}"
        ),
        predicted_effect=(
            f"the frozen model's share of the {fmt_bytes(act)} of activations at the peak no longer kept (the trace "
            "has no module hierarchy to say how much)"
        ),
        formula="activations' = activations − those made in the frozen model's forward and saved for backward",
        severity="info",
    )
