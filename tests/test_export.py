"""swift_nb.export: a run sent to MLflow (a local sqlite store), W&B (offline) and
TensorBoard (event files), each read back with the library's own reader; an active MLflow
run joined; a missing extra named; ``swift-nb export``."""

from __future__ import annotations

import importlib
import json
import struct
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from swift_nb.cli import main as cli
from swift_nb.core.errors import ConfigError, MissingDependencyError
from swift_nb.record import (
    MEMORY_COLUMNS,
    REPORT_FILE,
    STEP_COLUMNS,
    TRACE_FILE,
    Run,
    load_run,
    save,
    summarize,
)
from swift_nb.trackers import export, payload
from swift_nb.vocabulary.options import parse_log_to

export_module = importlib.import_module("swift_nb.trackers")  # `swift_nb.export` is the function


@pytest.fixture
def run(tmp_path) -> Run:
    """A saved run of 30 steps with GPU energy samples, memory by category, a price, and a
    report and trace beside it (the trace's content is not read: it is an artifact here)."""
    return _saved_run(tmp_path, 30)


def _saved_run(tmp_path: Path, n: int) -> Run:
    dur = np.full(n, 0.1)
    dur[20 * n // 30 :] = 0.13
    start = np.concatenate([[0.0], np.cumsum(dur)[:-1]])
    steps = pd.DataFrame(
        {
            "step": range(n),
            "start_s": start,
            "end_s": start + dur,
            "duration_s": dur,
            "phase": "none",
            "trigger": "optimizer",
            "overhead_s": 0.0,
            "peak_tensor_bytes": np.arange(n) * 1e6 + 1e8,
            "reserved_bytes": np.nan,
            "rss_bytes": 1e9,
            "compile_s": 0.0,
        },
        columns=STEP_COLUMNS,
    )
    t = np.linspace(0, start[-1] + dur[-1], 50)
    samples = pd.DataFrame({"t_s": t, "kind": "periodic", "step": 0, "rank": 0, "gpu0_energy_j": 250.0 * t})
    memory = pd.DataFrame([[0.1, 3, 4e7, 0, 4e7, 8e7, 2e8, 1e6]], columns=MEMORY_COLUMNS)
    r = Run(id="20261205-export", label="exported", status="ok", wall_s=float(t[-1]) + 0.5)
    r.steps, r.samples, r.memory = steps, samples, memory
    r.environment = {"device": "cuda", "devices": ["NVIDIA H100 80GB HBM3"], "world_size": 1}
    r.summary.update(summarize(steps, samples))
    r.summary.update(device_idle_pct=25.0, device_compute_pct=70.0)
    from swift_nb.analysis.cost import price

    price(r, price_per_hour=3.0, price_per_kwh=0.2)
    save(r, tmp_path / r.id)
    (r.path / REPORT_FILE).write_text("<html>report</html>")
    (r.path / TRACE_FILE).write_bytes(b"\x1f\x8b not really")
    r.files["trace"] = TRACE_FILE
    save(r)
    return r


def test_the_payload(run):
    p = payload(run, max_points=7, analyze=False)
    assert p.name == "exported"
    assert p.scalars["step_time_median_s"] == pytest.approx(0.1)
    assert p.scalars["energy_j"] == pytest.approx(250.0 * run.samples["t_s"].iloc[-1])
    assert p.scalars["energy_per_step_j"] == pytest.approx(25.0)
    assert p.scalars["avg_power_w"] == pytest.approx(250.0)
    assert p.scalars["cost_per_1k_steps_usd"] == pytest.approx(1000 * 0.1 / 3600 * 3.0)
    assert p.scalars["idle_cost_per_1k_steps_usd"] == pytest.approx(1000 * 0.1 / 3600 * 3.0 / 4)
    assert p.scalars["peak_activations_bytes"] == 2e8
    steps, values = p.series["step_time_s"]
    assert len(steps) <= 7 and steps[0] == 0 and steps[-1] == 29 and values[-1] == pytest.approx(0.13)
    assert set(p.series) == {"step_time_s", "peak_tensor_bytes", "step_energy_j"}
    assert sorted(f.name for f in p.artifacts) == [REPORT_FILE, TRACE_FILE]


def test_targets_and_their_arguments():
    assert parse_log_to("tensorboard:log_dir=runs/a, x=1") == ("tensorboard", {"log_dir": "runs/a", "x": "1"})
    with pytest.raises(ConfigError, match="mlflow, wandb, tensorboard"):
        parse_log_to("neptune")
    with pytest.raises(ConfigError, match="key=value"):
        parse_log_to("mlflow:sqlite")


def test_a_missing_extra_is_named_before_any_work(run, monkeypatch):
    monkeypatch.setitem(export_module.TARGETS, "wandb", "wandb_not_installed_here")
    with pytest.raises(MissingDependencyError, match=r"pip install 'swift_nb\[wandb\]'"):
        export(run, to="wandb")
    from swift_nb.vocabulary.options import ProfileOptions

    with pytest.raises(ImportError, match=r"swift_nb\[wandb\]"):
        ProfileOptions(log_to=("wandb",))


# -- MLflow ----------------------------------------------------------------------------------


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch) -> str:
    """A local sqlite store; its artifacts go to ./mlruns, MLflow's default: tmp_path here."""
    monkeypatch.chdir(tmp_path)
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_mlflow_creates_a_run_named_by_the_label(run, mlflow_store):
    mlflow = pytest.importorskip("mlflow")
    uri = mlflow_store
    run_id = export(run, to="mlflow", tracking_uri=uri, experiment_name="swift")
    client = mlflow.MlflowClient(tracking_uri=uri)
    got = client.get_run(run_id)
    assert got.info.run_name == "exported" and got.info.status == "FINISHED"
    assert got.data.metrics["swift_nb/cost_usd"] == pytest.approx(run.summary["cost_usd"])
    assert got.data.metrics["swift_nb/energy_per_step_j"] == pytest.approx(25.0)
    assert got.data.tags["swift_nb.run_id"] == run.id
    history = client.get_metric_history(run_id, "swift_nb/step_time_s")
    assert sorted(m.step for m in history) == list(range(30))
    assert {m.step: m.value for m in history}[25] == pytest.approx(0.13)
    arts = {a.path for a in client.list_artifacts(run_id, "swift_nb")}
    assert {"swift_nb/report.html", "swift_nb/trace.json.gz", "swift_nb/findings.md"} <= arts
    assert client.get_experiment(got.info.experiment_id).name == "swift"


def test_mlflow_takes_long_series_in_batches(tmp_path, mlflow_store):
    mlflow = pytest.importorskip("mlflow")
    long = _saved_run(tmp_path / "long", 1500)  # 3 series of 1 500 steps: 4 500 metrics and more
    run_id = export(long, to="mlflow", tracking_uri=mlflow_store)
    history = mlflow.MlflowClient(tracking_uri=mlflow_store).get_metric_history(
        run_id, "swift_nb/step_time_s"
    )
    assert sorted(m.step for m in history) == list(range(1500))


def test_mlflow_joins_the_active_run(run, mlflow_store):
    mlflow = pytest.importorskip("mlflow")
    mlflow.set_tracking_uri(mlflow_store)
    try:
        with mlflow.start_run(run_name="users-own") as active:
            mlflow.log_metric("loss", 1.0)
            assert export(run, to="mlflow") == active.info.run_id
            assert mlflow.active_run().info.status == "RUNNING"  # left running: it is the user's
        got = mlflow.MlflowClient().get_run(active.info.run_id)
        assert got.info.run_name == "users-own"
        assert {"loss", "swift_nb/step_time_median_s"} <= set(got.data.metrics)
        assert len(mlflow.MlflowClient().search_runs([got.info.experiment_id])) == 1
    finally:
        mlflow.set_tracking_uri(None)


# -- W&B ----------------------------------------------------------------------------------------


def _wandb_records(folder: Path, wait_s: float = 60.0) -> list:
    """The records of W&B's offline run file (``run-*.wandb``), once it holds its run and
    its summary: W&B's service process writes the file, and on a loaded machine it may
    still be writing when ``finish()`` has returned."""
    deadline = time.monotonic() + wait_s
    while True:
        files = list(folder.rglob("run-*.wandb"))
        records = _read_wandb_file(files[0]) if files else []
        kinds = {r.WhichOneof("record_type") for r in records}
        if {"run", "summary"} <= kinds or time.monotonic() > deadline:
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


@pytest.mark.slow  # wandb starts its service process
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


@pytest.mark.slow  # wandb starts its service process
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


# -- TensorBoard ------------------------------------------------------------------------------


def test_tensorboard_event_files(run, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_dir = tmp_path / "tb"
    assert export(run, to="tensorboard", log_dir=str(log_dir)) == str(log_dir)
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    steps = acc.Tensors("swift_nb/step_time_s")
    assert [e.step for e in steps] == list(range(30))
    from tensorboard.util import tensor_util

    assert float(tensor_util.make_ndarray(steps[25].tensor_proto)) == pytest.approx(0.13)
    cost = acc.Tensors("swift_nb/summary/cost_usd")[0]
    assert float(tensor_util.make_ndarray(cost.tensor_proto)) == pytest.approx(run.summary["cost_usd"])
    assert "swift_nb/findings" in tags["tensors"]
    assert (log_dir / "swift_nb_report.html").exists()
    assert list((log_dir / "plugins" / "profile" / run.id).glob("*.pt.trace.json.gz"))


def test_cli_export(run, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    assert cli(["export", str(run.path), "--to", "tensorboard", "--log-dir", str(tmp_path / "tb")]) == 0
    assert "tensorboard" in capsys.readouterr().out
    assert cli(["export", str(run.path), "--to", "tensorboard", "--tracking-uri", "x"]) == 2
    assert "--tracking-uri is not an argument of tensorboard" in capsys.readouterr().err


def test_swift_nb_export_is_the_function(run, tmp_path):
    import swift_nb
    from swift_nb.vocabulary.options import ProfileOptions

    ProfileOptions(log_to=("tensorboard",))  # imports the module swift_nb.export, again
    assert callable(swift_nb.export) and swift_nb.export is export
    assert swift_nb.export(run, to="tensorboard", log_dir=str(tmp_path / "tb")) == str(tmp_path / "tb")


def test_exported_from_disk_and_after_a_report(run):
    """What a run folder alone gives (the CLI's path): the same scalars."""
    again = payload(load_run(run.path), analyze=False)
    assert again.scalars == payload(run, analyze=False).scalars


def test_findings_of_a_real_trace_reach_the_tracker(tmp_path):
    """An imported GPU trace (tests/data/gpu: HolisticTraceAnalysis's test data, MIT License,
    Copyright (c) Meta Platforms, Inc. and affiliates): its findings as text, its MFU-free
    device figures as scalars."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    from swift_nb.importing.assembly import import_trace

    trace = tmp_path / "gpu_nccl_2ranks_rank0.json.gz"
    trace.write_bytes((Path(__file__).parent / "data" / "gpu" / trace.name).read_bytes())
    imported = import_trace(trace, tmp_path / "runs", label="nccl", price_per_hour=2.0)
    sent = payload(imported)
    assert sent.findings and sent.scalars["device_idle_pct"] == pytest.approx(77.23, abs=0.01)
    export(imported, to="tensorboard", log_dir=str(tmp_path / "tb"))
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    text = tensor_util.make_ndarray(acc.Tensors("swift_nb/findings")[0].tensor_proto).item().decode()
    assert sent.findings[0]["title"].replace("|", "\\|") in text
