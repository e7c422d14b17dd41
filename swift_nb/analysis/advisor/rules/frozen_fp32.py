"""Frozen weights kept in fp32: the base under the adapters (or the frozen layers of a partial
fine-tune) is float32 and a large share of the peak. Nothing updates it, so nothing needs
its fp32 precision: loaded in bfloat16 it takes half the bytes, and on CUDA 4-bit NF4
(QLoRA) about a seventh.

A full fine-tune is left alone: its frozen weights are buffers and other models (a
reference, a teacher) whose dtype the run does not record."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor import frameworks
from swift_nb.analysis.advisor.evidence import LORA_METHODS, Evidence, Thresholds, finetune
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.frameworks import Recorded
from swift_nb.analysis.advisor.words import pct
from swift_nb.core.units import fmt_bytes

#: frozen weights at least this share of the peak tensor memory are worth a smaller dtype
FROZEN_SHARE = 0.20
#: bfloat16 weights take half the bytes of float32 ones
BF16_RATIO = 0.5
#: 4-bit NF4 with double quantization keeps 4.127 bits per weight of the quantized linear
#: layers (Dettmers et al., 2023): 4 B → 0.52 B, ÷ 7.75; the embeddings, norms and LM head
#: stay in 16 bits, so about ÷ 7 over a language model's frozen weights
NF4_RATIO = 1 / 7
#: what a 4-bit base is loaded with (bitsandbytes, CUDA only)
QLORA_CONFIG = (
    'BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)'
)


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    ft = finetune(context)
    frozen = ev.at_peak("frozen_parameters")
    if not ft or not ev.peak_bytes or not math.isfinite(frozen) or frozen / ev.peak_bytes < FROZEN_SHARE:
        return None
    if ft.get("method") == "full" or ft.get("base_dtype") != "float32" or ft.get("quantization"):
        return None
    # the trained model's frozen weights, which base_dtype describes (the rest of the frozen
    # bytes are buffers and other models, whose dtype the run does not record)
    total, trainable = ft.get("total_params"), ft.get("trainable_params")
    base = min(frozen, 4.0 * (total - trainable)) if total and trainable is not None else frozen
    bf16 = ev.peak_bytes - base * (1 - BF16_RATIO)
    evidence = {
        "frozen_parameters_bytes": frozen,
        "peak_bytes": ev.peak_bytes,
        "frozen_pct": pct(frozen / ev.peak_bytes),
        "base_dtype": "float32",
        "base_frozen_bytes": base,
        "method": ft.get("method"),
        "tensors_on": ev.tensors_on,
        "predicted_peak_bytes": bf16,
    }
    effect = (
        f"in bfloat16: frozen weights ≈ {fmt_bytes(frozen - base * (1 - BF16_RATIO))} instead of "
        f"{fmt_bytes(frozen)}, peak tensor memory ≈ {fmt_bytes(bf16)} (−{pct(base * (1 - BF16_RATIO) / ev.peak_bytes)} %)"
    )
    if ev.tensors_on == "cuda":
        nf4 = ev.peak_bytes - base * (1 - NF4_RATIO)
        evidence["predicted_peak_bytes_4bit"] = nf4
        effect += (
            f"; in 4-bit NF4: ≈ {fmt_bytes(frozen - base * (1 - NF4_RATIO))}, peak ≈ {fmt_bytes(nf4)} "
            f"(−{pct(base * (1 - NF4_RATIO) / ev.peak_bytes)} %)"
        )
    return Finding(
        id="frozen_fp32",
        title=f"Frozen weights are kept in float32: {pct(frozen / ev.peak_bytes)} % of peak tensor memory",
        evidence=evidence,
        suggestion=_change(ft, ev.tensors_on, frameworks.recorded(context)),
        predicted_effect=effect
        + " (the activations of the 16-bit layers shrink too, not counted here: their inputs follow the weights' dtype)",
        formula=(
            f"peak' ≈ peak − W·(1 − k), W the base's fp32 weights (frozen elements × 4 B): k = {BF16_RATIO} in "
            f"bfloat16, ≈ 1/{round(1 / NF4_RATIO)} in 4-bit NF4 (4.127 bits per quantized weight; embeddings, "
            "norms and the LM head in 16 bits)"
        ),
    )


def _change(ft: Mapping[str, Any], tensors_on: str, rec: Recorded | None) -> str:
    """Loading the frozen base in bfloat16 (and, on CUDA, in 4 bits), in the run's terms: from
    its checkpoint when the run names one, else cast where the cell builds it."""
    base = ft.get("base_model") or {}
    cls = base.get("class") or "AutoModelForCausalLM"
    name = base.get("name_or_path")
    source = repr(name) if name else "…"
    ways = []
    if name:
        ways.append(
            f"load the base in bfloat16, {cls}.from_pretrained({source}, dtype=torch.bfloat16) (torch_dtype= "
            "before transformers 4.56)"
        )
    if ft.get("method") in LORA_METHODS or ft.get("library") == "peft":
        ways.append(
            f"cast the base{' built in the cell' if name else ''} before adding the adapters, base.to(torch.bfloat16), "
            "then get_peft_model(base, config): peft keeps the adapters in float32 (autocast_adapter_dtype=True), "
            "so their updates keep full precision"
        )
    else:
        ways.append(
            "cast the layers frozen by hand alone (layer.to(torch.bfloat16)) and run the forward under "
            f"torch.autocast({tensors_on!r}, dtype=torch.bfloat16), so that fp32 inputs meet them in bfloat16"
        )
    text = "Nothing trains the frozen weights, so they need no fp32 precision: " + "; or ".join(ways) + "."
    if rec is not None and rec.is_trainer:
        if rec.cls.startswith("SFT"):
            text += (
                f" When {rec.name} loads the model from its name: "
                f"{frameworks.call('SFTConfig', model_init_kwargs={'dtype': 'bfloat16'})}."
            )
        if rec.get("bf16") is not True:
            text += f" Then {frameworks.set_arguments(rec, bf16=True)} runs the forward under bf16 autocast."
    if tensors_on == "cuda":
        text += (
            f" On this GPU the base can be 4-bit instead (QLoRA): {cls}.from_pretrained({source}, "
            f"quantization_config={QLORA_CONFIG}), then peft.prepare_model_for_kbit_training(model) before "
            "get_peft_model."
        )
    return text
