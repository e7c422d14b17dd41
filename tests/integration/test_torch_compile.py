"""The torch_compile toggle: the models a block uses (found in the namespace, or built in
it) are compiled for the block and eager again after; bad parameters and a missing C++
compiler are refused before any work; ``--compare torch_compile`` reruns the cell with
``--compile`` and the comparison shows its compile time apart from the steady steps."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import swift_nb
from swift_nb.core.errors import ConfigError
from swift_nb.core.units import fmt_seconds
from swift_nb.record import step_durations
from swift_nb.render.comparison.page import compare_table_text, display_table
from swift_nb.rerun import comparison, parse_variants, run_variants
from swift_nb.toggles import get
from swift_nb.toggles.torch_compile import CompilerMissingError, cxx_compiler

needs_compiler = pytest.mark.skipif(
    cxx_compiler() is None,
    reason="Inductor needs a C++ compiler on CPU and none is installed (g++, c++, clang++)",
)


def _frames() -> int:
    return sum(counters["frames"].values())


@needs_compiler
def test_models_are_compiled_for_the_block_and_eager_after(tmp_path):
    torch.set_num_threads(1)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    weight = model[0].weight
    with swift_nb.profile(
        toggles=["torch_compile"], out_dir=tmp_path, wait=0, warmup=1, active=2, report=False
    ) as run:
        head = torch.nn.Linear(1, 1)  # built in the block: compiled from its second call
        for _ in range(4):
            head(model(torch.randn(4, 8))).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    (report,) = run.context["toggles"]
    assert report["changes"] == [
        "`model` (Sequential) compiled (backend=inductor, mode=default)",
        "`new Linear` (Linear) compiled (backend=inductor, mode=default)",
    ]
    assert report["details"]["compiled_models"] == 2
    assert run.summary["compile_s"] > 0 and run.steps["compile_s"].iloc[0] > 0

    # undone: the same module, its own parameters trained, running eagerly again
    assert "forward" not in model.__dict__ and "forward" not in head.__dict__
    assert model[0].weight is weight and opt.param_groups[0]["params"][0] is weight
    before = _frames()
    model(torch.randn(3, 8))  # a new batch size would recompile a compiled model
    head(torch.ones(2, 1))
    assert _frames() == before


def test_the_toggle_itself_causes_no_recompile(tmp_path):
    """Its hook that finds models built in the block runs inside compiled forwards too;
    dynamo must not guard on what it has seen (aot_eager calls a graph module each step)."""
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    toggles = ["torch_compile(backend=aot_eager)"]
    with swift_nb.profile(toggles=toggles, out_dir=tmp_path, wait=0, warmup=1, active=2, report=False) as run:
        for _ in range(5):
            model(torch.randn(4, 8)).sum().backward()
            swift_nb.step()
    assert run.summary["recompiles"] == 0, run.context["compile"]["events"]
    assert run.summary["compile_s"] > 0


def test_bad_parameters_and_a_missing_compiler_are_refused_before_any_work(monkeypatch):
    with pytest.raises(
        ConfigError,
        match=r"torch_compile mode must be one of default, reduce-overhead, max-autotune; got 'fast'",
    ):
        parse_variants("torch_compile(mode=fast)")
    with pytest.raises(ConfigError, match=r"torch_compile dynamic must be true or false; got 'sometimes'"):
        get("torch_compile", dynamic="sometimes")
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(
        CompilerMissingError, match=r"needs a C\+\+ compiler for Inductor on CPU.*backend=aot_eager"
    ):
        parse_variants("torch_compile(mode=max-autotune)")
    assert get("torch_compile", backend="aot_eager").values["backend"] == "aot_eager"


def test_nothing_to_compile_is_said():
    toggle = get("torch_compile", backend="eager")
    toggle.apply({"loss": torch.nn.MSELoss()})
    report = toggle.undo()
    assert report.notes == ["no model ran a forward pass while the toggle was applied: nothing was compiled"]


SETUP = (
    "import torch\n"
    "torch.set_num_threads(1)\n"
    "torch.manual_seed(0)\n"
    "model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))\n"
    "opt = torch.optim.SGD(model.parameters(), lr=1e-3)\n"
)
TRAIN = (
    "for _ in range(6):\n"
    "    model(torch.randn(8, 16)).pow(2).mean().backward()\n"
    "    opt.step(); opt.zero_grad()\n"
)


@needs_compiler
def test_compare_shows_compile_time_apart_from_the_steady_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    outcomes = run_variants(
        [SETUP],
        TRAIN,
        "--wait 0 --warmup 1 --active 2",
        parse_variants("torch_compile"),
        tmp_path,
        timeout_s=300,
    )
    assert [o.status for o in outcomes] == ["ok", "ok"], [(o.status, o.error) for o in outcomes]
    compared = comparison([(o, swift_nb.load_run(o.run_path)) for o in outcomes])
    table = compared.table.set_index("variant")
    base, compiled = table.loc["baseline"], table.loc["torch_compile"]
    assert base["compile_s"] == 0 and base["recompiles"] == 0
    assert compiled["compile_s"] > 0
    run = dict(compared.runs)["torch_compile"]
    assert run.context["toggles"][0]["changes"] == [
        "`model` (Sequential) compiled (backend=inductor, mode=default)"
    ]
    # the step time leaves the compiling steps out (record.step_durations); the one with them is kept apart
    steps = run.steps[run.steps["trigger"] != "end"]
    timed, _ = step_durations(run.steps)
    assert set(timed.index) <= set(steps.index[steps["compile_s"] == 0])
    assert compiled["step_time_median_s"] == pytest.approx(timed.median())
    assert compiled["step_time_median_all_s"] == pytest.approx(steps["duration_s"].median())

    shown = display_table(compared.table).set_index("variant")
    assert shown.loc["torch_compile", "compile"] == fmt_seconds(compiled["compile_s"])
    assert shown.loc["baseline", "compile"] == fmt_seconds(0.0)
    assert shown.loc["torch_compile", "step (median, profiler off)"] == fmt_seconds(
        compiled["step_time_median_s"]
    )
    assert shown.loc["torch_compile", "step incl. compile"] == fmt_seconds(compiled["step_time_median_all_s"])
    assert "compile" in compare_table_text(compared.table).splitlines()[0]
