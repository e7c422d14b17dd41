"""Toggles on real models: the demo GPT, a plain PyTorch transformer, Hugging Face causal
LMs built from configs. Exactness in fp32, reversibility, reports, and the magic's flags."""

from __future__ import annotations

import torch
from support.toggles import (
    grads,
    make,
)

import swift_nb


def test_profile_api_applies_and_records_toggles(runs_dir):
    model = make("demo")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with swift_nb.profile(
        wait=0, warmup=1, active=1, out_dir=runs_dir, toggles=["flash_attention", "galore:rank=16"]
    ) as run:
        for _ in range(3):
            grads(model)
            opt.step()
    assert type(opt) is torch.optim.AdamW
    saved = swift_nb.load_run(run.path)
    recorded = {t["toggle"]: t for t in saved.context["toggles"]}
    assert recorded.keys() == {"flash_attention", "galore"}
    assert recorded["galore"]["params"]["rank"] == 16 and recorded["galore"]["applied"]
    assert recorded["flash_attention"]["details"]["sdpa_calls"] == 2 * 3
