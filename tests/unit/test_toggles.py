"""Toggles on real models: the demo GPT, a plain PyTorch transformer, Hugging Face causal
LMs built from configs. Exactness in fp32, reversibility, reports, and the magic's flags."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from support.toggles import (
    PlainAttention,
    PlainLM,
    grads,
    make,
)
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

import swift_nb
from swift_nb import toggles
from swift_nb.core.errors import ConfigError
from swift_nb.demo import CausalSelfAttention
from swift_nb.toggles.galore import galore_adamw, galore_state_bytes, state_bytes

VOCAB, SEQ = 128, 32


class HandAttention(PlainAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).split(d, dim=2))
        att = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(dim=-1)
        return self.out((att @ v).transpose(1, 2).reshape(b, t, d))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def structure(model: nn.Module) -> list[tuple[str, type]]:
    return [(n, type(m)) for n, m in model.named_modules()]


MODELS = ["demo", "plain", "llama", "gpt2"]


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("toggle_id", ["flash_attention", "grad_checkpointing"])
def test_toggle_is_exact_and_undone(kind, toggle_id):
    model = make(kind)
    before = structure(model)
    loss0, g0 = grads(model)
    toggle = toggles.get(toggle_id)
    toggle.apply({"model": model})
    loss1, g1 = grads(model)
    report = toggle.undo()
    assert report is not None and report.applied, str(report)
    assert rel(torch.tensor(loss1), torch.tensor(loss0)) <= 1e-5
    assert g0.keys() == g1.keys()
    worst = max(g0, key=lambda k: rel(g1[k], g0[k]))
    assert rel(g1[worst], g0[worst]) <= 1e-5, (
        f"{toggle_id} on {kind}: gradient differs by {rel(g1[worst], g0[worst])}"
    )
    assert structure(model) == before, "undo must restore the module tree"
    if kind == "demo":
        assert all(m.attn_impl == "eager" for m in model.modules() if isinstance(m, CausalSelfAttention))
    if kind in ("llama", "gpt2"):
        assert model.config._attn_implementation == "eager"
        assert not model.is_activation_checkpointing
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


def test_reports_say_what_changed():
    demo, plain, llama = make("demo"), make("plain"), make("llama")
    flash = toggles.get("flash_attention")
    flash.apply({"model": demo, "plain": plain, "llama": llama})
    for m in (demo, plain, llama):
        grads(m)
    report = flash.undo()
    text = str(report)
    assert "`model` (GPT, 2 attention layers): eager → sdpa" in text
    assert "`llama` (LlamaForCausalLM, 2 attention layers): eager → sdpa" in text
    assert report.details["sdpa_calls"] == 2 + 3 + 2  # demo, plain, llama layers

    ckpt = toggles.get("grad_checkpointing", every_n=2)
    ckpt.apply({"model": plain})
    grads(plain)
    wrapped = [m for m in plain.modules() if isinstance(m, CheckpointWrapper)]
    report = ckpt.undo()
    assert len(wrapped) == 2  # blocks 0 and 2 of 3
    assert "2 of 3 PlainBlock blocks in `model.layers` checkpointed (non-reentrant)" in str(report)


class DeclaredAttention(HandAttention):
    """Hand-written attention that declares it, by the protocol of swift_nb.toggles._attention."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__(d, heads)
        self.config = SimpleNamespace(_attn_implementation="eager")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.config._attn_implementation == "sdpa":
            return PlainAttention.forward(self, x)
        return HandAttention.forward(self, x)


def test_any_module_declaring_its_attention_is_switched_and_restored():
    model = PlainLM(attention=DeclaredAttention)
    flash = toggles.get("flash_attention")
    flash.apply({"net": model})
    assert [m.config._attn_implementation for m in model.modules() if isinstance(m, DeclaredAttention)] == [
        "sdpa"
    ] * 3
    grads(model)
    report = flash.undo()
    assert "`net.layers.0.attn` (DeclaredAttention, 1 attention layer): eager → sdpa" in str(report)
    assert report.details["sdpa_calls"] == 3
    assert not report.notes, "a declared module is not named as hand-written"
    assert all(
        m.config._attn_implementation == "eager" for m in model.modules() if isinstance(m, DeclaredAttention)
    )


def _imports_demo(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[:2] == ["swift_nb", "demo"] for a in node.names)
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        return module.split(".")[:2] == ["swift_nb", "demo"] or (
            module == "swift_nb" and any(a.name == "demo" for a in node.names)
        )
    return False


def test_no_product_module_imports_the_demo_model():
    """The toggles reach the demo model through the protocol, not by importing it."""
    package = Path(swift_nb.__file__).parent
    importers = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "demo.py" and any(map(_imports_demo, ast.walk(ast.parse(path.read_text()))))
    ]
    assert not importers


def test_hand_written_attention_is_named_not_reachable():
    model = PlainLM(attention=HandAttention)
    flash = toggles.get("flash_attention")
    flash.apply({"net": model})
    report = flash.undo()
    assert not report.applied
    assert any("not reachable: `net.layers.0.attn` (HandAttention)" in n for n in report.notes), report.notes
    assert any("F.scaled_dot_product_attention" in n for n in report.notes)


def test_not_applicable_leaves_everything_untouched():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    sgd = torch.optim.SGD(mlp.parameters(), lr=0.1)
    ns = {"mlp": mlp, "sgd": sgd}
    reports = {}
    for tid in ("flash_attention", "grad_checkpointing", "galore"):
        t = toggles.get(tid)
        t.apply(ns)
        mlp(torch.randn(4, 8)).sum().backward()
        sgd.step()
        reports[tid] = t.undo()
    assert not any(r.applied for r in reports.values())
    assert "no attention module was found" in reports["flash_attention"].notes[0]
    assert "has no repeated blocks" in reports["grad_checkpointing"].notes[0]
    assert "`sgd` is SGD: GaLore replaces only Adam and AdamW" in reports["galore"].notes[0]
    assert type(sgd) is torch.optim.SGD and isinstance(mlp[0], nn.Linear)


def test_constructed_while_applied_are_changed_then_restored():
    ns: dict = {}
    flash, ckpt, galore = (
        toggles.get("flash_attention"),
        toggles.get("grad_checkpointing"),
        toggles.get("galore", rank=16),
    )
    for t in (flash, ckpt, galore):
        t.apply(ns)
    model = make("demo")  # built after apply, as a training cell does
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert type(opt) is galore_adamw()[0]
    grads(model)
    assert all(m.attn_impl == "sdpa" for m in model.modules() if isinstance(m, CausalSelfAttention))
    assert any(isinstance(m, CheckpointWrapper) for m in model.modules())
    opt.step()
    reports = [t.undo() for t in (galore, ckpt, flash)]
    assert all(r.applied for r in reports), [str(r) for r in reports]
    assert type(opt) is torch.optim.AdamW
    assert not any(isinstance(m, CheckpointWrapper) for m in model.modules())
    assert all(m.attn_impl == "eager" for m in model.modules() if isinstance(m, CausalSelfAttention))
    # a model built after undo is left alone
    other = make("demo")
    grads(other)
    assert all(m.attn_impl == "eager" for m in other.modules() if isinstance(m, CausalSelfAttention))


def test_galore_undo_restores_optimizer_object_and_state():
    model = make("plain")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    grads(model)
    opt.step()
    state_before = {id(p): {k: v for k, v in s.items()} for p, s in opt.state.items()}
    groups_before = opt.param_groups
    galore = toggles.get("galore", rank=16)
    galore.apply({"opt": opt, "model": model})
    assert type(opt) is galore_adamw()[0] and len(opt.param_groups) == 2
    grads(model)
    opt.step()
    galore.undo()
    assert type(opt) is torch.optim.AdamW and opt.param_groups is groups_before
    assert {id(p) for p in opt.state} == state_before.keys()
    for p, s in opt.state.items():
        assert all(s[k] is v for k, v in state_before[id(p)].items())
    grads(model)
    opt.step()  # still a working AdamW


def test_galore_trains_like_adamw_and_its_state_is_the_analytic_size():
    """100 steps of a noisy regression task (noise variance 1, the loss floor); GaLore at
    rank d/2 ends within 10 % of AdamW's loss."""

    def run(use_galore: bool) -> tuple[float, torch.optim.Optimizer, toggles.ToggleReport | None]:
        torch.manual_seed(0)
        teacher = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 64))
        model = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 64))
        x = torch.randn(512, 64)
        with torch.no_grad():
            y = teacher(x) + torch.randn(512, 64)
        galore = toggles.get("galore", rank=32, gap=50, scale=1.0) if use_galore else None
        if galore:
            galore.apply({"model": model})
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for i in range(100):
            batch = slice((i * 64) % 512, (i * 64) % 512 + 64)
            F.mse_loss(model(x[batch]), y[batch]).backward()
            opt.step()
            opt.zero_grad()
        with torch.no_grad():
            final = F.mse_loss(model(x), y).item()
        report = galore.undo() if galore else None
        return final, opt, report

    adamw_loss, _, _ = run(False)
    galore_loss, _, report = run(True)
    assert galore_loss <= 1.10 * adamw_loss, (galore_loss, adamw_loss)
    d = report.details
    # Linear(64→128).weight is 128×64 → moments 128×32, projection 32×64; and the other way round
    analytic = 4 * (2 * (2 * 128 * 32 + 32 * 64) + 2 * (128 + 64))
    assert d["optimizer_state_bytes_after"] == analytic
    assert d["optimizer_state_bytes_measured"] == analytic
    assert d["optimizer_state_bytes_before"] == 4 * 2 * sum(
        p.numel() for p in nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 64)).parameters()
    )


def test_galore_state_formula_matches_measurement_on_every_projection():
    for proj in ("std", "reverse_std", "left", "right", "full"):
        model = make("plain")
        galore = toggles.get("galore", rank=8, proj_type=proj)
        galore.apply({"model": model})
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        grads(model)
        opt.step()
        assert state_bytes(opt) == galore_state_bytes(opt, 8, proj), proj
        galore.undo()


@pytest.mark.parametrize(
    ("tid", "params", "message"),
    [
        ("galore", {"rank": 0}, "galore rank must be ≥ 1; got 0"),
        ("galore", {"gap": -1}, "galore gap must be ≥ 1; got -1"),
        ("galore", {"ranks": 4}, "galore ranks is not a parameter of galore (known: rank, update_proj_gap"),
        ("galore", {"proj_type": "diag"}, "galore proj_type must be one of std, reverse_std"),
        ("grad_checkpointing", {"every_n": "x"}, "grad_checkpointing every_n must be an integer; got 'x'"),
        (
            "flash_attention",
            {"backend": "x"},
            "flash_attention backend is not a parameter of flash_attention",
        ),
        (
            "sparse",
            {},
            "toggle must be one of flash_attention, grad_checkpointing, activation_offload, lora, qlora, galore, optim_8bit",
        ),
    ],
)
def test_bad_parameters_are_refused_with_a_clear_message(tid, params, message):
    with pytest.raises(ConfigError, match=None) as e:
        toggles.get(tid, **params)
    assert message in str(e.value)


def test_toggles_reach_the_optimizer_inside_accelerates_wrapper():
    """``accelerator.prepare`` (and so a Trainer) hands out an AcceleratedOptimizer: GaLore
    converts the optimizer it wraps, under the wrapper's name, and steps go through."""
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState

    try:
        accelerator = accelerate.Accelerator(cpu=True)
        model = make("plain")
        inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
        opt = accelerator.prepare(inner)
        assert toggles.find_optimizers({"opt": opt}) == [("opt", inner)]
        galore = toggles.get("galore", rank=16)
        galore.apply({"model": model, "opt": opt})
        assert type(inner) is galore_adamw()[0] and type(opt) is not galore_adamw()[0]
        grads(model)
        opt.step()
        report = galore.undo()
        assert report.changes[0].startswith(
            "`opt` (AdamW → GaLore AdamW): 13 weight matrices projected to rank 16"
        )
        assert type(inner) is torch.optim.AdamW
        grads(model)
        opt.step()
    finally:
        AcceleratorState._reset_state(True)


def test_a_wrapper_around_a_changed_model_is_left_alone():
    """torch.compile, DDP and loss wrappers run a model that was changed already: its blocks
    are checkpointed once, and the wrapper is no model of its own."""
    model = make("demo")
    ckpt = toggles.get("grad_checkpointing")
    ckpt.apply({"model": model})
    grads(Holder(model))
    report = ckpt.undo()
    assert report.changes == ["2 of 2 Block blocks in `model.blocks` checkpointed (non-reentrant)"]
    assert not any(isinstance(m, CheckpointWrapper) for m in model.modules())


class Holder(nn.Module):
    """A module that holds a model and runs it (as torch.compile's OptimizedModule does)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.inner(idx, targets)
