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
output layer's soft-capping where the config has one. A model whose output layer is not a
plain linear layer without bias, or whose forward cannot keep only the last logits, is
refused before any work, naming what was looked for.
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
    return None


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
        softcap = getattr(getattr(lm, "config", None), "final_logit_softcapping", None)
        # under packing (applied first), the loss is computed on the packed row: wrap what it calls
        packing = getattr(lm.forward, PACKING_INNER, None)
        original = packing["inner"] if packing is not None else lm.forward
        keep = next(k for k in _KEEP if k in inspect.signature(original).parameters)
        decoder = lm.get_decoder()
        calls = self._calls

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
            reduction = "sum" if items is not None else "mean"
            value = loss(found["hidden"], lm.get_output_embeddings().weight, labels, softcap, reduction)
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
