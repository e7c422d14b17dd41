"""A large trace's events decoded by two processes (``swift_nb.importing.halves``): the
tables are those one process makes of the same file, and an error in the worker's half
is the import's ``RecordError``, as it would be in one process. The size past which a
trace is split is lowered for the test: the shared GPU traces hold tens of thousands of
events, not millions."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

import swift_nb
from swift_nb.analysis.trace.tables import read_trace, read_trace_with_meta
from swift_nb.core.errors import RecordError
from swift_nb.importing import halves

GPU = Path(__file__).parents[1] / "data" / "gpu"


@pytest.fixture
def split_small(monkeypatch):
    monkeypatch.setattr(halves, "MIN_EVENTS", 1000)


@pytest.mark.parametrize("name", ["gpu_nccl_2ranks_rank0.json.gz", "gpu_1rank_5steps.json.gz"])
def test_two_halves_make_the_tables_one_process_makes(split_small, name):
    one = read_trace(GPU / name)
    two, meta = read_trace_with_meta(GPU / name, decode=halves.decode_in_halves)
    assert len(two.events) > 2 * 1000 and meta
    for table in ("events", "memory", "steps"):
        pd.testing.assert_frame_equal(getattr(two, table), getattr(one, table))


def test_an_import_of_one_trace_decodes_it_in_halves(split_small, tmp_path, monkeypatch):
    called = []
    real = halves.decode_in_halves
    monkeypatch.setattr(halves, "decode_in_halves", lambda *a: called.append(1) or real(*a))
    from swift_nb.importing import files

    monkeypatch.setattr(files, "decode_in_halves", halves.decode_in_halves)
    run = swift_nb.import_trace(GPU / "gpu_1rank_5steps.json.gz", tmp_path, report=False)
    assert called == [1]
    assert run.summary["trace_events"] == len(read_trace(GPU / "gpu_1rank_5steps.json.gz").events)


def test_a_malformed_event_in_the_workers_half_is_a_record_error(split_small, tmp_path):
    doc = json.loads(gzip.decompress((GPU / "gpu_1rank_5steps.json.gz").read_bytes()))
    events = doc["traceEvents"]
    last_x = max(i for i, e in enumerate(events) if e.get("ph") == "X")
    events[last_x]["ts"] = "not a time"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(RecordError, match="malformed trace events") as one:
        read_trace(bad)
    with pytest.raises(RecordError, match="malformed trace events") as two:
        read_trace_with_meta(bad, decode=halves.decode_in_halves)
    assert two.value.path == bad and two.value.problem == one.value.problem


def test_without_room_for_the_half_it_is_decoded_in_one_process(split_small, monkeypatch):
    """A container's /dev/shm is often 64 MB and its temp folder small: where the second
    half does not fit, nothing is written and the trace is decoded here, whole."""
    import os

    monkeypatch.setattr(
        os, "statvfs", lambda folder: os.statvfs_result((4096, 4096, 10, 1, 1, 10, 1, 1, 0, 255))
    )
    started = []
    monkeypatch.setattr(halves, "context", lambda: started.append(1))
    one = read_trace(GPU / "gpu_nccl_2ranks_rank0.json.gz")
    two, _ = read_trace_with_meta(GPU / "gpu_nccl_2ranks_rank0.json.gz", decode=halves.decode_in_halves)
    assert started == []
    pd.testing.assert_frame_equal(two.events, one.events)
