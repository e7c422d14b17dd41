"""What the attention toggles share: switching a model's attention implementation, and
replacing ``F.scaled_dot_product_attention`` while a toggle is applied.

The protocol is Hugging Face's: a module whose ``config._attn_implementation`` names the
attention its layers run ("eager": softmax(q·kᵀ)·v written out, the score matrix
materialised; "sdpa": ``F.scaled_dot_product_attention``), read at each forward. Setting
it goes through the module's ``set_attn_implementation`` when it has one (transformers ≥
4.54, which also updates sub-configs), else assigns the config attribute (older
transformers read it at each forward). A value the module cannot take raises ValueError
or ImportError. transformers models follow it, so does swift_nb's demo GPT, and so can
any model: give it a ``config`` whose ``_attn_implementation`` its attention layers read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
from torch import nn

Sdpa = Callable[..., Any]


def attn_implementation(module: nn.Module) -> str | None:
    """The attention implementation ``module`` declares, or None when it follows no
    protocol."""
    impl = getattr(getattr(module, "config", None), "_attn_implementation", None)
    return impl if isinstance(impl, str) else None


def attention_owners(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(path, module)`` of the outermost modules in ``model`` (itself included, path
    '') that declare an attention implementation; switching one switches what it holds."""
    owners, inside = [], set()
    for path, sub in model.named_modules():
        if id(sub) not in inside and attn_implementation(sub) is not None:
            owners.append((path, sub))
            inside |= {id(m) for m in sub.modules()}
    return owners


def set_attn_implementation(module: nn.Module, impl: str) -> Callable[[], None]:
    """Switch ``module`` to ``impl``; returns the function that switches it back."""
    before = attn_implementation(module)
    if before is None:
        raise ValueError(f"{type(module).__name__} declares no config._attn_implementation")
    _set(module, impl)
    return lambda: _set(module, before)


def _set(module: nn.Module, impl: str) -> None:
    if hasattr(module, "set_attn_implementation"):
        module.set_attn_implementation(impl)
    else:
        module.config._attn_implementation = impl


def replace_sdpa(wrap: Callable[[Sdpa], Sdpa]) -> Callable[[], None]:
    """Make ``F.scaled_dot_product_attention`` the function ``wrap(original)`` returns;
    returns the function that puts the original back. Code looks it up at call time
    (``F.scaled_dot_product_attention`` in a forward, transformers'
    ``sdpa_attention_forward``), so the replacement reaches every call."""
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = wrap(original)

    def restore() -> None:
        F.scaled_dot_product_attention = original

    return restore
