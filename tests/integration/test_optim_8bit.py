"""optim_8bit on a real run: bitsandbytes' AdamW8bit in place of the cell's AdamW, its
state at ≤ 0.3× of fp32 AdamW's, the forecast of the toggled run from the plain one within
10 % of the toggled run's measured peak, groups added while converted with the user's
defaults, and an undo that gives the user's optimizer back with the moments it reached."""

from __future__ import annotations

import contextlib
import io

import bitsandbytes
import pytest
import torch

import swift_nb
from swift_nb import toggles
from swift_nb.analysis.forecast import forecast, measure
from swift_nb.core.errors import ConfigError
from swift_nb.core.units import MIN_8BIT_SIZE
from swift_nb.demo import make_model
from swift_nb.toggles.optim_8bit import state_bytes


def _model():
    torch.manual_seed(0)
    return make_model(n_layer=2, n_head=2, d_model=128, vocab_size=512, seq_len=64)


def _profile(tmp_path, model, opt, toggle_ids=()):
    x = torch.randint(0, 512, (2, 64))
    with contextlib.redirect_stdout(io.StringIO()):
        prof = swift_nb.profile(
            out_dir=tmp_path,
            wait=0,
            warmup=1,
            active=2,
            profile_memory=True,
            report=False,
            toggles=list(toggle_ids),
        )
        with prof as run:
            for _ in range(4):
                model(x, x).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    return swift_nb.load_run(run.path)


def test_8bit_state_is_a_quarter_and_the_forecast_of_the_toggled_run_holds(tmp_path):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    plain = _profile(tmp_path / "plain", model, opt)
    base = measure(plain)
    assert base.params_small is not None and 0 < base.params_small < base.params
    predicted = forecast(base, toggles=["optim_8bit"])

    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    toggled = _profile(tmp_path / "toggled", model, opt, ["optim_8bit"])
    measured = measure(toggled)
    assert type(opt) is torch.optim.AdamW  # the user's object, given back
    assert "optim_8bit" in measured.toggles and measured.optimizer == "AdamW8bit"
    assert measured.categories["optimizer_state"] <= 0.3 * base.categories["optimizer_state"]
    assert predicted.categories["optimizer_state"] == pytest.approx(
        measured.categories["optimizer_state"], rel=0.02
    )
    assert predicted.total_bytes == pytest.approx(measured.total, rel=0.10)


def test_undo_gives_back_the_moments_the_8bit_optimizer_reached_and_the_last_learning_rate():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    x = torch.randint(0, 512, (2, 16))
    model(x, x).backward()
    opt.step()
    sched.step()
    state, groups = opt.state, opt.param_groups
    frozen = model.ln_f.bias  # no gradient while converted: nothing moves its moments
    kept = {k: v.clone() for k, v in opt.state[frozen].items()}
    trained = [p for p in model.parameters() if p is not frozen]
    b1, b2 = opt.param_groups[0]["betas"]
    # Adam's moments from the conversion on (its state starts empty), computed here from the gradients
    m = {p: torch.zeros_like(p) for p in trained}
    v = {p: torch.zeros_like(p) for p in trained}
    toggle = toggles.get("optim_8bit")
    with toggles.applied({"model": model, "opt": opt}, [toggle]) as reports:
        assert type(opt) is bitsandbytes.optim.AdamW8bit
        for _ in range(3):
            opt.zero_grad()
            model(x, x).backward()
            frozen.grad = None
            for p in trained:
                m[p] = b1 * m[p] + (1 - b1) * p.grad
                v[p] = b2 * v[p] + (1 - b2) * p.grad**2
            opt.step()
            sched.step()
        assert state_bytes(opt) <= 0.3 * sum(2 * 4 * p.numel() for p in model.parameters())
    assert type(opt) is torch.optim.AdamW and opt.state is state and opt.param_groups is groups
    for p in trained:
        s = opt.state[p]
        assert s["step"].dtype == kept["step"].dtype and s["step"].item() == 3
        # 8-bit block-wise moments come back within 3 % of the tensor's largest; fp32 ones exactly
        tol = 0.03 if p.numel() >= MIN_8BIT_SIZE else 1e-5
        for got, want in ((s["exp_avg"], m[p]), (s["exp_avg_sq"], v[p])):
            assert got.shape == p.shape and got.dtype == p.dtype
            assert (got - want).abs().max() <= tol * want.abs().max(), (
                p.shape,
                got.flatten()[:4],
                want.flatten()[:4],
            )
    assert all(torch.equal(opt.state[frozen][k], v) for k, v in kept.items())
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.5**4)  # the scheduler stepped the 8-bit one
    opt.zero_grad()
    model(x, x).backward()
    opt.step()  # AdamW goes on from the moments given back
    assert opt.state[trained[0]]["step"].item() == 4
    (report,) = reports
    unstepped = 2 * 4 * frozen.numel()  # the fp32 moments of the tensor that never stepped
    assert (
        report.details["optimizer_state_bytes_measured"]
        == report.details["optimizer_state_bytes_after"] - unstepped
    )
    assert not any("Failed to load" in line for line in report.changes)
    assert not any("reset" in line for line in report.notes)


def test_a_group_added_while_converted_takes_the_users_defaults_and_stays_after_undo():
    model = _model()
    added = list(model.ln_f.parameters())
    body = [p for p in model.parameters() if all(p is not q for q in added)]
    # bitsandbytes' own defaults are lr 1e-3 and weight decay 1e-2; the user's differ
    opt = torch.optim.Adam(body, lr=3e-4, betas=(0.8, 0.95), eps=1e-6)
    x = torch.randint(0, 512, (2, 16))
    with toggles.applied({"model": model, "opt": opt}, [toggles.get("optim_8bit")]):
        opt.add_param_group({"params": added})
        group = opt.param_groups[-1]
        assert (group["lr"], tuple(group["betas"]), group["eps"], group["weight_decay"]) == (
            3e-4,
            (0.8, 0.95),
            1e-6,
            0,
        )
        model(x, x).backward()
        opt.step()
    assert type(opt) is torch.optim.Adam and len(opt.param_groups) == 2
    group = opt.param_groups[-1]
    assert group["params"] == added and group["lr"] == 3e-4 and group["amsgrad"] is False
    assert opt.state[added[0]]["step"].item() == 1
    opt.zero_grad()
    model(x, x).backward()
    opt.step()  # Adam steps the group it was given back


def test_undo_says_when_the_8bit_moments_cannot_be_read_back():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 512, (2, 16))
    model(x, x).backward()
    opt.step()
    broken = model.tok_emb.weight
    with toggles.applied({"model": model, "opt": opt}, [toggles.get("optim_8bit")]) as reports:
        opt.zero_grad()
        model(x, x).backward()
        opt.step()
        del opt.state[broken]["absmax1"]  # a layout this toggle cannot read
    assert not opt.state.get(broken)  # reset, never the moments from before the conversion
    assert opt.state[model.pos_emb.weight]["step"].item() == 1  # the others are given back
    (report,) = reports
    (note,) = [n for n in report.notes if "reset" in n]
    assert "`opt`" in note and "1 of" in note, note
    opt.zero_grad()
    model(x, x).backward()
    opt.step()


def test_an_sgd_optimizer_is_left_alone_with_a_note_and_clashes_are_refused():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with toggles.applied({"model": model, "opt": opt}, [toggles.get("optim_8bit")]) as reports:
        assert type(opt) is torch.optim.SGD
    assert "replaces only Adam and AdamW" in reports[0].notes[0]
    with pytest.raises(ConfigError, match="optim_8bit and galore cannot run together: each replaces"):
        toggles.build(["optim_8bit", "galore"])
