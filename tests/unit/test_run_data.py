"""analysis.run_data: a run's trace read once and the intermediates several analyses share
derived once (``analyze`` hands each analysis its pieces); each piece is what its analysis
computes alone. On the recorded run of tests/data/cost_run, a GPU trace and a hand-written
trace; no training, no profiler."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_analysis_pure import _x  # one hand-built event for both pure modules

from swift_nb.analysis import analyze
from swift_nb.analysis.breakdown import step_breakdown
from swift_nb.analysis.comm import collectives, comm_per_step
from swift_nb.analysis.memory import memory_footprint
from swift_nb.analysis.operators import op_self_times_us
from swift_nb.analysis.run_data import run_data
from swift_nb.analysis.throughput import batch_and_seq
from swift_nb.analysis.trace import tables as trace_module
from swift_nb.analysis.trace.tables import load_trace, load_trace_file, parse_events, per_name, per_value
from swift_nb.core import trace_names as tn
from swift_nb.record import Run, load_run

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture
def cost_run(tmp_path) -> Run:
    folder = tmp_path / "run"
    shutil.copytree(DATA / "cost_run", folder)  # a copy: reading the trace caches its tables beside it
    return load_run(folder)


def _spy(monkeypatch, name: str, original: Callable) -> list[tuple]:
    """The arguments of every call to ``original`` from the package's modules that import it
    by ``name``."""
    calls: list[tuple] = []

    def spy(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    for module in list(sys.modules.values()):
        if (
            getattr(module, "__name__", "").startswith("swift_nb.")
            and getattr(module, name, None) is original
        ):
            monkeypatch.setattr(module, name, spy)
    return calls


def test_analyze_reads_the_trace_once_and_derives_each_shared_table_once(cost_run, monkeypatch):
    loads = _spy(monkeypatch, "load_trace", trace_module.load_trace)
    lookups = _spy(monkeypatch, "derived", trace_module.derived)
    analyze(cost_run)
    assert len(loads) == 1
    keys = [args[1] for args in lookups]
    assert len(keys) == len(set(keys)), f"derived tables looked up again: {keys}"
    assert {k.split("/")[0] for k in keys} == {
        "breakdown",
        "self_times",
        "operators",
        "comm_per_step",
        "collectives",
        "device_work",
        "step_rows",
    }


def test_each_piece_is_what_its_analysis_computes_alone(cost_run):
    data = run_data(cost_run)
    alone = load_trace(cost_run)  # other tables: nothing derived from data.trace is reused
    assert alone.events is not data.trace.events
    pd.testing.assert_frame_equal(data.breakdown, step_breakdown(cost_run, alone))
    pd.testing.assert_frame_equal(data.footprint, memory_footprint(cost_run))
    ops = alone.events[(alone.events["cat"] == "cpu_op") & (alone.events["step"] >= 0)]
    pd.testing.assert_frame_equal(data.cpu_ops, ops)
    pd.testing.assert_series_equal(data.cpu_op_self_us, op_self_times_us(alone.events).reindex(ops.index))
    pd.testing.assert_frame_equal(data.comm_per_step, comm_per_step(alone))
    pd.testing.assert_frame_equal(data.collectives, collectives(alone, 1, 0))
    assert data.traced_batch_and_seq == batch_and_seq(alone.events) == (2, 32)
    assert (data.world_size, data.rank) == (1, 0)


def test_a_given_trace_is_not_read_again(cost_run, monkeypatch):
    trace = load_trace(cost_run)
    loads = _spy(monkeypatch, "load_trace", trace_module.load_trace)
    assert run_data(cost_run, trace).trace is trace
    analyze(cost_run, trace=trace)
    assert loads == []


def test_a_jobs_report_holds_one_ranks_tables_at_a_time(tmp_path, monkeypatch):
    """The report shares its own trace's tables between the analyses, the timeline and the
    places; every other rank is read, reduced and let go, so memory does not grow with the
    ranks (sharing every rank read held all 16 of a 16-rank job at once: 1.58 GiB against
    1.08 in benchmarks/scale.py)."""
    from support.imported_traces import JOB

    import swift_nb

    folder = swift_nb.import_trace(JOB, tmp_path, report=False).path
    held, reads = [], []
    real_load, real_share = trace_module._load_trace_file, trace_module.share

    def load(path, max_bytes):
        reads.append(Path(path).name)
        return real_load(path, max_bytes)

    def share(path, trace):
        real_share(path, trace)
        held.append(len(trace_module._SHARED or {}))

    monkeypatch.setattr(trace_module, "_load_trace_file", load)
    monkeypatch.setattr(trace_module, "share", share)
    assert swift_nb.report(folder).analysis is not None
    assert "trace.rank1.json.gz" in reads and reads.count("trace.json.gz") <= 1
    assert max(held) <= 1  # rank 0's tables at most, whatever else was read


def _allreduce_trace():
    """Two steps, each all-reducing 64·64 floats (16 KiB) issued on the training thread and
    run by gloo on its own."""
    dims = {"Input Dims": [[[64, 64]], []], "Input type": ["TensorList", "Object"]}
    events = []
    for k in (1, 2):
        t = 1000.0 * (k - 1)
        events += [
            _x(f"ProfilerStep#{k}", t, 1000, cat="user_annotation"),
            _x("aten::linear", t + 100, 300),
            _x("c10d::allreduce_", t + 500, 50, args=dims),
            _x("gloo:all_reduce", t + 450, 300, cat="user_annotation", tid=2),
        ]
    return parse_events(events)


def test_a_ranks_own_record_keeps_its_world_for_the_advisor_and_reports_as_one_process():
    """Rank 1's record of a job of 2, analyzed alone: the advisor's collectives count the
    ring over 2 ranks, the report's those of a single process (no wire bytes)."""
    trace = _allreduce_trace()
    run = Run(id="rank1", context={"world_size": 2}, environment={"rank": 1})
    data = run_data(run, trace)
    assert (data.world_size, data.rank) == (2, 1)
    advisor = data.collectives.set_index("kind").loc["all_reduce"]
    assert advisor["rank"] == 1
    assert advisor["bytes_per_step"] == advisor["wire_bytes_per_step"] == 64 * 64 * 4  # 2·(2−1)/2 × bytes
    reported = analyze(run, trace=trace).collectives.set_index("kind").loc["all_reduce"]
    assert reported["bytes_per_step"] == 64 * 64 * 4
    assert reported["wire_bytes_per_step"] == 0.0  # a single process sends nothing


def test_per_name_is_per_value_of_the_events_names(cost_run):
    trace = load_trace(cost_run)
    names = trace.events["name"]
    for fn, dtype, missing in (
        (tn.is_collective, bool, False),
        (lambda n: tn.DATA.search(n) is not None, bool, False),
        (tn.collective_kind, object, None),
    ):
        np.testing.assert_array_equal(
            per_name(trace, fn, dtype, missing), per_value(names, fn, dtype, missing)
        )
    some = (trace.events["cat"] == "cpu_op").to_numpy()
    np.testing.assert_array_equal(
        per_name(trace, tn.is_collective)[some], per_value(names[some], tn.is_collective)
    )
    assert per_name(parse_events([]), tn.is_collective).shape == (0,)


def test_the_device_analyses_share_one_table_of_device_work(tmp_path, monkeypatch):
    path = tmp_path / "gpu.json.gz"
    shutil.copy(DATA / "gpu" / "gpu_nccl_2ranks_rank0.json.gz", path)
    trace = load_trace_file(path)
    lookups = _spy(monkeypatch, "derived", trace_module.derived)
    analysis = analyze(Run(id="gpu", environment={"device": "cuda"}), trace=trace)
    assert analysis.device["device_idle_pct"] is not None and len(analysis.kernel_kinds)
    keys = [args[1].split("/")[0] for args in lookups]
    assert keys.count("device_work") == 1
    assert keys.count("self_times") == keys.count("collectives") == 1
