"""The ``flash_attention`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

import math
import re
from typing import Any

from ..common import Ctx, mib, step_peak, train

TITLE = "the flash_attention toggle: the SDPA backend that runs, and the peak with vs without"


BACKEND_OPS = [  # torch's SDPA dispatches to one of these operators, named by its backend
    ("cudnn", "aten::_scaled_dot_product_cudnn_attention"),
    ("flash", "aten::_scaled_dot_product_flash_attention"),  # the CPU's is "…_for_cpu"
    ("efficient", "aten::_scaled_dot_product_efficient_attention"),
    ("math", "aten::_scaled_dot_product_attention_math"),
]
BACKEND_KERNELS = [  # cuDNN's kernels may say "flash" too: it is tried first
    ("cudnn", re.compile(r"cudnn.*(?:sdpa|fmha|attn|attention)", re.I)),
    ("flash", re.compile(r"flash", re.I)),
    ("efficient", re.compile(r"fmha|efficient_attention|mem_?eff", re.I)),
]
FUSED = ("flash", "efficient", "cudnn")


def sdpa_backend(trace) -> dict[str, Any]:
    """Which attention ran, read from a trace: the SDPA backend from its operators and from
    its kernels' names; ``eager`` when no SDPA operator ran at all."""
    ev = trace.events
    ops = set(ev.loc[ev["cat"] == "cpu_op", "name"])
    kernels = sorted(set(ev.loc[ev["cat"] == "kernel", "name"]))
    from_ops = next((b for b, op in BACKEND_OPS if any(o.startswith(op) for o in ops)), None)
    if from_ops is None:
        from_ops = "unknown" if any("scaled_dot_product" in o for o in ops) else "eager"
    matched = {b: [k[:160] for k in kernels if rx.search(k)] for b, rx in BACKEND_KERNELS}
    from_kernels = next((b for b, _ in BACKEND_KERNELS if matched[b]), None)
    return {
        "backend": from_kernels or from_ops,
        "from_operators": from_ops,
        "from_kernels": from_kernels,
        "sdpa_operators": sorted(o for o in ops if "scaled_dot_product" in o),
        "attention_kernels": (matched[from_kernels] if from_kernels else [])[:6],
    }


def check(ctx: Ctx) -> None:
    """The flash_attention toggle on the eager-attention model, in fp32 and under bf16
    autocast: which SDPA backend ran, and the step's peak with it and without."""
    import torch

    from swift_nb.analysis.trace.tables import load_trace

    cfg = ctx.config()
    variants = {
        "eager": (None, None),
        "flash_attention": (["flash_attention"], None),
        "flash_attention_bf16": (["flash_attention"], torch.bfloat16),
    }
    found: dict[str, dict[str, Any]] = {}
    for name, (toggles, autocast) in variants.items():
        model, opt = ctx.model_and_optimizer(cfg)
        x, y = ctx.batch(cfg, ctx.sizes.batch)
        run = ctx.profiled(
            name,
            lambda model=model, opt=opt, x=x, y=y, autocast=autocast: train(
                model, opt, x, y, ctx.sizes.steps, autocast
            ),
            toggles=toggles,
            namespace={"model": model, "opt": opt},
        )
        found[name] = {
            "run": str(run.path),
            **sdpa_backend(load_trace(run)),
            "step_peak_mib": mib(step_peak(run)),
            "toggle_report": run.context.get("toggles"),
            "attn_impl_after": model.config.attn_impl,
        }
    ctx.details.update(found)
    eager, flash, bf16 = (found[n] for n in variants)
    peak_ratio = (flash["step_peak_mib"] or math.nan) / (eager["step_peak_mib"] or math.nan)
    ctx.details["peak_with_over_without"] = peak_ratio
    ctx.expect("without the toggle attention runs eager (no SDPA operator)", eager["backend"] == "eager")
    ctx.expect("with the toggle a fused SDPA backend runs in fp32", flash["backend"] in FUSED)
    ctx.expect("with the toggle under bf16 autocast the flash backend runs", bf16["backend"] == "flash")
    ctx.expect("the toggle lowers the step's peak (fp32)", peak_ratio < 1.0)
    ctx.expect(
        "the toggle is undone after each run (attention back to eager)",
        all(f["attn_impl_after"] == "eager" for f in found.values()),
    )
