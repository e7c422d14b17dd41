"""The bf16_autocast toggle: autocast for the cell, undone after; measured on the demo
model, where fp32 activations halve."""

from __future__ import annotations

import torch

import swift_nb
from swift_nb import demo
from swift_nb.toggles import get
from swift_nb.vocabulary import TOGGLES


def test_applied_for_the_cell_and_undone():
    lin = torch.nn.Linear(8, 8)
    t = get("bf16_autocast")
    report = t.apply({"lin": lin})
    assert lin(torch.randn(2, 8)).dtype == torch.bfloat16
    assert lin.weight.dtype == torch.float32  # master weights stay fp32
    assert report.changes[0].startswith("autocast to bfloat16 on cpu until the cell ends: matmuls")
    final = t.undo()
    assert lin(torch.randn(2, 8)).dtype == torch.float32
    assert final.details["parameter_dtypes"] == {"lin": ["float32"]}
    assert "bf16_autocast" in TOGGLES


def _activations(tmp_path, toggles) -> float:
    torch.manual_seed(0)
    cfg = demo.GPTConfig(vocab_size=256, seq_len=128, n_layer=2, n_head=2, d_model=64)
    model = demo.GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (4, 128))
    with swift_nb.profile(
        out_dir=tmp_path, wait=0, warmup=1, active=1, profile_memory=True, report=False, toggles=toggles
    ) as run:
        for _ in range(3):
            model(x, x).backward()
            opt.step()
            opt.zero_grad()
    return float(run.steps["activations_bytes"].dropna().iloc[0])


def test_activations_shrink_in_a_profiled_run(tmp_path):
    fp32 = _activations(tmp_path / "fp32", None)
    bf16 = _activations(tmp_path / "bf16", ["bf16_autocast"])
    # matmul outputs are half the bytes; softmax and norms stay fp32, so not exactly ½
    assert 0.4 * fp32 < bf16 < 0.85 * fp32
