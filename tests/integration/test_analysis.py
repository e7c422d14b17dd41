"""The analyses on real runs: breakdown adds up, memory categories match analytic sizes."""

from __future__ import annotations

import pandas.testing as pdt
import pytest
import torch

import swift_nb
from swift_nb.analysis import analyze
from swift_nb.analysis.breakdown import PARTS, step_breakdown
from swift_nb.analysis.memory import memory_footprint
from swift_nb.analysis.trace.tables import load_trace
from swift_nb.demo import make_model
from swift_nb.record import tables_path

B, T, D, H, L, V = 4, 64, 64, 2, 2, 256


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    torch.manual_seed(0)
    model = make_model(seq_len=T, n_layer=L, d_model=D, n_head=H, vocab_size=V, attn_impl="eager")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, V, (B, T))
    with swift_nb.profile(out_dir=tmp_path_factory.mktemp("runs"), wait=1, warmup=1, active=3) as run:
        for _ in range(6):
            opt.zero_grad(set_to_none=True)
            model(x, x).backward()
            opt.step()
    params = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    return run, sum(params.values()), len(list(model.parameters()))


def test_breakdown_parts_sum_to_the_measured_step_time(gpt_run):
    run, _, _ = gpt_run
    bd = step_breakdown(run)
    assert list(bd["step"]) == [2, 3, 4]
    parts = bd[PARTS].sum(axis=1)
    assert (parts - bd["step_s"]).abs().max() < 1e-9  # every instant has exactly one part
    measured = run.steps.set_index("step").loc[bd["step"], "duration_s"].to_numpy()
    assert (abs(parts.to_numpy() - measured) / measured).max() < 0.05
    assert (bd["forward_s"] > 0).all() and (bd["backward_s"] > 0).all() and (bd["optimizer_s"] > 0).all()
    assert (bd["comm_s"] == 0).all() and (bd["data_s"] == 0).all()


def test_memory_categories_match_analytic_sizes(gpt_run):
    run, param_bytes, n_tensors = gpt_run
    fp = memory_footprint(run).set_index("category")
    per_step = run.memory.groupby("step")[["gradients_bytes", "optimizer_state_bytes"]].agg(
        ["first", "max", "last"]
    )
    assert fp.loc["parameters", "at_peak_bytes"] == param_bytes, per_step
    assert fp.loc["gradients", "max_bytes"] == param_bytes, per_step
    # AdamW: exp_avg and exp_avg_sq like the fp32 weights, plus a 4-byte `step` per tensor
    assert fp.loc["optimizer_state", "at_peak_bytes"] == 2 * param_bytes + 4 * n_tensors, per_step
    # Saved for backward per block (fp32): LN in/out ×2, q, k, v, attention out, MLP in,
    # GELU in and out (4·d each) = 16·B·T·D, plus the softmax output B·H·T²; then the final
    # LayerNorm's input and output and the logits with their log-softmax.
    estimate = 4 * (L * (16 * B * T * D + B * H * T * T) + 2 * B * T * D + 2 * B * T * V)
    activations = fp.loc["activations", "max_bytes"]
    assert 0.5 * estimate <= activations <= 2 * estimate, (activations, estimate)
    assert run.summary["peak_mem_bytes"] >= 0.99 * fp["at_peak_bytes"].sum()


def test_analyze_and_report_from_a_run_folder(gpt_run):
    run, _, _ = gpt_run
    assert (run.path / "report.html").is_file()
    assert not any("analysis failed" in n for n in run.notes)
    result = analyze(swift_nb.load_run(run.path))
    assert result.verdict.kind in ("compute-bound", "overhead-bound", "memory-bound")
    assert result.throughput.batch_size == B and result.throughput.seq_len == T
    assert len(result.operators_time) == 15 and result.operators_memory["alloc_bytes"].iloc[0] > 0


def test_trace_tables_cache_matches_the_json_and_survives_corruption(gpt_run):
    run, _, _ = gpt_run
    cache = tables_path(run.trace_path)
    assert cache.is_file()  # written when the run was analyzed
    cache.unlink()
    fresh = load_trace(run)  # from the JSON; writes the cache again
    cached = load_trace(run)
    for name in ("events", "memory", "steps"):
        pdt.assert_frame_equal(getattr(fresh, name), getattr(cached, name), check_dtype=False)
    cache.write_bytes(b"not an npz")
    pdt.assert_frame_equal(load_trace(run).events, fresh.events, check_dtype=False)
