"""Models alive in a real kernel under ``%%swift_profile --lora``: an earlier cell's model
and a 24 MiB one stay alive beside the cell's training function, whose local ``model``
shares the earlier model's name. The run names them (its notes, the summary, the
finding) and its fine-tuning record describes the adapted model that trained."""

from __future__ import annotations

import pytest

import swift_nb
from swift_nb.analysis import analyze

EARLIER_CELL = """
from swift_nb.demo import make_model

def gpt():
    torch.manual_seed(0)
    return make_model(n_layer=2, n_head=4, d_model=64, seq_len=16, vocab_size=128)

model = gpt()
big = torch.nn.Linear(2048, 3072)
"""
PROFILED_CELL = """
def fit():
    model = gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 128, (2, 16))
    for _ in range(3):
        model(idx, idx).backward()
        opt.step()
        opt.zero_grad()
    return model

trained = fit()
"""
#: r=4 adapters on qkv (64 → 192), proj (64 → 64), mlp.0 (64 → 256), mlp.2 (256 → 64) of 2 blocks
ADAPTERS = 2 * 4 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))
BIG_BYTES = (2048 * 3072 + 3072) * 4


def test_the_magic_names_stale_models_and_describes_the_lora_model(kernel, tmp_path):
    pytest.importorskip("peft")
    # the kernel is shared: models other tests left in its namespace would be stale here too
    kernel.execute(
        "for _k in [k for k, v in list(globals().items()) if isinstance(v, torch.nn.Module) and k[0] != '_']:\n"
        "    del globals()[_k]"
    )
    assert kernel.execute(EARLIER_CELL).status == "ok"
    try:
        res = kernel.execute(
            f"%%swift_profile --out {tmp_path} --wait 0 --warmup 1 --active 1 --lora r=4\n{PROFILED_CELL}"
        )
        base = kernel.eval("sum(p.numel() for p in trained.parameters())")
    finally:
        kernel.execute("del model, big, trained")
    assert res.status == "ok", res.text()
    run = swift_nb.load_run(swift_nb.runs(tmp_path).path[0])
    assert any("`big` (Linear, 24.0 MiB)" in n and "are alive in the kernel" in n for n in run.notes)
    ft = run.context["finetune"]
    assert (ft["method"], ft["rank"], ft["model_variable"]) == ("lora", 4, "fit.model")
    assert (ft["trainable_params"], ft["total_params"]) == (ADAPTERS, base + ADAPTERS)
    stale = {e["variable"]: e for e in run.summary["stale_models"]}
    assert set(stale) == {"model", "big"}
    assert stale["big"]["bytes"] == pytest.approx(BIG_BYTES, rel=0.01)
    cats = run.summary["memory_categories_at_peak"]
    assert cats["frozen_parameters"] == base * 4 and cats["other"] >= BIG_BYTES
    (finding,) = [f for f in analyze(run).findings if f.id == "stale_models"]
    assert finding.title.startswith("`big` (24.0 MiB) and `model` (")
    assert finding.title.endswith("nobody trains: `del big, model; gc.collect()`")
