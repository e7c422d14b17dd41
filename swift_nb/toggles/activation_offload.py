"""activation_offload: the tensors autograd saves for backward are copied to pinned host
memory as forward makes them and brought back when backward needs them, so the device holds
no activations between forward and backward (torch's ``save_on_cpu``, as TRL's offloading
context does it).

Like ``bf16_autocast``, it is entered when the toggle is applied and left when it is undone:
a ``torch.autograd.graph.saved_tensors_hooks`` pair covers every forward of the cell,
models built inside it and those a Trainer runs included. Unlike plain ``save_on_cpu``, a
tensor that is a model's weight (or a view of one, as a linear layer saves ``weight.t()``)
stays where it is: copying the weights to the host every step would move the model, not its
activations. Tensors on the CPU already and small ones (< 1 MiB) stay too: their copy costs
more than it frees. CUDA only: on the CPU there is no device memory to free, and the toggle
is refused before any work.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from swift_nb.toggles.base import Toggle, refuse_without_cuda

#: saved tensors smaller than this stay on the device
MIN_OFFLOAD_BYTES = 1 << 20


def on_device(t: torch.Tensor) -> bool:
    """Whether a saved tensor lives in the device memory the toggle frees (anything not on
    the CPU). The one place that decides: a test points it at CPU tensors to run the copy to
    the host and back without a GPU."""
    return t.device.type != "cpu"


class ActivationOffload(Toggle):
    id = "activation_offload"
    watches_models = True

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        refuse_without_cuda(self.id, "activations live in host memory already on the CPU")
        self._weights: set[int] = set()
        self._moved = [0, 0]  # tensors, bytes

    def apply(self, namespace=None):
        report = super().apply(namespace)
        try:
            hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
            hooks.__enter__()
            self._undo.append(lambda: hooks.__exit__(None, None, None))
        except BaseException:
            self.undo()
            raise
        report.change(
            "tensors saved for backward (≥ 1 MiB, not weights) kept in pinned host memory until backward "
            "needs them, for every forward of the cell"
        )
        return report

    def _apply_model(self, model: nn.Module, name: str) -> None:
        self._weights |= {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._weights |= {b.untyped_storage().data_ptr() for b in model.buffers()}

    def _pack(self, t: torch.Tensor) -> Any:
        if not on_device(t) or t.layout != torch.strided or t.numel() * t.element_size() < MIN_OFFLOAD_BYTES:
            return t
        try:
            if t.untyped_storage().data_ptr() in self._weights:
                return t
        except (RuntimeError, NotImplementedError):  # a tensor without a storage of its own (a subclass)
            return t
        # pinned where the tensor is on an accelerator (a CPU tensor only comes here in tests,
        # and a machine without one has no pinned allocator)
        host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=t.device.type != "cpu")
        host.copy_(t, non_blocking=True)
        self._moved[0] += 1
        self._moved[1] += t.numel() * t.element_size()
        return (t.device, host)

    def _finalize(self, report) -> None:
        report.details["offloaded_tensors"], report.details["offloaded_bytes"] = self._moved

    def _nothing_found(self) -> str:
        return "no model was found; the offloading still covered every forward of the cell"


def _unpack(packed: Any) -> torch.Tensor:
    if isinstance(packed, torch.Tensor):
        return packed
    device, host = packed
    return host.to(device, non_blocking=True)
