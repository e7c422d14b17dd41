"""How a run's context names its fine-tuning (``context["finetune"]``, written by
``swift_nb.capture.finetune``), and the short label a table shows for it.

Keys: ``method`` (``FINETUNE_METHODS``), ``library`` (``peft`` or None), ``rank``,
``alpha``, ``dropout``, ``target_modules`` (adapters), ``trainable_params``,
``total_params``, ``trainable_pct`` (of the trained model), ``base_model`` (``class``,
``name_or_path``), ``quantization`` (``nf4``, ``fp4``, ``int8`` or None), ``base_dtype``
(the frozen weights' dtype), and ``frozen_models`` (other models the run runs that nothing
trains: a DPO reference, a teacher; those only alive in the kernel are the summary's
``stale_models`` instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FINETUNE_KEY = "finetune"
FINETUNE_METHODS = ("full", "lora", "qlora", "dora", "ia3", "prefix", "prompt", "partial")
_TITLES = {"lora": "LoRA", "qlora": "QLoRA", "dora": "DoRA", "ia3": "IA³", "prefix": "prefix tuning"}


def finetune_label(finetune: dict[str, Any] | None) -> str:
    """``LoRA r=8 · 0.9 %``, ``full · 100 %``, ``partial · 12 %``; empty when unknown."""
    if not isinstance(finetune, dict) or not finetune.get("method"):
        return ""
    method = str(finetune["method"])
    head = _TITLES.get(method, method)
    if finetune.get("rank") is not None and method in ("lora", "qlora", "dora"):
        head += f" r={finetune['rank']}"
    pct = finetune.get("trainable_pct")
    if not isinstance(pct, (int, float)):
        return head
    share = f"{pct:.0f} %" if pct >= 10 else f"{pct:.2g} %"
    return f"{head} · {share}"


def repeated_blocks(context: Mapping[str, Any]) -> tuple[int, str] | None:
    """How many blocks the model repeats, and what says so, as the capture recorded them
    (``context["repeated_blocks"]``: count, class, path); None when not recorded."""
    found = context.get("repeated_blocks")
    if isinstance(found, Mapping) and int(found.get("count") or 0) > 1:
        return int(
            found["count"]
        ), f"the model's {found.get('count')} × {found.get('class')} ({found.get('path')})"
    return None
