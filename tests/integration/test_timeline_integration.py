"""Timeline (swift_nb.analysis.timeline.query and its tracks, counters, places and rank overview):
what a viewer draws of a trace at any zoom, checked on the real GPU traces in
../shared/traces and on a profiled CPU run."""

from __future__ import annotations

import pytest
import torch
from support.common import train

import swift_nb
from swift_nb.analysis import analyze
from swift_nb.analysis.timeline.places import places
from swift_nb.analysis.timeline.query import Timeline


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    with swift_nb.profile(out_dir=tmp_path_factory.mktemp("runs"), wait=1, warmup=1, active=2) as run:
        train(5, model)
    return swift_nb.load_run(run.path)


def test_a_profiled_cpu_run_draws_its_ops_steps_and_counters(cpu_run):
    tl = Timeline.of_run(cpu_run)
    items = tl.query(width_px=800)
    assert {"steps", "cpu"} <= set(tl.tracks["kind"])
    assert items[items["track"] == "steps"]["name"].str.startswith("ProfilerStep#").all()
    assert items["name"].str.startswith("aten::").any()
    counters = tl.counters(width_px=800)
    tracks = set(counters["track"])
    assert "CPU" in tracks and any(t.startswith("Memory: ") for t in tracks)
    # the samples taken during the recorded steps land inside the trace's bounds
    inside = counters[(counters["t_us"] >= tl.start_us) & (counters["t_us"] <= tl.end_us)]
    assert len(inside)
    found = places(cpu_run, analyze(cpu_run).findings)
    # the slowest step's window is padded by a quarter of the step on each side (a step slowed
    # by a loaded machine pads far): the step it is centred on lies inside the trace
    w0, w1 = found["slowest_step"]
    assert tl.start_us <= (w0 + w1) / 2 <= tl.end_us
