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
from swift_nb.analysis.timeline.counters import clock_offset_us, downsample
from swift_nb.analysis.timeline.places import places
from swift_nb.analysis.timeline.query import ITEM_COLUMNS, Timeline
from swift_nb.analysis.timeline.ranks import STATES, rank_overview, rank_states, states_per_rank
from swift_nb.analysis.timeline.tracks import depths
from swift_nb.analysis.trace.tables import load_trace_file, parse_events, read_trace, spans_trace
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
        # the events drawn as themselves in that stretch are not part of the merged item
        alone = wide[
            (wide["count"] == 1) & (wide["track"] == item["track"]) & (wide["depth"] == item["depth"])
        ]
        drawn = set(zip(alone["start_us"], alone["end_us"], alone["name"], strict=True))
        run = run[[k not in drawn for k in zip(run["start_us"], run["end_us"], run["name"], strict=True)]]
        assert item["name"] in set(run["name"])
        assert item["count"] == len(run)
        assert item["start_us"] == run["start_us"].min() and item["end_us"] == run["end_us"].max()


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
    gap_start, gap_end = _longest_device_gap(gpu_trace)
    # the window is the longest gap, padded by a quarter of it (at least 5 µs) on each side
    pad = max((gap_end - gap_start) * 0.25, 5.0)
    assert (g0, g1) == pytest.approx((gap_start - pad, gap_end + pad), abs=1e-6)


def _longest_device_gap(trace) -> tuple[float, float]:
    """The longest stretch between two pieces of device work inside the steps, found with
    a plain loop over the device events (not the interval code the place uses)."""
    ev = trace.events
    work = ev[ev["cat"].isin(["kernel", "gpu_memcpy", "gpu_memset"])]
    steps = trace.steps[["start_us", "end_us"]].to_numpy()
    spans = sorted(
        (s, e)
        for s, e in zip(work["ts_us"], work["end_us"], strict=True)
        if any(a <= s < b for a, b in steps)
    )
    best, reach = (0.0, (0.0, 0.0)), spans[0][1]
    for s, e in spans[1:]:
        if s - reach > best[0]:
            best = (s - reach, (reach, s))
        reach = max(reach, e)
    return best[1]


def _events(*spans, memory=()) -> list[dict]:
    """A hand-written trace: a step from 0 to 1 000 µs on thread 1, then ``spans`` as
    (name, cat, ts, dur) on thread 1, and ``memory`` as (ts, bytes) allocations."""
    out = [
        {
            "ph": "X",
            "name": "ProfilerStep#1",
            "cat": "user_annotation",
            "ts": 0,
            "dur": 1000,
            "pid": 1,
            "tid": 1,
        }
    ]
    out += [{"ph": "X", "name": n, "cat": c, "ts": ts, "dur": d, "pid": 1, "tid": 1} for n, c, ts, d in spans]
    out += [
        {
            "ph": "i",
            "name": "[memory]",
            "ts": ts,
            "pid": 1,
            "tid": 1,
            "args": {"Bytes": b, "Total Allocated": b},
        }
        for ts, b in memory
    ]
    return out


def test_the_sync_place_is_the_op_around_the_longest_synchronisation():
    trace = parse_events(
        _events(
            ("aten::_local_scalar_dense", "cpu_op", 100, 300),
            ("cudaStreamSynchronize", "cuda_runtime", 120, 250),
            ("cudaDeviceSynchronize", "cuda_runtime", 600, 20),
        )
    )
    # the longest sync (250 µs) sits inside .item()'s op: the window is the op's, padded
    assert places(_run(), [Finding("sync_stalls", "", {}, "")], trace=trace)["sync_stalls"] == (25.0, 475.0)


def test_the_collective_and_batch_places_are_the_longest_of_each():
    trace = parse_events(
        _events(
            ("c10d::allreduce_", "cpu_op", 100, 40),
            ("c10d::allreduce_", "cpu_op", 300, 200),
            ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", 10, 60),
            ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", 700, 100),
        )
    )
    found = places(_run(), [Finding(f, "", {}, "") for f in ("communication", "data_loading")], trace=trace)
    assert found["communication"] == (250.0, 550.0)
    assert found["data_loading"] == (675.0, 825.0)


def test_the_oom_place_holds_the_last_fifty_allocations():
    allocs = [(10.0 * k, 1 << 20) for k in range(1, 81)] + [(805.0, -(1 << 20))]  # a free last
    trace = parse_events(_events(("aten::empty", "cpu_op", 5, 10), memory=allocs))
    run = _run(oom={"bytes": 1 << 30})
    # allocations 31..80 (at 310..800 µs), padded by a quarter of that span
    assert places(run, trace=trace)["oom"] == pytest.approx((310.0 - 122.5, 800.0 + 122.5))
    assert "oom" not in places(_run(), trace=trace)


def _run(oom=None):
    class Run:
        pass

    run = Run()
    run.oom = oom
    return run


def test_counters_keep_each_pixel_columns_lowest_and_highest_value():
    t = np.arange(10_000, dtype=float)
    values = np.sin(t / 37.0) * 100 + (t % 7)
    counters = pd.DataFrame({"track": "mem:activations", "t_us": t, "value": values})
    out = downsample(counters, 0.0, 10_000.0, 100)
    assert len(out) <= 2 * 100 + 2
    for col in range(100):  # each column of 100 µs: its extremes are kept
        inside = (t >= col * 100) & (t < (col + 1) * 100)
        kept = out[(out["t_us"] >= col * 100) & (out["t_us"] < (col + 1) * 100)]["value"]
        assert kept.min() == values[inside].min() and kept.max() == values[inside].max()
    # a window keeps the values in force at its edges
    edge = downsample(counters, 2500.5, 2600.5, 10)
    assert edge["t_us"].min() <= 2500.5 and edge["t_us"].max() >= 2600.5


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
    # its tables, built from columns, are what parse_events makes of one dict per state span
    raw = [
        {
            "ph": "X",
            "name": state,
            "cat": "rank_state",
            "ts": s,
            "dur": e - s,
            "pid": "ranks",
            "tid": f"{r:07d}",
        }
        for r, path in sorted(job.rank_trace_paths().items())
        for state, iv in rank_states(load_trace_file(path))
        for s, e in iv
    ]
    assert len(raw) > 1000
    spans = spans_trace(
        np.array([e["name"] for e in raw], dtype=object),
        "rank_state",
        np.array([e["ts"] for e in raw]),
        np.array([e["dur"] for e in raw]),
        "ranks",
        np.array([e["tid"] for e in raw], dtype=object),
    )
    for table in ("events", "memory", "steps"):
        pd.testing.assert_frame_equal(
            getattr(spans, table), getattr(parse_events(raw), table), check_exact=True
        )
    items = overview.all_items().sort_values(["track", "start_us"], ignore_index=True)
    assert len(items) == len(raw) and items["end_us"].sub(items["start_us"]).sum() == pytest.approx(
        sum(e["dur"] for e in raw), rel=1e-12
    )


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
