"""liger: Liger-Kernel's Triton kernels for the model's family (RMSNorm, RoPE, SwiGLU, the
fused linear cross-entropy that never holds the logits), on CUDA.

``liger_kernel.transformers._apply_liger_kernel_to_instance`` patches one model instance
for the families Liger knows (Llama, Qwen2/3, Mistral, Gemma, Phi3 …): its modules'
``forward`` and the modeling module's functions it swaps (RoPE). Everything it changes is
saved first and put back by ``undo()``: the ``__dict__`` of every submodule and the
globals of the model's modeling module. Off CUDA the toggle is refused before any work,
naming the device: Triton kernels run on NVIDIA (and AMD) GPUs only.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from swift_nb.core.errors import ConfigError, MissingDependencyError
from swift_nb.toggles.base import Toggle, find_models
from swift_nb.toggles.fused_ce import LOOKED_FOR, causal_lm

_MISSING = object()


def liger_apply() -> Any:
    """Liger's per-instance patcher, or an error that says how to install it."""
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
    except ImportError as e:
        raise MissingDependencyError(
            f"the liger toggle needs liger-kernel ({e}): pip install liger-kernel (CUDA, Triton)"
        ) from None
    return _apply_liger_kernel_to_instance


def refuse_off_cuda(models: list[tuple[str, nn.Module]]) -> None:
    """ConfigError naming the device when the run cannot use Triton's CUDA kernels."""
    if not torch.cuda.is_available():
        raise ConfigError(
            "liger",
            f"runs Liger-Kernel's Triton kernels on a CUDA device, and this machine has none (torch "
            f"{torch.__version__} sees no GPU): use fused_ce for the loss's logits on the CPU",
            "liger",
        )
    for name, model in models:
        p = next(model.parameters(), None)
        if p is not None and p.device.type != "cuda":
            raise ConfigError(
                "liger",
                f"runs on CUDA tensors, and `{name}` is on {p.device}: move it with .cuda() first",
                "liger",
            )


class Liger(Toggle):
    id = "liger"
    watches_models = True

    def apply(self, namespace=None):
        models = find_models(namespace or {})
        refuse_off_cuda(models)
        if models and not any(causal_lm(m) for _, m in models):
            raise ConfigError("liger", f"found no language model: looked for {LOOKED_FOR}", "liger")
        liger_apply()  # missing: said before any work
        return super().apply(namespace)

    def _apply_model(self, model: nn.Module, name: str) -> None:
        refuse_off_cuda([(name, model)])
        lm = causal_lm(model)
        if lm is None:
            raise ConfigError(
                "liger",
                f"`{name}` ({type(model).__name__}) is not a language model: looked for {LOOKED_FOR}",
                "liger",
            )
        report = self.report
        assert report is not None
        self._undo.append(_saved(lm))
        liger_apply()(model=lm)
        report.change(
            f"{name}: Liger-Kernel's kernels for {type(lm).__name__} (RMSNorm, RoPE, SwiGLU, the fused linear "
            "cross-entropy where the family has them)"
        )


def _saved(model: nn.Module):
    """What puts back every submodule's ``__dict__`` entries and the modeling module's
    globals as they are now."""
    modules = [(m, dict(m.__dict__)) for m in model.modules()]
    owners = {type(m).__module__ for m in model.modules()}
    globals_ = [(sys.modules[o], dict(vars(sys.modules[o]))) for o in owners if o in sys.modules]

    def restore() -> None:
        for m, before in modules:
            for key in [k for k in m.__dict__ if k not in before]:
                del m.__dict__[key]
            m.__dict__.update(before)
        for module, before in globals_:
            for key, value in before.items():
                if vars(module).get(key, _MISSING) is not value:
                    setattr(module, key, value)

    return restore
