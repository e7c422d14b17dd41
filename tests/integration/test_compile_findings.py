"""What the advisor and the report say about torch.compile: the recompile's guard and fix,
the graph break's line, reason and fix, compile time against the steady steps, an eager
loop's overhead answered with the compile toggle, a compile-dominated verdict, and the
compiled rows of the operators table."""

from __future__ import annotations

import pytest
import test_compile_capture as capture

import swift_nb
from swift_nb.analysis import analyze
from swift_nb.analysis.operators import compiling_steps, top_operators
from swift_nb.analysis.trace.tables import load_trace
from swift_nb.render.tables import summary_rows


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory):
    """The compiled loop of test_compile_capture, its profiled window on the steady steps
    before the size change and the recompiling step."""
    run = capture.compiled_run(tmp_path_factory.mktemp("runs"), wait=1, warmup=1, active=3)
    return run, analyze(swift_nb.load_run(run.path))


def _finding(analysis, rule_id):
    found = [f for f in analysis.findings if f.id == rule_id]
    assert found, [f.id for f in analysis.findings]
    return found[0]


def test_the_recompile_names_its_guard_and_the_dynamic_fix(analyzed):
    _, analysis = analyzed
    f = _finding(analysis, "recompile")
    assert f"tensor 'x' changed size at dim 0 (8 → 12) at step {capture.SIZE_CHANGE_STEP}" in f.title
    assert "torch.compile(model, dynamic=True)" in f.suggestion
    assert "torch._dynamo.mark_dynamic(x, 0)" in f.suggestion
    assert (
        f"`tensor 'x' size mismatch at index 0. expected 8, actual 12` in forward at {capture.__file__}"
        in (f.suggestion)
    )
    assert f.toggle == "torch_compile"
    # the float from .item() crossing the break is guarded too, and named as such
    assert "after its graph break at line" in f.suggestion
    assert "crossed a graph break and was baked into the next graph" in f.suggestion


def test_the_graph_break_names_its_line_reason_and_fix(analyzed):
    _, analysis = analyzed
    f = _finding(analysis, "graph_break")
    where = f"{capture.__file__}:{capture.BREAK_LINE}"
    assert (
        f.title
        == f"torch.compile's graph breaks at {where}: Unsupported Tensor.item() call with capture_scalar_outputs=False"
    )
    assert "torch._dynamo.config.capture_scalar_outputs = True" in f.suggestion
    assert "keep the value a tensor" in f.suggestion


def test_compile_time_is_counted_in_steady_steps(analyzed):
    run, analysis = analyzed
    f = _finding(analysis, "compile_time")
    assert f.title.startswith(f"Compiling took {swift_nb.core.units.fmt_seconds(run.summary['compile_s'])}")
    assert "steady steps' worth" in f.title
    assert "the eager step, which this run did not measure" in f.suggestion


def test_a_compile_dominated_run_is_not_called_compute_bound(analyzed):
    _, analysis = analyzed
    assert analysis.verdict.kind == "compile-bound"
    assert analysis.verdict.reason.startswith("compiling took ")
    assert "the steady steps (median " in analysis.verdict.reason


def test_the_operators_table_marks_compiled_code(analyzed):
    run, analysis = analyzed
    ops = analysis.operators_time
    assert "compiled" in ops
    flags = dict(zip(ops["name"] + "|" + ops["compiled"].astype(str), ops["compiled"], strict=True))
    assert flags.get("CompiledFunction|True") is True
    # the linear layers run inside the compiled forward; the loss, outside the model, eagerly
    assert ops.loc[ops["name"] == "aten::addmm", "compiled"].all()
    every = top_operators(None, n=None, trace=load_trace(run), skip_steps=compiling_steps(run))
    assert not every.loc[every["name"] == "aten::pow", "compiled"].any()
    # the compiling steps are left out: dynamo's tracing spans are not operators of the loop
    assert not every["name"].str.contains("dynamo_timed").any()


def test_the_summary_shows_compile_apart_from_the_step_time(analyzed):
    run, _ = analyzed
    rows = dict(summary_rows(run))
    assert rows["torch.compile"].startswith(
        swift_nb.core.units.fmt_seconds(run.summary["compile_s"]) + " compiling; "
    )
    assert "1 graph breaks" in rows["torch.compile"]
