"""activation_offload: refused off CUDA before any work, naming CUDA; on CUDA
(``scripts/gpu_check.sh``'s ``memory_kit`` check) the saved tensors go to pinned host
memory. Here, with the device check lifted, its hooks: weights, CPU tensors and small ones
stay where they are, the cell's math is unchanged, and nothing stays installed after undo."""

from __future__ import annotations

import pytest
import torch

from swift_nb import toggles
from swift_nb.core.errors import ConfigError
from swift_nb.toggles import activation_offload


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_it_is_refused_off_cuda_naming_cuda_before_any_work():
    with pytest.raises(ConfigError, match=r"activation_offload needs a CUDA device, and torch .* sees none"):
        toggles.get("activation_offload")


def test_weights_and_cpu_tensors_stay_and_the_hooks_leave_with_undo(monkeypatch):
    monkeypatch.setattr(activation_offload, "refuse_without_cuda", lambda *a: None)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    x = torch.randn(4, 8)
    expected = torch.autograd.grad(net(x).sum(), list(net.parameters()))
    toggle = toggles.get("activation_offload")
    with toggles.applied({"net": net}, [toggle]) as reports:
        assert toggle._pack(net[0].weight) is net[0].weight  # a weight stays
        assert toggle._pack(x) is x  # on the CPU already
        got = torch.autograd.grad(net(x).sum(), list(net.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert reports[0].details == {"offloaded_tensors": 0, "offloaded_bytes": 0}
    assert not torch._C._autograd._top_saved_tensors_default_hooks(False)  # nothing left installed
