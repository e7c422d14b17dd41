"""Nothing of a run outlives it: no thread, global hook, patched class or autograd hook of
swift_nb stays once a profiled loop (with toggles) has ended; only the idle helper process,
documented, stays. The same bare loop's speed after a run is benchmarks/never_waits.py's
to measure, not a test's."""

from __future__ import annotations

import contextlib
import io
import threading

import torch
from torch import nn
from torch.optim import optimizer as optim_module

import swift_nb
from swift_nb.demo import make_model


def _globals() -> dict[str, int]:
    module = nn.modules.module
    return {
        "forward_pre_hooks": len(module._global_forward_pre_hooks),
        "forward_hooks": len(module._global_forward_hooks),
        "backward_hooks": len(module._global_backward_hooks),
        "parameter_registration_hooks": len(module._global_parameter_registration_hooks),
        "optimizer_pre_hooks": len(optim_module._global_optimizer_pre_hooks),
        "optimizer_post_hooks": len(optim_module._global_optimizer_post_hooks),
    }


def _patched() -> dict[str, object]:
    return {
        "Adam.__init__": torch.optim.Adam.__dict__["__init__"],
        "AdamW.__init__": torch.optim.AdamW.__dict__["__init__"],
        "sdpa": torch.nn.functional.scaled_dot_product_attention,
    }


def test_a_run_with_toggles_leaves_no_thread_hook_or_patch(tmp_path):
    torch.manual_seed(0)
    model = make_model(n_layer=2, n_head=2, d_model=32, vocab_size=128, seq_len=32)
    x = torch.randint(0, 128, (2, 32))
    threads, hooks, patched = {t.ident for t in threading.enumerate()}, _globals(), _patched()
    with (
        contextlib.redirect_stdout(io.StringIO()),
        swift_nb.profile(
            out_dir=tmp_path,
            wait=0,
            warmup=1,
            active=2,
            profile_memory=True,
            toggles=["flash_attention", "grad_checkpointing", "optim_8bit"],
        ),
    ):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(5):
            model(x, x).backward()
            opt.step()
            opt.zero_grad()
    # the idle helper (one per process, documented in the README: it stays for the next run)
    left = [t.name for t in threading.enumerate() if t.ident not in threads and t.is_alive()]
    assert set(left) <= {"swift_nb-helper"}, left
    assert _globals() == hooks
    assert _patched() == patched
    assert not torch.autograd.profiler._is_profiler_enabled
    assert not torch._C._autograd._top_saved_tensors_default_hooks(False)
    assert all("forward" not in m.__dict__ for m in model.modules())  # no instance forward left
