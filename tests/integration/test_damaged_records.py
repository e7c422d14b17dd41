"""A damaged run folder says which file is damaged and how; nothing damaged is reported as
a success, and one damaged run never hides the others.

One real run is recorded once (module fixture); each test damages its own copy."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pytest
import torch

import swift_nb
from swift_nb.analysis.trace.tables import load_trace_file, parse_events
from swift_nb.cli import main
from swift_nb.core.errors import RecordError
from swift_nb.record import STEP_COLUMNS, load_run, tables_path


def _train(iterations: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(iterations):
        model(torch.randn(4, 16)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A real run folder (report written, trace and its cached tables beside it)."""
    root = tmp_path_factory.mktemp("recorded")
    with swift_nb.profile(out_dir=root, wait=0, warmup=1, active=2, label="good") as run:
        _train(5)
    assert run.path is not None and run.summary["steps"] == 5
    return run.path


@pytest.fixture
def run_dir(recorded, tmp_path) -> Path:
    """This test's own copy of the recorded run, alone in a runs folder."""
    return Path(shutil.copytree(recorded, tmp_path / "runs" / recorded.name))


def _cli(*args) -> subprocess.CompletedProcess:
    """``swift-nb ARGS`` in this process (a fresh one costs seconds of imports)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def _edit_meta(run_dir: Path, **changes) -> None:
    meta = json.loads((run_dir / "run.json").read_text())
    for key, value in changes.items():
        if value is _DROP:
            meta.pop(key)
        else:
            meta[key] = value
    (run_dir / "run.json").write_text(json.dumps(meta))


_DROP = object()
WRONG_TYPES = [
    ({"context": ["a", "list"]}, "'context' must be an object, got a list"),
    ({"summary": "fast"}, "'summary' must be an object, got a string"),
    ({"notes": {"a": 1}}, "'notes' must be a list of strings, got an object"),
    ({"id": _DROP}, "'id' is missing"),
    ({"status": "great"}, "'status' must be one of"),
    ({"wall_s": "long"}, "'wall_s' must be a number, got a string"),
    ({"files": {"trace": 3}}, "'files.trace' must be a string, got a number"),
]


@pytest.mark.parametrize(("changes", "problem"), WRONG_TYPES, ids=lambda v: str(v)[:24])
def test_wrong_types_in_run_json_are_one_clear_error(run_dir, changes, problem):
    _edit_meta(run_dir, **changes)
    with pytest.raises(RecordError) as info:
        load_run(run_dir)
    assert isinstance(info.value, ValueError)
    assert info.value.path == run_dir / "run.json" and problem in str(info.value)
    assert str(info.value).startswith(str(run_dir / "run.json") + ": ")


def test_a_damaged_run_is_a_listed_row_and_hides_no_other_run(run_dir, recorded):
    good = Path(shutil.copytree(recorded, run_dir.parent / "20990101-000000-other"))
    _edit_meta(good, id="other")
    _edit_meta(run_dir, context=["a", "list"])
    table = swift_nb.runs(run_dir.parent)
    rows = table.set_index("path")
    assert len(table) == 2
    assert rows.loc[str(good), "status"] == "ok" and pd.isna(rows.loc[str(good), "problem"])
    assert rows.loc[str(run_dir), "status"] == "damaged"
    assert rows.loc[str(run_dir), "problem"] == "run.json: 'context' must be an object, got a list"
    listed = _cli("list", run_dir.parent)
    assert listed.returncode == 0, listed.stderr
    assert "damaged" in listed.stdout and "other" in listed.stdout and "Traceback" not in listed.stderr


@pytest.mark.parametrize("command", ["show", "report", "compare"])
def test_cli_on_a_damaged_record_exits_1_with_one_line(run_dir, command):
    _edit_meta(run_dir, summary="fast")
    res = _cli(command, run_dir)
    assert res.returncode == 1, res
    assert "Traceback" not in res.stderr
    assert (
        res.stderr.strip() == f"swift-nb: {run_dir / 'run.json'}: 'summary' must be an object, got a string"
    )


def test_unreadable_run_json_names_the_file(run_dir):
    text = (run_dir / "run.json").read_text()
    (run_dir / "run.json").write_text(text[: len(text) // 2])
    with pytest.raises(RecordError, match=r"run\.json: not valid JSON \(.* line \d+ column \d+"):
        load_run(run_dir)
    (run_dir / "run.json").write_bytes(b"\xff\xfe garbage")
    with pytest.raises(RecordError, match=r"run\.json: not UTF-8 text"):
        load_run(run_dir)
    (run_dir / "run.json").write_text("[1, 2]")
    with pytest.raises(RecordError, match=r"run\.json: must be a JSON object, got a list"):
        load_run(run_dir)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("a,b\n1,2,3,4\n", r"steps\.csv: not a readable CSV table \(a row has more fields than the header"),
        ('a,"b\n1,2\n', r"steps\.csv: not a readable CSV table \(Error tokenizing data"),
        ("when,what\n0,0.1\n", r"steps\.csv: lacks the columns step, duration_s: not a swift_nb steps\.csv"),
        (None, r"steps\.csv: 'duration_s' must hold numbers; line 3 holds 'slow'"),
        (b"\x00\xff\xfe", r"steps\.csv: not UTF-8 text"),
    ],
    ids=["ragged", "quote", "columns", "types", "binary"],
)
def test_damaged_steps_csv_names_the_file(run_dir, content, problem):
    path = run_dir / "steps.csv"
    if content is None:
        steps = pd.read_csv(path).astype({"duration_s": object})
        steps.loc[1, "duration_s"] = "slow"
        steps.to_csv(path, index=False)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(RecordError, match=problem) as info:
        load_run(run_dir)
    assert info.value.path == path
    res = _cli("report", run_dir)
    assert res.returncode == 1 and "steps.csv" in res.stderr and "Traceback" not in res.stderr


def test_a_last_line_cut_by_a_kill_is_dropped_with_a_note(run_dir):
    path = run_dir / "steps.csv"
    whole = path.read_text()
    lines = whole.splitlines(keepends=True)
    path.write_text("".join(lines[:3]) + lines[3][:7])  # header, two rows, part of the third
    run = load_run(run_dir)
    assert run.steps["step"].tolist() == [0, 1]
    assert list(run.steps.columns[: len(STEP_COLUMNS)]) == STEP_COLUMNS
    assert any("steps.csv: its last line was cut off" in n for n in run.notes)
    assert run.problems and run.problems[0] in run.notes
    path.write_text(lines[0])  # a header only: a run that crashed before its first step
    assert load_run(run_dir).steps.empty and not load_run(run_dir).problems
    assert load_run(run_dir).meta()["notes"] == json.loads((run_dir / "run.json").read_text())["notes"]


def test_a_record_without_some_known_columns_still_loads(run_dir):
    # records of older versions: samples.csv without rank, steps.csv without overhead_s
    for name, column in (("samples.csv", "rank"), ("steps.csv", "overhead_s")):
        pd.read_csv(run_dir / name).drop(columns=[column]).to_csv(run_dir / name, index=False)
    run = load_run(run_dir)
    assert run.samples["rank"].isna().all() and run.steps["overhead_s"].isna().all()
    assert len(run.steps) == 5 and not run.problems


def test_missing_steps_csv_is_not_a_run_with_zero_steps(run_dir):
    (run_dir / "steps.csv").unlink()
    run = load_run(run_dir)
    note = "steps.csv is missing: the steps of this run are unknown"
    assert note in run.notes and note in run.problems
    assert note not in run.meta()["notes"]  # what was found on loading is not written back
    shown = _cli("show", run_dir)
    assert shown.returncode == 0 and f"swift-nb: warning: {note}" in shown.stderr
    reported = _cli("report", run_dir)
    assert reported.returncode == 1, reported
    assert note in reported.stderr and "verdict:" not in reported.stdout
    assert not (run_dir / "steps.csv").exists()  # the report does not write an empty table in its place
    html = (run_dir / "report.html").read_text()
    assert note in html and "no trace" not in html


@pytest.mark.parametrize("damage", ["truncated", "empty", "not-gzip", "foreign-json"])
def test_damaged_trace_fails_the_report_and_names_the_file(run_dir, damage):
    trace = run_dir / "trace.json.gz"
    data = trace.read_bytes()
    tables_path(trace).unlink()
    trace.write_bytes(
        {
            "truncated": data[: len(data) // 2],
            "empty": b"",
            "not-gzip": b"plain text",
            "foreign-json": gzip.compress(b'{"traceEvents": {"not": "a list"}}'),
        }[damage]
    )
    with pytest.raises(RecordError) as info:
        load_trace_file(trace)
    assert info.value.path == trace
    res = _cli("report", run_dir)
    assert res.returncode == 1, res
    assert "trace.json.gz is damaged (" in res.stderr and "the analysis could not run" in res.stderr
    assert "verdict:" not in res.stdout
    html = (run_dir / "report.html").read_text()
    assert "trace.json.gz is damaged (" in html
    assert "no trace" not in html and "recorded no step" not in html
    # the record itself is not rewritten with the report's failure
    assert not any("damaged" in n for n in json.loads((run_dir / "run.json").read_text())["notes"])


def test_the_command_exits_1_when_its_report_could_not_analyze(run_dir):
    (run_dir / "trace.json.gz").write_bytes(b"")
    res = subprocess.run(
        [sys.executable, "-m", "swift_nb.cli", "report", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1, res
    assert res.stderr.strip() == (
        "swift-nb: trace.json.gz is damaged (the file is empty): the analysis could not run"
    )
    assert res.stdout.strip() == str(run_dir / "report.html")


def _damage_npz(path: Path, how: str) -> None:
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    if how == "lengths":
        arrays["events/ts_us"] = arrays["events/ts_us"][:-1]
    elif how == "key":
        del arrays["steps/start_us"]
    elif how == "codes":
        arrays["events/name"] = arrays["events/name"] + 10_000
    elif how == "negative-codes":
        arrays["events/name"] = arrays["events/name"] - 3
    elif how == "labels":
        arrays["events/cat#labels"] = np.frombuffer(b"not json", dtype=np.uint8)
    if how == "garbage":
        path.write_bytes(b"PK\x03\x04 not really a zip")
        return
    with path.open("wb") as f:
        np.savez(f, **arrays)


@pytest.mark.parametrize("how", ["lengths", "key", "codes", "negative-codes", "labels", "garbage"])
def test_a_cache_that_disagrees_with_its_trace_is_rebuilt(run_dir, how):
    trace = run_dir / "trace.json.gz"
    cache = tables_path(trace)
    expected = parse_events(json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"])
    _damage_npz(cache, how)
    later = trace.stat().st_mtime + 10
    os.utime(cache, (later, later))  # newer than the trace: the cache is what gets read
    got = load_trace_file(trace)
    for name in ("events", "memory", "steps"):
        pdt.assert_frame_equal(getattr(got, name), getattr(expected, name), check_dtype=False)
    again = load_trace_file(trace)  # the rebuilt cache is whole again
    pdt.assert_frame_equal(again.events, expected.events, check_dtype=False)


def test_a_cache_of_another_trace_is_not_used(run_dir, recorded, tmp_path):
    trace = run_dir / "trace.json.gz"
    with gzip.open(trace, "rb") as f:
        doc = json.loads(f.read())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "aten::mm"]
    with gzip.open(trace, "wb") as f:
        f.write(json.dumps(doc).encode())
    old = (recorded / "trace.json.gz").stat().st_mtime
    os.utime(trace, (old, old))  # the same age as before: only its content changed
    got = load_trace_file(trace)
    assert "aten::mm" not in set(got.events["name"])


def test_a_failed_run_keeps_its_traceback(tmp_path):
    with pytest.raises(ValueError, match="<b>bad</b>"), swift_nb.profile(out_dir=tmp_path) as run:
        _train(2)
        raise ValueError("<b>bad</b> batch")
    assert run.status == "failed"
    tb = run.summary["traceback"]
    assert tb.startswith("Traceback (most recent call last)") and "ValueError: <b>bad</b> batch" in tb
    assert load_run(run.path).summary["traceback"] == tb
    html = (run.path / "report.html").read_text()
    assert "<details" in html and "ValueError: &lt;b&gt;bad&lt;/b&gt; batch" in html
    assert "<b>bad</b>" not in html
    shown = _cli("show", run.path)
    assert shown.returncode == 0 and "ValueError: <b>bad</b> batch" in shown.stdout
    assert "Traceback (most recent call last)" in shown.stdout
