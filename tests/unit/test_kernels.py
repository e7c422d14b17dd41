"""How well the kernels fill the GPU, read from real CUDA traces (``tests/data/gpu``, from
``../shared/traces``): each step's kernel-time-weighted achieved occupancy, the share of
kernel time in kernels launching fewer blocks than SMs and the tensor cores' share of GEMM
time, checked against the same figures computed here from the trace's JSON, event by
event, without swift_nb's tables."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from swift_nb.analysis.kernels import fill_summary, kernel_fill
from swift_nb.analysis.trace.tables import read_trace
from swift_nb.core import trace_names as tn

GPU = Path(__file__).parents[1] / "data" / "gpu"
TRACES = ["gpu_1rank_5steps.json.gz", "gpu_nccl_2ranks_rank0.json.gz", "gpu_128ranks_rank0.json.gz"]


def _by_hand(path: Path) -> dict[int, dict[str, float]]:
    """Per step: (Σ occupancy·dur, Σ dur with occupancy, Σ dur with blocks < 1, Σ dur with
    blocks, Σ gemm dur, Σ tensor-core gemm dur), from the JSON's kernel events."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1]))
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    )
    out: dict[int, dict[str, float]] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "kernel":
            continue
        step = next((s for t0, t1, s in steps if t0 <= e["ts"] <= t1), None)
        if step is None:
            continue
        a, d = e.get("args", {}), float(e.get("dur", 0.0))
        acc = out.setdefault(step, dict.fromkeys(("occ_w", "occ_d", "under", "blocks_d", "gemm", "tc"), 0.0))
        if "est. achieved occupancy %" in a:
            acc["occ_w"] += a["est. achieved occupancy %"] * d
            acc["occ_d"] += d
        if "blocks per SM" in a:
            acc["blocks_d"] += d
            acc["under"] += d if a["blocks per SM"] < 1 else 0.0
        if tn.kernel_kind(e["name"]) == "gemm":
            acc["gemm"] += d
            acc["tc"] += 0.0 if tn.SIMT_SGEMM.search(e["name"]) else d
    return out


# HolisticTraceAnalysis 0.5.0's parse of the same files (its est_occupancy, blocks_per_sm,
# iteration and unrounded durations), reduced as analysis.kernels reduces them: kernel-time-
# weighted occupancy and under-filled % of the recorded steps (benchmarks/hta_compare.py
# prints them; HTA has no such summary of its own)
HTA_KERNELS = {
    "gpu_1rank_5steps.json.gz": (46.45, 7.31),
    "gpu_nccl_2ranks_rank0.json.gz": (35.31, 40.27),
    "gpu_128ranks_rank0.json.gz": (21.04, 67.60),
    "gpu_128ranks_rank1.json.gz": (25.19, 60.39),
}


@pytest.mark.parametrize("name", sorted(HTA_KERNELS))
def test_the_kernel_figures_agree_with_htas_parse_within_a_point(name):
    summary = fill_summary(read_trace(GPU / name))
    occupancy, under = HTA_KERNELS[name]
    assert abs(summary["kernel_occupancy_pct"] - occupancy) <= 1.0
    assert abs(summary["kernel_under_filled_pct"] - under) <= 1.0


@pytest.mark.parametrize("name", TRACES)
def test_each_steps_fill_matches_a_count_by_hand(name):
    fill = kernel_fill(read_trace(GPU / name)).set_index("step")
    hand = _by_hand(GPU / name)
    assert set(fill.index) == set(hand) and len(hand) >= 1
    for step, h in hand.items():
        row = fill.loc[step]
        assert row["occupancy_pct"] == pytest.approx(h["occ_w"] / h["occ_d"], rel=1e-9)
        assert row["under_filled_share"] == pytest.approx(h["under"] / h["blocks_d"], rel=1e-9, abs=1e-12)
        if h["gemm"]:
            assert row["tensor_core_gemm_share"] == pytest.approx(h["tc"] / h["gemm"], rel=1e-9)
        assert 0 <= row["occupancy_pct"] <= 100


def test_the_summary_is_over_every_recorded_steps_kernels():
    trace = read_trace(GPU / "gpu_1rank_5steps.json.gz")
    hand = _by_hand(GPU / "gpu_1rank_5steps.json.gz").values()
    occ = sum(h["occ_w"] for h in hand) / sum(h["occ_d"] for h in hand)
    under = sum(h["under"] for h in hand) / sum(h["blocks_d"] for h in hand)
    summary = fill_summary(trace)
    assert summary["kernel_occupancy_pct"] == round(occ, 1)
    assert summary["kernel_under_filled_pct"] == round(100 * under, 1)


def test_a_cpu_trace_has_no_fill(tmp_path):
    from swift_nb.analysis.trace.tables import parse_events

    trace = parse_events(
        [
            {
                "ph": "X",
                "name": "ProfilerStep#1",
                "cat": "user_annotation",
                "ts": 0,
                "dur": 10,
                "pid": 1,
                "tid": 1,
            },
            {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1, "dur": 5, "pid": 1, "tid": 1},
        ]
    )
    assert kernel_fill(trace).empty and fill_summary(trace) == {}


def test_busy_but_under_filled_kernels_are_a_finding(tmp_path):
    """The 1-rank trace (busy 98 % of its window, kernels at 46 % occupancy, 7 % under-filled:
    no finding) with every kernel's launch rewritten to half a block per SM at 10 %
    occupancy, as a model of tiny kernels records: ``idle_sms``, and the Summary's row."""
    import swift_nb

    plain = swift_nb.import_trace(GPU / "gpu_1rank_5steps.json.gz", tmp_path / "plain")
    assert "idle_sms" not in {f.id for f in swift_nb.report(plain).analysis.findings}
    doc = json.loads(gzip.decompress((GPU / "gpu_1rank_5steps.json.gz").read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and "blocks per SM" in e.get("args", {}):
            e["args"].update({"blocks per SM": 0.5, "est. achieved occupancy %": 10})
    small = tmp_path / "small_kernels.json"
    small.write_text(json.dumps(doc))
    run = swift_nb.import_trace(small, tmp_path / "small")
    assert run.summary["kernel_occupancy_pct"] == 10.0 and run.summary["kernel_under_filled_pct"] == 100.0
    found = {f.id: f for f in swift_nb.report(run).analysis.findings}
    idle = found["idle_sms"]
    assert idle.evidence["kernel_under_filled_pct"] == 100.0 and idle.evidence["device_busy_pct"] > 90
    assert idle.toggle == "torch_compile" and idle.evidence["under_filled_kernels"]
    html = (run.path / "report.html").read_text()
    assert "occupancy 10 %" in html and "100 % of kernel time on fewer blocks than SMs" in html
