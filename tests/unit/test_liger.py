"""The liger toggle off CUDA: refused before any work, naming the device, and nothing of it
stays applied; its undo puts back what Liger's patcher changes (submodules' attributes, the
modeling module's functions)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

from swift_nb import toggles
from swift_nb.core.errors import ConfigError
from swift_nb.toggles.liger import _saved


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_liger_is_refused_off_cuda_naming_the_device():
    toggle = toggles.get("liger")
    with pytest.raises(ConfigError, match=r"CUDA device, and this machine has none .* use fused_ce"):
        toggle.apply({"net": nn.Linear(4, 4)})
    assert toggle.report is None
    with pytest.raises(ConfigError, match="no GPU"):
        toggle.apply({})  # a cell that builds its model itself: refused all the same


def test_the_undo_puts_back_attributes_and_module_functions():
    modeling = types.ModuleType("fake_modeling")
    modeling.rope = lambda x: x
    sys.modules["fake_modeling"] = modeling
    try:
        cls = type("Block", (nn.Module,), {"__module__": "fake_modeling", "forward": lambda self, x: x})
        model = nn.Sequential(cls(), nn.Linear(2, 2))
        original_rope = modeling.rope
        restore = _saved(model)
        model[0].forward = lambda x: x * 2  # what a patcher does
        model[0].offset = 1.0
        modeling.rope = lambda x: -x
        restore()
        assert "forward" not in model[0].__dict__ and not hasattr(model[0], "offset")
        assert modeling.rope is original_rope
        assert torch.equal(model[0](torch.ones(1)), torch.ones(1))
    finally:
        del sys.modules["fake_modeling"]
