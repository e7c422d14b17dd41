"""Optimizer state: a large share of the peak. A full fine-tune keeps Adam's moments in a
low-rank space with GaLore; an adapter fine-tune (LoRA, IA³, prompts …) trains low-rank or
tiny weights already, so GaLore has nothing to project there: 8-bit moments, or fewer and
smaller adapters, shrink its state instead."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from swift_nb.analysis import effects
from swift_nb.analysis.advisor import frameworks
from swift_nb.analysis.advisor.evidence import ADAPTER_METHODS, Evidence, Thresholds, finetune
from swift_nb.analysis.advisor.frameworks import Recorded
from swift_nb.analysis.advisor.words import pct
from swift_nb.analysis.findings import Finding
from swift_nb.analysis.forecast.spec import DTYPE_BYTES
from swift_nb.units import fmt_bytes


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    opt = ev.at_peak("optimizer_state")
    if not ev.peak_bytes or opt / ev.peak_bytes < th.optimizer_share:
        return None
    evidence = {
        "optimizer_state_bytes": opt,
        "peak_bytes": ev.peak_bytes,
        "optimizer_pct": pct(opt / ev.peak_bytes),
    }
    title = f"Optimizer state is {pct(opt / ev.peak_bytes)} % of peak tensor memory"
    method = finetune(context).get("method")
    if method in ADAPTER_METHODS:
        return _adapters(ev, context, opt, evidence, title, str(method))
    shapes = Counter((int(m), int(n)) for m, n in context.get("matrix_shapes") or [])
    rank = effects.GALORE_RANK
    if shapes:
        in_matrices = sum(m * n * k for (m, n), k in shapes.items())
        after = effects.galore_state(shapes, in_matrices, rank).elements * 4
        effect = f"optimizer state of the 2-D weights ≈ {fmt_bytes(after)} instead of {fmt_bytes(2 * in_matrices * 4)}"
    else:
        ratio = effects.galore_square_ratio(ev.at_peak("parameters") / 4, rank)
        effect = f"optimizer state ≈ ×{ratio:.2f} for square d×d weights (rank {rank})"
    # LEAD: the `lora` alternative for a full fine-tune goes here (toggle "lora", its
    # predicted state from swift_nb.analysis.effects once that formula exists), beside GaLore.
    return Finding(
        id="optimizer_state",
        title=title,
        evidence=evidence,
        suggestion=frameworks.phrased(context, fix)
        or (
            "Keep Adam's moments in a low-rank space: GaLore on the 2-D weight matrices "
            f"(rank {rank}, update_proj_gap=200), or an 8-bit optimizer."
        ),
        toggle="galore",
        predicted_effect=effect,
        formula="per m×n weight (m ≤ n): Adam state 2·m·n → 2·r·n + m·r (projection P is m×r)",
    )


def _adapters(
    ev: Evidence, context: Mapping[str, Any], opt: float, evidence: dict[str, Any], title: str, method: str
) -> Finding:
    """An adapter fine-tune: its trained weights are low-rank (LoRA) or tiny already."""
    ft = finetune(context)
    rec = frameworks.recorded(context)
    # 8-bit Adam keeps each moment in one byte, where AdamW keeps it in the parameters' dtype
    element = DTYPE_BYTES.get(str(context.get("dtype")), 4)
    after = opt * (effects.OPTIMIZERS["AdamW8bit"].element_bytes or 1) / element
    evidence.update(method=method, trainable_params=ft.get("trainable_params"))
    eight_bit = (
        frameworks.set_arguments(rec, optim="adamw_bnb_8bit")
        if rec is not None and rec.is_trainer
        else "bitsandbytes' AdamW8bit(params, lr=…) in place of AdamW"
    )
    lower = " or a lower rank r" if method in ("lora", "qlora", "dora") else ""
    return Finding(
        id="optimizer_state",
        title=title,
        evidence=evidence,
        suggestion=(
            f"This {method} run trains adapters only ({ft.get('trainable_params', '?')} parameters): they are "
            "low-rank or tiny already, so GaLore has nothing to project. Keep the moments in 8 bits: "
            f"{eight_bit}; or adapt fewer modules{lower}."
        ),
        predicted_effect=(
            f"optimizer state ≈ {fmt_bytes(after)} instead of {fmt_bytes(opt)} with 8-bit moments, peak tensor "
            f"memory ≈ {fmt_bytes(ev.peak_bytes - opt + after)}"
        ),
        formula=(
            f"8-bit Adam: the two moments at 1 byte per element instead of {element} (bitsandbytes keeps tensors "
            "under 4096 elements in 32 bits: min_8bit_size)"
        ),
        severity="info",
    )


def fix(rec: Recorded) -> str | None:
    if not rec.is_trainer:
        return None
    return (
        f"Keep Adam's moments in a low-rank space: "
        f"{frameworks.set_arguments(rec, optim='galore_adamw', optim_target_modules=['attn', 'mlp'])} (GaLore on the nn.Linear "
        "weights of the modules those names match), or optim='adamw_bnb_8bit' for 8-bit moments."
    )
