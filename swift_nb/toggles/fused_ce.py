"""fused_ce: the loss of a causal language model computed from its hidden states without
materialising the logits.

A Hugging Face ``*ForCausalLM`` given ``labels=`` computes ``logits = lm_head(hidden)`` for
every token, upcasts them to fp32 and takes their cross-entropy: B·T × V floats, kept for
backward with their log-softmax and, in backward, their gradient. Under this toggle the
model's forward runs with ``logits_to_keep=1`` (the logits of the last position only, which
is what ``outputs.logits`` then holds) and its loss comes from a maintained fused linear
cross-entropy on the last hidden states and the output layer's weight:

- on CUDA, Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss`` (chunks over the tokens)
  when it is installed, else cut-cross-entropy's ``cce`` kernel;
- elsewhere (the CPU, where Triton kernels cannot run), cut-cross-entropy's
  ``torch_compile`` path: the ignored positions (padding, masked prompts) are dropped before
  the logits are formed and the softmax is fused by inductor.

The loss is the model's own: the labels shifted by one, -100 ignored, the mean over the
predicted tokens (or their sum over ``num_items_in_batch``, as a Trainer passes it), the
output layer's soft-capping where the config has one (``SOFTCAPS``). A model whose output
layer is not a plain linear layer without bias, whose forward cannot keep only the last
logits, or whose config scales its logits (``SCALES``: Granite, Cohere, Falcon-H1) is refused
before any work, naming what was looked for or the attribute. Post-processing no config
announces (remote code, a hook on the output layer) is caught at the first loss: the last
position's logits, which the model returns anyway, are compared with the output layer's own,
and a model whose logits differ is refused there.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from swift_nb.core.errors import ConfigError, MissingDependencyError
from swift_nb.toggles.base import Toggle, find_models, hf_model
from swift_nb.toggles.packing import INNER as PACKING_INNER

IGNORE_INDEX = -100
_KEEP = ("logits_to_keep", "num_logits_to_keep")
#: config attributes by which a model caps its logits as ``cap · tanh(logits / cap)``, which
#: the fused kernels reproduce (Gemma 2 to 4 and VaultGemma; RecurrentGemma)
SOFTCAPS = ("final_logit_softcapping", "logits_soft_cap")
#: config attributes by which a model multiplies or divides its logits, which the fused
#: kernels do not reproduce (Granite and HyperCLOVA X; Cohere and Aya; Falcon-H1)
SCALES = ("logits_scaling", "logit_scale", "lm_head_multiplier")
#: how far the logits the model returns may stray from the output layer's, relative to the
#: largest (half-precision rounding of a soft-cap stays well under it)
_SAME_LOGITS = 0.02
LOOKED_FOR = (
    "a Hugging Face causal language model (a transformers PreTrainedModel with "
    "get_output_embeddings() returning an nn.Linear without bias, get_decoder(), and a forward "
    "that takes labels= and logits_to_keep=)"
)


def causal_lm(model: nn.Module) -> nn.Module | None:
    """The Hugging Face causal LM inside ``model`` (itself, or under peft's or a wrapper's
    layers), or None."""
    for m in model.modules():
        if not hf_model(m) or not callable(getattr(m, "get_decoder", None)):
            continue
        try:
            head = m.get_output_embeddings()
        except Exception:
            continue
        if isinstance(head, nn.Linear):
            return m
    return None


def why_not(lm: nn.Module) -> str | None:
    """Why the fused loss cannot stand in for ``lm``'s own (None: it can)."""
    head = lm.get_output_embeddings()
    if head.bias is not None:
        return "its output layer has a bias, which the fused cross-entropy does not take"
    forward = getattr(lm.forward, PACKING_INNER, {"inner": lm.forward})["inner"]
    params = inspect.signature(forward).parameters
    if "labels" not in params or not any(k in params for k in _KEEP):
        return "its forward takes no labels= or no logits_to_keep=, so its full logits cannot be skipped"
    for config in _configs(lm):
        for attr in SCALES:
            value = getattr(config, attr, None)
            if value is not None and value != 1:
                return (
                    f"its config.{attr} = {value} scales its logits, which the fused cross-entropy "
                    "does not reproduce: its loss would be another; leave fused_ce off for this model"
                )
    return None


def softcap(lm: nn.Module) -> float | None:
    """The cap ``lm``'s config puts on its logits (``SOFTCAPS``), or None."""
    for config in _configs(lm):
        for attr in SOFTCAPS:
            value = getattr(config, attr, None)
            if value is not None:
                return float(value)
    return None


def _configs(lm: nn.Module) -> list[Any]:
    """``lm``'s config and, for a multimodal model, its text model's."""
    config = getattr(lm, "config", None)
    text = getattr(config, "text_config", None)
    return [c for c in (config, text) if c is not None]


def logits_differ(
    logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, cap: float | None
) -> str | None:
    """How the last position's ``logits`` a model returned differ from its output layer's
    (``weight`` applied to ``hidden``, soft-capped by ``cap``), which the fused loss takes; None
    when they agree within ``_SAME_LOGITS`` of the largest."""
    with torch.no_grad():
        own = nn.functional.linear(hidden[:, -1:], weight).float()
        if cap is not None:
            own = cap * torch.tanh(own / cap)
        got = logits[:, -1:].float()
        if got.shape != own.shape:
            return f"of shape {tuple(got.shape)} where its output layer gives {tuple(own.shape)}"
        off = float((got - own).abs().max())
        largest = float(got.abs().max())
    if off <= _SAME_LOGITS * largest:
        return None
    return f"off by up to {off:.3g} from its output layer's (largest {largest:.3g})"


def fused_loss(device_type: str) -> tuple[str, Callable[..., torch.Tensor]]:
    """(the implementation's name, ``loss(hidden, weight, labels, softcap, reduction)``)
    for tensors on ``device_type``; ``MissingDependencyError`` naming what to install."""
    if device_type == "cuda":
        try:
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        except ImportError:
            pass
        else:

            def liger(hidden, weight, labels, softcap, reduction):
                fn = LigerFusedLinearCrossEntropyLoss(
                    ignore_index=IGNORE_INDEX, reduction=reduction, softcap=softcap
                )
                h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
                return fn(weight, h, labels[:, 1:].reshape(-1))

            return "Liger-Kernel LigerFusedLinearCrossEntropyLoss", liger
    try:
        from cut_cross_entropy import linear_cross_entropy
    except ImportError as e:
        raise MissingDependencyError(
            f"the fused_ce toggle needs cut-cross-entropy ({e}): pip install 'swift_nb[fused_ce]' "
            "(on CUDA, liger-kernel serves too)"
        ) from None
    impl = "cce" if device_type == "cuda" else "torch_compile"

    def cce(hidden, weight, labels, softcap, reduction):
        return linear_cross_entropy(
            hidden, weight, labels, shift=True, softcap=softcap, reduction=reduction, impl=impl
        )

    return f"cut-cross-entropy ({impl})", cce


class FusedCE(Toggle):
    id = "fused_ce"
    watches_models = True

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        self._calls = {"calls": 0}

    def apply(self, namespace=None):
        models = find_models(namespace or {})
        lms = [(name, causal_lm(m)) for name, m in models]
        if models and not any(lm for _, lm in lms):
            names = ", ".join(f"`{n}` ({type(m).__name__})" for n, m in models)
            raise ConfigError(
                "fused_ce",
                f"found no language model in the cell's models {names}: looked for {LOOKED_FOR}",
                "fused_ce",
            )
        for name, lm in lms:
            if lm is not None and (reason := why_not(lm)) is not None:
                raise ConfigError(
                    "fused_ce",
                    f"cannot fuse the loss of `{name}` ({type(lm).__name__}): {reason}",
                    "fused_ce",
                )
        return super().apply(namespace)

    def _apply_model(self, model: nn.Module, name: str) -> None:
        lm = causal_lm(model)
        report = self.report
        assert report is not None
        if lm is None:
            raise ConfigError(
                "fused_ce",
                f"`{name}` ({type(model).__name__}) is not a language model: looked for {LOOKED_FOR}",
                "fused_ce",
            )
        reason = why_not(lm)
        if reason is not None:
            raise ConfigError(
                "fused_ce", f"cannot fuse the loss of `{name}` ({type(lm).__name__}): {reason}", "fused_ce"
            )
        weight = lm.get_output_embeddings().weight
        impl, loss = fused_loss(weight.device.type)
        cap = softcap(lm)
        # under packing (applied first), the loss is computed on the packed row: wrap what it calls
        packing = getattr(lm.forward, PACKING_INNER, None)
        original = packing["inner"] if packing is not None else lm.forward
        keep = next(k for k in _KEEP if k in inspect.signature(original).parameters)
        decoder = lm.get_decoder()
        calls = self._calls
        checked: list[bool] = []  # whether the model's logits were compared with the output layer's

        def forward(*args: Any, labels: torch.Tensor | None = None, **kwargs: Any) -> Any:
            if labels is None:
                return original(*args, **kwargs)
            found: dict[str, torch.Tensor] = {}

            def keep_hidden(module: nn.Module, inputs: Any, output: Any) -> None:
                found["hidden"] = output[0] if isinstance(output, tuple) else output.last_hidden_state

            items = kwargs.pop("num_items_in_batch", None)
            handle = decoder.register_forward_hook(keep_hidden)
            try:
                out = original(*args, **{**kwargs, keep: 1})
            finally:
                handle.remove()
            head_weight = lm.get_output_embeddings().weight
            if not checked:
                logits = out[0] if isinstance(out, tuple) else out.get("logits")
                if logits is not None and (how := logits_differ(logits, found["hidden"], head_weight, cap)):
                    raise ConfigError(
                        "fused_ce",
                        f"cannot fuse the loss of `{name}` ({type(lm).__name__}): the logits it returns are "
                        f"not its output layer's ({how}); its forward post-processes them in a way the "
                        "fused cross-entropy does not reproduce, so its loss would be another; "
                        "leave fused_ce off for this model",
                        "fused_ce",
                    )
                checked.append(True)
            reduction = "sum" if items is not None else "mean"
            value = loss(found["hidden"], head_weight, labels, cap, reduction)
            if items is not None:
                value = value / (items.to(value.device) if isinstance(items, torch.Tensor) else items)
            calls["calls"] += 1
            if isinstance(out, tuple):  # return_dict=False: the loss leads, as the model's own
                return (value, *out)
            out["loss"] = value
            return out

        forward.__wrapped__ = original  # type: ignore[attr-defined]  # its signature, for inspect
        if packing is not None:
            packing["inner"] = forward
            self._undo.append(lambda: packing.__setitem__("inner", original))
        else:
            lm.forward = forward
            self._undo.append(lambda: lm.__dict__.pop("forward", None))
        report.change(
            f"{name}: the loss from its hidden states by {impl}, never its full logits "
            f"({weight.shape[0]:,} × tokens); outputs.logits holds the last position only"
        )
        report.details["implementation"] = impl

    def _finalize(self, report) -> None:
        report.details["fused_calls"] = self._calls["calls"]
        if self._roots and not self._calls["calls"]:
            report.note("the model never computed a loss from labels=: the fused loss was not used")

    def _nothing_found(self) -> str:
        return f"no model was found in the namespace: looked for {LOOKED_FOR}"
