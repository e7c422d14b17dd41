"""What a run's fine-tuning is (``context["finetune"]``, see ``swift_nb.record.finetune``),
read from the models the cell holds and the optimizers that stepped.

The method comes from peft's own config objects (``peft_config`` on a ``PeftModel`` or on
a model adapters were injected into), never from module names: LoRA (DoRA with
``use_dora``, QLoRA when the base is quantized to 4 bits), IA³, prefix and prompt tuning.
Without adapters a run trains ``full`` (every parameter of the trained model) or
``partial`` (some frozen). The trained model is the root model holding the optimizers'
parameters; the other root models that train nothing are listed as ``frozen_models``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

_PEFT_METHODS = {
    "LORA": "lora",
    "IA3": "ia3",
    "PREFIX_TUNING": "prefix",
    "PROMPT_TUNING": "prompt",
    "P_TUNING": "prompt",
}


_QUANTIZED = ("Params4bit", "Int8Params")


def numel(p: torch.Tensor) -> int:
    """Elements a parameter stands for: a bitsandbytes 4-bit weight packs two in a byte."""
    n = p.numel()
    return n * 2 if type(p).__name__ == "Params4bit" else n


def describe(models: Mapping[str, nn.Module], optimizers: Iterable[torch.optim.Optimizer]) -> dict[str, Any]:
    """``context["finetune"]`` for these root models and optimizers; empty when neither
    holds a parameter."""
    trained = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"] if p.requires_grad}
    owner = _trained_model(models, trained)
    if owner is None:
        if not trained:
            return {}
        n = sum(numel(p) for opt in optimizers for g in opt.param_groups for p in g["params"])
        return {
            "method": "full",
            "library": None,
            "trainable_params": n,
            "total_params": n,
            "trainable_pct": 100.0,
        }
    name, model = owner
    params = list(dict.fromkeys(model.parameters()))
    total = sum(numel(p) for p in params)
    trainable = sum(numel(p) for p in params if p.requires_grad)
    out: dict[str, Any] = {
        "method": "full",
        "library": None,
        "trainable_params": trainable,
        "total_params": total,
        "trainable_pct": 100.0 * trainable / total if total else 0.0,
        "model_variable": name,
        "base_model": _base_model(model),
    }
    quant = quantization(model)
    frozen = [p for p in params if not p.requires_grad]
    out["quantization"] = quant
    # a 4-bit base is stored as uint8: its dtype is the quantization; the rest of it (norms,
    # embeddings, the head) says what the base computes in
    plain = [p for p in frozen if type(p).__name__ not in _QUANTIZED]
    out["base_dtype"] = _common_dtype(plain or frozen or params)
    out["linear_shapes"] = linear_shapes(model)
    config = _peft_config(model)
    if config is not None:
        out.update(_adapter(config))
        if out["method"] == "lora" and quant in ("nf4", "fp4"):
            out["method"] = "qlora"
    elif trainable < total:
        out["method"] = "partial"
    others = [
        {"variable": n, "class": type(m).__name__, "params": sum(numel(p) for p in m.parameters())}
        for n, m in models.items()
        if m is not model and not any(p.requires_grad and id(p) in trained for p in m.parameters())
    ]
    if others:
        out["frozen_models"] = others
    return out


def linear_shapes(model: nn.Module) -> list[list[Any]]:
    """``[[leaf name, out features, in features, how many], ...]`` of the model's linear
    layers (``nn.Linear`` and its quantized subclasses, transformers' ``Conv1D``), by the
    name the layer has in its block (``q_proj``); the adapters' own layers (``lora_A``,
    ``lora_B``) are left out and a wrapped layer (peft's ``base_layer``) goes by its
    wrapper's name. What the forecast adapts, by name, in ``lora(targets=…)``."""
    found: Counter[tuple[str, int, int]] = Counter()
    for name, m in model.named_modules():
        parts = name.split(".")
        if any(p.startswith("lora_") for p in parts):
            continue
        if isinstance(m, nn.Linear):
            shape = (int(m.out_features), int(m.in_features))
        elif type(m).__name__ == "Conv1D" and hasattr(m, "nf") and hasattr(m, "nx"):
            shape = (int(m.nf), int(m.nx))
        else:
            continue
        leaf = parts[-2] if parts[-1] == "base_layer" and len(parts) > 1 else parts[-1]
        found[(leaf, *shape)] += 1
    return [[leaf, o, i, n] for (leaf, o, i), n in found.items()]


def _trained_model(models: Mapping[str, nn.Module], trained: set[int]) -> tuple[str, nn.Module] | None:
    """The root model holding most of the trained parameters; between two holding as
    many (a peft wrapper and a container of the same blocks), the one with a peft config,
    then the larger. None when no model holds one."""
    best, key = None, (0, False, 0)
    for name, m in models.items():
        params = list(m.parameters())
        k = (sum(1 for p in params if id(p) in trained), _peft_config(m) is not None, len(params))
        if k[0] and k > key:
            best, key = (name, m), k
    return best


def _peft_config(model: nn.Module) -> Any:
    """The active adapter's peft config, wherever in the wrappers peft keeps it."""
    for m in (model, getattr(model, "base_model", None), *model.modules()):
        configs = getattr(m, "peft_config", None)
        if isinstance(configs, Mapping) and configs:
            active = getattr(m, "active_adapter", None)
            if isinstance(active, (list, tuple)):
                active = active[0] if active else None
            return (
                configs.get(active)
                if isinstance(active, str) and active in configs
                else next(iter(configs.values()))
            )
    return None


def _adapter(config: Any) -> dict[str, Any]:
    kind = str(getattr(getattr(config, "peft_type", None), "value", getattr(config, "peft_type", "")))
    method = _PEFT_METHODS.get(kind.upper(), kind.lower() or "adapter")
    if method == "lora" and getattr(config, "use_dora", False):
        method = "dora"
    targets = getattr(config, "target_modules", None)
    if isinstance(targets, (set, frozenset, list, tuple)):
        targets = sorted(str(t) for t in targets)
    elif targets is not None:
        targets = str(targets)
    return {
        "method": method,
        "library": "peft",
        "rank": getattr(config, "r", None),
        "alpha": getattr(config, "lora_alpha", None),
        "dropout": getattr(config, "lora_dropout", None),
        "target_modules": targets,
    }


def _base_model(model: nn.Module) -> dict[str, Any]:
    """The model under the adapters: its class and where it was loaded from."""
    inner = model
    for _ in range(3):  # PeftModel → LoraModel → the transformers model
        get_base = getattr(inner, "get_base_model", None)
        nxt = (
            get_base() if callable(get_base) else getattr(inner, "model", None) if _from_peft(inner) else None
        )
        if not isinstance(nxt, nn.Module) or nxt is inner:
            break
        inner = nxt
    config = getattr(inner, "config", None)
    name = getattr(config, "name_or_path", None) or getattr(config, "_name_or_path", None)
    out: dict[str, Any] = {"class": type(inner).__name__, "name_or_path": name or None}
    shape = _config_fields(config)
    if shape:
        out["config"] = shape
    return out


def _config_fields(config: Any) -> dict[str, Any] | None:
    """A transformers config as the fields that differ from its class's defaults, with its
    ``model_type``: what ``AutoConfig.for_model`` rebuilds it from (a forecast steps the same
    model on fake tensors); None for anything else or a config that cannot say."""
    if not (hasattr(config, "model_type") and callable(getattr(config, "to_diff_dict", None))):
        return None
    try:
        fields = config.to_diff_dict()
    except Exception:  # a config subclass that cannot serialize itself: not recorded
        return None
    fields = {k: v for k, v in fields.items() if _plain(v) and not k.startswith("_")}
    return {**fields, "model_type": config.model_type}


def _plain(value: Any) -> bool:
    """Whether ``value`` is JSON as it is (a run's context is written as JSON)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return True
    if isinstance(value, (list, tuple)):
        return all(map(_plain, value))
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _from_peft(m: Any) -> bool:
    return type(m).__module__.startswith("peft.")


def quantization(model: nn.Module) -> str | None:
    """``nf4``/``fp4`` (bitsandbytes 4-bit), ``int8`` (8-bit) or None, from the weights."""
    for p in model.parameters():
        kind = type(p).__name__
        if kind == "Params4bit":
            quant = getattr(getattr(p, "quant_state", None), "quant_type", None) or getattr(
                p, "quant_type", None
            )
            return str(quant or "nf4")
        if kind == "Int8Params":
            return "int8"
    return None


def _common_dtype(params: list[torch.Tensor]) -> str | None:
    """The dtype holding most bytes among ``params``."""
    by: Counter[str] = Counter()
    for p in params:
        by[str(p.dtype).removeprefix("torch.")] += p.numel() * p.element_size()
    return by.most_common(1)[0][0] if by else None
