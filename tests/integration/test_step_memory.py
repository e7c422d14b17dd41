"""CPU peak tensor memory per step agrees with torch's MemTracker."""

from __future__ import annotations

import torch
from torch.distributed._tools.mem_tracker import MemTracker

import swift_nb
from swift_nb.demo import make_model


def test_cpu_step_peak_matches_memtracker(runs_dir):
    torch.manual_seed(0)
    model = make_model(seq_len=64, n_layer=2, d_model=64, n_head=2, vocab_size=256)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 256, (4, 64))

    def step():
        model(x, x).backward()
        opt.step()
        opt.zero_grad()

    step()
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        step()
        tracker.reset_mod_stats()
        step()
    expected = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]

    with swift_nb.profile(out_dir=runs_dir, wait=0, warmup=1, active=3) as run:
        for _ in range(5):
            step()
    measured = run.steps["peak_tensor_bytes"].dropna()
    assert len(measured) == 3
    assert abs(measured.median() - expected) / expected < 0.02, (measured.tolist(), expected)


def _activations_at_peak(runs_dir, micro_batches: int) -> float:
    torch.manual_seed(0)
    model = make_model(seq_len=64, n_layer=2, d_model=64, n_head=2, vocab_size=256)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 256, (4, 64))
    with swift_nb.profile(out_dir=runs_dir, wait=0, warmup=1, active=2, report=False) as run:
        for _ in range(4):
            for _ in range(micro_batches):  # gradient accumulation: one optimizer step per k batches
                (model(x, x) / micro_batches).backward()
            opt.step()
            opt.zero_grad()
    return float(run.steps["activations_bytes"].dropna().median())


def test_activations_under_gradient_accumulation(runs_dir):
    """Each micro-batch's forward keeps its activations for its own backward: the peak's
    activations are one micro-batch's, whether the step accumulates 1 or 4 of them."""
    one = _activations_at_peak(runs_dir / "one", 1)
    four = _activations_at_peak(runs_dir / "four", 4)
    assert one > 1 << 20
    assert 0.9 * one < four < 1.1 * one, (one, four)
