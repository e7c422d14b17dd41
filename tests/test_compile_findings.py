"""What the advisor and the report say about torch.compile: the recompile's guard and fix,
the graph break's line, reason and fix, compile time against the steady steps, an eager
loop's overhead answered with the compile toggle, a compile-dominated verdict, and the
compiled rows of the operators table."""

from __future__ import annotations

import pytest
import test_compile_capture as capture
from test_advisor_rules import TH, _evidence

import swift_nb
from swift_nb.analysis import analyze
from swift_nb.analysis.advisor import bottleneck
from swift_nb.analysis.advisor.evidence import Compiled
from swift_nb.analysis.advisor.rules import compile_time, graph_break, overhead, recompile
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_compile_time_is_counted_in_steady_steps(analyzed):
    run, analysis = analyzed
    f = _finding(analysis, "compile_time")
    assert f.title.startswith(f"Compiling took {swift_nb.core.units.fmt_seconds(run.summary['compile_s'])}")
    assert "steady steps' worth" in f.title
    assert "the eager step, which this run did not measure" in f.suggestion


@pytest.mark.slow
def test_a_compile_dominated_run_is_not_called_compute_bound(analyzed):
    _, analysis = analyzed
    assert analysis.verdict.kind == "compile-bound"
    assert analysis.verdict.reason.startswith("compiling took ")
    assert "the steady steps (median " in analysis.verdict.reason


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_summary_shows_compile_apart_from_the_step_time(analyzed):
    run, _ = analyzed
    rows = dict(summary_rows(run))
    assert rows["torch.compile"].startswith(
        swift_nb.core.units.fmt_seconds(run.summary["compile_s"]) + " compiling; "
    )
    assert "1 graph breaks" in rows["torch.compile"]


# -- hand-built evidence ---------------------------------------------------------------------


def _compiled(**changes) -> Compiled:
    base = dict(
        compile_s=4.0,
        events=({"kind": "compile", "step": 0, "seconds": 4.0, "reason": None, "where": "train.py:3"},),
        steady_step_s=0.1,
        steps=100,
        compiling_steps=1,
        steps_s=4.0 + 99 * 0.1,
    )
    base.update(changes)
    return Compiled(**base)


def test_compile_pays_for_itself_after_n_steps_with_an_eager_baseline():
    f = compile_time.rule(_evidence(compiled=_compiled(eager_step_s=0.15)), TH, {})
    assert f.title == "torch.compile pays for itself after 80 steps"
    assert "each compiled step saves 50.0 ms against eager (150.0 ms)" in f.suggestion
    slower = compile_time.rule(_evidence(compiled=_compiled(eager_step_s=0.08)), TH, {})
    assert slower.title.startswith("torch.compile does not pay")


def test_without_a_baseline_compile_is_counted_in_steady_steps():
    f = compile_time.rule(_evidence(compiled=_compiled()), TH, {})
    assert f.title == "Compiling took 4.00 s: 40 steady steps' worth"


def test_an_eager_overhead_bound_loop_is_offered_the_compile_toggle():
    tiny_ops = dict(ops_per_step=900.0, median_op_us=8.0, heavy_op_share=0.2)
    eager = overhead.rule(_evidence(**tiny_ops), TH, {})
    assert eager.toggle == "torch_compile"
    assert "torch.compile fusing the small ops" in eager.predicted_effect
    compiled = overhead.rule(_evidence(compiled=_compiled(), **tiny_ops), TH, {})
    assert compiled.toggle is None


def test_a_value_guard_and_an_unknown_break_get_their_own_words():
    events = (
        {"kind": "recompile", "step": 1, "seconds": 0.5, "reason": "___stack0 == 0.25", "where": "m.py:9"},
        {
            "kind": "graph_break",
            "step": 0,
            "reason": "Unsupported thing",
            "where": "m.py:8",
            "hints": ["Do X."],
        },
    )
    ev = _evidence(compiled=_compiled(events=events))
    assert "crossed a graph break and was baked into the next graph" in recompile.rule(ev, TH, {}).suggestion
    assert "m.py:8: Unsupported thing — fix: Do X" in graph_break.rule(ev, TH, {}).suggestion


def test_compile_under_half_the_steps_time_leaves_the_verdict_to_the_steps():
    assert bottleneck(_evidence(compiled=_compiled()), TH).kind == "compute-bound"
    heavy = _evidence(compiled=_compiled(compile_s=20.0, steps_s=29.9))
    assert bottleneck(heavy, TH).kind == "compile-bound"
