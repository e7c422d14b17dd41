"""Run records on disk: round trip, listing, retention, pinning, corrupt folders."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pandas as pd
import pandas.testing as pdt
import pytest
from conftest import train

import swift_nb
from swift_nb.analysis.ranks import per_rank
from swift_nb.record import Run, new_run_id, prune, save


def _fake_run(root, i: int, status: str = "ok") -> Run:
    run = Run(
        id=f"20260101-0000{i:02d}-r{i}", label=f"r{i}", status=status, started_at=f"2026-01-01T00:00:{i:02d}"
    )
    run.pid, run.host = os.getpid(), "elsewhere-never-alive"
    run.steps = pd.DataFrame({"step": [0, 1], "trigger": ["optimizer"] * 2, "duration_s": [0.1, 0.2]})
    save(run, root / run.id)
    return run


@pytest.mark.slow  # profiles a real loop
def test_load_round_trips_a_real_run(runs_dir):
    with swift_nb.profile(out_dir=runs_dir, label="rt", context={"seq_len": 32}) as run:
        train(6)
    loaded = swift_nb.load_run(run.path)
    assert loaded.meta() == run.meta()
    pdt.assert_frame_equal(loaded.steps, run.steps, check_dtype=False)
    pdt.assert_frame_equal(loaded.samples, run.samples, check_dtype=False)
    assert loaded.context["seq_len"] == 32
    assert loaded.context["optimizer"] == "AdamW"
    assert swift_nb.load_run(save(loaded, run.path)).meta() == run.meta()


def test_runs_lists_newest_first(runs_dir):
    for i in range(3):
        _fake_run(runs_dir, i)
    table = swift_nb.runs(runs_dir)
    assert list(table["label"]) == ["r2", "r1", "r0"]
    assert list(table.columns[:3]) == ["id", "label", "status"]


def test_retention_keeps_exactly_n_and_spares_pinned(runs_dir):
    runs = [_fake_run(runs_dir, i) for i in range(6)]
    swift_nb.pin(runs[0])
    deleted = prune(runs_dir, keep=3)
    assert sorted(p.name for p in deleted) == sorted(r.id for r in runs[1:3])
    table = swift_nb.runs(runs_dir)
    assert set(table["label"]) == {"r0", "r3", "r4", "r5"}
    assert table.set_index("label").loc["r0", "pinned"]


def test_retention_never_deletes_a_run_being_written(runs_dir):
    live = _fake_run(runs_dir, 0, status="running")
    live.host = __import__("socket").gethostname()
    save(live)
    for i in range(1, 4):
        _fake_run(runs_dir, i)
    prune(runs_dir, keep=1)
    assert live.path.exists()


_OVERLAPPING_RUN = """
import sys, time, torch, swift_nb
root, label, sleep_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with swift_nb.profile(out_dir=root, keep=1, label=label, wait=0, warmup=0, active=1, report=False):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    print("inside", flush=True)
    time.sleep(sleep_s)
"""


def _overlapping(runs_dir, label, sleep_s) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _OVERLAPPING_RUN, str(runs_dir), label, str(sleep_s)],
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow  # profiles a real loop
def test_two_processes_sharing_a_folder_leave_keep_finished_runs(runs_dir):
    slow = _overlapping(runs_dir, "slow", 30)
    assert slow.stdout is not None and slow.stdout.readline().strip() == "inside"
    fast = _overlapping(runs_dir, "fast", 0)
    assert fast.wait(timeout=120) == 0
    assert sorted(swift_nb.runs(runs_dir)["status"]) == ["ok", "running"]  # a running run is never pruned
    os.kill(slow.pid, signal.SIGINT)  # ends its sleep: the run ends `interrupted`, and prunes
    slow.communicate(timeout=120)
    table = swift_nb.runs(runs_dir)
    assert list(table["label"]) == ["slow"]  # the run that just ended stays, whatever its age
    assert list(table["status"]) == ["interrupted"]
    with swift_nb.profile(out_dir=runs_dir, keep=1, label="third", wait=0, warmup=0, active=1, report=False):
        train(1)
    assert list(swift_nb.runs(runs_dir)["label"]) == ["third"]


def test_prune_keeps_finished_runs_beside_a_live_one(runs_dir):
    live = _fake_run(runs_dir, 5, status="running")
    live.host = __import__("socket").gethostname()
    save(live)
    for i in range(3):
        _fake_run(runs_dir, i)
    assert sorted(p.name for p in prune(runs_dir, keep=2)) == ["20260101-000000-r0"]
    assert sorted(swift_nb.runs(runs_dir)["label"]) == ["r1", "r2", "r5"]


@pytest.mark.slow  # profiles a real loop
def test_profile_applies_retention(runs_dir):
    for _ in range(3):
        with swift_nb.profile(out_dir=runs_dir, keep=2, wait=0, warmup=0, active=1):
            train(1)
    assert len(swift_nb.runs(runs_dir)) == 2


def test_corrupt_folder_is_a_damaged_row(runs_dir):
    _fake_run(runs_dir, 1)
    bad = runs_dir / "20260101-000099-bad"
    bad.mkdir()
    (bad / "run.json").write_text('{"id": "trunc')
    table = swift_nb.runs(runs_dir)
    assert list(table["status"]) == ["ok", "damaged"]  # its start is unknown: listed last
    damaged = table.iloc[1]
    assert damaged["id"] == bad.name and damaged["path"] == str(bad)
    assert damaged["problem"].startswith("run.json: not valid JSON (Unterminated string")
    assert prune(runs_dir, keep=1) == [] and bad.exists()  # never deleted unread


def test_dead_running_record_shows_as_crashed(runs_dir):
    run = _fake_run(runs_dir, 1, status="running")
    run.host, run.pid = __import__("socket").gethostname(), 2**22 + 12345
    save(run)
    assert swift_nb.runs(runs_dir)["status"].tolist() == ["crashed"]


@pytest.mark.slow  # profiles a real loop
def test_records_hold_no_tensor_contents(runs_dir):
    with swift_nb.profile(out_dir=runs_dir) as run:
        train(5)
    meta = json.loads((run.path / "run.json").read_text())
    assert "tensor(" not in json.dumps(meta)


def test_run_ids_are_sortable_and_safe():
    rid = new_run_id("my run/<x>")
    assert "/" not in rid and "<" not in rid and rid[:8].isdigit()


def _fake_job(root, comm_shares, missing=()) -> Run:
    """A job record as rank 0 writes it: rank 0's tables plus ranks.csv and rank_steps.csv."""
    from swift_nb.capture.job import RANK_COLUMNS

    run = _fake_run(root, 9)
    world = len(comm_shares) + len(missing)
    rows = []
    for r in range(world):
        row = dict.fromkeys(RANK_COLUMNS)
        if r in missing:
            row.update(rank=r, status="missing", source="missing")
        else:
            share = comm_shares[r]
            row.update(rank=r, node_rank=r // 2, host="h", status="ok", source="gather", steps=2)
            row.update(
                step_time_median_s=0.1,
                peak_mem_bytes=1e6,
                collective_share=share,
                collective_s_per_step=0.1 * share,
            )
        rows.append(row)
    run.ranks = pd.DataFrame(rows, columns=RANK_COLUMNS)
    run.rank_steps = pd.concat([run.steps.assign(rank=r) for r in range(len(comm_shares))], ignore_index=True)
    run.context.update(world_size=world, nnodes=(world + 1) // 2, missing_ranks=list(missing))
    save(run)
    return swift_nb.load_run(run.path)


def test_per_rank_flags_the_rank_the_others_wait_for(runs_dir):
    run = _fake_job(runs_dir, [0.5, 0.05, 0.5, 0.45], missing=[4])
    pr = per_rank(run)
    assert list(pr["rank"]) == [0, 1, 2, 3, 4]
    assert list(pr["straggler"]) == [False, True, False, False, False]
    assert pr.loc[4, "status"] == "missing" and pd.isna(pr.loc[4, "busy_s"])
    assert sorted(run.rank_steps["rank"].unique()) == [0, 1, 2, 3]
    assert swift_nb.runs(runs_dir)["world_size"].iloc[0] == 5


def test_per_rank_ignores_jitter(runs_dir):
    # ±10 % of a step spent waiting differently is no straggler
    pr = per_rank(_fake_job(runs_dir, [0.5, 0.4, 0.45]))
    assert not pr["straggler"].any()
