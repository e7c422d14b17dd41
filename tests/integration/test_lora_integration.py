"""The lora and qlora toggles (peft adapters for one run, undone to the same objects), and
GaLore's refusal on a model that trains adapters. Models are built from configs with random
weights; nothing is downloaded."""

from __future__ import annotations

import torch
from support.lora import demo, step

import swift_nb
from swift_nb.toggles.lora import peft_adapters

VOCAB, SEQ = 128, 16


def test_profile_api_applies_and_records_lora(runs_dir):
    model = demo()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, VOCAB, (2, SEQ))
    with swift_nb.profile(wait=0, warmup=1, active=1, out_dir=runs_dir, toggles=["lora(r=4)"]) as run:
        for _ in range(3):
            step(model, opt, idx)
    assert peft_adapters(model) is None and all(p.requires_grad for p in model.parameters())
    saved = swift_nb.load_run(run.path)
    (recorded,) = saved.context["toggles"]
    assert recorded["toggle"] == "lora" and recorded["applied"] and recorded["params"]["r"] == 4
    assert recorded["details"]["targets"] == 8
    assert recorded["changes"][0].startswith("`model` (GPT): LoRA r=4 on 8 modules")
    # the fine-tuning as the run trained it (read at its first step, before the undo)
    ft = saved.context["finetune"]
    assert (ft["method"], ft["library"], ft["rank"]) == ("lora", "peft", 4)
    assert ft["trainable_params"] == recorded["details"]["trainable_params"]
    assert saved.summary["memory_categories_at_peak"]["frozen_parameters"] > 0
