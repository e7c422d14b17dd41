"""swift_nb.analysis.trace_decode: trace files decoded into the tables without a dict per
event, and decompressed in a stream that stops at a size cap."""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import orjson
import pandas as pd
import pytest

import swift_nb
from swift_nb.analysis.trace import (
    load_trace_file,
    parse_events,
    read_trace,
    read_trace_document,
    read_trace_with_meta,
)
from swift_nb.analysis.trace_decode import DEFAULT_MAX_BYTES, read_json_bytes
from swift_nb.errors import RecordError

DATA = Path(__file__).parent / "data"
TRACES = [*sorted((DATA / "gpu").glob("*.json.gz")), DATA / "cost_run" / "trace.json.gz"]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.parent.name + "/" + p.name)
def test_the_tables_are_those_of_a_dict_per_event(path):
    expected = parse_events(read_trace_document(path)["traceEvents"])
    got = read_trace(path)
    for name in ("events", "memory", "steps"):
        pd.testing.assert_frame_equal(getattr(got, name), getattr(expected, name))


def test_the_metadata_comes_with_the_tables():
    trace, meta = read_trace_with_meta(DATA / "gpu" / "gpu_nccl_2ranks_rank0.json.gz")
    assert meta["distributedInfo"]["world_size"] == 2 and "traceEvents" not in meta
    assert len(trace.steps) > 0


def test_the_bare_array_form_and_a_gzip_of_several_members(tmp_path):
    doc = read_trace_document(DATA / "cost_run" / "trace.json.gz")
    text = orjson.dumps(doc["traceEvents"])
    bare = tmp_path / "bare.json"
    bare.write_bytes(text)
    members = tmp_path / "members.json.gz"
    half = len(text) // 2
    members.write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]))
    expected = parse_events(doc["traceEvents"])
    for path in (bare, members):
        pd.testing.assert_frame_equal(read_trace(path).events, expected.events)


@pytest.fixture
def bomb(tmp_path) -> Path:
    """256 MiB of JSON whitespace in a gzip of a few hundred KB."""
    path = tmp_path / "bomb.json.gz"
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(b'{"traceEvents": [')
        block = b" " * (1 << 20)
        for _ in range(256):
            f.write(block)
        f.write(b"]}")
    return path


def test_a_gzip_bomb_is_refused_at_the_cap_before_it_is_whole(bomb):
    tracemalloc.start()
    try:
        with pytest.raises(RecordError) as info:
            read_trace(bomb, max_bytes=4 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.path == bomb
    message = str(info.value)
    assert str(bomb) in message and "max_bytes=4194304" in message and "pass a larger max_bytes=" in message
    assert peak < 32 << 20  # the 256 MiB were never held


def test_the_cap_reaches_the_import_and_the_default_is_generous(bomb, tmp_path):
    out = tmp_path / "runs"
    with pytest.raises(RecordError, match="max_bytes=1048576"):
        swift_nb.import_trace(bomb, out, max_bytes=1 << 20)
    assert not [p for p in out.iterdir() if not p.name.startswith(".")]  # no half-imported run
    assert DEFAULT_MAX_BYTES == 16 << 30
    assert len(read_json_bytes(bomb)) == (256 << 20) + len(b'{"traceEvents": []}')


def test_a_plain_file_over_the_cap_is_refused_unread(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b'{"traceEvents": []}' + b" " * 4096)
    with pytest.raises(RecordError, match="max_bytes=1000"):
        load_trace_file(path, max_bytes=1000)


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"", "the file is empty"),
        (b"   \n", "the file is empty"),
        (b"plain text", "not JSON"),
        (b'{"traceEvents": {"not": "a list"}}', "not a Chrome trace"),
        (b'{"other": 1}', "not a Chrome trace"),
        (b'{"traceEvents": [{"ph": "X", "name": "a"}]}', "malformed trace events"),
    ],
)
def test_what_is_wrong_with_a_file_is_said(tmp_path, content, problem):
    path = tmp_path / "t.json"
    path.write_bytes(content)
    with pytest.raises(RecordError, match=problem) as info:
        read_trace(path)
    assert info.value.path == path


def test_a_gzip_cut_short_is_damaged(tmp_path):
    data = (DATA / "cost_run" / "trace.json.gz").read_bytes()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(RecordError, match="end-of-stream"):
        read_trace(path)
