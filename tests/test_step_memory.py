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
