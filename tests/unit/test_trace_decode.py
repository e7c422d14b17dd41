"""swift_nb.analysis.trace.decode: trace files decoded into the tables without a dict per
event, and decompressed in a stream that stops at a size cap; hostile files (JSON nested past
any decoder's recursion, gzip bombs) are one RecordError naming the file."""

from __future__ import annotations

import gzip
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
from support.trace_decode import (
    bomb,  # noqa: F401 (fixtures)
    write_bomb,
)

import swift_nb
from swift_nb.analysis.trace import decode as trace_decode
from swift_nb.analysis.trace.decode import DEFAULT_MAX_BYTES, read_json_bytes
from swift_nb.analysis.trace.tables import (
    cat_in,
    load_trace_file,
    parse_document,
    parse_events,
    read_trace,
    read_trace_document,
    read_trace_with_meta,
    step_rows,
)
from swift_nb.core import trace_names as tn
from swift_nb.core.errors import RecordError

DATA = Path(__file__).parents[1] / "data"


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
    # under the default cap the bomb is refused at its first MAX_STRETCH of whitespace
    with pytest.raises(RecordError, match="64 MiB of JSON without a string"):
        read_json_bytes(bomb)


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


def test_a_trace_without_complete_events_is_empty_not_malformed(tmp_path):
    path = tmp_path / "t.json"
    for text in (b'{"traceEvents": []}', b'[{"ph": "i", "name": "x", "ts": 1}]'):
        path.write_bytes(text)
        got, expected = read_trace(path), parse_events([])
        for name in ("events", "memory", "steps"):
            pd.testing.assert_frame_equal(getattr(got, name), getattr(expected, name))


@pytest.mark.parametrize("piece", [1, 7, 1000])
def test_inflating_a_piece_at_a_time_loses_nothing(tmp_path, monkeypatch, piece):
    """Pieces of any size, across reads and members."""
    monkeypatch.setattr(trace_decode, "_PIECE", piece)
    monkeypatch.setattr(trace_decode, "_READ", 100)
    text = b'{"traceEvents": [' + b'{"ph": "i", "name": "' + b"}" * 5000 + b'"}' + b"]}"
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(text[:40]) + gzip.compress(text[40:], compresslevel=9))
    assert read_json_bytes(path) == text


DEPTH = 200_000


DEEP = {
    "in traceEvents": b'{"traceEvents": [' + b"[" * DEPTH + b"]" * DEPTH + b"]}",
    "bare array": b"[" + b"[" * DEPTH + b"]" * DEPTH + b"]",
    "in args": b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "args": {"x": '
    + b'{"a": ' * DEPTH
    + b"1"
    + b"}" * DEPTH
    + b"}}]}",
    "in metadata": b'{"traceEvents": [], "distributedInfo": ' + b"[" * DEPTH + b"]" * DEPTH + b"}",
}


@pytest.mark.parametrize("gzipped", [False, True], ids=["json", "gzip"])
@pytest.mark.parametrize("where", DEEP)
def test_json_nested_past_any_recursion_is_one_record_error(tmp_path, where, gzipped):
    path = tmp_path / ("deep.json.gz" if gzipped else "deep.json")
    path.write_bytes(gzip.compress(DEEP[where]) if gzipped else DEEP[where])
    for read in (read_trace, read_trace_document):
        with pytest.raises(RecordError, match=r"not JSON: .*(nested too deeply|depth limit)") as info:
            read(path)
        assert info.value.path == path and str(info.value).startswith(f"{path}: ")


@pytest.mark.parametrize("limit", [1000, 2000, 5000])
@pytest.mark.parametrize("depth", [33, 1020])
def test_args_nested_past_the_limit_are_one_record_error_at_any_recursion_limit(tmp_path, limit, depth):
    """orjson decodes 1024 levels, more than the str() of an event's shapes recurses at
    Python's default limit; past ``MAX_NESTING`` the trace is refused the same way whatever
    the interpreter's limit (Inductor raises it to 2000 for the rest of a process)."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    path = tmp_path / "t.json"
    dims = b"[" * depth + b"]" * depth
    path.write_bytes(
        b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "args": {"Input Dims": ' + dims + b"}}]}"
    )
    try:
        with pytest.raises(RecordError, match="nested too deeply"):
            parse_document(path, read_trace_document(path))
        with pytest.raises(RecordError, match="nested too deeply"):
            read_trace(path)
    finally:
        sys.setrecursionlimit(before)


def test_args_at_the_nesting_limit_are_read(tmp_path):
    path = tmp_path / "t.json"
    dims = b"[" * trace_decode.MAX_NESTING + b"]" * trace_decode.MAX_NESTING
    path.write_bytes(
        b'{"traceEvents": [{"ph": "X", "name": "ProfilerStep#1", "ts": 1, "dur": 5, "args": {"Input Dims": '
        + dims
        + b"}}]}"
    )
    cols = parse_document(path, read_trace_document(path))
    assert cols is not None


def test_the_import_refuses_deep_nesting_naming_the_file(tmp_path):
    path = tmp_path / "deep.json"
    path.write_bytes(DEEP["in args"])
    out = tmp_path / "runs"
    with pytest.raises(RecordError, match="nested too deeply") as info:
        swift_nb.import_trace(path, out, report=False)
    assert info.value.path == path
    assert not [p for p in out.iterdir() if not p.name.startswith(".")]


@pytest.mark.parametrize(
    "body, missing",
    [(b" ", "a string"), (b"\n\t ", "a string"), (b"[", "a string"), (b'{"a": ', "the end of an object")],
    ids=["spaces", "whitespace", "nesting", "nested objects"],
)
def test_a_bomb_is_refused_at_the_first_long_stretch_without_inflating_more(
    tmp_path, monkeypatch, body, missing
):
    monkeypatch.setattr(trace_decode, "MAX_STRETCH", 1 << 20)
    bomb = write_bomb(tmp_path / "bomb.json.gz", 64, body)
    tracemalloc.start()
    try:
        with pytest.raises(RecordError, match=f"more than 1 MiB of JSON without {missing}") as info:
            read_trace(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.path == bomb
    assert peak < 8 << 20  # a stretch and a piece, never the 64 MiB


def test_a_giant_string_is_refused_like_a_bomb(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_decode, "MAX_STRETCH", 1 << 20)
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "' + b"a" * (8 << 20) + b'"}]}'))
    with pytest.raises(RecordError, match="without a string"):
        read_trace(path)


def test_real_traces_have_no_stretch_near_the_limit(monkeypatch):
    monkeypatch.setattr(trace_decode, "MAX_STRETCH", 64 << 10)  # a thousandth of the limit
    for path in TRACES:
        read_json_bytes(path)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.parent.name + "/" + p.name)
def test_cat_in_and_step_rows_answer_as_the_columns_do(path):
    events = read_trace(path).events
    cats = set(events["cat"].dropna())
    for asked in [(c,) for c in cats] + [tuple(tn.DEVICE_WORK), ("cpu_op", "kernel"), ("no such category",)]:
        np.testing.assert_array_equal(
            cat_in(events, *asked), events["cat"].isin(asked).to_numpy(), str(asked)
        )
    rows = step_rows(events)
    assert sorted(rows) == sorted(set(events["step"]))
    for step, at in rows.items():
        np.testing.assert_array_equal(at, np.flatnonzero(events["step"].to_numpy() == step))


def test_cat_in_of_a_category_missing_or_not_text():
    events = pd.DataFrame({"cat": ["cpu_op", None, 5, "kernel", float("nan")]})
    np.testing.assert_array_equal(cat_in(events, "cpu_op", "kernel"), [True, False, False, True, False])
    np.testing.assert_array_equal(cat_in(events, "gpu_memcpy"), [False] * 5)
