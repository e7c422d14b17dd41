"""The advisor's fine-tuning rules (``rules/frozen_fp32.py``, ``lora_small_batch.py``,
``lora_activations.py``, ``frozen_grad.py``), and GaLore and LoRA offered to full fine-tunes
only (``rules/optimizer_state.py``), LoRA's predicted state against ``--compare lora``'s.

Real runs profiled on the CPU (peft LoRA and full fine-tunes of a Llama built from a config,
random weights; a model whose encoder only the optimizer leaves out; a frozen encoder beside
a trained head), one per module, for the memory rules; hand-built evidence for thresholds
and for overhead, whose timings a test cannot pin."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from swift_nb.analysis import advisor, effects
from swift_nb.analysis.advisor import Evidence, Thresholds
from swift_nb.analysis.advisor.evidence import DeviceTime
from swift_nb.analysis.advisor.rules import (
    frozen_fp32,
    frozen_grad,
    lora_activations,
    lora_small_batch,
    optimizer_state,
)
from swift_nb.analysis.advisor.rules.lora_small_batch import scaled_peak
from swift_nb.analysis.device import CAUSES
from swift_nb.record import MEMORY_CATEGORIES

MIB = 1 << 20


TH = Thresholds()


VOCAB, SEQ, BATCH, STEPS = 512, 64, 4, 6


def _footprint(**at_peak: float) -> pd.DataFrame:
    return pd.DataFrame(
        {"category": MEMORY_CATEGORIES, "at_peak_bytes": [at_peak.get(c, 0.0) for c in MEMORY_CATEGORIES]}
    )


def _evidence(footprint: pd.DataFrame | None = None, **changes) -> Evidence:
    """A 100 ms compute-bound CPU step of a LoRA run: 100 MiB at the peak, 30 of them the base."""
    fp = (
        footprint
        if footprint is not None
        else _footprint(
            parameters=1 * MIB,
            frozen_parameters=30 * MIB,
            optimizer_state=2 * MIB,
            activations=35 * MIB,
            other=32 * MIB,
        )
    )
    shares = dict.fromkeys(
        ("data", "forward", "backward", "optimizer", "comm", "h2d", "other", "untraced"), 0.0
    )
    shares.update(forward=0.3, backward=0.6, optimizer=0.1)
    base = dict(
        step_s=0.1,
        shares=shares,
        ops_per_step=120.0,
        median_op_us=400.0,
        heavy_op_share=0.9,
        attention_seq=0,
        attention_shape=[],
        attention_layers=0,
        attention_calls=4,
        footprint=fp,
        peak_bytes=float(fp["at_peak_bytes"].sum()),
        limit_bytes=16 * 1024 * MIB,
        growth_bytes_per_step=0.0,
        growth_source="memory.csv",
        batch=4,
    )
    base.update(changes)
    return Evidence(**base)


def _lora(**changes) -> dict:
    ft = {
        "method": "lora",
        "library": "peft",
        "rank": 8,
        "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "trainable_params": 262_144,
        "total_params": 262_144 + 30 * MIB // 4,
        "base_model": {"class": "LlamaForCausalLM", "name_or_path": "meta-llama/Llama-3.2-1B"},
        "quantization": None,
        "base_dtype": "float32",
        **changes,
    }
    return {"finetune": ft, "dtype": "float32", "params": 262_144}


def _trainer(cls: str = "Trainer", **arguments) -> dict:
    return {
        "trainer": {
            "framework": "transformers",
            "class": cls,
            "variable": "trainer",
            "checkpointing_field": "gradient_checkpointing",
            "arguments": {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, **arguments},
        }
    }


#: a CPU step of many tiny operators: the overhead rule's cause
TINY_OPS = dict(ops_per_step=900.0, median_op_us=8.0, heavy_op_share=0.2)


def test_frozen_fp32_needs_a_large_fp32_base():
    f = frozen_fp32.rule(_evidence(), TH, _lora())
    assert f.id == "frozen_fp32" and f.evidence["frozen_pct"] == 30.0
    assert f.evidence["predicted_peak_bytes"] == 85 * MIB
    assert "LlamaForCausalLM.from_pretrained('meta-llama/Llama-3.2-1B', dtype=torch.bfloat16)" in f.suggestion
    assert "; or cast the base built in the cell before adding the adapters" in f.suggestion
    assert f.predicted_effect.startswith(
        "in bfloat16: frozen weights ≈ 15.0 MiB instead of 30.0 MiB, peak tensor memory ≈ 85.0 MiB (−15.0 %)"
    )
    small = _footprint(parameters=1 * MIB, frozen_parameters=19 * MIB, activations=80 * MIB)
    assert frozen_fp32.rule(_evidence(small), TH, _lora()) is None  # 19 % < FROZEN_SHARE
    assert frozen_fp32.rule(_evidence(), TH, _lora(base_dtype="bfloat16")) is None
    assert frozen_fp32.rule(_evidence(), TH, _lora(quantization="nf4", method="qlora")) is None
    assert frozen_fp32.rule(_evidence(), TH, _lora(method="full")) is None
    assert frozen_fp32.rule(_evidence(), TH, {}) is None  # no fine-tuning recorded
    partial = frozen_fp32.rule(
        _evidence(), TH, _lora(method="partial", library=None, base_model={"class": "Net"})
    )
    assert "layer.to(torch.bfloat16)" in partial.suggestion and "torch.autocast('cpu'" in partial.suggestion
    assert "from_pretrained" not in partial.suggestion
    unknown = _footprint(parameters=1 * MIB, frozen_parameters=float("nan"), activations=80 * MIB)
    assert frozen_fp32.rule(_evidence(unknown), TH, _lora()) is None  # an older run


def test_frozen_fp32_offers_four_bits_on_cuda_and_the_trainers_settings():
    f = frozen_fp32.rule(_evidence(tensors_on="cuda"), TH, _lora())
    assert 'BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"' in f.suggestion
    assert f.evidence["predicted_peak_bytes_4bit"] == pytest.approx(100 * MIB - 30 * MIB * 6 / 7)
    assert "in 4-bit NF4: ≈ 4.3 MiB" in f.predicted_effect
    sft = frozen_fp32.rule(_evidence(), TH, {**_lora(), **_trainer("SFTTrainer")})
    assert "SFTConfig(model_init_kwargs={'dtype': 'bfloat16'})" in sft.suggestion
    assert "set TrainingArguments(bf16=True)" in sft.suggestion


def test_lora_with_a_small_batch_takes_the_overhead_findings_place():
    ev = _evidence(**TINY_OPS)
    found = {f.id: f for f in advisor.findings(ev, TH, _lora())}
    assert "overhead" not in found
    f = found["lora_small_batch"]
    assert f.title.startswith(
        "LoRA with a small batch (4 per micro-batch) is overhead-bound — Many tiny operators"
    )
    assert f.evidence["ops_per_step"] == 900 and f.evidence["batch"] == 4
    assert f.evidence["adapted_layers"] == 16  # 4 target modules × 4 blocks
    assert f.toggle == "torch_compile"
    # the base (30 MiB), adapters and state stay; activations and other tensors double
    assert f.evidence["peak_at_2x_batch_bytes"] == scaled_peak(ev, 2) == 33 * MIB + 2 * 67 * MIB
    assert f.evidence["peak_at_4x_batch_bytes"] == 33 * MIB + 4 * 67 * MIB
    assert (
        "Raise the batch to 16: its predicted peak stays under 80 % of the device's memory" in f.suggestion
        and "torch.compile(model)" in f.suggestion
    )
    assert "target_modules=[q_proj, k_proj, v_proj, o_proj] (16 adapted layers per forward)" in f.suggestion
    assert "batch 8: peak ≈ 167.0 MiB, 1.0 % of the device's 16.0 GiB" in f.predicted_effect
    # a full fine-tune, or a large batch: the overhead finding as it was
    assert lora_small_batch.rule(ev, TH, {}).id == "overhead"
    assert lora_small_batch.rule(dataclasses.replace(ev, batch=64), TH, _lora()).id == "overhead"
    assert lora_small_batch.rule(_evidence(), TH, _lora()) is None  # no overhead at all
    # no memory by category recorded: no peaks to predict
    unmeasured = _evidence(_footprint(), peak_bytes=0.0, **TINY_OPS)
    f = lora_small_batch.rule(unmeasured, TH, _lora())
    assert "peak_at_2x_batch_bytes" not in f.evidence and "batch 8: peak" not in f.predicted_effect
    assert "Raise the batch to 16 or more, as far as memory allows" in f.suggestion


def test_lora_with_a_small_batch_says_when_a_larger_one_does_not_fit():
    ev = _evidence(limit_bytes=150 * MIB, **TINY_OPS)
    f = lora_small_batch.rule(ev, TH, _lora())
    assert "only as far as memory allows: even 8 would pass 80 % of the device's memory" in f.suggestion
    trainer = lora_small_batch.rule(_evidence(**TINY_OPS), TH, {**_lora(), **_trainer()})
    assert (
        "set TrainingArguments(per_device_train_batch_size=16, gradient_accumulation_steps=1, torch_compile=True)"
        in trainer.suggestion
    )
    assert "the same 16 samples per optimizer step); the micro-batch can grow to 16:" in trainer.suggestion


def test_lora_with_a_small_batch_on_a_gpu_with_launch_gaps():
    idle = dict.fromkeys(CAUSES, 0.0) | {"other_s": 0.0, "host_bound_s": 0.5}
    device = DeviceTime(
        window_s=1.0,
        idle_pct=50.0,
        compute_pct=50.0,
        non_compute_pct=0.0,
        overlap_pct=None,
        idle=idle,
        kinds={"gemm": 0.5},
        steps=4,
        kernels=4000,
        kernel_median_us=5.0,
    )
    f = lora_small_batch.rule(_evidence(device=device, tensors_on="cuda"), TH, _lora())
    assert f.id == "lora_small_batch" and f.evidence["launch_gap_pct"] == 50.0
    assert "mode='reduce-overhead'" in f.suggestion
    assert f.severity == "critical"


def test_lora_activations_fire_below_the_activations_rules_threshold():
    fp = _footprint(parameters=1 * MIB, frozen_parameters=30 * MIB, activations=45 * MIB, other=24 * MIB)
    ev = _evidence(fp)
    f = lora_activations.rule(ev, TH, _lora())
    assert f.id == "lora_activations" and f.evidence["activations_pct"] == 45.0
    assert f.evidence["predicted_peak_bytes"] == effects.checkpointed_peak(100 * MIB, 45 * MIB, 4)
    # a full fine-tune at 45 %: below the activations rule's 50 %
    assert lora_activations.rule(ev, TH, {}) is None
    # checkpointing on already (the toggle, or the Trainer's switch): the activations rule's say
    toggled = {**_lora(), "toggles": [{"toggle": "grad_checkpointing", "params": {}}]}
    assert lora_activations.rule(ev, TH, toggled) is None
    on = {**_lora(), **_trainer(gradient_checkpointing=True)}
    high = _evidence(_footprint(frozen_parameters=30 * MIB, activations=70 * MIB))
    assert lora_activations.rule(high, TH, on).id == "activations"
    trainer = lora_activations.rule(ev, TH, {**_lora(), **_trainer()})
    assert (
        "set TrainingArguments(gradient_checkpointing=True, gradient_checkpointing_kwargs={'use_reentrant': False})"
        in trainer.suggestion
    )


def test_frozen_grad_thresholds():
    # the optimizer holds 262,144 fp32 parameters (1 MiB); 300,000 require grad: 37,856 left out
    left_out = _lora(trainable_params=300_000)
    f = frozen_grad.rule(_evidence(), TH, left_out)
    assert f.evidence["untrained_params"] == 300_000 - 262_144
    # under UNTRAINED_SHARE of them: bookkeeping noise, not a frozen module
    assert frozen_grad.rule(_evidence(), TH, _lora(trainable_params=262_144 + 1000)) is None
    # a sharded rank holds a part of the parameters
    assert frozen_grad.rule(_evidence(world_size=4), TH, left_out) is None
    frozen = _lora(frozen_models=[{"variable": "vision", "class": "CLIPVisionModel", "params": 1000}])
    assert frozen_grad.rule(_evidence(), TH, frozen) is None  # activations 35 % < 40 %
    dominant = _evidence(_footprint(parameters=1 * MIB, frozen_parameters=30 * MIB, activations=69 * MIB))
    assert frozen_grad.rule(dominant, TH, frozen).evidence["confidence"].startswith("indirect")


def test_optimizer_state_offers_galore_to_full_finetunes_only():
    fp = _footprint(parameters=25 * MIB, optimizer_state=50 * MIB, activations=25 * MIB)
    full = optimizer_state.rule(_evidence(fp), TH, {"finetune": {"method": "full"}})
    assert full.toggle == "galore"
    # LoRA beside it: 4 blocks of ≈ 12·d² holding the 6,553,600 fp32 parameters, d = 369
    layers = {(369, 369): 16, (1476, 369): 4, (369, 1476): 4}
    assert effects.block_linears(25 * MIB / 4, 4) == layers
    after = 2 * effects.lora_params(layers, 8) * 4
    assert after == 2 * 8 * 18 * 369 * 4 * 4 == 1_700_352
    assert full.evidence["lora_optimizer_state_bytes"] == after
    assert full.evidence["lora_saved_bytes"] == 50 * MIB - after
    assert full.evidence["lora_saved_pct"] == round(100 * (50 * MIB - after) / (100 * MIB), 1) == 48.4
    assert (
        "with lora (r=8): optimizer state ≈ 1.6 MiB, 48.4 MiB (48.4 % of the peak) less"
        in full.predicted_effect
    )
    assert "the lora toggle" in full.suggestion
    # no count of blocks: LoRA named without a figure
    unknown = optimizer_state.rule(_evidence(fp, attention_calls=0), TH, {"finetune": {"method": "full"}})
    assert "the lora toggle" in unknown.suggestion and "with lora" not in unknown.predicted_effect
    assert "lora_optimizer_state_bytes" not in unknown.evidence
    # a partial fine-tune training a head of a 100M-parameter model: adapters on every block
    # would need more state than the head has, so no figure
    head = _footprint(parameters=1 * MIB, frozen_parameters=1 * MIB, optimizer_state=2 * MIB)
    partial = {"finetune": {"method": "partial", "total_params": 100_000_000}}
    f = optimizer_state.rule(_evidence(head), TH, partial)
    assert f.toggle == "galore" and "lora_optimizer_state_bytes" not in f.evidence
    for method in ("lora", "qlora", "dora", "ia3", "prompt"):
        f = optimizer_state.rule(_evidence(fp), TH, _lora(method=method))
        assert f is not None and f.toggle == "optim_8bit"  # not galore
        assert "GaLore has nothing to project" in f.suggestion and "GaLore on" not in f.suggestion
        assert f.predicted_effect.startswith(
            "optimizer state ≈ 12.5 MiB instead of 50.0 MiB with 8-bit moments"
        )
    trainer = optimizer_state.rule(_evidence(fp), TH, {**_lora(), **_trainer()})
    assert (
        "galore" not in trainer.suggestion
        and "set TrainingArguments(optim='adamw_bnb_8bit')" in trainer.suggestion
    )
