"""fp8: refused before any work where float8 matmuls cannot run, naming CUDA and the
capability; which linear layers it converts (both sides multiples of 16, not the output
layer). The conversion itself runs on CUDA ≥ 8.9 in ``scripts/gpu_check.sh``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swift_nb import toggles
from swift_nb.core.errors import ConfigError
from swift_nb.toggles.fp8 import float8_eligible


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_it_is_refused_off_cuda_naming_the_capability():
    with pytest.raises(ConfigError, match=r"fp8 needs a CUDA device of compute capability ≥ 8\.9"):
        toggles.get("fp8")


def test_only_linear_layers_float8_can_take_are_converted():
    assert float8_eligible(nn.Linear(64, 128), "model.layers.0.mlp.up_proj")
    assert not float8_eligible(nn.Linear(64, 100), "model.layers.0.mlp.up_proj")  # 100 is no multiple of 16
    assert not float8_eligible(nn.Linear(64, 128), "lm_head")  # the output layer stays high-precision
    assert not float8_eligible(nn.Conv1d(16, 16, 3), "conv")


def test_it_clashes_with_qlora():
    with pytest.raises(ConfigError, match="fp8 and qlora cannot run together"):
        toggles.build(["fp8", "qlora"])
