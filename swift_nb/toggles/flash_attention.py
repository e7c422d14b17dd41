"""flash_attention: route attention to fused kernels.

- ``F.scaled_dot_product_attention`` calls run under ``sdpa_kernel`` with the flash
  backend first (torch has a CPU flash kernel too); where flash cannot take the inputs
  (an unsupported mask or dtype) SDPA falls back to the next backend instead of failing.
- Models that declare their attention implementation (``config._attn_implementation``,
  see :mod:`swift_nb.toggles._attention`: Hugging Face models, swift_nb's demo GPT) are
  switched from ``eager`` to ``sdpa``, or to ``flash_attention_2`` when the model is a
  Hugging Face one, the flash-attn package is installed and the model is on CUDA in
  fp16/bf16. A model under peft's adapters is switched inside them (``PeftModel`` →
  ``LoraModel`` → the model).
- Attention written by hand (softmax(q·kᵀ)·v in a module's forward) cannot be reached:
  it is named in the report, with the fix (call ``F.scaled_dot_product_attention``).
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from swift_nb.toggles._attention import (
    attention_owners,
    attn_implementation,
    replace_sdpa,
    set_attn_implementation,
)
from swift_nb.toggles.base import Toggle, hf_model
from swift_nb.toggles.grad_checkpointing import under_adapters

_BACKENDS = [
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
]
_ATTENTION_NAME = re.compile(r"attention|attn", re.IGNORECASE)


class FlashAttention(Toggle):
    id = "flash_attention"
    watches_models = True

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        self._calls = {"calls": 0}

    def apply(self, namespace=None):
        report = super().apply(namespace)
        try:
            self._route_sdpa()
        except BaseException:
            self.undo()
            raise
        return report

    def _route_sdpa(self) -> None:
        ctx = sdpa_kernel(_BACKENDS, set_priority=True)
        ctx.__enter__()
        self._undo.append(lambda: ctx.__exit__(None, None, None))
        counter = self._calls = {"calls": 0}

        def count(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
            def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
                counter["calls"] += 1
                return original(*args, **kwargs)

            return counted

        self._undo.append(replace_sdpa(count))

    def _finalize(self, report) -> None:
        calls = self._calls["calls"]
        report.details["sdpa_calls"] = calls
        if calls:
            report.change(f"{calls} scaled_dot_product_attention calls ran with the flash backend preferred")

    def _apply_model(self, model: nn.Module, name: str) -> None:
        assert self.report is not None
        # peft's wrappers answer for the model inside (its config, set_attn_implementation):
        # switch and name that model, whose kind decides between sdpa and flash-attn
        inner_path, model = under_adapters(model)
        name = f"{name}.{inner_path}" if inner_path else name
        owners = attention_owners(model)
        for path, owner in owners:
            self._switch(owner, f"{name}.{path}" if path else name)
        inside = {id(m) for _, owner in owners for m in owner.modules()}
        for sub_name, sub in model.named_modules():
            if id(sub) in inside:
                continue
            path = f"{name}.{sub_name}" if sub_name else name
            if isinstance(sub, nn.MultiheadAttention):
                self.report.note(
                    f"`{path}` is nn.MultiheadAttention: it uses fused attention only when called with "
                    "need_weights=False (the default True computes the score matrix explicitly)"
                )
            elif _hand_written(sub):
                self.report.note(
                    f"not reachable: `{path}` ({type(sub).__name__}) computes attention by hand "
                    "(softmax of q·kᵀ); replace it with F.scaled_dot_product_attention(q, k, v, is_causal=...)"
                )

    def _switch(self, model: nn.Module, name: str) -> None:
        """A model that declares its attention implementation: eager → sdpa (or flash-attn)."""
        assert self.report is not None
        before = attn_implementation(model)
        target = "flash_attention_2" if hf_model(model) and _flash_attn_usable(model) else "sdpa"
        if before == target or (before == "flash_attention_2" and target == "sdpa"):
            self.report.note(f"`{name}` already uses {before} attention")
            return
        try:
            self._undo.append(set_attn_implementation(model, target))
        except (ValueError, ImportError) as e:
            self.report.note(f"`{name}` ({type(model).__name__}) cannot use {target} attention: {e}")
            return
        layers = sum(1 for _, m in model.named_modules() if _ATTENTION_NAME.search(type(m).__name__))
        self.report.change(
            f"`{name}` ({type(model).__name__}, {layers} attention layer{'s' * (layers != 1)}): "
            f"{before} → {target}"
        )

    def _nothing_found(self) -> str:
        return "no attention module was found in the models (SDPA calls still prefer the flash backend)"


def _hand_written(module: nn.Module) -> bool:
    """A module named like attention whose own forward computes a softmax and never calls
    SDPA; a container whose children do the work is not it."""
    cls = type(module)
    if not _ATTENTION_NAME.search(cls.__name__) or cls.__module__.startswith(("torch.", "transformers.")):
        return False
    try:
        src = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "softmax" in src and "scaled_dot_product_attention" not in src


def _flash_attn_usable(model: nn.Module) -> bool:
    p = next(model.parameters(), None)
    return (
        p is not None
        and p.is_cuda
        and p.dtype in (torch.float16, torch.bfloat16)
        and importlib.util.find_spec("flash_attn") is not None
    )
