"""``swift_nb.profile()`` in unmodified torchrun scripts: one record per job, gathered on
rank 0; stragglers, collectives and faults. Real jobs through torch's elastic launcher,
gloo on 127.0.0.1; each job is launched once and checked by several tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.common import free_port

import swift_nb
from swift_nb.analysis import analyze
from swift_nb.analysis.comm import comm_per_step, comm_shares
from swift_nb.analysis.memory import memory_footprint
from swift_nb.analysis.ranks import per_rank
from swift_nb.analysis.trace.tables import load_trace_file
from swift_nb.capture.job import RANK_COLUMNS

WORKLOAD = Path(__file__).parents[1] / "workloads" / "ranks_job.py"
STEPS = 10


def _launch_cmd(nproc: int, port: int, nnodes: int = 1, args: tuple[str, ...] = ()) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--monitor-interval=0.2",
        str(WORKLOAD),
        *args,
    ]


def _env(runs: Path, gather_timeout_s: float | None = None) -> dict[str, str]:
    env = {**os.environ, "SWIFT_NB_DIR": str(runs), "OMP_NUM_THREADS": "1"}
    if gather_timeout_s is not None:
        env["SWIFT_NB_GATHER_TIMEOUT_S"] = str(gather_timeout_s)
    return env


class Job:
    """A finished launch: its output, exit status and the one job record."""

    def __init__(self, runs: Path, proc: subprocess.CompletedProcess) -> None:
        self.runs = runs
        self.proc = proc
        folders = [p for p in runs.iterdir() if p.is_dir()] if runs.exists() else []
        assert len(folders) == 1, (folders, proc.stdout[-3000:], proc.stderr[-3000:])
        self.run = swift_nb.load_run(folders[0])


def _job(tmp_path_factory, name: str, nproc: int, *args: str, gather_timeout_s: float | None = None) -> Job:
    runs = tmp_path_factory.mktemp(name) / "runs"
    proc = subprocess.run(
        _launch_cmd(nproc, free_port(), args=args),
        env=_env(runs, gather_timeout_s),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return Job(runs, proc)


@pytest.fixture(scope="module")
def ddp2(tmp_path_factory) -> Job:
    # six recorded steps: which rank waits for which varies from step to step on a busy CPU;
    # batches of 4096 rows: a step's compute (tens of ms) outweighs the scheduler's slices, so
    # a rank descheduled for a few ms on a loaded machine is not yet a straggler
    return _job(tmp_path_factory, "ddp2", 2, "--steps", str(STEPS), "--active", "6", "--batch", "4096")


@pytest.fixture(scope="module")
def ddp4(tmp_path_factory) -> Job:
    return _job(tmp_path_factory, "ddp4", 4, "--steps", str(STEPS), "--batch", "64")


@pytest.mark.parametrize("name", ["ddp2", "ddp4"])
def test_one_job_record_with_every_rank(name, request):
    job: Job = request.getfixturevalue(name)
    world = 2 if name == "ddp2" else 4
    assert job.proc.returncode == 0, job.proc.stderr[-3000:]
    run = job.run
    assert run.status == "ok", run.notes
    assert run.context["world_size"] == world and run.context["missing_ranks"] == []
    assert run.context["layout"]["parallel"] == ["DDP"]
    pr = per_rank(run)
    assert list(pr["rank"]) == list(range(world))
    assert {
        "rank",
        "host",
        "steps",
        "step_time_median_s",
        "peak_mem_bytes",
        "collective_share",
        "straggler",
    } <= set(pr.columns)
    assert (pr["steps"] == STEPS).all()  # one step per optimizer.step() on every rank
    assert (pr["collective_share"] > 0).all() and (pr["collective_share"] < 1).all()
    # what each rank measured of itself is what the analysis measures in its trace; on CPU
    # nothing hides a collective, so all of its time is exposed
    for r, path in run.rank_trace_paths().items():
        collective, exposed = comm_shares(comm_per_step(load_trace_file(path)))
        assert collective == pytest.approx(pr.loc[r, "collective_share"]) and exposed == collective
    for r in range(world):
        assert (run.path / f"trace.rank{r}.json.gz").exists()
        assert swift_nb.load_run(run.path / f"rank{r}").status == "ok"  # each rank's own record
    assert sorted(run.rank_steps.groupby("rank").size().items()) == [(r, STEPS) for r in range(world)]
    assert set(run.rank_samples["rank"]) == set(range(world))
    listed = swift_nb.runs(job.runs)
    assert len(listed) == 1 and listed["world_size"].iloc[0] == world


def test_no_straggler_without_delay_and_report_has_ranks(ddp2):
    run = ddp2.run
    pr = per_rank(run)
    # Without a delay no rank straggles, where each rank has a core. On a machine busier
    # than its cores (pytest-xdist beside the job) the scheduler can give one rank half the
    # time of the other for the whole job (measured: 97 ms against 45 ms busy per step), and
    # then that rank is slower, and the analysis rightly says so.
    crowded = os.getloadavg()[0] >= (os.cpu_count() or 1)
    assert crowded or not pr["straggler"].any(), pr
    html = (run.path / "report.html").read_text()
    assert "<h2>Ranks</h2>" in html and "Collectives per step" in html
    a = analyze(run)
    assert crowded or "straggler" not in {f.id for f in a.findings}
    assert set(a.collectives["rank"]) == {0, 1}
    ar = a.collectives[a.collectives["kind"] == "all_reduce"]
    # DDP all-reduces every gradient once per step: 2 Linear(256, 256) layers, fp32
    grad_bytes = 2 * (256 * 256 + 256) * 4
    assert (ar["bytes_per_step"] == grad_bytes).all()
    assert (ar["wire_bytes_per_step"] == grad_bytes).all()  # 2·(P−1)/P = 1 for P = 2
    assert (ar["time_s_per_step"] > 0).all()


def test_single_process_per_rank_has_one_row(runs_dir):
    from support.common import train

    with swift_nb.profile(out_dir=runs_dir, wait=0, warmup=1, active=2) as run:
        train(4)
    pr = per_rank(swift_nb.load_run(run.path))
    assert len(pr) == 1 and pr["rank"].iloc[0] == 0 and pr["steps"].iloc[0] == 4
    assert pr["collective_share"].iloc[0] == 0.0 and not pr["straggler"].iloc[0]
    assert not (run.path / "ranks.csv").exists() and (run.path / "trace.json.gz").exists()


def test_fsdp_records_all_gather_and_reduce_scatter(tmp_path_factory):
    job = _job(tmp_path_factory, "fsdp", 2, "--parallel", "fsdp", "--steps", "6")
    assert job.proc.returncode == 0, job.proc.stderr[-3000:]
    run = job.run
    assert run.context["layout"]["parallel"] == ["FSDP"] and run.context["layout"]["mesh"] == {"dim0": 2}
    comm = analyze(run).collectives
    for r in (0, 1):
        kinds = comm[comm["rank"] == r].set_index("kind")
        assert kinds.loc["all_gather", "time_s_per_step"] > 0
        assert kinds.loc["reduce_scatter", "time_s_per_step"] > 0
        params_bytes = 2 * (256 * 256 + 256) * 4
        # forward and backward each gather every parameter; gradients are reduce-scattered once
        assert kinds.loc["all_gather", "bytes_per_step"] == 2 * params_bytes
        assert kinds.loc["reduce_scatter", "bytes_per_step"] == params_bytes
    # memory by category counts each rank's own shard (FSDP2 keeps DTensors)
    assert (per_rank(run)["peak_mem_bytes"] > 0).all(), per_rank(run)
    fp = memory_footprint(run).set_index("category")["at_peak_bytes"]
    assert fp["parameters"] == params_bytes / 2
    # by module: FSDP2's units under their own class, each holding its shard
    mods = analyze(run).modules.set_index("path")
    assert set(mods.index) == {"model", "0", "1", "2"}, mods.index
    assert mods.at["model", "class"] == "Sequential" and mods.at["0", "class"] == "Linear"
    assert mods.loc[["model", "0", "2"], "role"].tolist() == ["sharded"] * 3 and mods.at["1", "role"] == ""
    assert mods.at["0", "parameter_bytes"] == mods.at["0", "gradient_bytes"] == params_bytes / 4
    assert mods.at["model", "parameter_bytes"] == params_bytes / 2
    assert (mods.loc[["0", "2"], "forward_s"] > 0).all() and (mods.loc[["0", "2"], "backward_s"] > 0).all()


def test_slow_rank_is_the_straggler(tmp_path_factory):
    # 0.3 s a step: the sleep outweighs what a loaded machine does to either rank's time
    # outside the all-reduce (at 0.1 s, a busy machine once measured the sleeper 0.073 s busy)
    job = _job(tmp_path_factory, "slow", 2, "--sleep-rank", "1", "--sleep-s", "0.3", "--steps", "6")
    assert job.proc.returncode == 0, job.proc.stderr[-3000:]
    pr = per_rank(job.run)
    assert list(pr["straggler"]) == [False, True], pr
    # the fast rank waits for it inside the all-reduce
    assert pr.loc[0, "collective_s_per_step"] > pr.loc[1, "collective_s_per_step"]
    findings = {f.id: f for f in analyze(job.run).findings}
    f = findings["straggler"]
    assert f.evidence["straggler_ranks"] == [1] and f.title.startswith("Rank 1 ")
    # rank 0 waits in its all-reduce, so the communication finding holds on rank 0 alone
    f = findings["communication"]
    assert f.evidence["ranks"] == [0] and "(rank 0; others ≤ " in f.title
    assert f.evidence["per_rank_pct"]["0"] > f.evidence["per_rank_pct"]["1"]


def test_rank_raising_fails_the_job_with_its_traceback(tmp_path_factory):
    job = _job(
        tmp_path_factory,
        "raise",
        2,
        "--raise-rank",
        "1",
        "--pg-timeout-s",
        "10",
        "--steps",
        "8",
        gather_timeout_s=5,
    )
    assert job.proc.returncode != 0
    run = job.run
    assert run.status == "failed"
    ranks = run.ranks.set_index("rank")
    assert ranks.loc[1, "status"] == "failed"
    assert "ValueError: injected failure on rank 1 at step 4" in ranks.loc[1, "error"]
    assert ranks.loc[0, "status"] in ("failed", "interrupted")
    assert int(ranks.loc[0, "steps"]) >= 4 and int(ranks.loc[1, "steps"]) == 4
    assert (run.path / "trace.rank0.json.gz").exists() and (run.path / "trace.rank1.json.gz").exists()
    assert any(n.startswith("rank 1: failed: ValueError: injected failure") for n in run.notes), run.notes


def test_a_rank_out_of_memory_makes_the_job_oom_with_its_post_mortem(tmp_path_factory):
    job = _job(
        tmp_path_factory,
        "oom",
        2,
        "--raise-rank",
        "1",
        "--raise-oom",
        "--pg-timeout-s",
        "10",
        "--steps",
        "8",
        gather_timeout_s=5,
    )
    run = job.run
    assert run.status == "oom"  # rank 0 failed waiting for rank 1: the job failed because rank 1 ran out
    ranks = run.ranks.set_index("rank")
    assert ranks.loc[1, "status"] == "oom"
    assert run.oom is not None and run.oom.step == 4 and run.oom.requested_bytes == 1 << 30
    assert "rank 1 ran out of memory; the post-mortem shown is rank 1's" in run.notes
    # torchrun stops rank 0 once rank 1 has failed, so the job's report is written afterwards
    page = (swift_nb.report(run).run.path / "report.html").read_text()
    assert "Out of memory in step 4, forward, asking for 1.0 GiB" in page


def _gone(pids, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.2)
    return False


def test_killed_rank_leaves_a_partial_record_and_no_process(tmp_path_factory):
    job = _job(tmp_path_factory, "kill", 2, "--kill-rank", "1", "--steps", "8", gather_timeout_s=5)
    assert job.proc.returncode != 0
    run = job.run
    assert run.status == "failed"
    ranks = run.ranks.set_index("rank")
    # it never finished: killed. Whether rank 0's gather finds the process already reaped
    # ("crashed") or still a zombie of torchrun ("running") is a race; both say unfinished.
    assert ranks.loc[1, "status"] in ("running", "crashed")
    assert int(ranks.loc[0, "steps"]) >= 4
    assert any("rank 1 did not finish profiling" in n for n in run.notes), run.notes
    assert _gone([int(p) for p in run.ranks["pid"].dropna()])


def test_rank_that_never_profiles_is_named_missing(tmp_path_factory):
    job = _job(tmp_path_factory, "skip", 2, "--skip-rank", "1", "--steps", "6", gather_timeout_s=4)
    assert job.proc.returncode == 0, job.proc.stderr[-3000:]
    run = job.run
    assert run.context["missing_ranks"] == [1]
    assert list(run.ranks.columns) == RANK_COLUMNS
    pr = per_rank(run).set_index("rank")
    assert pr.loc[1, "status"] == "missing" and int(pr.loc[0, "steps"]) == 6
    assert any("rank 1 never arrived" in n for n in run.notes), run.notes


def test_folders_not_shared_lose_nothing(tmp_path_factory):
    runs = tmp_path_factory.mktemp("own") / "runs"
    proc = subprocess.run(
        _launch_cmd(2, free_port(), args=("--own-folders", "--steps", "6")),
        env=_env(runs),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = Job(runs / "rank0", proc).run  # rank 0's folder holds the job record …
    assert list(per_rank(run)["steps"]) == [6, 6] and list(run.ranks["source"]) == ["self", "gather"]
    (elsewhere,) = (runs / "rank1").iterdir()  # … rank 1's trace and record stay in its own
    trace = elsewhere / "trace.rank1.json.gz"
    assert trace.exists() and swift_nb.load_run(elsewhere / "rank1").status == "ok"
    assert any("rank 1's trace is not in this folder" in n and str(trace) in n for n in run.notes), run.notes
    assert "trace_rank1" not in run.files


def test_two_nodes_one_record(tmp_path):
    runs = tmp_path / "runs"
    port = free_port()
    cmd = _launch_cmd(1, port, nnodes=2, args=("--steps", "6"))
    procs = [
        subprocess.Popen(cmd, env=_env(runs), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    run = Job(runs, subprocess.CompletedProcess(cmd, 0, *outs[0])).run
    assert run.context["nnodes"] == 2
    assert sorted(n["node_rank"] for n in run.context["nodes"]) == [0, 1]
    pr = per_rank(run)
    assert sorted(pr["node_rank"]) == [0, 1] and (pr["steps"] == 6).all()
