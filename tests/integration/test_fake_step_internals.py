"""The fake step rests on PyTorch internals (MemTracker's): a change to them is said before
any work, naming what changed; a failure inside the step that is not a model's
data-dependent operation is raised, never turned into a lower bound with no activations."""

from __future__ import annotations

import pytest
import torch
from torch.distributed._tools import mem_tracker

import swift_nb
from swift_nb.capture.memory import peak_tracker


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(1000, 16)
        self.head = torch.nn.Linear(16, 1000)

    def forward(self, ids):
        return self.head(self.embed(ids))


def test_a_changed_internal_is_named_before_the_step(monkeypatch):
    monkeypatch.delattr(mem_tracker.MemTracker, "_update_peak_stats")
    built = []
    with pytest.raises(RuntimeError, match=r"MemTracker\._update_peak_stats.*forecast from a measured run"):
        swift_nb.forecast(model=lambda: built.append(1) or TinyLM(), dtype="fp32", progress=False)
    assert not built  # refused before the model was built


def test_an_internal_failure_inside_the_step_is_raised_not_a_lower_bound(monkeypatch):
    def broken(self, *args, **kwargs):
        raise AttributeError("'_WeakRefInfo' object has no attribute 'mem_consumed'")

    monkeypatch.setattr(peak_tracker.PeakTracker, "_update_snap", broken)
    with pytest.raises(AttributeError, match="mem_consumed"):
        swift_nb.forecast(model=TinyLM, dtype="fp32", batch_size=2, seq_len=8, progress=False)


def test_the_logits_of_a_fake_step_are_the_heads_output_and_what_the_loss_makes_of_it():
    f = swift_nb.forecast(model=TinyLM, dtype="fp32", batch_size=4, seq_len=64, progress=False)
    copy = 4 * 64 * 1000 * 4  # one fp32 B·T × V tensor
    assert copy <= f.categories["logits"] <= 4 * copy, f.categories
