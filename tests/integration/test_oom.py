"""Out of memory: a real allocation failure under RLIMIT_AS in a child process, saved as
status ``oom`` with what was live, where it failed and what would make it fit; the
post-mortem's parts on their own; the cell's traceback unchanged in a kernel."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.oom import _text

import swift_nb
from swift_nb import demo
from swift_nb.analysis.oom import diagnose
from swift_nb.capture.job import _worst
from swift_nb.capture.memory import oom
from swift_nb.record import OutOfMemory, load_run, runs
from swift_nb.render.oom import oom_text

WORKLOAD = Path(__file__).parents[1] / "workloads" / "oom_job.py"


MIB = 1 << 20


def _run_job(out: Path, active: int) -> swift_nb.Run:
    proc = subprocess.run(
        [sys.executable, str(WORKLOAD), str(out), str(active)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT oom "), proc.stdout + proc.stderr[-3000:]
    return load_run(last.split()[-1])


@pytest.fixture(scope="module")
def outside_window(tmp_path_factory):
    """The job fails in step 3; the profiler recorded steps 1-2 only."""
    return _run_job(tmp_path_factory.mktemp("oom"), active=2)


def _param_bytes() -> int:
    return sum(p.numel() * p.element_size() for p in demo.GPT(demo.quickstart_config()).parameters())


def test_a_real_oom_is_saved_with_what_was_live(outside_window):
    run = outside_window
    assert run.status == "oom" and not run.problems
    o = run.oom
    assert isinstance(o, OutOfMemory)
    # where: the fourth step's forward pass, the last block's attention, its score product
    # the blocks reached before the limit vary a little with the address space the process
    # maps; the failure is always in an attention block's score product
    assert (o.step, o.phase) == (3, "forward")
    block = int(re.fullmatch(r"model\.blocks\.(\d)\.attn", o.module).group(1))
    assert "q @ k.transpose(-2, -1)" in o.op
    assert o.requested_bytes == 96 * 1024 * 1024 * 4  # batch 24 × 4 heads of 1024×1024 fp32 scores
    assert o.capacity_source == "the process's address-space limit (RLIMIT_AS)" and o.capacity_bytes > 0
    # categories from the same snapshot the per-step categories use: exact for the weights
    params = _param_bytes()
    assert o.categories["parameters"] == params
    assert o.categories["gradients"] == 0  # zero_grad(set_to_none=True) before the step
    assert (
        2 * params <= o.categories["optimizer_state"] <= 2 * params + 4096
    )  # AdamW's two moments (+ step counters)
    # the blocks before it each saved their attention probabilities for backward, 384 MiB each
    assert o.categories["activations"] >= block * o.requested_bytes
    assert o.square_bytes >= block * o.requested_bytes
    if block:
        top = o.top_tensors[0]
        assert top["shape"] == [96, 1024, 1024] and top["category"] == "activations"
        assert top["made_by"].startswith("saved for backward by ")
    assert (o.blocks, o.blocks_reached) == (4, block + 1)
    # nothing already measured is lost: the steps before, and the recorded steps' memory
    assert list(run.steps["step"][:3]) == [0, 1, 2]
    assert run.steps.loc[run.steps["step"] == 1, "activations_bytes"].iloc[0] > 0
    assert run.trace_path is not None and run.trace_path.exists()


def test_the_report_explains_it_and_names_the_fixes(outside_window):
    run = outside_window
    page = _text((run.path / "report.html").read_text())
    o = run.oom
    assert f"Out of memory in step 3, forward, in {o.module}, asking for 384.0 MiB with " in page
    assert "The operation that asked: scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)" in page
    assert "The largest live tensors:" in page and "AdamW" in page
    d = diagnose(run.oom, run.context.get("optimizer"))
    fits = {f.toggle for f in d.fixes if f.fits}
    # without the T×T scores the step needs a fraction: FlashAttention fits, and so does
    # half the batch (test_the_predicted_fix_does_fit runs it under the same limit)
    assert {"flash_attention", "grad_checkpointing", None} <= fits
    assert "galore" not in fits  # the optimizer state is 2 MiB of 1.8 GiB
    flash = next(f for f in d.fixes if f.toggle == "flash_attention")
    assert flash.need_bytes < d.need_bytes / 3
    assert "FlashAttention (fused attention: no T×T scores kept): the step would need ≈ " in page
    assert f"Measure them: put {d.compare_line} on top of the training cell." in page
    assert d.compare_line.startswith("%%swift_profile --compare flash_attention")
    text = oom_text(run)
    assert text.splitlines()[0].startswith(f"Out of memory in step 3, forward, in {o.module}, asking for")
    listed = runs(run.path.parent)
    assert listed["status"].iloc[0] == "oom"


def test_the_room_is_never_more_than_what_failed():
    """The capacity less the process's other memory can measure more room than the step
    needed (on CPU that memory moves with threads and malloc arenas): the room is then what
    was live plus the failed request, less the margin, so a fix saving 0.1 % never fits
    and one saving most of the activations still does."""
    o = OutOfMemory(
        requested_bytes=384 * MIB,
        phase="forward",
        blocks=4,
        blocks_reached=4,
        categories={"parameters": MIB, "gradients": 0, "optimizer_state": 2 * MIB, "activations": 1400 * MIB},
        capacity_bytes=8 << 30,  # measured: far more than the step needs
        outside_tensors_bytes=1 << 30,
        square_bytes=1152 * MIB,
    )
    d = diagnose(o, "AdamW")
    failed_at = (MIB + 2 * MIB + 1400 * MIB + 384 * MIB) * 0.95
    assert d.room_bytes == int(failed_at) < d.need_bytes
    assert "room = (what was live + the request that failed, " in d.formula
    fits = {f.toggle for f in d.fixes if f.fits}
    assert "galore" not in fits and "flash_attention" in fits
    # where the capacity is the tighter bound, it stays the room
    tight = diagnose(OutOfMemory(**{**o.__dict__, "capacity_bytes": 2 << 30}), "AdamW")
    assert tight.room_bytes == int(((2 << 30) - (1 << 30)) * 0.95)
    assert "capacity −" in tight.formula


def test_the_predicted_fix_does_fit(tmp_path):
    """Half the batch, predicted to fit, runs to its end under the same limit."""
    proc = subprocess.run(
        [sys.executable, str(WORKLOAD), str(tmp_path), "2", "12"], capture_output=True, text=True, timeout=600
    )
    assert proc.stdout.strip().splitlines()[-1].startswith("RESULT ok "), proc.stdout + proc.stderr[-2000:]


def test_oom_inside_the_profiled_window(tmp_path):
    """The profiler is recording when the step fails: the trace is still saved (or its
    loss is noted), and the post-mortem is the same."""
    run = _run_job(tmp_path, active=6)
    assert run.status == "oom" and run.oom.phase == "forward" and run.oom.step == 3
    assert run.trace_path is not None or any("trace could not be written" in n for n in run.notes)


def test_what_counts_as_out_of_memory():
    assert oom.is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB."))
    assert oom.is_oom(MemoryError())
    assert oom.is_oom(
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes.")
    )
    assert not oom.is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not oom.is_oom(None) and not oom.is_oom(ValueError("out of range"))
    cuda = torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.10 GiB"
    )
    assert oom.requested_bytes(cuda) == int(2.5 * (1 << 30))
    assert oom.requested_bytes(RuntimeError("you tried to allocate 4096 bytes")) == 4096
    assert oom.requested_bytes(MemoryError()) is None
    # a job is oom when any rank ran out of memory: that is why the others failed
    assert _worst(["ok", "failed", "oom"]) == "oom"


def test_injected_oom_in_process(tmp_path):
    """An allocation failure raised inside a module's forward (a fault injected with a
    hook): status oom, the module's path, the user's line, and a normal run beside it."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def fail(module, args):
        if fail.armed:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB.")

    fail.armed = False
    net[2].register_forward_pre_hook(fail)
    with pytest.raises(torch.OutOfMemoryError), swift_nb.profile(out_dir=tmp_path, report=False) as run:
        for step in range(4):
            fail.armed = step == 3
            net(torch.randn(16, 32)).sum().backward()
            opt.step()
            opt.zero_grad()
    saved = load_run(run.path)
    assert saved.status == "oom"
    o = saved.oom
    assert o.step == 3 and o.phase == "forward" and o.module == "net.2"
    assert o.requested_bytes == 20 * MIB
    assert "test_oom.py:" in o.where and o.where.endswith(" in fail")  # the deepest line of the user's code
    assert o.categories["parameters"] == sum(p.numel() * 4 for p in net.parameters())
    assert o.categories["activations"] > 0  # the first layers' outputs, saved for backward
    assert saved.summary["steps"] == 3
    assert saved.oom == OutOfMemory.from_dict(o.__dict__)  # round trip through run.json
