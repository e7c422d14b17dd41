"""swift_nb.diff (analysis.diff), its text and HTML (render.diff), compare.html's "What
changed", and the `swift-nb diff` gate: on two real GPU traces imported (tests/data/gpu, from
HolisticTraceAnalysis's test data) and on a CPU pair where the flash_attention toggle swaps
eager attention for SDPA."""

from __future__ import annotations

import pytest
from support.diff import (
    _row,
    gpu_pair,  # noqa: F401 (fixtures)
)

import swift_nb
from swift_nb.analysis.comparison.run_diff import (
    BOTH,
    CHANGE_COLUMNS,
    KERNEL,
    KERNEL_KIND,
    NOT_CHECKED,
    ONLY_A,
    ONLY_B,
    OPERATOR,
    REGRESSION,
    WITHIN,
    environment_changes,
    gate,
    short_name,
)
from swift_nb.analysis.device import kernels_by_kind
from swift_nb.analysis.trace.tables import load_trace, parse_events
from swift_nb.cli import main
from swift_nb.record import Run
from swift_nb.render.comparison.run_diff import diff_html, diff_text

NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def test_two_gpu_traces(gpu_pair):
    a, b = gpu_pair
    d = swift_nb.diff(a.path, b.path)
    assert (d.a_name, d.b_name, d.a_steps, d.b_steps) == ("gpu_1rank_5steps", "gpu_nccl_2ranks_rank0", 5, 3)
    env = d.environment.set_index("field")
    assert env.loc["GPU"].tolist() == ["Tesla V100-SXM2-32GB", "NVIDIA A100-PG509-200"]
    assert env.loc["world size"].tolist() == ["1", "2"]
    # facts neither trace records (torch, Python) are no difference; both are eager
    assert not {"torch", "Python", "compiled"} & set(env.index)

    assert list(d.changes.columns) == CHANGE_COLUMNS
    size = d.changes["delta_ms_per_step"].abs().to_numpy()
    assert (size[:-1] >= size[1:]).all()  # ranked by |Δ ms per step|
    one_run = d.changes[d.changes["status"] != BOTH]
    assert (one_run.loc[one_run["status"] == ONLY_A, "b_ms_per_step"] == 0).all()
    assert (one_run.loc[one_run["status"] == ONLY_B, "a_ms_per_step"] == 0).all()

    # all-reduce is what B does and A does not: its kind and its kernel are new
    comm, kernel = _row(d, KERNEL_KIND, "communication"), _row(d, KERNEL, NCCL)
    assert comm["status"] == kernel["status"] == ONLY_B
    assert comm["b_ms_per_step"] == pytest.approx(15.6, abs=0.1)
    conv = _row(d, KERNEL_KIND, "convolution")
    assert conv["status"] == BOTH and conv["delta_ms_per_step"] < -20  # a smaller net on a faster GPU
    # per recorded step: a kind's device time over B's 3 steps
    kinds = kernels_by_kind(load_trace(b), by_step=True)
    assert comm["b_ms_per_step"] == pytest.approx(
        1e3 * kinds.loc[kinds["kind"] == "communication", "time_s"].sum() / 3
    )
    # the kernels add up to their kinds (copies and sets are kinds, not kernels)
    for side in ("a_ms_per_step", "b_ms_per_step"):
        kinds_ms = d.changes.loc[
            (d.changes["kind"] == KERNEL_KIND) & ~d.changes["name"].isin(["memcpy", "memset"]), side
        ]
        assert d.changes.loc[d.changes["kind"] == KERNEL, side].sum() == pytest.approx(kinds_ms.sum())
    assert _row(d, OPERATOR, "aten::cudnn_convolution")["status"] == BOTH

    assert d.step_regression_pct == pytest.approx(
        100 * (b.summary["step_time_median_s"] / a.summary["step_time_median_s"] - 1)
    )
    assert d.memory_regression_pct is None  # recorded without profile_memory: no peak
    for said in (
        "GPU: Tesla V100-SXM2-32GB → NVIDIA A100-PG509-200",
        "world size: 1 → 2",
        "step time: 95.6 → 222.4 ms (×2.3)",
        "communication kernels are new: 15.6 ms per step",
        "ncclKernel_AllReduce_RING_LL_Sum_float is new: 15.6 ms per step",
        "convolution kernels: 36.2 → 7.12 ms per step (−29.12 ms, −80.4 %)",
    ):
        assert said in d.sentences, (said, d.sentences)
    assert any(s.startswith("aten::") and " (host): " in s for s in d.sentences)


def test_a_run_against_itself_changes_nothing(gpu_pair):
    a, _ = gpu_pair
    d = swift_nb.diff(a, a)
    assert d.environment.empty and (d.changes["status"] == BOTH).all()
    assert (d.changes["delta_ms_per_step"] == 0).all()
    assert d.sentences == ["step time: 95.6 → 95.6 ms (+0.0 %)"]
    assert d.step_regression_pct == 0


def test_gate_outcomes(gpu_pair):
    d = swift_nb.diff(*gpu_pair)
    assert gate(d) == []
    assert gate(d, max_step_pct=5) == [(REGRESSION, "step time +132.8 %, more than the 5 % allowed")]
    assert gate(d, max_step_pct=200, max_memory_pct=5) == [
        (WITHIN, "step time +132.8 %, within the 200 % allowed"),
        (NOT_CHECKED, "peak memory: gpu_1rank_5steps and gpu_nccl_2ranks_rank0 record none"),
    ]


def test_text_and_html(gpu_pair):
    d = swift_nb.diff(*gpu_pair, names=("<a>", "b & c"))
    text = diff_text(d, rows=5)
    assert text.startswith("What changed: <a> → b & c (per step over 5 and 3 recorded steps)")
    assert "- world size: 1 → 2" in text and f"({len(d.changes) - 5} smaller changes not shown)" in text
    assert "only in b & c" in text and "ncclKernel_AllReduce_RING_LL_Sum_float" in text
    html = diff_html(d)
    assert "<h3>&lt;a&gt; → b &amp; c</h3>" in html and "<a>" not in html
    assert "<li>communication kernels are new: 15.6 ms per step</li>" in html


def test_short_names():
    assert short_name(NCCL) == "ncclKernel_AllReduce_RING_LL_Sum_float"
    long = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >(int, float)"
    )
    assert short_name(long) == "at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>"
    cat = (
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 1, 128, 1>(float*)"
    )
    assert short_name(cat) == "at::native::CatArrayBatchedCopy<float, unsigned int, 1, 128, 1>"
    assert short_name("autograd::engine::evaluate_function: BmmBackward0") == (
        "autograd::engine::evaluate_function: BmmBackward0"
    )
    assert short_name("x" * 100, width=10) == "x" * 9 + "…"


def test_environment_from_context_and_trace():
    """Compiled or not is read from the trace (the compiled graph's autograd function); the
    rest from the record, a fact one run does not record shown as None."""

    def trace(*names):
        step = {"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 100}
        ops = [{"ph": "X", "name": n, "cat": "cpu_op", "ts": 10, "dur": 5} for n in names]
        return parse_events([{**e, "pid": 1, "tid": 1} for e in (step, *ops)])

    eager = Run(id="a", environment={"device": "cuda", "devices": ["A100"], "torch": "2.5.0"})
    eager.context = {"dtype": "float32", "toggles": [], "trainer": {"arguments": {"bf16": False}}}
    compiled = Run(id="b", environment={"device": "cuda", "devices": ["H100"]})
    compiled.context = {
        "dtype": "bfloat16",
        "toggles": [{"toggle": "galore"}],
        "trainer": {"arguments": {"bf16": True}},
    }
    env = environment_changes(eager, compiled, trace("aten::mm"), trace("CompiledFunction", "aten::mm"))
    assert env.set_index("field").to_dict("index") == {
        "GPU": {"a": "A100", "b": "H100"},
        "torch": {"a": "2.5.0", "b": None},
        "parameter dtype": {"a": "float32", "b": "bfloat16"},
        "mixed precision": {"a": "no", "b": "bf16"},
        "toggles": {"a": "none", "b": "galore"},
        "compiled": {"a": "no", "b": "yes"},
    }


def test_compare_html_says_what_changed(gpu_pair):
    a, b = gpu_pair
    swift_nb.compare(a, b, html=True)
    page = (a.path / "compare.html").read_text()
    assert "<h2>What changed</h2><h3>gpu_1rank_5steps → gpu_nccl_2ranks_rank0</h3>" in page
    assert "<li>world size: 1 → 2</li>" in page


def test_bad_limits_and_folders_are_usage_errors(gpu_pair, tmp_path, capsys):
    a, b = gpu_pair
    for bad in ("abc", "-1", "nan"):
        with pytest.raises(SystemExit) as info:
            main(["diff", str(a.path), str(b.path), "--max-step-regression-pct", bad])
        assert info.value.code == 2
        out = capsys.readouterr()
        assert "must be a percentage ≥ 0" in out.err and out.out == ""
    assert main(["diff", str(a.path), str(tmp_path / "missing")]) == 2
    out = capsys.readouterr()
    assert "not a swift_nb run folder" in out.err and out.out == ""


def test_what_a_rank_holds_is_the_least_of_its_steps_maxima():
    """A copy that outlives its step in some steps (twice the gradient shard, in two of three
    steps) does not decide what the rank holds; what it holds in every step does."""
    import pandas as pd

    from swift_nb.analysis.comparison.variants import _held
    from swift_nb.record import MEMORY_CATEGORIES

    rows = []
    for step, grads in ((1, 32), (2, 16), (3, 32)):
        for t, live in enumerate((0, grads)):
            row = {f"{c}_bytes": 0.0 for c in MEMORY_CATEGORIES}
            row.update(
                step=step, t=t, parameters_bytes=16.0, gradients_bytes=float(live), optimizer_state_bytes=32.0
            )
            rows.append(row)
    held = _held(Run(id="r", memory=pd.DataFrame(rows)))
    assert (held["parameters"], held["gradients"], held["optimizer_state"]) == (16.0, 16.0, 32.0)
