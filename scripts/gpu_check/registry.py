"""The checks, in the order they run. A check is one file under ``checks/`` with
``check(ctx)`` (its statements tested with ``ctx.expect``, its numbers in ``ctx.details``) and
``TITLE``, and one line here: its name (the record's and ``--one``'s), whether it needs CUDA,
and its time limit. Every file under ``checks/`` is registered once (``tests`` check it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .checks import (
    cost_ratio,
    cuda_oom,
    energy,
    flash_attention,
    forecast,
    gpm,
    import_trace,
    logits,
    lora,
    max_memory,
    memory_kit,
    model_forecast,
    quickstart_nvml,
    rerun_fork,
    scale,
    tokens,
)
from .common import Ctx


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    run: Callable[[Ctx], None]
    cuda_only: bool
    limit_s: float  # on a GPU; the smoke's sizes take far less


CHECKS = [
    Check("quickstart_nvml", quickstart_nvml.TITLE, quickstart_nvml.check, cuda_only=True, limit_s=120),
    Check("max_memory_allocated", max_memory.TITLE, max_memory.check, cuda_only=True, limit_s=90),
    Check("cuda_oom", cuda_oom.TITLE, cuda_oom.check, cuda_only=True, limit_s=90),
    Check("energy", energy.TITLE, energy.check, cuda_only=True, limit_s=90),
    Check("rerun_fork", rerun_fork.TITLE, rerun_fork.check, cuda_only=True, limit_s=150),
    Check("gpm", gpm.TITLE, gpm.check, cuda_only=True, limit_s=90),
    Check("flash_attention", flash_attention.TITLE, flash_attention.check, cuda_only=False, limit_s=150),
    Check("forecast", forecast.TITLE, forecast.check, cuda_only=False, limit_s=120),
    Check("lora", lora.TITLE, lora.check, cuda_only=False, limit_s=150),
    Check("cost_ratio", cost_ratio.TITLE, cost_ratio.check, cuda_only=False, limit_s=150),
    Check("import_trace", import_trace.TITLE, import_trace.check, cuda_only=False, limit_s=120),
    Check("tokens", tokens.TITLE, tokens.check, cuda_only=False, limit_s=180),
    Check("memory_kit", memory_kit.TITLE, memory_kit.check, cuda_only=False, limit_s=240),
    Check("model_forecast", model_forecast.TITLE, model_forecast.check, cuda_only=False, limit_s=180),
    Check("logits", logits.TITLE, logits.check, cuda_only=False, limit_s=120),
    Check("scale", scale.TITLE, scale.check, cuda_only=False, limit_s=120),
]
BY_NAME = {c.name: c for c in CHECKS}
