"""Run records on disk: round trip, listing, retention, pinning, corrupt folders."""

from __future__ import annotations

import os

import pandas as pd

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


def test_prune_keeps_finished_runs_beside_a_live_one(runs_dir):
    live = _fake_run(runs_dir, 5, status="running")
    live.host = __import__("socket").gethostname()
    save(live)
    for i in range(3):
        _fake_run(runs_dir, i)
    assert sorted(p.name for p in prune(runs_dir, keep=2)) == ["20260101-000000-r0"]
    assert sorted(swift_nb.runs(runs_dir)["label"]) == ["r1", "r2", "r5"]


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
