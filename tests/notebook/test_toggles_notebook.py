"""Toggles on real models: the demo GPT, a plain PyTorch transformer, Hugging Face causal
LMs built from configs. Exactness in fp32, reversibility, reports, and the magic's flags."""

from __future__ import annotations

import swift_nb

MAGIC_CELL = """\
from swift_nb.demo import make_model
import torch
model = make_model(n_layer=2, n_head=4, d_model=64, seq_len=32, vocab_size=128, attn_impl="eager")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(4):
    idx = torch.randint(0, 128, (2, 32))
    model(idx, idx).backward()
    opt.step(); opt.zero_grad()
"""


def test_magic_flags_apply_for_the_run_and_undo_after(kernel, tmp_path):
    res = kernel.execute(
        f"%%swift_profile --out {tmp_path} --wait 0 --warmup 1 --active 2 --flash-attn --grad-ckpt "
        f"--galore rank=16,gap=10\n{MAGIC_CELL}"
    )
    assert res.status == "ok", [(e["ename"], e["evalue"], e["traceback"][-3:]) for e in res.of_type("error")]
    out = res.text("stdout")
    assert "flash_attention: `model` (GPT, 2 attention layers): eager → sdpa" in out
    assert "grad_checkpointing: 2 of 2 Block blocks" in out
    assert "galore: `new AdamW` (AdamW → GaLore AdamW): 9 weight matrices projected to rank 16" in out
    assert kernel.eval(
        "(type(opt).__name__, model.blocks[0].attn.attn_impl, type(model.blocks[0]).__name__)"
    ) == (
        "AdamW",
        "eager",
        "Block",
    )
    run = swift_nb.load_run(swift_nb.runs(tmp_path).path[0])
    assert [t["toggle"] for t in run.context["toggles"]] == [
        "flash_attention",
        "grad_checkpointing",
        "galore",
    ]
    assert all(t["applied"] for t in run.context["toggles"])


def test_magic_refuses_bad_toggle_parameters_before_the_cell_runs(kernel, tmp_path):
    kernel.execute("ran = False")
    res = kernel.execute(f"%%swift_profile --out {tmp_path} --galore rank=0\nran = True")
    usage = res.text("stderr")
    assert "UsageError: --galore rank must be ≥ 1; got 0" in usage, usage
    assert kernel.eval("ran") is False
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_sequence_parallel_outside_a_rerun_is_a_usage_error(kernel, tmp_path):
    kernel.execute("ran = False")
    res = kernel.execute(f"%%swift_profile --out {tmp_path} --sequence-parallel sp_size=2\nran = True")
    usage = res.text("stderr")
    assert "UsageError: sequence_parallel runs in a rerun with sp_size worker processes" in usage, usage
    assert kernel.eval("ran") is False
    assert not tmp_path.exists() or not list(tmp_path.iterdir())
