"""A run's analysis kept beside it (``analysis/stored.py``): a reopen takes it instead of
reading the trace, only while nothing the analysis read has changed, and the file is read
as data, never as code. Real runs: a CPU run profiled here, a real CUDA trace and a real
two-rank job imported."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
import torch
from support.common import train
from support.imported_traces import JOB, NCCL_RANK0

import swift_nb
from swift_nb.analysis import Analysis, analyze, stored
from swift_nb.record import REPORT_FILE, load_run


def _profiled(runs_dir: Path) -> Path:
    model = train(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with swift_nb.profile(out_dir=runs_dir, report=True) as run:
        train(6, model, opt)
    return Path(run.path)


def _imported(source, runs_dir: Path) -> Path:
    return Path(swift_nb.import_trace(source, runs_dir, report=True).path)


def _spoil_keeping_size_and_time(path: Path) -> None:
    """``path``'s bytes made unreadable as a trace or tables, its size and modification time
    as they were: what a reopen then reads of it fails."""
    stat = path.stat()
    path.write_bytes(b"\0" * stat.st_size)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.fixture(params=["profiled", "cuda trace", "two-rank job"])
def folder(request, runs_dir) -> Path:
    if request.param == "profiled":
        return _profiled(runs_dir)
    return _imported(NCCL_RANK0 if request.param == "cuda trace" else JOB, runs_dir)


def test_a_reopen_reads_the_kept_analysis_not_the_trace(folder):
    first_html = (folder / REPORT_FILE).read_text()
    kept = stored.load_analysis(load_run(folder), Analysis)
    assert kept is not None and kept.viewer is not None
    # what it keeps is what analysing the run again gives, to the last cell and attribute
    assert stored.same(kept.analysis, analyze(load_run(folder)))
    traces = [p for p in folder.rglob("*") if p.name.endswith((".json.gz", ".tables.npz"))]
    assert traces
    for path in traces:
        _spoil_keeping_size_and_time(path)
    again = swift_nb.report(folder)
    assert not again.run.problems, again.run.problems
    assert stored.same(again.analysis, kept.analysis)
    # the same report: its sections, figures and the timeline viewer with its events
    assert (folder / REPORT_FILE).read_text() == first_html


def test_what_the_analysis_reads_changing_makes_it_stale(runs_dir, monkeypatch):
    folder = _profiled(runs_dir)
    assert stored.load_analysis(load_run(folder)) is not None

    steps = folder / "steps.csv"
    original = steps.read_bytes()
    steps.write_bytes(original + b"\n")
    assert stored.load_analysis(load_run(folder)) is None
    steps.write_bytes(original)  # the same bytes, a later time: still another file to it
    assert stored.load_analysis(load_run(folder)) is None

    swift_nb.report(folder)  # analysed again, and kept again
    run = load_run(folder)
    assert stored.load_analysis(run) is not None
    run.context["world_size"] = 8  # the record in memory, not only its files
    assert stored.load_analysis(run) is None
    monkeypatch.setattr(stored, "code_digest", lambda: "another version of swift_nb")
    assert stored.load_analysis(load_run(folder)) is None


def test_a_damaged_file_is_analysed_again_and_replaced(runs_dir):
    folder = _profiled(runs_dir)
    path = folder / stored.ANALYSIS_FILE
    whole = path.read_bytes()
    for damaged in (whole[: len(whole) // 2], b"[]", b'{"format": 1}', b"\xff\xfe"):
        path.write_bytes(damaged)
        assert stored.load_analysis(load_run(folder)) is None
    report = swift_nb.report(folder)
    assert report.analysis is not None and not report.run.problems
    assert stored.load_analysis(load_run(folder)) is not None


@pytest.mark.parametrize(
    "named",
    ["os:system", "builtins:eval", "subprocess:Popen", "swift_nb.reporting:report", "swift_nb:profile"],
)
def test_a_file_naming_code_runs_nothing(runs_dir, named):
    """A shared run folder's file can name any type: only swift_nb's own dataclasses and
    enums are rebuilt, field by field, without running anything they name."""
    folder = _profiled(runs_dir)
    path = folder / stored.ANALYSIS_FILE
    kept = orjson.loads(path.read_bytes())
    kept["analysis"]["fields"]["verdict"] = {"~object": named, "fields": {"command": "touch /tmp/x"}}
    path.write_bytes(orjson.dumps(kept))
    with pytest.raises(ValueError, match=r"swift_nb's own|not a dataclass"):
        stored.decode(kept["analysis"]["fields"]["verdict"])
    assert stored.load_analysis(load_run(folder)) is None
    assert swift_nb.report(folder).analysis is not None  # analysed again instead


class Colour(enum.Enum):
    RED = "red"


@dataclass(frozen=True)
class Point:
    x: float
    label: tuple[str, ...] = ()


def test_values_come_back_equal_to_the_last_cell():
    frame = pd.DataFrame(
        {
            "name": ["aten::mm", None, float("nan")],
            "ms": [1.5, float("nan"), float("inf")],
            "n": np.array([1, 2, 3], dtype=np.int32),
            "ok": [True, False, True],
            "kind": pd.Categorical(["a", "b", "a"]),
            "maybe": pd.array([1, None, 3], dtype="Int64"),
            "stamp": pd.to_datetime(["2026-12-07", None, "2026-12-08"]),
        },
        index=pd.Index(["x", "y", "z"], name="op"),
    )
    frame.attrs = {"time_source": "device", "blocks": {"count": 4, "shares": (0.1, 0.2)}}
    nested = pd.DataFrame(
        {"v": [1.0, 2.0]}, index=pd.MultiIndex.from_tuples([(0, "a"), (1, "b")], names=["s", "k"])
    )
    value = {
        "frame": frame,
        "nested": nested,
        "series": pd.Series([1.0, None], name="s"),
        "empty": pd.DataFrame(),
        "float": float("-inf"),
        "keys": {1: "one", ("a", 2): Path("/tmp/x")},
        "set": frozenset({1, 2}),
        "array": np.arange(6, dtype=np.float32).reshape(2, 3),
        "numpy scalar": np.float64(0.25),
    }
    assert stored.same(stored.decode(orjson.loads(orjson.dumps(stored.encode(value)))), value)
    assert not stored.same(frame, frame.astype({"n": np.int64}))  # a dtype is part of the value


def test_what_cannot_be_kept_exactly_is_not_kept(runs_dir):
    folder = _profiled(runs_dir)
    run = load_run(folder)
    assert not stored.save_analysis(run, {"a function": lambda: None})
    assert not (folder / stored.ANALYSIS_FILE).exists()  # the earlier one is gone, not stale
    assert not stored.save_analysis(run, [Point(1.0), Colour.RED])  # the test's own types
    assert stored.load_analysis(run) is None
