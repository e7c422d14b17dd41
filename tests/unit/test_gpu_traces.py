"""swift_nb.analysis.device (and the collectives of analysis.comm) on real CUDA traces
(tests/data/gpu, from HolisticTraceAnalysis's test data): HTA's own numbers on the same files
are reproduced, the kinds of kernels and causes of idle time add up, and a CPU trace has
no GPU figures at all."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from swift_nb.analysis import analyze, device
from swift_nb.analysis.advisor.evidence import gather
from swift_nb.analysis.comm import collectives
from swift_nb.analysis.trace.tables import Trace, load_trace_file, parse_events
from swift_nb.importing.assembly import import_trace
from swift_nb.record import Run, load_run, runs
from swift_nb.render.document import report_html
from swift_nb.render.tables import runs_text

DATA = Path(__file__).parents[1] / "data" / "gpu"
NAMES = ["gpu_1rank_5steps", "gpu_nccl_2ranks_rank0", "gpu_128ranks_rank0", "gpu_128ranks_rank1"]

# HTA 0.5.0's get_temporal_breakdown / get_comm_comp_overlap on these files (idle, compute,
# non-compute, overlap %; benchmarks/hta_compare.py prints them): HTA rounds nanosecond
# timestamps inward to whole µs, so on the two ns-resolution traces it finds more idle time.
HTA = {
    "gpu_1rank_5steps": (2.63, 96.75, 0.62, None),
    "gpu_nccl_2ranks_rank0": (77.78, 17.26, 4.97, 14.31),
    "gpu_128ranks_rank0": (53.56, 17.71, 28.74, 11.81),
    "gpu_128ranks_rank1": (54.72, 22.57, 22.72, 20.05),
}
# The same with HTA_DISABLE_NS_ROUNDING=1: the timestamps as recorded, as swift_nb reads them.
HTA_UNROUNDED = {
    **HTA,
    "gpu_1rank_5steps": (1.68, 97.43, 0.90, None),
    "gpu_nccl_2ranks_rank0": (77.23, 17.66, 5.10, 14.76),
}
KEYS = ["device_idle_pct", "device_compute_pct", "device_non_compute_pct", "comm_compute_overlap_pct"]


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Trace]:
    """Each trace parsed from a copy (loading caches tables beside the file)."""
    folder = tmp_path_factory.mktemp("gpu")
    out = {}
    for name in NAMES:
        copy = folder / f"{name}.json.gz"
        shutil.copy(DATA / copy.name, copy)
        out[name] = load_trace_file(copy)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_summary_agrees_with_hta(traces, name):
    summary = device.device_summary(traces[name])
    for key, theirs, unrounded in zip(KEYS, HTA[name], HTA_UNROUNDED[name], strict=True):
        ours = summary[key]
        if theirs is None:  # no NCCL kernel (a world of one rank): nothing to overlap
            assert ours is None
            continue
        assert abs(ours - theirs) <= 1.0, (key, ours, theirs)
        assert abs(ours - unrounded) <= 0.006, (key, ours, unrounded)  # HTA prints 2 decimals
    shares = summary["device_idle_pct"] + summary["device_compute_pct"] + summary["device_non_compute_pct"]
    assert shares == pytest.approx(100.0)
    assert summary["last_step_left_out"] is True


def test_window_is_htas_and_can_keep_the_last_step(traces):
    t = traces["gpu_1rank_5steps"]
    assert device.device_summary(t)["window_s"] == pytest.approx(0.384634523)  # HTA's kernel_time
    whole = device.device_summary(t, include_last_step=True)
    assert whole["window_s"] == pytest.approx(0.480029227) and whole["last_step_left_out"] is False
    assert whole["device_idle_pct"] == pytest.approx(1.578, abs=1e-3)
    rank0 = device.device_summary(traces["gpu_128ranks_rank0"], include_last_step=True)
    assert rank0["device_idle_pct"] == pytest.approx(55.215, abs=1e-3)
    assert rank0["comm_compute_overlap_pct"] == pytest.approx(14.946, abs=1e-3)


KINDS = {
    "gpu_1rank_5steps": {"convolution", "elementwise/reduction", "gemm", "memcpy", "memset"},
    "gpu_nccl_2ranks_rank0": {
        "communication",
        "convolution",
        "elementwise/reduction",
        "gemm",
        "memcpy",
        "memset",
    },
    "gpu_128ranks_rank0": {
        "communication",
        "embedding",
        "gemm",
        "elementwise/reduction",
        "memcpy",
        "memset",
        "other",
    },
}


@pytest.mark.parametrize("name", list(KINDS))
def test_kernels_by_kind(traces, name):
    kinds = device.kernels_by_kind(traces[name])
    assert set(kinds["kind"]) == KINDS[name]
    assert kinds["time_pct"].sum() == pytest.approx(100.0)
    assert kinds["time_s"].is_monotonic_decreasing
    # per step, the kinds share out exactly the work each step launched; the whole trace's
    # window leaves the last step's out
    work = device.device_work(traces[name])
    by_step = device.kernels_by_kind(traces[name], by_step=True)
    assert by_step["count"].sum() == (work["step"] >= 0).sum()
    last = traces[name].steps["step"].iloc[-1]
    assert kinds["count"].sum() == (work["step"] != last).sum()
    assert by_step.groupby("step")["time_pct"].sum().to_numpy() == pytest.approx(100.0)
    assert list(by_step["step"].unique()) == list(traces[name].steps["step"])


def test_kinds_of_real_traces_in_numbers(traces):
    kinds = device.kernels_by_kind(traces["gpu_nccl_2ranks_rank0"]).set_index("kind")
    assert kinds.loc["communication", "count"] == 14  # of 21 NCCL kernels: the last step's are left out
    assert kinds.loc["communication", "time_s"] == pytest.approx(0.024289, abs=1e-6)
    assert kinds.index[0] == "elementwise/reduction" and kinds["time_pct"].iloc[0] == pytest.approx(
        48.18, abs=0.01
    )
    rank1 = device.kernels_by_kind(traces["gpu_128ranks_rank1"]).set_index("kind")
    assert list(rank1.index[:2]) == ["communication", "embedding"]
    assert rank1.loc["other", "count"] == 2  # fbgemm's offsets and a CUDA helper
    one = device.kernels_by_kind(traces["gpu_1rank_5steps"]).set_index("kind")
    assert one.loc["convolution", "count"] == 1176 and one.loc["memcpy", "count"] == 1280


@pytest.mark.parametrize("name", NAMES)
def test_idle_causes_add_up_to_the_idle_time(traces, name):
    t = traces[name]
    whole = device.idle_by_cause(t)
    assert len(whole) == 1
    row = whole.iloc[0]
    summary = device.device_summary(t)
    assert row["window_s"] == pytest.approx(summary["window_s"])
    assert row["idle_s"] == pytest.approx(summary["device_idle_pct"] / 100 * summary["window_s"])
    assert row[device.CAUSES].sum() == pytest.approx(row["idle_s"], rel=1e-9)
    assert (row[device.CAUSES] >= 0).all()

    steps = device.idle_by_cause(t, by_step=True)
    assert list(steps["step"]) == list(t.steps["step"])
    assert steps[device.CAUSES].sum(axis=1).to_numpy() == pytest.approx(steps["idle_s"].to_numpy(), rel=1e-9)
    # the steps' windows tile the device's timeline: from the first step's first work to the
    # last step's last
    work = device.device_work(t)
    launched = work[work["step"] >= 0]
    assert steps["window_s"].sum() == pytest.approx(
        (launched["end_us"].max() - launched["ts_us"].min()) / 1e6
    )


def test_idle_causes_in_numbers(traces):
    # rank 0 of 2, DDP on a ResNet: the host launching thousands of small kernels sets the pace;
    # a few stream synchronisations and copy calls block it too
    row = device.idle_by_cause(traces["gpu_nccl_2ranks_rank0"]).iloc[0]
    assert row["idle_s"] == pytest.approx(0.336420, abs=1e-6)
    assert row["host_bound_s"] == pytest.approx(0.323749, abs=1e-6)
    assert row["comm_wait_s"] == pytest.approx(0.002092, abs=1e-6)
    assert row["sync_s"] == pytest.approx(0.004855, abs=1e-6)
    assert row["copy_s"] == pytest.approx(0.005663, abs=1e-6)
    assert row["other_s"] == pytest.approx(0.000061, abs=1e-6)
    # rank 0 of 128: all-to-alls queued behind their peers hold the GPU a quarter of its idle
    # time; the rest the host spends inside its step's annotations (## backward ##,
    # ## optimizer ##) between traced operators: the GPU waits for the host to launch. The
    # trace was sampled, so those gaps have no operator of their own, but they are the step's.
    row = device.idle_by_cause(traces["gpu_128ranks_rank0"]).iloc[0]
    assert row["comm_wait_s"] / row["idle_s"] == pytest.approx(0.2475, abs=1e-3)
    assert row["host_bound_s"] / row["idle_s"] == pytest.approx(0.7522, abs=1e-3)
    assert row["other_s"] / row["idle_s"] < 0.01  # all but 0.2 % of the idle time explained


def test_device_steps(traces):
    steps = device.device_steps(traces["gpu_nccl_2ranks_rank0"])
    assert list(steps["step"]) == [4, 5, 6]
    shares = steps[["idle_pct", "compute_pct", "non_compute_pct"]].sum(axis=1)
    assert shares.to_numpy() == pytest.approx(100.0)
    assert steps["idle_pct"].round(1).tolist() == [77.7, 77.4, 73.3]
    assert steps["comm_compute_overlap_pct"].round(1).tolist() == [15.2, 14.3, 16.5]
    no_comm = device.device_steps(traces["gpu_1rank_5steps"])
    assert no_comm["comm_compute_overlap_pct"].isna().all() and len(no_comm) == 5


def test_device_work_is_tied_to_its_launch(traces):
    work = device.device_work(traces["gpu_1rank_5steps"])
    assert len(work) == 4350 + 1600 + 145  # kernels, memcpys, memsets
    assert work["launch_us"].notna().all() and (work["launch_us"] <= work["ts_us"]).all()
    assert set(work["step"]) == {101, 102, 103, 104, 105}
    # nanosecond durations survive: times are relative to the trace's start
    assert np.allclose(work["end_us"] - work["ts_us"], np.round(work["end_us"] - work["ts_us"], 3))


def cpu_trace() -> Trace:
    ev = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#0",
            "ts": 0,
            "dur": 100,
            "pid": 1,
            "tid": 1,
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 50, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 70, "dur": 20, "pid": 1, "tid": 1},
    ]
    return parse_events(ev)


def test_a_cpu_trace_has_no_device_figures():
    t = cpu_trace()
    summary = device.device_summary(t)
    assert set(device.SUMMARY_KEYS) <= set(summary) and all(v is None for v in summary.values())
    assert device.kernels_by_kind(t).empty and device.idle_by_cause(t).empty
    assert device.device_steps(t).empty and device.idle_by_cause(t, by_step=True).empty
    html = report_html(
        Run(id="cpu"),
        device=summary,
        device_steps=device.device_steps(t),
        kernel_kinds=device.kernels_by_kind(t),
        idle_causes=device.idle_by_cause(t),
    )
    assert "<h2>GPU</h2>" not in html


def test_collective_bytes_from_what_the_profiler_recorded(traces):
    # no shapes recorded: sizes from record_param_comms ("In/Out msg nelems", "dtype", "Group size")
    comm = collectives(traces["gpu_nccl_2ranks_rank0"], world=2).set_index("kind")
    assert comm.loc["all_reduce", "bytes_per_step"] == 102228128  # 25.6 M floats per step
    assert comm.loc["all_reduce", "wire_bytes_per_step"] == 102228128  # 2·(P−1)/P = 1 for P = 2
    assert comm.loc["all_reduce", "busbw_bytes_per_s"] == pytest.approx(6.558e9, rel=1e-3)
    # all-reduce of a TensorList without shapes: sizes from the nccl:all_reduce annotation
    comm = collectives(traces["gpu_128ranks_rank0"], world=128).set_index("kind")
    floats = 19618307 + 26955536 + 26258430 + 5716654  # four all-reduces over two steps
    assert comm.loc["all_reduce", "bytes_per_step"] == floats * 4 / 2
    assert comm.loc["all_gather", "bytes_per_step"] == 2**30
    # a size nobody recorded stays unknown, never 0
    t = cpu_trace()
    unknown = collectives(t).set_index("kind")
    assert np.isnan(unknown.loc["all_reduce", "bytes_per_step"])


def reader_text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


def test_report_of_an_imported_gpu_trace(tmp_path):
    run = import_trace(DATA / "gpu_nccl_2ranks_rank0.json.gz", tmp_path, report=True)
    text = reader_text((run.path / "report.html").read_text("utf-8"))
    assert (
        "Over 435.6 ms from the first to the last kernel, copy or memset of the device work launched "
        "before the last profiled step" in text
    )
    assert (
        "the GPU was idle 77.2 % of the time, ran compute kernels 17.7 % of it and ran only non-compute "
        "work (communication, memory copies and sets) 5.1 % of it." in text
    )
    assert "Communication kernels ran alongside compute kernels for 14.8 % of their running time." in text
    assert "Of the 336.4 ms the GPU was idle, 2.1 ms (0.6 %) went to waiting on communication" in text
    assert "323.7 ms (96.2 %) were host launch gaps" in text
    assert "Elementwise and reduction took the most device time: 49.6 ms in 1376 kernels, 48.2 %" in text
    assert "communication 14 24.3 ms 23.6 %" in text
    assert "4 222.1 ms 77.7 % 17.3 % 4.9 % 15.2 % 1.1 ms 4.9 ms 2.9 ms 0 µs 163.7 ms 61 µs" in text
    # what a trace cannot hold is said to be missing, not shown as zero or as empty axes
    assert "Peak tensor memory not recorded in this trace" in text
    assert "Utilisation and memory over time were not recorded in this trace" in text
    assert "Tensor memory by category was not recorded in this trace" in text
    assert "Memory allocated by operators was not recorded in this trace" in text
    assert " 0 B " not in text


def x(cat, name, ts, dur, tid, **args):
    """A complete event of a hand-drawn timeline (µs); thread 7 is the device's stream."""
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0 if tid == 7 else 1,
            "tid": tid, "args": args}  # fmt: skip


def hand_built() -> Trace:
    """Two steps on a hand-drawn timeline (µs). Device: a GEMM [5, 20), an NCCL all-reduce
    [40, 60) launched at 30 with an elementwise kernel [50, 55) under it; in step 2 a copy
    [120, 130) and a GEMM [150, 160). Host: aten::mm [20, 25), an awaitable's wait [62, 70),
    aten::copy_ [100, 115)."""

    return parse_events(
        [
            x("user_annotation", "ProfilerStep#1", 0, 100, 1),
            x("user_annotation", "ProfilerStep#2", 100, 100, 1),
            x("cuda_runtime", "cudaLaunchKernel", 1, 1, 1, correlation=1),
            x("kernel", "ampere_sgemm_128x64_nn", 5, 15, 7, correlation=1),
            x("cpu_op", "aten::mm", 20, 5, 1),
            x("cuda_runtime", "cudaLaunchKernel", 30, 1, 1, correlation=2),
            x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40, 20, 7, correlation=2),
            x("cuda_runtime", "cudaLaunchKernel", 31, 1, 1, correlation=3),
            x("kernel", "void at::native::vectorized_elementwise_kernel<4>", 50, 5, 7, correlation=3),
            x("user_annotation", "## KJTAllToAllSplitsAwaitable wait() ##", 62, 8, 1),
            x("cpu_op", "aten::copy_", 100, 15, 1),
            x("cuda_runtime", "cudaMemcpyAsync", 110, 1, 1, correlation=4),
            x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 120, 10, 7, correlation=4),
            x("cuda_runtime", "cudaLaunchKernel", 140, 1, 1, correlation=5),
            x("kernel", "volta_sgemm_64x64_nt", 150, 10, 7, correlation=5),
        ]
    )


def test_the_rules_on_a_hand_built_timeline():
    t = hand_built()
    # HTA's window: the work launched before step 2 began, [5, 60): 20 µs idle of 55
    summary = device.device_summary(t)
    assert summary["window_s"] == pytest.approx(55e-6)
    assert summary["device_idle_pct"] == pytest.approx(100 * 20 / 55)
    assert summary["device_compute_pct"] == pytest.approx(100 * 20 / 55)  # GEMM 15 + elementwise 5
    assert summary["device_non_compute_pct"] == pytest.approx(100 * 15 / 55)  # the all-reduce alone
    assert summary["comm_compute_overlap_pct"] == pytest.approx(25.0)  # 5 of its 20 µs
    # idle [20, 40): the all-reduce launched at 30 waits to start until 40; before it, the
    # host in aten::mm and then between operators inside its step (ProfilerStep#1 [0, 100))
    whole = device.idle_by_cause(t).iloc[0]
    assert whole[["idle_s", "comm_wait_s", "host_bound_s", "other_s"]].tolist() == pytest.approx(
        [20e-6, 10e-6, 10e-6, 0.0]
    )
    # step 1's window runs to step 2's first work (120): idle also [60, 120), of which the
    # wait [62, 70) is communication, the copy call [110, 111) a copy, the rest the host in
    # its steps; step 2's window [120, 160) idles [130, 150), the host inside ProfilerStep#2
    cols = ["window_s", "idle_s", "comm_wait_s", "copy_s", "host_bound_s", "other_s"]
    steps = device.idle_by_cause(t, by_step=True).set_index("step")
    assert steps.loc[1, cols].tolist() == pytest.approx([115e-6, 80e-6, 18e-6, 1e-6, 61e-6, 0.0])
    assert steps.loc[2, cols].tolist() == pytest.approx([40e-6, 20e-6, 0.0, 0.0, 20e-6, 0.0])
    kinds = device.kernels_by_kind(t, include_last_step=True).set_index("kind")
    assert kinds["count"].to_dict() == {
        "communication": 1,
        "gemm": 2,
        "memcpy": 1,
        "elementwise/reduction": 1,
    }
    assert kinds.loc["gemm", "time_s"] == pytest.approx(25e-6)


def test_report_of_an_imported_job_names_rank_0s_gpu(tmp_path):
    paths = [DATA / "gpu_128ranks_rank0.json.gz", DATA / "gpu_128ranks_rank1.json.gz"]
    run = import_trace(paths, tmp_path, report=True)
    text = reader_text((run.path / "report.html").read_text("utf-8").replace("&#x27;", "'"))
    assert "rank 0's GPU was idle 53.6 % of the time, ran compute kernels 17.7 % of it" in text
    assert "Communication kernels ran alongside compute kernels for 11.8 % of their running time." in text
    assert "Of the 321.4 ms rank 0's GPU was idle, 79.5 ms (24.8 %) went to waiting on communication" in text
    assert "Communication (NCCL) took the most device time: 195.3 ms in 5 kernels, 64.6 %" in text


# Ground truth: each shared trace labelled from its device figures, and why.
VERDICTS = {
    # 97.4 % of the window runs compute kernels (convolutions, elementwise, GEMMs); the GPU
    # idles 1.7 %: nothing keeps it from computing
    "gpu_1rank_5steps": "compute-bound",
    # the GPU idles 77.2 % of the window and 96 % of that idle time the host is inside its
    # step launching ~900 short kernels per step (median 16 µs): the host sets the pace
    "gpu_nccl_2ranks_rank0": "overhead-bound",
    # rank 0 of 128: all-to-all and all-reduce kernels run alone for 172 ms (overlap with
    # compute 11.8 %) and the GPU idles 80 ms more waiting for collectives: 42 % of the window,
    # more than the host's launch gaps (40 %) and far more than compute (17.7 %)
    "gpu_128ranks_rank0": "communication-bound",
    # rank 1 of the same job: 39 % communication against 36 % launch gaps and 22.6 % compute
    "gpu_128ranks_rank1": "communication-bound",
}


@pytest.mark.parametrize("name", NAMES)
def test_the_verdict_comes_from_the_gpu(traces, tmp_path, name):
    """The verdict answers what keeps the GPU from computing, and its reason quotes the
    device's own figures (never a number that contradicts its kind)."""
    run = import_trace(DATA / f"{name}.json.gz", tmp_path, report=True)
    analysis = analyze(run)
    verdict = analysis.verdict
    assert verdict.kind == VERDICTS[name], verdict.reason
    # the host's parts of the step add up to at most the step (each part counted once)
    assert sum(gather(run).shares.values()) <= 1.005
    assert verdict.evidence["device_idle_pct"] == pytest.approx(analysis.device["device_idle_pct"], abs=0.05)
    if verdict.kind == "compute-bound":
        assert verdict.reason.startswith("the GPU computes 97.4 % of the window (convolution")
    elif verdict.kind == "overhead-bound":
        # with what the idle share costs at the A100's list price (swift_nb.analysis.cost)
        assert verdict.reason.startswith("the GPU idles 77.2 % of the window: $")
        assert "per 1 000 steps; for 328.7 ms of its 336.4 ms idle it waits for the host" in verdict.reason
    else:
        assert verdict.reason.startswith("the GPU waits on communication 3") or verdict.reason.startswith(
            "the GPU waits on communication 4"
        )
        assert "kernels no compute hides" in verdict.reason
    # the run's summary carries the device figures (runs(), swift-nb list and compare show them)
    summary = load_run(run.path).summary
    assert summary["device_idle_pct"] == pytest.approx(analysis.device["device_idle_pct"], abs=1e-3)
    assert summary["device_compute_pct"] == pytest.approx(analysis.device["device_compute_pct"], abs=1e-3)
    listed = runs(tmp_path)
    assert listed["device_idle_pct"].iloc[0] == summary["device_idle_pct"]
    assert "GPU idle" in runs_text(listed)


def test_gpu_findings_do_not_claim_the_same_time_twice(traces, tmp_path):
    run = import_trace(DATA / "gpu_1rank_5steps.json.gz", tmp_path, report=False)
    found = {f.id: f for f in analyze(run).findings}
    # fp32 GEMMs on Volta's CUDA cores, 93.9 ms of the 384.6 ms window: a bf16/TF32 finding
    assert set(found) == {"fp32_gemm"}
    assert found["fp32_gemm"].toggle == "bf16_autocast"
    assert found["fp32_gemm"].evidence["simt_sgemm_s"] == pytest.approx(
        0.0939, abs=1e-4
    )  # of 94.0 ms of GEMMs
    run = import_trace(DATA / "gpu_nccl_2ranks_rank0.json.gz", tmp_path, report=False)
    found = {f.id: f for f in analyze(run).findings}
    gaps = found["overhead"]
    assert gaps.title == "Host launch gaps: the GPU idles 74.3 % of the window waiting for the host"
    assert "900 kernels of median 16.2 µs" in gaps.suggestion  # many small kernels: fuse them
    # the 1 % of synchronisation stalls is too small a part to raise
    assert "sync_stalls" not in found


def test_a_synchronisation_names_its_operator_and_the_users_line():
    """``.item()`` in the loop: the stall from the sync call to the next launch, the operator
    that made it and, with stacks recorded, the user's line around it."""
    t = parse_events(
        [
            x("user_annotation", "ProfilerStep#1", 0, 200, 1),
            x("user_annotation", "ProfilerStep#2", 200, 100, 1),
            x("python_function", "/usr/lib/python3.11/site-packages/torch/_tensor.py(1): item", 38, 50, 1),
            x("python_function", "train.py(42): <module>", 0, 200, 1),
            x("cuda_runtime", "cudaLaunchKernel", 1, 1, 1, correlation=1),
            x("kernel", "ampere_sgemm_128x64_nn", 5, 35, 7, correlation=1),
            x("cpu_op", "aten::item", 39, 45, 1),
            x("cpu_op", "aten::_local_scalar_dense", 40, 42, 1),
            x("cuda_runtime", "cudaStreamSynchronize", 41, 40, 1),
            x("cuda_runtime", "cudaLaunchKernel", 150, 1, 1, correlation=2),
            x("kernel", "void at::native::vectorized_elementwise_kernel<4>", 160, 20, 7, correlation=2),
            x("cuda_runtime", "cudaLaunchKernel", 201, 1, 1, correlation=3),
            x("kernel", "void at::native::vectorized_elementwise_kernel<4>", 210, 10, 7, correlation=3),
        ]
    )
    # idle [40, 160): the sync call [41, 81) and on to the next launch at 150, then the
    # launch gap [150, 160)
    row = device.idle_by_cause(t).iloc[0]
    assert row["sync_s"] == pytest.approx(109e-6) and row["host_bound_s"] == pytest.approx(11e-6)
    from swift_nb.analysis.advisor.evidence import device_time

    d = device_time(t)
    assert d.syncs == {"aten::_local_scalar_dense": 1}
    assert d.sync_sites == {"train.py(42): <module>": 1}  # torch's own frame is not the user's line
