"""Step boundaries: each training iteration is one step, whatever marks it."""

from __future__ import annotations

import pytest
import torch

import swift_nb


def _loop(optimizer_steps: list[bool], explicit_steps: list[bool]) -> swift_nb.Run:
    """One iteration per entry: forward, backward, then ``opt.step()`` where
    ``optimizer_steps`` says so (else a hand-written update), then ``swift_nb.step()``
    where ``explicit_steps`` says so."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with swift_nb.profile(wait=0, warmup=0, active=1, report=False) as run:
        for use_opt, use_step in zip(optimizer_steps, explicit_steps, strict=True):
            model(torch.randn(2, 8)).sum().backward()
            if use_opt:
                opt.step()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.01 * p.grad
            opt.zero_grad()
            if use_step:
                swift_nb.step()
    return run


@pytest.fixture(autouse=True)
def _runs_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("SWIFT_NB_DIR", str(tmp_path))


@pytest.mark.parametrize(
    ("optimizer_steps", "explicit_steps", "triggers"),
    [
        ([True] * 6, [True] * 6, ["optimizer"] + ["explicit"] * 5),  # both: nothing counted twice
        ([True] * 6, [False] * 6, ["optimizer"] * 6),
        ([False] * 6, [True] * 6, ["explicit"] * 6),
        # training marked by the optimizer, then evaluation marked by step()
        ([True] * 3 + [False] * 3, [False] * 3 + [True] * 3, ["optimizer"] * 3 + ["explicit"] * 3),
    ],
    ids=["both", "optimizer", "explicit", "optimizer-then-explicit"],
)
def test_each_iteration_is_one_step(optimizer_steps, explicit_steps, triggers):
    run = _loop(optimizer_steps, explicit_steps)
    assert run.summary["steps"] == 6
    assert run.steps["trigger"].tolist() == triggers
    assert run.steps["step"].tolist() == list(range(6))
    # the steps tile the run: each starts where the previous ended (plus the hook's own time)
    starts, ends = run.steps["start_s"].to_numpy(), run.steps["end_s"].to_numpy()
    assert (starts[1:] >= ends[:-1]).all() and (ends > starts).all()


def test_an_update_the_grad_scaler_skips_still_ends_the_step():
    """Mixed precision's GradScaler skips ``optimizer.step()`` when the gradients hold inf
    (an fp16 run's first steps often do): no optimizer hook fires, yet the iteration is over."""
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    with swift_nb.profile(wait=0, warmup=0, active=1, report=False) as run:
        for i in range(6):
            loss = model(torch.randn(2, 8)).sum() * (float("inf") if i in (1, 3) else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    assert run.summary["steps"] == 6 and run.steps["trigger"].eq("optimizer").all()
    assert run.context["skipped_updates"] == 2
    assert torch.amp.GradScaler.step.__qualname__ == "GradScaler.step"  # put back after the run


def test_accelerate_accumulation_is_one_step_per_update_skipped_ones_included():
    """``accelerator.prepare``'s optimizer steps the real one once per accumulation cycle;
    with a GradScaler (accelerate makes one for fp16 on GPUs) an overflowing cycle's update
    is skipped and still ends its step."""
    import accelerate
    from accelerate.state import AcceleratorState

    try:
        accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=4)
        accelerator.scaler = torch.amp.GradScaler("cpu")
        model = torch.nn.Linear(8, 8)
        opt = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.01))
        with swift_nb.profile(wait=0, warmup=0, active=1, report=False) as run:
            for i in range(24):
                with accelerator.accumulate(model):
                    loss = model(torch.randn(2, 8)).sum() * (float("inf") if i in (5, 6) else 1.0)
                    accelerator.backward(loss)
                    opt.step()
                    opt.zero_grad()
        assert run.summary["steps"] == 24 // 4
        assert run.context["skipped_updates"] == 1  # the second cycle, micro-batches 4–7
        recorded = run.context["trainer"]
        assert recorded["framework"] == "accelerate" and recorded["variable"] == "accelerator"
        assert recorded["arguments"]["gradient_accumulation_steps"] == 4
    finally:
        AcceleratorState._reset_state(True)


def test_a_framework_that_does_not_step_the_optimizer_is_not_recorded():
    import accelerate
    from accelerate.state import AcceleratorState

    try:
        accelerator = accelerate.Accelerator(cpu=True)  # present, but this loop steps its own optimizer
        run = _loop([True] * 3, [False] * 3)
        assert "trainer" not in run.context and "batch_size" not in run.context
        assert accelerator.gradient_accumulation_steps == 1
    finally:
        AcceleratorState._reset_state(True)
