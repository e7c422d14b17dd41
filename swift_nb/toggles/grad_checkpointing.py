"""grad_checkpointing: keep only the inputs of the repeated blocks for backward and
recompute each block's activations when its gradient is needed (≈ one more forward).

Hugging Face models use their own switch (``activation_checkpointing_enable``, called
``gradient_checkpointing_enable`` before transformers 5; non-reentrant), which also makes
the embeddings' output require grad (``enable_input_require_grads``) so that gradients
reach adapters when the embeddings are frozen; ``undo()`` switches it off and removes that
hook. A model under peft's adapters (``PeftModel`` → ``LoraModel`` → the model) is reached
through them: the switch belongs to the model inside, and wrapping its layers instead
would recompute them with the kv cache the forward filled, which the recompute extends a
second time (keys twice as long as the mask).
Other models: the largest ``nn.ModuleList``/``nn.Sequential`` whose children are all of
one type (the transformer blocks) gets each ``every_n``-th block wrapped with torch's
non-reentrant ``checkpoint_wrapper`` via ``apply_activation_checkpointing``; parameters
stay the same objects, so optimizers and state dicts are unaffected.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

from swift_nb.capture.models import repeated_blocks
from swift_nb.toggles.base import Toggle, hf_model


class GradCheckpointing(Toggle):
    id = "grad_checkpointing"
    watches_models = True

    def _apply_model(self, model: nn.Module, name: str) -> None:
        assert self.report is not None
        every_n = self.values["every_n"]
        path, inner = under_adapters(model)
        hf_every_n = every_n == 1 or hasattr(inner, "activation_checkpointing_enable")
        if hf_model(inner) and getattr(inner, "supports_gradient_checkpointing", False) and hf_every_n:
            self._enable_hf(inner, f"{name}.{path}" if path else name)
            return
        found = repeated_blocks(model)
        if found is None:
            self.report.note(
                f"`{name}` ({type(model).__name__}) has no repeated blocks to checkpoint "
                "(an nn.ModuleList or nn.Sequential of ≥ 2 modules of one type)"
            )
            return
        path, blocks = found
        chosen = {id(b) for i, b in enumerate(blocks) if i % every_n == 0}
        apply_activation_checkpointing(
            model,
            checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(
                m, checkpoint_impl=CheckpointImpl.NO_REENTRANT
            ),
            check_fn=lambda m: id(m) in chosen,
        )
        wrapped = [
            (parent, child_name, child)
            for parent in model.modules()
            for child_name, child in parent.named_children()
            if isinstance(child, CheckpointWrapper) and id(child._checkpoint_wrapped_module) in chosen
        ]

        def unwrap() -> None:
            for parent, child_name, child in wrapped:
                setattr(parent, child_name, child._checkpoint_wrapped_module)

        self._undo.append(unwrap)
        where = f"{name}.{path}" if path else name
        kind = type(blocks[0]).__name__
        self.report.change(
            f"{len(wrapped)} of {len(blocks)} {kind} blocks in `{where}` checkpointed (non-reentrant)"
        )
        self.report.details.setdefault("checkpointed_blocks", 0)
        self.report.details["checkpointed_blocks"] += len(wrapped)

    def _enable_hf(self, model: nn.Module, name: str) -> None:
        assert self.report is not None
        if _hf_checkpointing(model):
            self.report.note(f"`{name}` already has gradient checkpointing enabled")
            return
        every_n = self.values["every_n"]
        kwargs = {"use_reentrant": False}
        hooks_before = _input_grad_hooks(model)
        if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5 (the old name warns)
            model.activation_checkpointing_enable(
                activation_checkpointing_kwargs=kwargs, every_n_layers=every_n
            )
            disable = model.activation_checkpointing_disable
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
            disable = model.gradient_checkpointing_disable
        # transformers ≥ 5 adds the hook for models taking input_ids, older ones only for their own peft
        if _input_grad_hooks(model) == hooks_before and hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()

        def undo() -> None:
            disable()
            _restore_input_grad_hooks(model, hooks_before)

        self._undo.append(undo)
        layers = repeated_blocks(model)
        total = len(layers[1]) if layers else 0
        checkpointed = len(range(0, total, every_n))
        if not total:
            which = "its layers"
        elif checkpointed == total:
            which = f"its {total} layers"
        else:
            which = f"{checkpointed} of its {total} layers"
        self.report.change(
            f"`{name}` ({type(model).__name__}): gradient_checkpointing_enable() on {which} (non-reentrant)"
        )
        if checkpointed:
            self.report.details["checkpointed_blocks"] = (
                self.report.details.get("checkpointed_blocks", 0) + checkpointed
            )

    def _nothing_found(self) -> str:
        return "no model ran a forward pass while the toggle was applied"


def _hf_checkpointing(model: nn.Module) -> bool:
    # transformers 5 renamed is_gradient_checkpointing (which now warns) to is_activation_checkpointing
    for attr in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), attr):
            return bool(getattr(model, attr))
    return False


_ABSENT = object()


def _input_grad_hooks(model: nn.Module) -> dict[str, Any]:
    """What ``enable_input_require_grads`` keeps on the model: the hooks' handles (a list,
    and the first one under its older name), as they are now."""
    return {
        attr: list(value) if isinstance(value, list) else value
        for attr in ("_require_grads_hooks", "_require_grads_hook")
        if (value := model.__dict__.get(attr, _ABSENT)) is not _ABSENT
    }


def _restore_input_grad_hooks(model: nn.Module, before: dict[str, Any]) -> None:
    """Remove the input-require-grads hooks added since ``before`` was taken and put the
    model's handles back as they were (hooks the user had added stay registered)."""
    now = _input_grad_hooks(model)
    kept = {id(h) for h in [*before.get("_require_grads_hooks", []), before.get("_require_grads_hook")]}
    for handle in [*now.get("_require_grads_hooks", []), now.get("_require_grads_hook")]:
        if handle is not None and id(handle) not in kept:
            handle.remove()
    for attr in ("_require_grads_hooks", "_require_grads_hook"):
        if attr in before:
            model.__dict__[attr] = before[attr]
        else:
            model.__dict__.pop(attr, None)


def under_adapters(model: nn.Module) -> tuple[str, nn.Module]:
    """The model peft's wrappers hold (``PeftModel`` → ``LoraModel`` → the transformers or
    plain torch model) and its path in ``model``; ``("", model)`` for a model not wrapped
    by peft."""
    inner = model
    while type(inner).__module__.startswith("peft."):
        get_base = getattr(inner, "get_base_model", None)
        nxt = get_base() if callable(get_base) else getattr(inner, "model", None)
        if not isinstance(nxt, nn.Module) or nxt is inner:
            break
        inner = nxt
    if inner is model:
        return "", model
    return next((path for path, m in model.named_modules() if m is inner), ""), inner
