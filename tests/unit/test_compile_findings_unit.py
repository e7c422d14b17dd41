"""What the advisor and the report say about torch.compile: the recompile's guard and fix,
the graph break's line, reason and fix, compile time against the steady steps, an eager
loop's overhead answered with the compile toggle, a compile-dominated verdict, and the
compiled rows of the operators table."""

from __future__ import annotations

from test_advisor_rules import TH, _evidence

from swift_nb.analysis.advisor import bottleneck
from swift_nb.analysis.advisor.evidence import Compiled
from swift_nb.analysis.advisor.rules import compile_time, graph_break, overhead, recompile


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
