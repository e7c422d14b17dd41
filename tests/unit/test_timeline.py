"""Timeline (swift_nb.analysis.timeline.query and its tracks, counters, places and rank overview):
what a viewer draws of a trace at any zoom, checked on the real GPU traces in
../shared/traces and on a profiled CPU run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import swift_nb
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.timeline.counters import clock_offset_us
from swift_nb.analysis.timeline.places import places
from swift_nb.analysis.timeline.query import ITEM_COLUMNS, Timeline
from swift_nb.analysis.timeline.ranks import STATES, rank_overview, states_per_rank
from swift_nb.analysis.timeline.tracks import depths
from swift_nb.analysis.trace.tables import load_trace_file, parse_events, read_trace
from swift_nb.core import intervals
from swift_nb.core.errors import ConfigError

TRACES = Path(__file__).parents[1] / "data" / "gpu"  # the shared real traces (README.md there)


ONE_RANK = TRACES / "gpu_1rank_5steps.json.gz"


PAIR = [TRACES / "gpu_128ranks_rank0.json.gz", TRACES / "gpu_128ranks_rank1.json.gz"]


@pytest.fixture(scope="module")
def gpu_trace():
    return read_trace(ONE_RANK)


@pytest.fixture(scope="module")
def gpu(gpu_trace):
    return Timeline(gpu_trace)


def _columns_of(items: pd.DataFrame, t0: float, t1: float, width: int) -> np.ndarray:
    px = (t1 - t0) / width
    return np.clip(np.floor((np.maximum(items["start_us"], t0) - t0) / px), 0, width - 1)


@pytest.mark.parametrize("width", [1, 37, 1000])
def test_the_whole_trace_at_any_width_holds_every_event_once_within_two_items_per_pixel(
    gpu, gpu_trace, width
):
    items = gpu.query(None, None, width)
    assert list(items.columns) == ITEM_COLUMNS
    # every event (and each step and DataLoader span, drawn on their own tracks) is counted once
    assert items["count"].sum() == gpu.events == len(gpu_trace.events) + len(gpu_trace.steps)
    assert items["start_us"].min() == gpu.start_us and items["end_us"].max() == gpu.end_us
    per_column = items.assign(col=_columns_of(items, gpu.start_us, gpu.end_us, width))
    assert per_column.groupby(["track", "depth", "col"]).size().max() <= 2
    assert len(items) <= 2 * width * len(items.groupby(["track", "depth"]))


def test_none_bounds_are_the_trace_s_own(gpu):
    pd.testing.assert_frame_equal(gpu.query(None, None, 300), gpu.query(gpu.start_us, gpu.end_us, 300))
    pd.testing.assert_frame_equal(gpu.query(width_px=300), gpu.query(gpu.start_us, None, 300))


def test_a_narrow_window_returns_its_kernels_exactly(gpu, gpu_trace):
    ev = gpu_trace.events
    kernels = ev[ev["cat"] == "kernel"]
    t0 = float(kernels["ts_us"].iloc[len(kernels) // 2]) - 300.0
    t1 = t0 + 1000.0
    inside = kernels[(kernels["end_us"] > t0) & (kernels["ts_us"] < t1)]
    assert len(inside) >= 3
    items = gpu.query(t0, t1, 1200)
    drawn = items[items["track"].str.startswith("gpu:") & items["name"].isin(set(kernels["name"]))]
    assert (drawn["count"] == 1).all()
    got = sorted(zip(drawn["start_us"], drawn["end_us"], drawn["name"], strict=True))
    want = sorted(zip(inside["ts_us"], inside["end_us"], inside["name"], strict=True))
    assert got == want
    assert (items["end_us"] > t0).all() and (items["start_us"] < t1).all()


def test_merged_runs_carry_their_count_and_a_name_from_the_run(gpu):
    wide = gpu.query(None, None, 20)
    merged = wide[wide["count"] > 1]
    assert len(merged)
    fine = gpu.all_items()
    for _, item in merged.head(20).iterrows():
        run = fine[
            (fine["track"] == item["track"])
            & (fine["depth"] == item["depth"])
            & (fine["start_us"] >= item["start_us"])
            & (fine["start_us"] < item["end_us"])
        ]
        assert item["name"] in set(run["name"])
        assert item["end_us"] == run["end_us"].max() or item["end_us"] <= run["end_us"].max()


def test_tracks_are_steps_threads_and_streams_in_order(gpu):
    kinds = list(gpu.tracks["kind"])
    assert kinds[0] == "steps"
    assert kinds.index("cpu") < kinds.index("gpu")
    assert "(training loop)" in gpu.tracks.loc[gpu.tracks["kind"] == "cpu", "label"].iloc[0]
    assert gpu.tracks["track"].is_unique
    assert gpu.tracks.loc[gpu.tracks["kind"] == "cpu", "max_depth"].iloc[0] > 2  # ops nest


def test_depths_nest_children_and_keep_siblings_side_by_side():
    # parent [0, 10] holding [1, 3] and [3, 5] back to back, [3, 3] zero-length at the
    # second's start, and a grandchild [3.5, 4]; then a sibling of the parent [10, 12]
    start = np.array([0.0, 1.0, 3.0, 3.0, 3.5, 10.0])
    end = np.array([10.0, 3.0, 5.0, 3.0, 4.0, 12.0])
    assert depths(start, end).tolist() == [0, 1, 1, 2, 2, 0]


def test_detail_gives_the_stack_and_the_kernels_an_op_launched(gpu):
    items = gpu.all_items()
    cpu = items[items["track"].str.startswith("cpu:") & items["name"].str.startswith("aten::")]
    with_launch = None
    for _, op in cpu[cpu["depth"] >= 1].iterrows():
        d = gpu.detail(op["track"], op["depth"], op["start_us"])
        if d and d["launches"]:
            with_launch = d
            break
    assert with_launch is not None
    assert with_launch["name"].startswith("aten::") and len(with_launch["stack"]) == with_launch["depth"]
    kernel = with_launch["launches"][0]
    assert kernel["track"].startswith("gpu:") and kernel["start_us"] >= with_launch["start_us"]
    back = gpu.detail(kernel["track"], kernel["depth"], kernel["start_us"])
    assert back["launched_by"]["name"] in {
        "cudaLaunchKernel",
        "cudaMemcpyAsync",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
    }
    assert back["launched_by"]["start_us"] <= kernel["start_us"]
    assert gpu.detail(kernel["track"], kernel["depth"], gpu.start_us - 1.0) is None
    assert gpu.detail("no such track", 0, gpu.start_us) is None


def test_search_finds_names_in_any_case(gpu):
    hits = gpu.search("NCCL", limit=5)
    assert 0 < len(hits) <= 5 and hits["name"].str.lower().str.contains("nccl").all()
    assert hits["start_us"].is_monotonic_increasing
    assert gpu.search("no event is called this").empty


def test_a_window_that_ends_before_it_starts_or_no_width_is_refused(gpu):
    with pytest.raises(ConfigError, match="ends after it starts"):
        gpu.query(gpu.end_us, gpu.start_us, 100)
    with pytest.raises(ConfigError, match="width_px"):
        gpu.query(None, None, 0)


def test_embed_carries_every_event_within_its_budget_and_says_when_it_merges(gpu):
    full = gpu.embed()
    assert full["detail"] == "full" and full["note"] is None
    assert len(full["items"]["start"]) == gpu.events
    small = gpu.embed(budget_items=3000)
    assert small["detail"] == "merged" and "45,4" in small["note"]
    assert len(small["items"]["start"]) <= 3000
    assert sum(small["items"]["count"]) == gpu.events
    json.dumps(small)  # plain JSON
    assert min(small["items"]["start"]) == 0.0  # µs after origin_us
    assert small["origin_us"] == gpu.start_us


def test_places_point_at_the_slowest_step_and_the_longest_launch_gap(gpu_trace):
    class Run:
        oom = None

    found = places(Run(), [Finding("overhead", "", {}, ""), Finding("leak", "", {}, "")], trace=gpu_trace)
    assert set(found) == {"slowest_step", "overhead"}
    longest = gpu_trace.steps.loc[gpu_trace.steps["dur_us"].idxmax()]
    s0, s1 = found["slowest_step"]
    assert s0 < longest["start_us"] and s1 > longest["end_us"]
    g0, g1 = found["overhead"]
    kernels = gpu_trace.events[gpu_trace.events["cat"] == "kernel"]
    # nothing runs on the device inside the gap the window is centred on
    mid = (g0 + g1) / 2
    assert not ((kernels["ts_us"] < mid) & (kernels["end_us"] > mid)).any()


def test_the_128_rank_pair_opens_each_rank_and_an_overview(tmp_path):
    job = swift_nb.import_trace(PAIR, tmp_path / "job", report=False)
    one = Timeline.of_run(job, rank=1)
    assert (one.tracks.loc[one.tracks["kind"] == "gpu", "label"].str.startswith("GPU 1 ")).all()
    with pytest.raises(ConfigError, match="ranks with one: 0, 1"):
        Timeline.of_run(job, rank=7)
    overview = rank_overview(job)
    assert list(overview.tracks["track"]) == ["rank:0", "rank:1"]
    assert set(overview.all_items()["name"]) <= set(STATES)
    per_rank = states_per_rank(overview).set_index("track")
    for rank, path in job.rank_trace_paths().items():
        steps = intervals.union(*load_trace_file(path).steps[["start_us", "end_us"]].to_numpy().T)
        # the states tile the rank's steps: every instant of a step is exactly one of them
        assert per_rank.loc[f"rank:{rank}", list(STATES)].sum() == pytest.approx(
            intervals.length(steps), rel=1e-9
        )
        assert per_rank.loc[f"rank:{rank}", "communicating"] > 0


def test_counters_move_the_run_clock_onto_the_trace_s():
    raw = [
        {
            "ph": "X",
            "name": f"ProfilerStep#{k}",
            "cat": "user_annotation",
            "ts": 1e9 + k * 1000.0,
            "dur": 900.0,
            "pid": 1,
            "tid": 1,
        }
        for k in (2, 3)
    ] + [
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1e9 + 2100.0, "dur": 50.0, "pid": 1, "tid": 1}
    ]
    trace = parse_events(raw)
    steps_csv = pd.DataFrame({"step": [2, 3], "start_s": [0.5, 0.501]})
    assert clock_offset_us(trace, steps_csv) == pytest.approx(1e9 + 2000.0 - 0.5e6)
    samples = pd.DataFrame({"t_s": [0.5005, 0.5015], "cpu_pct": [90.0, 50.0], "rss_bytes": [1e8, 2e8]})
    memory = pd.DataFrame({"t_s": [0.5012], "step": [3], "activations_bytes": [4096.0]})
    tl = Timeline.of_trace(trace, samples, memory, steps_csv)
    counters = tl.counters()
    cpu = counters[counters["track"] == "CPU"]
    assert cpu["t_us"].tolist() == pytest.approx([1e9 + 2500.0, 1e9 + 3500.0])
    assert "Memory: activations" in set(counters["track"])
    units = tl.tracks.set_index("track")["unit"]
    assert (units["CPU"], units["Process memory (RSS)"], units["Memory: activations"]) == (
        "%",
        "bytes",
        "bytes",
    )
    assert tl.payload(tl.query(), counters)["tracks"][-1]["unit"] == "bytes"
    assert set(counters["track"]) <= set(tl.tracks.loc[tl.tracks["kind"] == "counter", "track"])
