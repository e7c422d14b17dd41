"""grad_checkpointing: keep only the inputs of the repeated blocks for backward and
recompute each block's activations when its gradient is needed (≈ one more forward).

Hugging Face models use their own switch (``activation_checkpointing_enable``, called
``gradient_checkpointing_enable`` before transformers 5; non-reentrant).
Other models: the largest ``nn.ModuleList``/``nn.Sequential`` whose children are all of
one type (the transformer blocks) gets each ``every_n``-th block wrapped with torch's
non-reentrant ``checkpoint_wrapper`` via ``apply_activation_checkpointing``; parameters
stay the same objects, so optimizers and state dicts are unaffected.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

from swift_nb.toggles.base import Toggle, hf_model


class GradCheckpointing(Toggle):
    id = "grad_checkpointing"
    watches_models = True

    def _apply_model(self, model: nn.Module, name: str) -> None:
        assert self.report is not None
        every_n = self.values["every_n"]
        hf_every_n = every_n == 1 or hasattr(model, "activation_checkpointing_enable")
        if hf_model(model) and getattr(model, "supports_gradient_checkpointing", False) and hf_every_n:
            self._enable_hf(model, name)
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
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5 (the old name warns)
            model.activation_checkpointing_enable(
                activation_checkpointing_kwargs=kwargs, every_n_layers=self.values["every_n"]
            )
            self._undo.append(model.activation_checkpointing_disable)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
            self._undo.append(model.gradient_checkpointing_disable)
        layers = repeated_blocks(model)
        count = f"{len(layers[1])} " if layers else ""
        self.report.change(
            f"`{name}` ({type(model).__name__}): gradient_checkpointing_enable() on its {count}layers (non-reentrant)"
        )
        if layers:
            self.report.details["checkpointed_blocks"] = self.report.details.get(
                "checkpointed_blocks", 0
            ) + len(layers[1])

    def _nothing_found(self) -> str:
        return "no model ran a forward pass while the toggle was applied"


def _hf_checkpointing(model: nn.Module) -> bool:
    # transformers 5 renamed is_gradient_checkpointing (which now warns) to is_activation_checkpointing
    for attr in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), attr):
            return bool(getattr(model, attr))
    return False


def repeated_blocks(model: nn.Module) -> tuple[str, list[nn.Module]] | None:
    """The ``(path, blocks)`` of the container of ≥ 2 same-type modules holding the most
    parameters (the transformer blocks), or None."""
    best: tuple[int, str, list[nn.Module]] | None = None
    for path, mod in model.named_modules():
        if not isinstance(mod, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(mod.children())
        if len(children) < 2 or len({type(c) for c in children}) != 1:
            continue
        size = sum(p.numel() for p in mod.parameters())
        if size and (best is None or size > best[0]):
            best = (size, path, children)
    return None if best is None else (best[1], best[2])
