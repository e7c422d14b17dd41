"""fp8: torchao's float8 training of the model's linear layers (``convert_to_float8_training``):
their matmuls run in float8 (e4m3 forward, e5m2 gradients) with dynamic per-tensor scales,
on CUDA devices of compute capability 8.9 or more (Ada, Hopper, Blackwell). Elsewhere the
toggle is refused before any work, naming the capability.

Each ``nn.Linear`` whose sides are both multiples of 16 (what float8 matmuls take) is
swapped for torchao's ``Float8Linear``, which holds the same weight and bias parameters, so
optimizers and state dicts are unaffected; ``undo()`` puts the original modules back in
their parents. The model's output layer is left in high precision, as torchao recommends
(``lm_head`` and a root that is itself a linear layer).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from swift_nb.core.errors import MissingDependencyError
from swift_nb.toggles.base import Toggle, refuse_without_cuda

#: module names kept in high precision (the output projection to the vocabulary)
KEEP = ("lm_head", "output", "classifier")


def convert_to_float8() -> Any:
    """torchao's ``convert_to_float8_training``, or an error that says how to install it."""
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError as e:
        raise MissingDependencyError(
            f"the fp8 toggle needs torchao ({e}): pip install 'swift_nb[fp8]'"
        ) from None
    return convert_to_float8_training


def float8_eligible(module: nn.Module, fqn: str) -> bool:
    """A linear layer float8 matmuls can take (both sides multiples of 16), not the output layer."""
    return (
        isinstance(module, nn.Linear)
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
        and fqn.rpartition(".")[2] not in KEEP
    )


class FP8(Toggle):
    id = "fp8"
    watches_models = True

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        refuse_without_cuda(self.id, "float8 matmuls need Ada, Hopper or Blackwell tensor cores")
        self._convert = convert_to_float8()

    def _apply_model(self, model: nn.Module, name: str) -> None:
        assert self.report is not None
        before = {
            (id(parent), child): (parent, child, mod)
            for parent in model.modules()
            for child, mod in parent.named_children()
            if isinstance(mod, nn.Linear)
        }
        self._convert(model, module_filter_fn=float8_eligible)
        swapped = [
            (parent, child, mod)
            for parent, child, mod in before.values()
            if getattr(parent, child) is not mod
        ]
        for parent, child, mod in swapped:
            self._undo.append(lambda parent=parent, child=child, mod=mod: setattr(parent, child, mod))
        if not swapped:
            self.report.note(f"`{name}` has no linear layer float8 can take (sides multiples of 16)")
            return
        kept = len(before) - len(swapped)
        self.report.change(
            f"`{name}`: {len(swapped)} nn.Linear layers train in float8 (torchao Float8Linear)"
            + (
                f"; {kept} kept in high precision (the output layer, or sides not multiples of 16)"
                if kept
                else ""
            )
        )
        self.report.details["float8_layers"] = self.report.details.get("float8_layers", 0) + len(swapped)

    def _nothing_found(self) -> str:
        return "no model was found or ran a forward pass while the toggle was applied"
