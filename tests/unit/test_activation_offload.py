"""activation_offload: refused off CUDA before any work, naming CUDA; on CUDA
(``scripts/gpu_check.sh``'s ``memory_kit`` check) the saved tensors go to pinned host
memory. Here, with the device check lifted: on the CPU as it is, nothing moves and the math
is unchanged; with ``activation_offload.on_device`` pointed at CPU tensors, the copy to the
host and back runs for real: every saved activation of ≥ 1 MiB is copied at pack time, comes
back from that copy at unpack time, and the gradients equal a run without offload. Weights
and small tensors stay, and nothing stays installed after undo."""

from __future__ import annotations

import pytest
import torch

from swift_nb import toggles
from swift_nb.core.errors import ConfigError
from swift_nb.toggles import activation_offload

#: rows × width of the input: each activation of the net below is 1024 × 512 × 4 B = 2 MiB
ROWS, WIDTH = 1024, 512
ACTIVATION_BYTES = ROWS * WIDTH * 4
#: what autograd saves of the net below that is not a weight: the first Linear's input, each
#: Tanh's output, and each following Linear's input (that same output, saved again)
SAVED_ACTIVATIONS = 5


def _net() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.Tanh(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.Tanh(),
        torch.nn.Linear(WIDTH, 1),
    )


def _grads(net: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(net(x).sum(), list(net.parameters()))


@pytest.fixture
def offload(monkeypatch):
    """The toggle with its CUDA check lifted (the math it runs is the same on any device)."""
    monkeypatch.setattr(activation_offload, "refuse_without_cuda", lambda *a: None)
    return toggles.get("activation_offload")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_it_is_refused_off_cuda_naming_cuda_before_any_work():
    with pytest.raises(ConfigError, match=r"activation_offload needs a CUDA device, and torch .* sees none"):
        toggles.get("activation_offload")


def test_on_the_cpu_as_it_is_nothing_moves_and_the_hooks_leave_with_undo(offload):
    net, x = _net(), torch.randn(ROWS, WIDTH)
    expected = _grads(net, x)
    with toggles.applied({"net": net}, [offload]) as reports:
        assert offload._pack(x) is x  # on the CPU: not the device's memory
        got = _grads(net, x)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert reports[0].details == {"offloaded_tensors": 0, "offloaded_bytes": 0}
    assert not torch._C._autograd._top_saved_tensors_default_hooks(False)  # nothing left installed


def test_saved_activations_go_to_a_host_copy_and_backward_reads_them_back(offload, monkeypatch):
    net, x = _net(), torch.randn(ROWS, WIDTH)
    expected = _grads(net, x)

    # CPU tensors count as the device's: the pack and unpack paths run as on CUDA
    monkeypatch.setattr(activation_offload, "on_device", lambda t: True)
    packed: list[tuple[torch.Tensor, object]] = []
    unpacked: list[tuple[object, torch.Tensor]] = []
    pack, unpack = offload._pack, activation_offload._unpack

    def record_pack(t):
        packed.append((t, pack(t)))
        return packed[-1][1]

    def record_unpack(p):
        unpacked.append((p, unpack(p)))
        return unpacked[-1][1]

    monkeypatch.setattr(offload, "_pack", record_pack)
    monkeypatch.setattr(activation_offload, "_unpack", record_unpack)
    with toggles.applied({"net": net}, [offload]) as reports:
        small = torch.ones(8)
        assert pack(net[0].weight) is net[0].weight and pack(small) is small  # a weight and < 1 MiB stay
        got = _grads(net, x)

    moved = [(t, p) for t, p in packed if isinstance(p, tuple)]
    assert len(moved) == SAVED_ACTIVATIONS, [tuple(t.shape) for t, _ in packed]
    for t, (device, host) in moved:
        assert device == t.device
        copy_at, original_at = host.untyped_storage().data_ptr(), t.untyped_storage().data_ptr()
        assert copy_at != original_at, "the host copy is the saved tensor itself"
    hosts = {id(host) for _, (_, host) in moved}
    came_back = [id(out) for p, out in unpacked if isinstance(p, tuple)]
    assert len(came_back) == SAVED_ACTIVATIONS and set(came_back) == hosts, (
        "backward did not read the host copies"
    )
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True)), "the gradients changed"
    assert reports[0].details == {
        "offloaded_tensors": SAVED_ACTIVATIONS,
        "offloaded_bytes": SAVED_ACTIVATIONS * ACTIVATION_BYTES,
    }
    assert not torch._C._autograd._top_saved_tensors_default_hooks(False)
