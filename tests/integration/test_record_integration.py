"""Run records on disk: round trip, listing, retention, pinning, corrupt folders."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pandas.testing as pdt
from support.common import train

import swift_nb
from swift_nb.record import save


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


def test_profile_applies_retention(runs_dir):
    for _ in range(3):
        with swift_nb.profile(out_dir=runs_dir, keep=2, wait=0, warmup=0, active=1):
            train(1)
    assert len(swift_nb.runs(runs_dir)) == 2


def test_records_hold_no_tensor_contents(runs_dir):
    with swift_nb.profile(out_dir=runs_dir) as run:
        train(5)
    meta = json.loads((run.path / "run.json").read_text())
    assert "tensor(" not in json.dumps(meta)
