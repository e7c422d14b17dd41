"""swift_nb.import_trace and `swift-nb import`: torch.profiler traces recorded elsewhere
(real CUDA/NCCL traces in tests/data/gpu, and CPU traces torch.profiler writes here) become
ordinary run folders."""

from __future__ import annotations

import gzip
import json
import math
import shutil

import pandas as pd
import pytest
import torch
from support.imported_traces import GPU, JOB, NCCL_RANK0

import swift_nb
from swift_nb.core.errors import ConfigError, RecordError
from swift_nb.importing.rank import TRIGGER
from swift_nb.record import load_run, rank_folder, runs

ONE_RANK = GPU / "gpu_1rank_5steps.json.gz"


def _report_text(run) -> str:
    import html
    import re

    page = (run.path / "report.html").read_text()
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    return swift_nb.import_trace(ONE_RANK, tmp_path_factory.mktemp("runs"))


def test_a_cuda_trace_becomes_a_run(one_rank):
    run = load_run(one_rank.path)
    assert run.status == "ok" and not run.problems
    # the trace's five ProfilerStep spans, numbered as the profiler numbered them
    assert list(run.steps["step"]) == [101, 102, 103, 104, 105]
    assert set(run.steps["trigger"]) == {TRIGGER}
    assert run.steps["duration_s"].iloc[0] == pytest.approx(35115.869e-6)
    assert run.summary["steps"] == 5 and run.summary["recorded_steps"] == [101, 102, 103, 104, 105]
    env = run.environment
    assert env["device"] == "cuda" and env["devices"] == ["Tesla V100-SXM2-32GB"]
    assert env["backend"] == "nccl" and env["nccl"] == "2.17.1" and env["world_size"] == 1
    assert run.started_at.startswith("2024-04-0")  # the recording's time, not the import's
    # what a trace cannot say is absent, not zero
    assert run.samples.empty
    assert run.steps["peak_tensor_bytes"].isna().all() and run.summary["peak_mem_bytes"] is None
    assert run.summary["mean_util_pct"] is None
    assert any("absent" in n for n in run.notes)
    assert (run.path / "trace.json.gz").exists() and (run.path / "report.html").exists()
    assert run.source["imported_from"] == [str(ONE_RANK.resolve())]


def test_the_imported_run_is_listed_reported_and_compared(one_rank, tmp_path):
    listed = runs(one_rank.path.parent)
    assert list(listed["id"]) == [one_rank.id] and listed["steps"].iloc[0] == 5
    text = _report_text(one_rank)
    assert "Tesla V100-SXM2-32GB" in text and "95.6 ms" in text  # the median step
    other = swift_nb.import_trace(NCCL_RANK0, tmp_path, label="a100")
    table = swift_nb.compare(one_rank, other)
    assert list(table["variant"]) == [one_rank.id, "a100"]
    assert table["step_time_ratio"].iloc[1] == pytest.approx(2.33, abs=0.01)
    assert table["step_time_median_s"].iloc[1] == pytest.approx(0.2224, abs=1e-3)


def test_ranks_of_one_job_make_a_job_record(tmp_path):
    run = swift_nb.import_trace(JOB, tmp_path)
    run = load_run(run.path)
    assert list(run.ranks["rank"]) == [0, 1]
    assert list(run.ranks["source"]) == ["trace", "trace"]
    assert run.context["world_size"] == 128 and run.context["missing_ranks"] == list(range(2, 128))
    assert set(run.rank_trace_paths()) == {0, 1}
    for r in (0, 1):
        assert load_run(rank_folder(run.path, r)).trace_path.exists()
    assert sorted(run.rank_steps["rank"].unique()) == [0, 1]
    note = next(n for n in run.notes if "128 ranks" in n)
    assert note == (
        "the job had 128 ranks; only the traces of ranks 0, 1 were imported, so comparisons "
        "across ranks leave out ranks 2–127"
    )
    # collectives measured on each rank's own trace
    assert 0.15 < run.ranks["collective_s_per_step"].iloc[1] < 0.25
    text = _report_text(run)
    assert "(ranks 0, 1)" in text  # findings say on which of the imported ranks they hold
    assert "not analyzed" not in text


def test_a_jobs_report_made_in_the_import_equals_one_made_from_its_folder(tmp_path):
    """The import's workers analyze each rank while they hold its tables; the report they
    feed says word for word what a report made later from the folder says."""
    run = swift_nb.import_trace(JOB, tmp_path, workers=2)
    first = _report_text(run)
    again = swift_nb.report(load_run(run.path))  # every rank's trace read again
    assert _report_text(again.run) == first
    assert sorted(again.analysis.collectives["rank"].unique()) == [0, 1]
    assert all("(ranks 0, 1)" in f.title for f in again.analysis.findings if "ranks" in f.evidence)


def test_a_job_imported_in_part_keeps_its_ranks_numbers(tmp_path):
    """Ranks 1 and 2 of a job: the record's own trace is rank 1's, not a rank 0's."""
    doc = json.loads(gzip.decompress(JOB[0].read_bytes()))
    doc["distributedInfo"]["rank"] = 2
    rank2 = tmp_path / "rank2.json.gz"
    rank2.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=1))
    run = swift_nb.import_trace([JOB[1], rank2], tmp_path / "runs")
    assert set(run.rank_trace_paths()) == {1, 2}
    analysis = swift_nb.report(load_run(run.path)).analysis
    assert sorted(analysis.collectives["rank"].unique()) == [1, 2]
    titles = [f.title for f in analysis.findings if "ranks" in f.evidence]
    assert titles and all("(ranks 1, 2)" in t for t in titles)
    assert "not analyzed" not in _report_text(run)


def test_a_folder_of_traces_and_plain_json_from_torch_profiler(tmp_path):
    """What torch.profiler itself writes on this machine: tensorboard_trace_handler's
    plain .pt.trace.json in a folder, with memory events."""
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    traces = tmp_path / "tb"
    with torch.profiler.profile(
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=3),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(str(traces)),
        profile_memory=True,
    ) as prof:
        for _ in range(5):
            model(torch.randn(32, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    (written,) = traces.iterdir()
    assert written.name.endswith(".pt.trace.json")
    run = swift_nb.import_trace(traces, tmp_path / "runs", label="tb")
    assert run.label == "tb" and run.summary["steps"] == 3
    assert run.environment["device"] == "cpu"
    # profile_memory=True: per-step peaks come from the trace's [memory] events
    peaks = run.steps["peak_tensor_bytes"]
    assert peaks.notna().all() and (peaks >= 64 * 64 * 4).all()
    with gzip.open(run.trace_path) as f:  # stored gzipped, as every run's trace
        assert json.load(f)["traceEvents"]


def test_bad_input_is_refused_before_any_folder_is_made(tmp_path):
    out = tmp_path / "runs"
    with pytest.raises(ConfigError, match="existing trace files"):
        swift_nb.import_trace(tmp_path / "nope.json", out)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="must hold trace files"):
        swift_nb.import_trace(tmp_path / "empty", out)
    no_steps = tmp_path / "no_steps.json"
    no_steps.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2}]}))
    with pytest.raises(RecordError, match="no profiler step"):
        swift_nb.import_trace(no_steps, out)
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(ONE_RANK.read_bytes()[:5000])
    with pytest.raises(RecordError, match=r"cut\.json\.gz"):
        swift_nb.import_trace(cut, out)
    twice = tmp_path / "again.json.gz"
    shutil.copyfile(NCCL_RANK0, twice)
    with pytest.raises(ConfigError, match="one trace per rank"):
        swift_nb.import_trace([NCCL_RANK0, twice], out)
    with pytest.raises(ConfigError, match="one job"):
        swift_nb.import_trace([NCCL_RANK0, JOB[1]], out)
    assert not out.exists() or not any(out.iterdir())


def test_steps_table_types_survive_the_round_trip(one_rank):
    steps = load_run(one_rank.path).steps
    assert pd.api.types.is_integer_dtype(steps["step"])
    assert all(math.isnan(v) for v in steps["overhead_s"])
