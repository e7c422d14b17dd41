"""torch.compile's work recorded by swift_nb.capture.compile: compile seconds per step,
recompiles (the guard that failed) and graph breaks (their line and reason), on a tiny
compiled model with a batch-size change and a ``.item()`` graph break."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

import swift_nb
from swift_nb.capture.compile import CompileRecorder

SIZE_CHANGE_STEP = 4
STEPS = 7


class Scaled(torch.nn.Module):
    """A small MLP whose output is scaled by a Python float read with ``.item()``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        scale = h.mean().item()  # BREAK_LINE: a graph break
        return self.b(h) * scale


BREAK_LINE = next(
    i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if "# BREAK_LINE" in line
)
FORWARD_LINE = BREAK_LINE - 2  # `def forward`


def compiled_run(out_dir, steps: int = STEPS, backend: str = "aot_eager", **options):
    """A compiled training loop under swift_nb.profile(): the batch grows from 8 to 12 at
    SIZE_CHANGE_STEP (a recompile)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Scaled()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    fast = torch.compile(model, backend=backend)
    with swift_nb.profile(out_dir=out_dir, **options) as run:
        for step in range(steps):
            x = torch.randn(8 if step < SIZE_CHANGE_STEP else 12, 16)
            fast(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    return run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return compiled_run(tmp_path_factory.mktemp("runs"), wait=1, warmup=1, active=3)


def test_each_step_has_its_compile_seconds(run):
    compile_s = run.steps["compile_s"].tolist()
    assert compile_s[0] > 0  # the first call compiles the forward and its resume function
    assert compile_s[SIZE_CHANGE_STEP] > 0  # the batch size changed: recompiled
    assert all(s == 0 for s in compile_s[SIZE_CHANGE_STEP + 1 :])
    assert run.summary["compile_s"] == pytest.approx(sum(compile_s))


def test_step_time_median_leaves_compiling_steps_out(run):
    steps = run.steps
    steady = steps.loc[steps["compile_s"] == 0, "duration_s"]
    assert run.summary["step_time_median_s"] == pytest.approx(steady.median())
    assert run.summary["step_time_median_all_s"] == pytest.approx(steps["duration_s"].median())


def test_summary_counts_recompiles_and_distinct_graph_breaks(run):
    assert run.summary["recompiles"] >= 1
    assert run.summary["graph_breaks"] == 1  # met again when the forward recompiled: one break


def test_the_recompile_names_the_guard_and_the_compiled_function(run):
    events = run.context["compile"]["events"]
    size = [e for e in events if e["kind"] == "recompile" and "size mismatch" in (e["reason"] or "")]
    assert size, events
    first = size[0]
    assert first["step"] == SIZE_CHANGE_STEP
    assert first["reason"].startswith("tensor 'x' size mismatch at index 0. expected 8, actual 12")
    assert first["where"] == f"{__file__}:{FORWARD_LINE}"
    assert first["function"] == "forward"
    assert first["seconds"] > 0


def test_the_graph_break_names_its_line_and_reason(run):
    breaks = [e for e in run.context["compile"]["events"] if e["kind"] == "graph_break"]
    assert len(breaks) == 1
    brk = breaks[0]
    assert brk["step"] == 0
    assert brk["where"] == f"{__file__}:{BREAK_LINE}"
    assert "Tensor.item()" in brk["reason"]
    assert any("capture_scalar_outputs" in h for h in brk["hints"])
    assert brk["seconds"] is None


def test_first_compile_is_a_compile_of_forward(run):
    first = run.context["compile"]["events"][0]
    assert first["kind"] == "compile" and first["step"] == 0 and first["function"] == "forward"
    assert first["where"] == f"{__file__}:{FORWARD_LINE}"


def test_the_record_reads_back(run):
    loaded = swift_nb.load_run(run.path)
    assert loaded.steps["compile_s"].tolist() == pytest.approx(run.steps["compile_s"].tolist())
    assert loaded.context["compile"]["events"] == run.context["compile"]["events"]


def test_an_eager_cell_records_no_compile(tmp_path):
    from support.common import train

    with swift_nb.profile(out_dir=tmp_path, report=False) as run:
        train(3)
    assert (
        run.summary["compile_s"] == 0 and run.summary["recompiles"] == 0 and run.summary["graph_breaks"] == 0
    )
    assert "compile" not in run.context
    assert (run.steps["compile_s"] == 0).all()
    assert run.summary["step_time_median_s"] == run.summary["step_time_median_all_s"]


def test_dynamo_logger_and_callbacks_are_restored():
    from torch._dynamo import symbolic_convert
    from torch._dynamo.callback import callback_handler

    log = symbolic_convert.graph_break_log
    before = (log.level, log.propagate, list(log.handlers))
    starts, ends = len(callback_handler.start_callbacks), len(callback_handler.end_callbacks)
    rec = CompileRecorder()
    rec.install()
    assert log.isEnabledFor(logging.DEBUG)
    rec.remove()
    rec.remove()
    assert (log.level, log.propagate, list(log.handlers)) == before
    assert (len(callback_handler.start_callbacks), len(callback_handler.end_callbacks)) == (starts, ends)


def test_without_dynamo_the_recorder_says_so_and_records_nothing(monkeypatch):
    from swift_nb.record import Run

    monkeypatch.setitem(
        sys.modules, "torch._dynamo.callback", None
    )  # an import that fails, as without dynamo
    rec = CompileRecorder()
    rec.install()
    assert rec.unavailable is not None and "torch._dynamo" in rec.unavailable
    assert rec.at_boundary() == 0.0
    rec.remove()
    run = Run(id="r")
    rec.add_to(run)
    assert run.notes == [rec.unavailable] and "compile" not in run.context and "compile_s" not in run.summary
