"""Optimizer state: a large share of the peak. A full fine-tune keeps Adam's moments in a
low-rank space with GaLore, or trains LoRA adapters in place of its weights (the ``lora``
toggle: the optimizer keeps state for the adapters alone); an adapter fine-tune (LoRA, IA³,
prompts …) trains low-rank or tiny weights already, so GaLore has nothing to project there:
8-bit moments, or fewer and smaller adapters, shrink its state instead.

LoRA's state is predicted with the forecast's formulas (``effects.lora_params``: r·(in + out)
per adapted linear layer, ``effects.adapter_optimizer_state``) on the layers ``targets=auto``
adapts (every linear layer but the output layer), as the capture recorded their shapes
(``context["finetune"]["linear_shapes"]``). A run without them (recorded before) has the
rule take the blocks as transformer blocks of ≈ 12·d² holding the model's parameters
(``effects.block_linears``), d = √(P / 12·L): the embeddings and the output layer count in P,
which overstates d where they are a large share (+14 % on a 2-block Llama with 28 % of its
parameters in them, −3 % on Llama-2-7B). Without a count of blocks it names LoRA without a
figure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from swift_nb.analysis import effects
from swift_nb.analysis.advisor import frameworks
from swift_nb.analysis.advisor.evidence import ADAPTER_METHODS, Evidence, Thresholds, applied, finetune
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.frameworks import Recorded
from swift_nb.analysis.advisor.rules import activations
from swift_nb.analysis.advisor.words import pct
from swift_nb.analysis.forecast.finetune import adapted_layers
from swift_nb.core.units import fmt_bytes
from swift_nb.vocabulary.forecast_spec import DTYPE_BYTES


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    opt = ev.at_peak("optimizer_state")
    # GaLore or 8-bit moments applied already: its state is what the finding would propose
    if (
        not ev.peak_bytes
        or opt / ev.peak_bytes < th.optimizer_share
        or applied(context, "galore")
        or applied(context, "optim_8bit")
    ):
        return None
    evidence = {
        "optimizer_pct": pct(opt / ev.peak_bytes),
        "optimizer_state_bytes": opt,
        "peak_bytes": ev.peak_bytes,
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
    formula = "per m×n weight (m ≤ n): Adam state 2·m·n → 2·r·n + m·r (projection P is m×r)"
    suggestion = frameworks.phrased(context, fix) or (
        "Keep Adam's moments in a low-rank space: GaLore on the 2-D weight matrices "
        f"(rank {rank}, update_proj_gap=200), or an 8-bit optimizer."
    )
    suggestion += (
        f" Or train LoRA adapters in place of the weights (the lora toggle: r={effects.LORA_RANK} on every "
        "linear layer of the repeated blocks, the rest frozen): the optimizer keeps state for the adapters alone."
    )
    blocks, source = activations._blocks(ev, context)
    params = finetune(context).get("total_params") or ev.at_peak("parameters") / _element(context)
    layers = adapted_layers(finetune(context))
    if layers:
        how = f"the {sum(layers.values())} linear layers of the model but its output layer, as the capture recorded them"
    elif blocks and params:
        how = (
            f"assumed: {blocks} blocks ({source}) of ≈ {effects.BLOCK_PARAMS_PER_D2}·d² holding the model's "
            f"{params:,.0f} parameters, their linear layers' shapes unknown"
        )
        layers = effects.block_linears(params, blocks)
    if layers:
        lora = lora_alternative(layers, how, opt, ev.peak_bytes, context)
        if lora["lora_saved_bytes"] > 0:
            evidence.update(lora)
            effect += (
                f"; with lora (r={effects.LORA_RANK}): optimizer state ≈ "
                f"{fmt_bytes(lora['lora_optimizer_state_bytes'])}, {fmt_bytes(lora['lora_saved_bytes'])} "
                f"({lora['lora_saved_pct']} % of the peak) less ({how})"
            )
            formula += (
                "; LoRA: the optimizer's states (Adam's 2) × Σ r·(in + out) over the adapted linear "
                f"layers × {effects.LORA_ADAPTER_BYTES} B (fp32 adapters)"
            )
    eight_bit = _eight_bit(context, ev, opt)
    if eight_bit is not None:
        evidence["optim_8bit_state_bytes"] = eight_bit
        effect += f"; with optim_8bit: optimizer state ≈ {fmt_bytes(eight_bit)}"
        formula += (
            "; AdamW8bit: 2 × 1 B per element + an fp32 absmax per 256 (fp32 for tensors < 4096 elements)"
        )
    return Finding(
        id="optimizer_state",
        title=title,
        evidence=evidence,
        suggestion=suggestion,
        toggle="galore",
        predicted_effect=effect,
        formula=formula,
        also=("optim_8bit", "lora") if eight_bit is not None else ("lora",),
    )


def _eight_bit(context: Mapping[str, Any], ev: Evidence, opt: float) -> float | None:
    """AdamW8bit's state for the run's parameters (``effects.adam8bit_state``), or None when
    the run's optimizer is not the Adam/AdamW it replaces."""
    if context.get("optimizer") not in ("Adam", "AdamW") or applied(context, "optim_8bit"):
        return None
    params = context.get("params") or ev.at_peak("parameters") / _element(context)
    small = min(float(context.get("params_small") or 0), float(params))
    return min(opt, effects.adam8bit_state(float(params) - small, small))


def lora_alternative(
    layers: Mapping[tuple[int, int], int], how: str, opt: float, peak: float, context: Mapping[str, Any]
) -> dict[str, Any]:
    """What the lora toggle (its default rank) leaves of the optimizer state ``opt`` (bytes)
    of a full fine-tune whose adapted linear layers are ``layers`` (``(out, in)`` → how many;
    ``how``: where their shapes come from): the adapters' elements, their optimizer's state
    (the run's optimizer, Adam when unknown) and the saving, in bytes and % of ``peak``."""
    elements = effects.lora_params(layers, effects.LORA_RANK)
    after = effects.adapter_optimizer_state(elements, context.get("optimizer"))
    return {
        "lora_adapter_params": elements,
        "lora_optimizer_state_bytes": after,
        "lora_saved_bytes": opt - after,
        "lora_saved_pct": pct((opt - after) / peak) if peak else 0.0,
        "lora_shapes": how,
    }


def _element(context: Mapping[str, Any]) -> int:
    """Bytes per parameter element: the run's dtype, fp32 when unknown."""
    return DTYPE_BYTES.get(str(context.get("dtype")), 4)


def _adapters(
    ev: Evidence, context: Mapping[str, Any], opt: float, evidence: dict[str, Any], title: str, method: str
) -> Finding:
    """An adapter fine-tune: its trained weights are low-rank (LoRA) or tiny already."""
    ft = finetune(context)
    rec = frameworks.recorded(context)
    # 8-bit Adam keeps each moment in one byte, where AdamW keeps it in the parameters' dtype
    element = _element(context)
    after = opt * (effects.OPTIMIZERS["AdamW8bit"].element_bytes or 1) / element
    evidence.update(method=method, trainable_params=ft.get("trainable_params"))
    if rec is not None and rec.is_lightning:
        eight_bit = (
            "return bitsandbytes' bnb.optim.AdamW8bit(self.parameters(), lr=…) from the LightningModule's "
            "configure_optimizers() in place of AdamW"
        )
    elif rec is not None and rec.is_trainer:
        eight_bit = frameworks.set_arguments(rec, optim="adamw_bnb_8bit")
    else:
        eight_bit = "bitsandbytes' AdamW8bit(params, lr=…) in place of AdamW"
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
        toggle="optim_8bit" if context.get("optimizer") in (None, "Adam", "AdamW") else None,
    )


def fix(rec: Recorded) -> str | None:
    if not rec.is_trainer:
        return None
    return (
        f"Keep Adam's moments in a low-rank space: "
        f"{frameworks.set_arguments(rec, optim='galore_adamw', optim_target_modules=['attn', 'mlp'])} (GaLore on the nn.Linear "
        "weights of the modules those names match), or optim='adamw_bnb_8bit' for 8-bit moments."
    )
