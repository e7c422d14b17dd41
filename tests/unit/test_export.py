"""swift_nb.export: a run sent to MLflow (a local sqlite store), W&B (offline) and
TensorBoard (event files), each read back with the library's own reader; an active MLflow
run joined; a missing extra named; ``swift-nb export``."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from support.export import (
    _saved_run,
    run,  # noqa: F401 (fixtures)
)

from swift_nb.cli import main as cli
from swift_nb.core.errors import ConfigError, MissingDependencyError
from swift_nb.record import (
    REPORT_FILE,
    TRACE_FILE,
    load_run,
)
from swift_nb.trackers import export, payload
from swift_nb.vocabulary.options import parse_log_to

export_module = importlib.import_module("swift_nb.trackers")
options_module = importlib.import_module("swift_nb.vocabulary.options")  # `swift_nb.export` is the function


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
    monkeypatch.setitem(options_module.TARGETS, "wandb", "wandb_not_installed_here")
    with pytest.raises(MissingDependencyError, match=r"pip install 'swift_nb\[wandb\]'"):
        export(run, to="wandb")
    from swift_nb.vocabulary.options import ProfileOptions

    with pytest.raises(ImportError, match=r"swift_nb\[wandb\]"):
        ProfileOptions(log_to=("wandb",))


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
    trace.write_bytes((Path(__file__).parents[1] / "data" / "gpu" / trace.name).read_bytes())
    imported = import_trace(trace, tmp_path / "runs", label="nccl", price_per_hour=2.0)
    sent = payload(imported)
    assert sent.findings and sent.scalars["device_idle_pct"] == pytest.approx(77.23, abs=0.01)
    export(imported, to="tensorboard", log_dir=str(tmp_path / "tb"))
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    text = tensor_util.make_ndarray(acc.Tensors("swift_nb/findings")[0].tensor_proto).item().decode()
    assert sent.findings[0]["title"].replace("|", "\\|") in text
