"""optim_8bit on a real run: bitsandbytes' AdamW8bit in place of the cell's AdamW, its
state at ≤ 0.3× of fp32 AdamW's, the forecast of the toggled run from the plain one within
10 % of the toggled run's measured peak, and an undo that gives the user's optimizer back."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

import swift_nb
from swift_nb import toggles
from swift_nb.analysis.forecast import forecast, measure
from swift_nb.core.errors import ConfigError
from swift_nb.demo import make_model
from swift_nb.toggles.optim_8bit import state_bytes

pytest.importorskip("bitsandbytes")


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


def test_undo_gives_back_the_optimizer_with_its_state_and_the_last_learning_rate():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    x = torch.randint(0, 512, (2, 16))
    model(x, x).backward()
    opt.step()
    sched.step()
    state, groups = opt.state, opt.param_groups
    moments = {k: v["exp_avg"].clone() for k, v in opt.state.items()}
    toggle = toggles.get("optim_8bit")
    with toggles.applied({"model": model, "opt": opt}, [toggle]) as reports:
        assert type(opt).__name__ == "AdamW8bit"
        for _ in range(2):
            opt.zero_grad()
            model(x, x).backward()
            opt.step()
            sched.step()
        assert state_bytes(opt) <= 0.3 * sum(2 * 4 * p.numel() for p in model.parameters())
    assert type(opt) is torch.optim.AdamW and opt.state is state and opt.param_groups is groups
    assert all(torch.equal(opt.state[k]["exp_avg"], v) for k, v in moments.items())
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.5**3)  # the scheduler stepped the 8-bit one
    (report,) = reports
    assert report.details["optimizer_state_bytes_measured"] == report.details["optimizer_state_bytes_after"]
    assert not any("Failed to load" in line for line in report.changes)


def test_an_sgd_optimizer_is_left_alone_with_a_note_and_clashes_are_refused():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with toggles.applied({"model": model, "opt": opt}, [toggles.get("optim_8bit")]) as reports:
        assert type(opt) is torch.optim.SGD
    assert "replaces only Adam and AdamW" in reports[0].notes[0]
    with pytest.raises(ConfigError, match="optim_8bit and galore cannot run together: each replaces"):
        toggles.build(["optim_8bit", "galore"])
