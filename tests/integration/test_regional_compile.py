"""regional_compile on a real run: the repeated blocks compiled as one code (one compile,
no recompile for the other blocks), the same losses as eager, undo puts every block's
forward back; a model without repeated blocks is left eager with a note."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

import swift_nb
from swift_nb import toggles
from swift_nb.core.errors import ConfigError
from swift_nb.demo import make_model


def _losses(model, steps=3):
    x = torch.randint(0, 256, (2, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for _ in range(steps):
        loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def _model():
    torch.manual_seed(0)
    return make_model(n_layer=4, n_head=2, d_model=32, vocab_size=256, seq_len=32)


def test_the_blocks_compile_once_with_the_losses_of_eager(tmp_path):
    eager = _losses(_model())
    model = _model()
    forwards = [b.forward for b in model.blocks]
    with contextlib.redirect_stdout(io.StringIO()):
        prof = swift_nb.profile(
            out_dir=tmp_path,
            wait=0,
            warmup=1,
            active=1,
            report=False,
            toggles=["regional_compile:backend=aot_eager"],
        )
        with prof as run:
            compiled = _losses(model)
    assert compiled == pytest.approx(eager, rel=1e-5)
    record = swift_nb.load_run(run.path)
    (report,) = record.context["toggles"]
    assert report["details"]["compiled_blocks"] == 4
    kinds = [e["kind"] for e in record.context["compile"]["events"]]
    assert kinds.count("compile") == 1 and "recompile" not in kinds, kinds
    assert [b.forward for b in model.blocks] == forwards  # undone
    assert all("forward" not in b.__dict__ for b in model.blocks)


def test_a_model_without_repeated_blocks_is_left_eager_and_torch_compile_clashes():
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    toggle = toggles.get("regional_compile", backend="eager")
    with toggles.applied({"net": net}, [toggle]) as reports:
        net(torch.randn(2, 4))
    assert "has no repeated blocks: left eager (use torch_compile)" in reports[0].notes[0]
    with pytest.raises(ConfigError, match="torch_compile and regional_compile cannot run together"):
        toggles.build(["torch_compile", "regional_compile"])
