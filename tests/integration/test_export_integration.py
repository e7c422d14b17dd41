"""swift_nb.export: a run sent to MLflow (a local sqlite store), W&B (offline) and
TensorBoard (event files), each read back with the library's own reader; an active MLflow
run joined; a missing extra named; ``swift-nb export``."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest
from support.export import run  # noqa: F401 (fixtures)

from swift_nb.record import (
    REPORT_FILE,
    TRACE_FILE,
)
from swift_nb.trackers import export


def _wandb_records(folder: Path, wait_s: float = 60.0) -> list:
    """The records of W&B's offline run file (``run-*.wandb``), once it holds its ``exit``
    record, the last one ``finish()`` writes: W&B's service process writes the file, and
    it may still be writing when ``finish()`` has returned (waiting for the run and a
    summary only, one run in six read 12 of 30 steps' history)."""
    deadline = time.monotonic() + wait_s
    while True:
        files = list(folder.rglob("run-*.wandb"))
        records = _read_wandb_file(files[0]) if files else []
        kinds = {r.WhichOneof("record_type") for r in records}
        if "exit" in kinds or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def _read_wandb_file(path: Path) -> list:
    """The records of one W&B run file: its LevelDB-style log of the library's own
    ``Record`` protobufs, read as W&B's sync reads it."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if len(data) < 7:  # not yet written
        return []
    assert data[:4] == b":W&B"
    block, pos, out, pending = 32768, 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if (kind == 0 and length == 0) or pos + 7 + length > len(data):  # the end, or a record half-written
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(pending)
            out.append(rec)
            pending = b""
    return out


def test_wandb_offline_run(run, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    export(run, to="wandb", dir=str(tmp_path), project="swift")
    records = _wandb_records(tmp_path / "wandb")

    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert runs and runs[0].display_name == "exported" and runs[0].project == "swift"
    history = [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    by_step = {h["swift_nb/step"]: h for h in history if "swift_nb/step" in h}
    assert sorted(by_step) == list(range(30))
    assert by_step[25]["swift_nb/series/step_time_s"] == pytest.approx(0.13)
    assert by_step[3]["swift_nb/series/step_energy_j"] == pytest.approx(25.0)
    assert any(k.startswith("swift_nb/findings/") for h in history for k in h)  # a table's fields
    summary = {
        (i.key or "/".join(i.nested_key)): json.loads(i.value_json)
        for r in records
        if r.WhichOneof("record_type") == "summary"
        for i in r.summary.update
    }
    assert summary["swift_nb/cost_usd"] == pytest.approx(run.summary["cost_usd"])
    ours = [
        r.artifact
        for r in records
        if r.WhichOneof("record_type") == "artifact" and r.artifact.type == "swift_nb_run"
    ]
    assert len(ours) == 1 and {e.path for e in ours[0].manifest.contents} == {REPORT_FILE, TRACE_FILE}


def test_wandb_joins_the_active_run(run, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    users = wandb.init(project="mine", name="users-own", dir=str(tmp_path))
    try:
        users.log({"loss": 1.0})
        assert export(run, to="wandb").endswith(users.id)
        assert wandb.run is users  # left running: it is the user's
        users.log({"loss": 0.5})
    finally:
        users.finish()
    records = _wandb_records(tmp_path / "wandb")
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 1
    keys = {
        i.key or "/".join(i.nested_key)
        for r in records
        if r.WhichOneof("record_type") == "history"
        for i in r.history.item
    }
    assert {"loss", "swift_nb/series/step_time_s"} <= keys
