"""PyTorch Lightning's Trainer around a profiled loop: ``trainer.fit`` under
``swift_nb.profile`` has one step per optimizer update under ``accumulate_grad_batches``,
records the Trainer's settings and its DataLoader in the run's context
(``swift_nb.capture.frameworks``) and counts the LightningModule's parameters; the advice
phrases its changes as the Trainer's arguments where Lightning has them
(``swift_nb.analysis.advisor.frameworks``), on hand-built contexts and evidence."""

from __future__ import annotations

import dataclasses
import sys

import pandas as pd
import pytest
import torch

from swift_nb.analysis.advisor import Evidence, Loader, Thresholds
from swift_nb.analysis.advisor.frameworks import phrased, recorded, set_arguments
from swift_nb.analysis.advisor.rules import (
    activations,
    communication,
    data_loading,
    eager_attention,
    fp32_activations,
    optimizer_state,
    overhead,
)
from swift_nb.capture import frameworks
from swift_nb.record import MEMORY_CATEGORIES

MAX_STEPS, ACCUMULATION, MICRO_BATCH = 6, 2, 4


MIB = 1 << 20


TH = Thresholds()


@pytest.mark.parametrize("module", ["lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer"])
def test_the_trainer_a_running_loop_holds_is_found_in_either_distribution(module):
    """By its class's module, without importing Lightning: a frame whose ``self`` holds the
    Trainer as ``trainer`` (Lightning's loops) is inside its ``fit()``."""
    trainer_class = type("Trainer", (), {"__module__": module})
    subclass = type("MyTrainer", (trainer_class,), {"__module__": __name__})

    class Loop:
        def __init__(self, trainer) -> None:
            self.trainer = trainer

        def run(self):
            return frameworks.find(sys._getframe(), torch.optim.SGD([torch.zeros(1, requires_grad=True)]))

    lit = subclass()
    assert frameworks.is_lightning_trainer(lit)
    assert Loop(lit).run() == ("lit", lit)
    # held in a variable but not running: it drives no loop
    assert frameworks.find(sys._getframe(), torch.optim.SGD([torch.zeros(1, requires_grad=True)])) is None


def _lightning(precision: str = "32-true", **arguments) -> dict:
    """The run context's entry for a Lightning Trainer, as ``frameworks.detect`` records it."""
    return {
        "trainer": {
            "framework": "lightning",
            "class": "Trainer",
            "variable": "trainer",
            "version": "2.6.6",
            "arguments": {
                "precision": precision,
                "accumulate_grad_batches": 2,
                "num_devices": 1,
                "world_size": 1,
                "max_steps": 100,
                "strategy": "SingleDeviceStrategy",
                "accelerator": "CPUAccelerator",
                **arguments,
            },
            "model": {"class": "Regressor", "automatic_optimization": True},
            "dataloader": {"batch_size": 4, "num_workers": 0},
        }
    }


def _evidence(**changes) -> Evidence:
    """A 100 ms step with 100 MiB at the peak, 60 MiB of it activations."""
    at_peak = {"parameters": 40 * MIB, "activations": 60 * MIB}
    footprint = pd.DataFrame(
        {"category": MEMORY_CATEGORIES, "at_peak_bytes": [at_peak.get(c, 0.0) for c in MEMORY_CATEGORIES]}
    )
    shares = dict.fromkeys(
        ("data", "forward", "backward", "optimizer", "comm", "h2d", "other", "untraced"), 0.0
    )
    base = dict(
        step_s=0.1,
        shares={**shares, "forward": 0.3, "backward": 0.6, "optimizer": 0.1, **changes.pop("shares", {})},
        ops_per_step=120.0,
        median_op_us=400.0,
        heavy_op_share=0.9,
        attention_seq=0,
        attention_shape=[],
        attention_layers=0,
        footprint=footprint,
        peak_bytes=100 * MIB,
        limit_bytes=16 * 1024 * MIB,
        growth_bytes_per_step=0.0,
        growth_source="memory.csv",
    )
    return Evidence(**{**base, **changes})


@pytest.mark.parametrize(
    "precision, mixed",
    [("32-true", False), ("64-true", False), ("bf16-mixed", True), ("16-mixed", True), ("bf16-true", True)],
)
def test_a_lightning_record_reads_its_trainers_settings(precision, mixed):
    rec = recorded(_lightning(precision))
    assert rec.is_lightning and rec.is_trainer
    assert rec.mixed_precision() is mixed
    assert rec.accumulation == 2 and rec.micro_batch == 4
    # the rules' TrainingArguments words, answered from Lightning's own
    assert rec.get("bf16") is precision.startswith("bf16")
    assert rec.get("gradient_accumulation_steps") == 2
    assert rec.get("dataloader_num_workers") == 0


def test_a_lightning_record_without_its_settings_says_nothing():
    context = _lightning()
    info = context["trainer"]
    info["arguments"] = {}
    del info["dataloader"]
    rec = recorded(context)
    assert rec.mixed_precision() is None
    assert rec.micro_batch == 0 and rec.accumulation == 1


def test_changes_are_phrased_as_the_lightning_trainers_arguments():
    rec = recorded(_lightning())
    assert set_arguments(rec, gradient_accumulation_steps=4) == (
        "set Trainer(accumulate_grad_batches=4) (`trainer` has accumulate_grad_batches=2)"
    )
    assert (
        set_arguments(rec, bf16=True)
        == "set Trainer(precision='bf16-mixed') (`trainer` has precision='32-true')"
    )
    assert set_arguments(rec, precision="16-mixed", gradient_clip_val=1.0) == (
        "set Trainer(precision='16-mixed', gradient_clip_val=1.0) (`trainer` has precision='32-true')"
    )
    # what Lightning's Trainer has no argument for is said as such, never as one of its own
    assert set_arguments(rec, optim="adamw_bnb_8bit") == (
        "outside the Trainer, what TrainingArguments(optim='adamw_bnb_8bit') does (Lightning's Trainer has no "
        "such argument)"
    )
    assert phrased(_lightning(), communication.fix).startswith(
        "The Trainer owns the DDP wrapper: set Trainer(accumulate_grad_batches=4) (`trainer` has "
        "accumulate_grad_batches=2) synchronises the gradients once per 4 micro-batches"
    )


def test_fp32_activations_under_lightning_name_its_precision():
    ev = _evidence(matmul_types=frozenset({"float"}))
    f = fp32_activations.rule(ev, TH, _lightning("32-true"))
    assert f is not None and f.toggle == "bf16_autocast"
    assert f.suggestion.startswith(
        "Train in mixed precision: set Trainer(precision='bf16-mixed') (`trainer` has precision='32-true'). "
        "The forward then runs under autocast in bfloat16"
    )
    assert fp32_activations.rule(ev, TH, _lightning("bf16-mixed")) is None


def test_changes_lightning_has_no_trainer_argument_for_keep_the_plain_advice():
    """Lightning's Trainer does not build the DataLoader, pick the optimizer, compile or
    checkpoint the module: the rules' transformers phrasings of those are not its."""
    context = _lightning()
    for fix in (data_loading.fix, overhead.fix, overhead.fix_tiny_step, activations.fix, optimizer_state.fix):
        assert phrased(context, fix) is None, fix.__module__
    assert phrased(context, eager_attention.fix) is None  # it names a Hugging Face model's method
    ev = _evidence(
        shares={"data": 0.4, "forward": 0.2, "backward": 0.3}, loader=Loader(data_s=0.04, in_workers=False)
    )
    suggestion = data_loading.rule(ev, TH, context).suggestion
    assert "DataLoader(num_workers=4, persistent_workers=True" in suggestion
    assert "TrainingArguments" not in suggestion


def test_fp32_activations_under_lightning_show_its_precision_setting():
    ev = _evidence(matmul_types=frozenset({"float"}), tensors_on="cuda")
    f = fp32_activations.rule(ev, TH, _lightning("32-true"))
    assert f.evidence["mixed_precision"] == "off (Trainer: precision='32-true')"
    assert "precision='16-mixed' instead on GPUs without bfloat16" in f.suggestion
    # a run on the CPU is told nothing about GPUs
    on_cpu = fp32_activations.rule(dataclasses.replace(ev, tensors_on="cpu"), TH, _lightning("32-true"))
    assert "GPU" not in on_cpu.suggestion and "precision='bf16-mixed'" in on_cpu.suggestion
    for words in ("bf16=", "fp16=", "TrainingArguments"):
        assert words not in f.suggestion and words not in f.evidence["mixed_precision"]


def test_communication_under_lightning_names_its_strategies():
    ev = _evidence(exposed_comm_share=0.5, collective_share=0.6, world_size=4, shares={"comm": 0.5})
    context = {**_lightning(num_devices=4, world_size=4, strategy="DDPStrategy"), "params": 1_000_000}
    f = communication.rule(ev, TH, context)
    assert "set Trainer(accumulate_grad_batches=4)" in f.suggestion
    assert "Trainer(strategy=DDPStrategy(bucket_cap_mb=…)) sets the bucket size" in f.suggestion
    assert "strategy='fsdp' with precision='bf16-mixed' shards" in f.suggestion
    for words in ("ddp_bucket_cap_mb", "fsdp='full_shard'", "bf16=True", "TrainingArguments"):
        assert words not in f.suggestion


def test_an_adapter_finetune_under_lightning_returns_8bit_adam_from_configure_optimizers():
    at_peak = {"parameters": 25 * MIB, "optimizer_state": 50 * MIB, "activations": 25 * MIB}
    footprint = pd.DataFrame(
        {"category": MEMORY_CATEGORIES, "at_peak_bytes": [at_peak.get(c, 0.0) for c in MEMORY_CATEGORIES]}
    )
    context = {**_lightning(), "finetune": {"method": "lora", "trainable_params": 1_000}}
    f = optimizer_state.rule(_evidence(footprint=footprint), TH, context)
    assert f is not None and f.toggle == "optim_8bit"
    assert (
        "bnb.optim.AdamW8bit(self.parameters(), lr=…) from the LightningModule's configure_optimizers()"
        in (f.suggestion)
    )
    for words in ("optim=", "adamw_bnb_8bit", "TrainingArguments", "bf16=True"):
        assert words not in f.suggestion
