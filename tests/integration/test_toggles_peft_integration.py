"""The model toggles on models under peft's LoRA adapters (``PeftModel`` → ``LoraModel`` →
the model): a transformers Llama (eager and SDPA attention) and the demo GPT, with real
peft and random weights. grad_checkpointing must use the inner model's own switch (the
layers wrapped from outside recomputed with the kv cache the forward had filled: keys
twice as long as the mask), give the same training and keep fewer tensors for backward;
flash_attention, bf16_autocast and torch_compile must reach the model inside; all undo."""

from __future__ import annotations

import torch
from support.toggles_peft import batches, inner_checkpointing, loss_of, peft_model

import swift_nb


def test_profile_with_grad_checkpointing_on_a_peft_model(runs_dir):
    model = peft_model()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    with swift_nb.profile(
        wait=0, warmup=1, active=1, out_dir=runs_dir, toggles=["grad_checkpointing"]
    ) as run:
        for idx in batches(3):
            loss_of(model, idx).backward()
            opt.step()
            opt.zero_grad()
    recorded = {t["toggle"]: t for t in swift_nb.load_run(run.path).context["toggles"]}
    assert recorded["grad_checkpointing"]["applied"], recorded
    assert recorded["grad_checkpointing"]["details"]["checkpointed_blocks"] == 2
    assert not inner_checkpointing(model)
