"""swift_nb.importing.pool's local worker processes, killed as the OOM killer would kill them:
the import always ends in ``RanksNotReadError`` naming the traces not read, and neither the
pool nor multiprocessing's helper processes (its fork server, its resource tracker) print
anything on the user's stderr. Each round runs in one subprocess whose whole stderr is read,
the helpers' included (they inherit it, as in a notebook's kernel)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.jobs import write_job

import swift_nb
from swift_nb.core.errors import RecordError
from swift_nb.importing.pool import WorkerError

#: a reduction whose worker, given the trace called ``name``, is killed before reading it;
#: ``family``: the fork server that forked it and the resource tracker go first (the OOM
#: killer picks by size, not by role). Imported by the workers from the script's folder.
KILLING = """
import os
import signal
from pathlib import Path

import psutil

from swift_nb.importing.rank import reduce_rank


def dies_on(name, how, path, staged, max_bytes, analyze):
    if Path(path).name == name and how != "server":
        if how == "family":
            server = psutil.Process(os.getppid())
            for p in server.parent().children():
                if "resource_tracker" in " ".join(p.cmdline()):
                    p.kill()
            server.kill()
        os.kill(os.getpid(), signal.SIGKILL)
    return reduce_rank(path, staged, max_bytes, analyze)
"""

#: one import per round in one process, as a notebook's kernel imports again and again;
#: prints what each round ended in
ROUNDS = """
import json
import os
import signal
import sys
from functools import partial
from multiprocessing import forkserver
from pathlib import Path

import killing
import swift_nb
from swift_nb.importing import assembly, pool
from swift_nb.importing.pool import RanksNotReadError

job, out = Path(sys.argv[1]), Path(sys.argv[2])
names = sorted(p.name for p in job.iterdir())
connect = forkserver.connect_to_new_process


def connect_then_server_dies(fds):
    pair = connect(fds)
    os.kill(forkserver._forkserver._forkserver_pid, signal.SIGKILL)
    return pair


for victim, workers, how in json.loads(sys.argv[3]):
    reduce = partial(killing.dies_on, names[victim], how)
    assembly.reduce_in_workers = partial(pool.reduce_in_workers, reduce=reduce)
    forkserver.connect_to_new_process = connect_then_server_dies if how == "server" else connect
    try:
        swift_nb.import_trace(job, out, report=False, workers=workers)
        said = "no error"
    except RanksNotReadError as e:
        named = job / names[victim] in e.unread and names[victim] in str(e)
        said = "RanksNotReadError" if named else f"RanksNotReadError without {names[victim]}: {e}"
    except BaseException as e:
        said = repr(e)
    print(json.dumps([victim, workers, how, said]), flush=True)
"""

#: (trace killed on, workers, what is killed): the first trace with 4 workers is killed
#: while the others are still being started (and the fork server killed then may leave a
#: worker being started without its pid); ``server``: the fork server dies as each worker
#: is being started, before it has said the worker's pid
CASES = [(0, 4, "self"), (1, 4, "self"), (0, 2, "self"), (7, 2, "self")]
CASES += [(0, 4, "family"), (2, 4, "family"), (0, 2, "family"), (6, 2, "family"), (0, 2, "server")]


def test_a_killed_worker_is_always_ranks_not_read_and_nothing_on_stderr(tmp_path):
    job = write_job(tmp_path / "job", 8)
    (tmp_path / "killing.py").write_text(KILLING)
    (tmp_path / "rounds.py").write_text(ROUNDS)
    rounds = CASES * 2
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "rounds.py"), str(job), str(tmp_path / "runs"), json.dumps(rounds)],
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ended = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(ended) == len(rounds), proc.stdout
    wrong = [e for e in ended if e[3] != "RanksNotReadError"]
    assert not wrong, wrong
    assert proc.stderr == "", proc.stderr[-3000:]
    assert not [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]


def test_a_trace_a_worker_cannot_read_keeps_its_own_error(tmp_path):
    """A damaged trace read in a worker is the error reading it in this process gives, with
    the worker's traceback as its cause; the other workers are stopped, no run is left."""
    job = write_job(tmp_path / "job", 4)
    (job / "rank2.json.gz").write_bytes(b"[1, 2")
    with pytest.raises(RecordError, match=r"rank2\.json\.gz") as caught:
        swift_nb.import_trace(job, tmp_path / "runs", report=False, workers=2)
    assert isinstance(caught.value.__cause__, WorkerError)
    assert "Traceback" in str(caught.value.__cause__) and "read_trace_file" in str(caught.value.__cause__)
    assert not [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
