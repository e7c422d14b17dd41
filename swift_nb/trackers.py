"""A run sent to an experiment tracker: MLflow, Weights & Biases or TensorBoard.

``export(run, to=...)`` sends what a tracker shows well:
- the summary's scalars (step time median and p90, peak memory and its categories, the
  device's idle and compute shares, energy, cost, MFU) under ``swift_nb/``;
- per-step series against their step numbers (``swift_nb/step_time_s``,
  ``swift_nb/peak_tensor_bytes``, ``swift_nb/step_energy_j``), at most ``max_points`` steps
  each, evenly spread over the run (its last step always among them);
- the findings, as a table (W&B) or Markdown text (MLflow, TensorBoard);
- ``report.html`` and ``trace.json.gz`` as artifacts (TensorBoard: copied into the log
  folder, the trace where torch-tb-profiler looks: ``plugins/profile/<run id>/``).

Inside the user's active MLflow run (``mlflow.active_run()``) or W&B run (``wandb.run``)
the export joins it, as those libraries' own integrations do; otherwise it creates a run
named by the run's label (or id) and ends it. Arguments: ``tracking_uri`` (MLflow),
``dir`` (W&B), ``log_dir`` (TensorBoard, default ``runs/<run id>``); any other keyword goes
to the library (``mlflow.MlflowClient.create_run``, ``wandb.init``). Each tracker is an
optional extra (``pip install 'swift_nb[mlflow]'``); without it, ``MissingDependencyError`` (an ``ImportError``) names it.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from swift_nb.core.errors import ConfigError
from swift_nb.record import MEMORY_CATEGORIES, REPORT_FILE, Run, load_run
from swift_nb.record.write import step_energy_j
from swift_nb.vocabulary.options import parse_log_to, require_tracker

#: the summary's scalars a tracker gets, when the run has them
SCALARS = [
    "steps",
    "steps_per_s",
    "step_time_median_s",
    "step_time_p90_s",
    "peak_mem_bytes",
    "peak_rss_bytes",
    "mean_util_pct",
    "mean_sm_active_pct",
    "mean_tensor_active_pct",
    "device_idle_pct",
    "device_compute_pct",
    "device_non_compute_pct",
    "energy_j",
    "energy_per_step_j",
    "avg_power_w",
    "cpu_energy_j",
    "price_per_hour",
    "cost_usd",
    "cost_per_1k_steps_usd",
    "idle_cost_per_1k_steps_usd",
    "energy_cost_usd",
]
DEFAULT_MAX_POINTS = 10_000
#: MLflow's most entities (metrics, params and tags together) in one log_batch
BATCH = 1000
PREFIX = "swift_nb/"


@dataclass
class Payload:
    """What a tracker is sent: ``name`` (the run's label or id), ``tags`` (text),
    ``scalars`` (summary numbers), ``series`` (name → (step numbers, values)),
    ``findings`` (one row each: severity, id, title, suggestion, predicted), ``artifacts``
    (the run's report and trace files that exist)."""

    name: str
    tags: dict[str, str]
    scalars: dict[str, float]
    series: dict[str, tuple[list[int], list[float]]]
    findings: list[dict[str, str]] = field(default_factory=list)
    artifacts: list[Path] = field(default_factory=list)

    def findings_markdown(self) -> str:
        if not self.findings:
            return "No findings."
        lines = ["| severity | finding | suggestion | predicted |", "|---|---|---|---|"]
        for f in self.findings:
            cells = (f["severity"], f["title"], f["suggestion"], f["predicted"])
            lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
        return "\n".join(lines)


def _spread(steps: pd.Series, values: pd.Series, max_points: int) -> tuple[list[int], list[float]]:
    keep = values.notna() & steps.notna()
    steps, values = steps[keep], values[keep]
    if len(steps) > max_points:
        stride = math.ceil(len(steps) / max_points)
        idx = list(range(0, len(steps), stride))
        if idx[-1] != len(steps) - 1:
            idx[-1] = len(steps) - 1
        steps, values = steps.iloc[idx], values.iloc[idx]
    return [int(s) for s in steps], [float(v) for v in values]


def payload(run: Run, max_points: int = DEFAULT_MAX_POINTS, analyze: bool = True) -> Payload:
    """What ``export`` sends of ``run`` (``analyze``: run the advisor for the findings and
    MFU; a run it cannot analyze is sent without them)."""
    s = run.summary
    from swift_nb.analysis.cost import finite  # the analysis layer loads when a run is exported

    scalars = {k: v for k in SCALARS if (v := finite(s.get(k))) is not None}
    scalars["wall_s"] = float(run.wall_s or 0.0)
    if len(run.memory):
        for c in MEMORY_CATEGORIES:
            peak = finite(pd.to_numeric(run.memory.get(f"{c}_bytes"), errors="coerce").max())
            if peak is not None:
                scalars[f"peak_{c}_bytes"] = peak
    steps = run.steps
    series: dict[str, tuple[list[int], list[float]]] = {}
    if len(steps):
        num = steps["step"].astype("float64")
        series["step_time_s"] = _spread(num, pd.to_numeric(steps["duration_s"], errors="coerce"), max_points)
        peak = pd.to_numeric(steps["peak_tensor_bytes"], errors="coerce")
        if peak.notna().any():
            series["peak_tensor_bytes"] = _spread(num, peak, max_points)
        energy = step_energy_j(steps, run.samples)
        if energy.notna().any():
            series["step_energy_j"] = _spread(num, energy, max_points)
    findings: list[dict[str, str]] = []
    if analyze:
        try:
            from swift_nb.analysis import analysis_of

            analysis = analysis_of(run)
        except Exception:  # sent without findings: the record itself is what matters here
            analysis = None
        if analysis is not None:
            mfu = finite(analysis.throughput.mfu_pct)
            if mfu is not None:
                scalars["mfu_pct"] = mfu
            findings = [
                {
                    "severity": f.severity,
                    "id": f.id,
                    "title": f.title,
                    "suggestion": f.suggestion,
                    "predicted": f.predicted_effect,
                }
                for f in analysis.findings
            ]
    files = [run.path / REPORT_FILE] if run.path is not None else []
    if run.trace_path is not None:
        files.append(Path(run.trace_path))
    tags = {"swift_nb.run_id": run.id, "swift_nb.status": run.status}
    if run.path is not None:
        tags["swift_nb.run_path"] = str(Path(run.path).resolve())
    if run.label:
        tags["swift_nb.label"] = run.label
    return Payload(run.label or run.id, tags, scalars, series, findings, [f for f in files if f.exists()])


def export(run: Run | Path | str, to: str, *, max_points: int = DEFAULT_MAX_POINTS, **kwargs: Any) -> str:
    """Send ``run`` to a tracker. See the module's docstring for what is sent and the arguments.

    Args:
        run: a Run or a run folder.
        to: the tracker: ``"mlflow"``, ``"wandb"`` or ``"tensorboard"``, with arguments as
            ``"tensorboard:log_dir=runs"``.
        max_points: the most steps of each per-step series, evenly spread over the run (a whole
            number, at least 2; default 10 000).
        **kwargs: the tracker's arguments, over those in ``to``: ``tracking_uri`` (MLflow),
            ``dir`` (W&B), ``log_dir`` (TensorBoard); any other goes to the library.

    Returns:
        Where it went: the MLflow run id, the W&B run's path, the TensorBoard log folder.

    Raises:
        MissingDependencyError: the tracker's optional extra is not installed (an ``ImportError``).
    """
    name, spec_kwargs = parse_log_to(to)
    lib = require_tracker(name)  # before any work: a missing extra is said at once
    if not isinstance(max_points, int) or isinstance(max_points, bool) or max_points < 2:
        raise ConfigError("max_points", "must be a whole number of steps, at least 2", max_points)
    run = run if isinstance(run, Run) else load_run(run)
    sent = payload(run, max_points)
    return SENDERS[name](lib, run, sent, {**spec_kwargs, **kwargs})


# -- MLflow --------------------------------------------------------------------------------


def _to_mlflow(mlflow: Any, run: Run, p: Payload, kwargs: dict[str, Any]) -> str:
    from mlflow.entities import Metric, RunTag

    tracking_uri = kwargs.pop("tracking_uri", None)
    active = mlflow.active_run()
    joined = active is not None and tracking_uri in (None, mlflow.get_tracking_uri())
    client = mlflow.MlflowClient(tracking_uri=None if joined else tracking_uri)
    if joined:
        run_id = active.info.run_id
    else:
        experiment_id = kwargs.pop("experiment_id", None)
        experiment_name = kwargs.pop("experiment_name", None)
        if experiment_id is None and experiment_name is not None:
            found = client.get_experiment_by_name(experiment_name)
            experiment_id = found.experiment_id if found else client.create_experiment(experiment_name)
        run_id = client.create_run(experiment_id or "0", run_name=p.name, **kwargs).info.run_id
    now = int(time.time() * 1000)
    metrics = [Metric(PREFIX + k, v, now, 0) for k, v in p.scalars.items()]
    for key, (steps, values) in p.series.items():
        metrics += [Metric(PREFIX + key, v, now, s) for s, v in zip(steps, values, strict=True)]
    tags = [RunTag(k, v) for k, v in p.tags.items()]
    if "price_source" in run.summary:  # a tag, not a param: a run exported again may say otherwise
        tags.append(RunTag(PREFIX + "price_source", str(run.summary["price_source"])))
    client.log_batch(run_id, tags=tags)
    for i in range(0, len(metrics), BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + BATCH])
    client.log_text(run_id, p.findings_markdown(), "swift_nb/findings.md")
    for f in p.artifacts:
        client.log_artifact(run_id, str(f), "swift_nb")
    if not joined:
        client.set_terminated(run_id)
    return str(run_id)


# -- Weights & Biases ------------------------------------------------------------------------


def _to_wandb(wandb: Any, run: Run, p: Payload, kwargs: dict[str, Any]) -> str:
    joined = wandb.run is not None
    if joined:
        wb = wandb.run
    else:
        kwargs.setdefault("project", "swift_nb")
        kwargs.setdefault("name", p.name)
        wb = wandb.init(**kwargs)
    try:
        step_key = PREFIX + "step"
        # W&B's convention for a second x-axis: the user's own `step` is left alone
        wb.define_metric(step_key, hidden=True)
        wb.define_metric(PREFIX + "series/*", step_metric=step_key)
        rows: dict[int, dict[str, float]] = {}
        for key, (steps, values) in p.series.items():
            for s, v in zip(steps, values, strict=True):
                rows.setdefault(s, {step_key: s})[f"{PREFIX}series/{key}"] = v
        for s in sorted(rows):
            wb.log(rows[s])
        wb.summary.update({PREFIX + k: v for k, v in p.scalars.items()})
        wb.config.update({PREFIX + "tags": p.tags}, allow_val_change=True)
        columns = ["severity", "id", "title", "suggestion", "predicted"]
        wb.log(
            {
                PREFIX + "findings": wandb.Table(
                    columns=columns, data=[[f[c] for c in columns] for f in p.findings]
                )
            }
        )
        if p.artifacts:
            artifact = wandb.Artifact(f"swift_nb-{_artifact_name(run.id)}", type="swift_nb_run")
            for f in p.artifacts:
                artifact.add_file(str(f))
            wb.log_artifact(artifact)
        where = str(wb.path) if getattr(wb, "path", None) else str(wb.id)
    finally:
        if not joined:
            wb.finish()
    return where


def _artifact_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


# -- TensorBoard -----------------------------------------------------------------------------


def _to_tensorboard(tensorboard: Any, run: Run, p: Payload, kwargs: dict[str, Any]) -> str:
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    from tensorboard.plugins.text.summary_v2 import text_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    log_dir = Path(kwargs.pop("log_dir", None) or Path("runs") / run.id)
    if kwargs:
        raise ConfigError("kwargs", "TensorBoard takes only log_dir", sorted(kwargs))
    log_dir.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(log_dir))
    now = time.time()

    def add(summary: Any, step: int) -> None:
        writer.add_event(Event(wall_time=now, step=step, summary=summary))

    try:
        for key, value in p.scalars.items():
            add(scalar_pb(f"{PREFIX}summary/{key}", value), 0)
        for key, (steps, values) in p.series.items():
            for s, v in zip(steps, values, strict=True):
                add(scalar_pb(PREFIX + key, v), s)
        add(text_pb(PREFIX + "findings", p.findings_markdown()), 0)
    finally:
        writer.close()
    for f in p.artifacts:
        if f.name.endswith(".json.gz"):  # where torch-tb-profiler's Trace view finds it
            dest = log_dir / "plugins" / "profile" / run.id / f"{run.host or 'host'}.pt.trace.json.gz"
        else:
            dest = log_dir / f"swift_nb_{f.name}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dest)
    return str(log_dir)


SENDERS: dict[str, Callable[[Any, Run, Payload, dict[str, Any]], str]] = {
    "mlflow": _to_mlflow,
    "wandb": _to_wandb,
    "tensorboard": _to_tensorboard,
}
