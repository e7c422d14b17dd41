"""swift_nb.analysis.cost: the money keys, exact against wall time and steps; the price
from the option, the environment or the device table; the idle GPU's price on real GPU
traces (tests/data/gpu, HolisticTraceAnalysis's test data, MIT License, Copyright (c) Meta
Platforms, Inc. and affiliates)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from swift_nb.analysis import cost
from swift_nb.core import devices
from swift_nb.core.errors import ConfigError
from swift_nb.importing.assembly import import_trace
from swift_nb.record import STEP_COLUMNS, Run, load_run, summarize
from swift_nb.reporting import report
from swift_nb.vocabulary.options import ProfileOptions

DATA = Path(__file__).parents[1] / "data" / "gpu"


def _run(durations: list[float], wall_s: float, env: dict | None = None, **summary) -> Run:
    rows, t = [], 0.0
    for k, d in enumerate(durations):
        rows.append((k, t, t + d, d, "none", "optimizer", 0.0, float("nan"), float("nan"), 0, 0.0))
        t += d
    steps = pd.DataFrame(rows, columns=STEP_COLUMNS)
    run = Run(id="r", status="ok", wall_s=wall_s, steps=steps, environment=env or {"device": "cpu"})
    run.summary.update(summarize(steps, pd.DataFrame()))
    run.summary.update(summary)
    return run


@pytest.fixture(autouse=True)
def _no_env_price(monkeypatch):
    monkeypatch.delenv(devices.ENV_PRICE_PER_HOUR, raising=False)
    monkeypatch.delenv(devices.ENV_PRICE_PER_KWH, raising=False)


def test_the_arithmetic_is_exact_against_wall_time_and_steps():
    # 7 200 s of wall time at $3.60 per device-hour on one machine: $7.20; a median step
    # of 0.5 s (the first step, lazy initialisation, left out): 1 000 steps are 500 s, $0.50;
    # idle 40 % of it: $0.20.
    run = _run([9.0, 0.4, 0.5, 0.5, 0.6], 7200.0, device_idle_pct=40.0)
    out = cost.cost_summary(run, price_per_hour=3.6)
    assert out["cost_usd"] == pytest.approx(7.2, rel=1e-12)
    assert out["cost_per_1k_steps_usd"] == pytest.approx(0.5, rel=1e-12)
    assert out["idle_cost_per_1k_steps_usd"] == pytest.approx(0.2, rel=1e-12)
    assert out["priced_devices"] == 1 and out["price_source"] == "given"
    assert "energy_cost_usd" not in out


def test_devices_a_job_or_a_process_rents():
    assert cost.devices_of(_run([1.0], 1.0, {"device": "cpu", "world_size": 1})) == 1
    assert cost.devices_of(_run([1.0], 1.0, {"device": "cuda", "devices": ["A", "B"]})) == 2
    assert cost.devices_of(_run([1.0], 1.0, {"device": "cuda", "devices": ["A"], "world_size": 8})) == 8
    one_rank = {"device": "cuda", "devices": ["A"], "rank_device": "cuda:0", "world_size": 1}
    assert cost.devices_of(_run([1.0], 1.0, one_rank)) == 1
    two = _run([1.0], 3600.0, {"device": "cuda", "devices": ["A", "B"]})
    assert cost.cost_summary(two, price_per_hour=2.0)["cost_usd"] == pytest.approx(4.0)
    # eight GPUs seen, one trained on: the samples say which held memory
    eight = _run([1.0], 3600.0, {"device": "cuda", "devices": ["H100"] * 8})
    eight.samples = pd.DataFrame(
        {"t_s": [0.0, 1.0], **{f"cuda{i}_allocated_bytes": [0.0, 2e9 if i == 0 else 0.0] for i in range(8)}}
    )
    assert cost.devices_of(eight) == 1


def test_energy_cost():
    assert cost.energy_cost_usd(3.6e6, 0.25) == pytest.approx(0.25)
    run = _run([1.0], 10.0, energy_j=7.2e6)
    out = cost.cost_summary(run, price_per_kwh=0.1)
    assert out == {"price_per_kwh": 0.1, "energy_cost_usd": pytest.approx(0.2)}


def test_the_price_from_the_environment_then_the_table(monkeypatch):
    gpu = _run([1.0], 3600.0, {"device": "cuda", "devices": ["NVIDIA H100 80GB HBM3"]})
    table = devices.price_of("NVIDIA H100 80GB HBM3")
    assert table is not None and table.as_of and "mercatus" in table.source
    out = cost.cost_summary(gpu)
    assert out["price_per_hour"] == table.usd_per_hour and out["price_source"].startswith("NVIDIA H100")
    monkeypatch.setenv(devices.ENV_PRICE_PER_HOUR, "1.5")
    assert cost.cost_summary(gpu)["price_per_hour"] == 1.5
    assert cost.cost_summary(gpu, price_per_hour=0.5)["cost_usd"] == pytest.approx(0.5)
    # a CPU run has no list price: no money keys without one given
    monkeypatch.delenv(devices.ENV_PRICE_PER_HOUR)
    assert cost.cost_summary(_run([1.0], 1.0)) == {}


def test_the_table_is_the_users_to_change(monkeypatch):
    mine = devices.Price(9.99, "our contract", "2026-12")
    monkeypatch.setattr(devices, "PRICES_PER_HOUR", [(r"H100", mine), *devices.PRICES_PER_HOUR])
    gpu = _run([1.0], 3600.0, {"device": "cuda", "devices": ["NVIDIA H100 80GB HBM3"]})
    assert cost.cost_summary(gpu)["cost_usd"] == pytest.approx(9.99)


def test_a_price_given_once_stays_with_the_run():
    run = _run([0.5], 3600.0)
    cost.price(run, price_per_hour=2.0, price_per_kwh=0.3)
    assert run.context["price_per_hour"] == 2.0 and run.summary["cost_usd"] == pytest.approx(2.0)
    cost.price(run)  # a later report prices it alike
    assert run.summary["cost_usd"] == pytest.approx(2.0) and run.summary["price_per_kwh"] == 0.3


@pytest.mark.parametrize("bad", [-1, "two dollars", float("nan"), True, [2]])
def test_a_bad_price_is_refused_before_any_work(bad, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="price_per_hour"):
        ProfileOptions(price_per_hour=bad)
    with pytest.raises(ConfigError, match="price_per_hour"):
        import_trace(DATA / "gpu_1rank_5steps.json.gz", tmp_path, price_per_hour=bad)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(devices.ENV_PRICE_PER_HOUR, "cheap")
    with pytest.raises(ConfigError, match=devices.ENV_PRICE_PER_HOUR):
        ProfileOptions()


# device_idle_pct of each real trace, as swift_nb (and HTA unrounded) measures it
IDLE = {
    "gpu_1rank_5steps": 1.678,
    "gpu_nccl_2ranks_rank0": 77.23,
    "gpu_128ranks_rank0": 53.56,
    "gpu_128ranks_rank1": 54.72,
}


@pytest.mark.parametrize("name", sorted(IDLE))
def test_the_idle_gpus_price_on_real_traces(name, tmp_path):
    trace = tmp_path / f"{name}.json.gz"
    shutil.copy(DATA / trace.name, trace)
    run = import_trace(trace, tmp_path / "runs", price_per_hour=2.0)
    s = run.summary
    world = run.environment["world_size"]
    assert s["priced_devices"] == world
    assert s["cost_usd"] == pytest.approx(run.wall_s / 3600 * world * 2.0, rel=1e-12)
    per_1k = 1000 * s["step_time_median_s"] / 3600 * world * 2.0
    assert s["cost_per_1k_steps_usd"] == pytest.approx(per_1k, rel=1e-12)
    assert s["device_idle_pct"] == pytest.approx(IDLE[name], abs=0.01)
    assert s["idle_cost_per_1k_steps_usd"] == pytest.approx(per_1k * s["device_idle_pct"] / 100, rel=1e-12)
    # the record keeps them, and a later report at another price re-prices it
    saved = json.loads((run.path / "run.json").read_text())["summary"]
    assert saved["idle_cost_per_1k_steps_usd"] == pytest.approx(s["idle_cost_per_1k_steps_usd"])
    again = report(load_run(run.path), price_per_hour=4.0).run.summary
    assert again["idle_cost_per_1k_steps_usd"] == pytest.approx(2 * s["idle_cost_per_1k_steps_usd"], rel=1e-9)


def test_money_in_the_verdict_and_the_findings(tmp_path, monkeypatch):
    from swift_nb.analysis import analyze
    from swift_nb.analysis.cost import fmt_usd

    trace = tmp_path / "gpu_nccl_2ranks_rank0.json.gz"
    shutil.copy(DATA / trace.name, trace)
    run = import_trace(trace, tmp_path / "runs", price_per_hour=3.0, report=False)
    s = run.summary
    a = analyze(run)
    said = (
        f"the GPU idles {round(s['device_idle_pct'], 1)} % of the window: "
        f"{fmt_usd(s['idle_cost_per_1k_steps_usd'])} of every {fmt_usd(s['cost_per_1k_steps_usd'])} per 1 000 steps"
    )
    assert said in a.verdict.reason and a.verdict.reason.count("the GPU idles") == 1
    assert a.verdict.evidence["idle_cost_per_1k_steps_usd"] == pytest.approx(
        s["idle_cost_per_1k_steps_usd"], rel=1e-5
    )
    timed = [f for f in a.findings if "saved_per_1k_steps_usd" in f.evidence]
    assert timed and all("less per 1 000 steps" in f.predicted_effect for f in timed)
    gaps = next(f for f in timed if f.id == "overhead")
    assert gaps.evidence["saved_per_1k_steps_usd"] == pytest.approx(
        gaps.time_cut * s["cost_per_1k_steps_usd"], rel=1e-5
    )
    # without a price (none given, none listed for its GPU): the words as they were
    del run.context["price_per_hour"]
    monkeypatch.setattr(devices, "PRICES_PER_HOUR", [])
    plain = analyze(run)
    assert "$" not in plain.verdict.reason and all("$" not in f.predicted_effect for f in plain.findings)


@pytest.mark.parametrize("name", sorted(IDLE))
def test_every_rule_that_predicts_a_cut_in_time_says_its_share(name, tmp_path):
    from swift_nb.analysis import analyze

    # the dollars a finding saves come from its time_cut, never from its words: each
    # finding whose predicted effect reads as a cut in time carries one
    trace = tmp_path / f"{name}.json.gz"
    shutil.copy(DATA / trace.name, trace)
    run = import_trace(trace, tmp_path / "runs", report=False)
    for f in analyze(run).findings:
        text = f.predicted_effect
        reads_as_time = "step time ≈" in text or (
            "−" in text and any(w in text for w in ("step time", "time per sample", "window"))
        )
        assert (f.time_cut is not None) == reads_as_time, (f.id, f.predicted_effect)
        if f.time_cut is not None:
            assert 0.0 < f.time_cut <= 1.0
            assert f.time_cut_bound == ("up to" in text)


def test_fmt_usd():
    from swift_nb.analysis.cost import fmt_usd

    assert [fmt_usd(x) for x in (2.3144, 0.371, 0.00142, 1234.5, 0)] == [
        "$2.31",
        "$0.371",
        "$0.0014",
        "$1,234",
        "$0.00",
    ]


def test_comparison_and_diff_have_cost_columns(tmp_path):
    from swift_nb.analysis.comparison.run_diff import diff
    from swift_nb.analysis.comparison.variants import COMPARE_COLUMNS
    from swift_nb.analysis.cost import MONEY_COLUMNS
    from swift_nb.reporting import compare

    runs = []
    for name, usd in (("gpu_128ranks_rank0", 2.0), ("gpu_128ranks_rank1", 4.0)):
        trace = tmp_path / f"{name}.json.gz"
        shutil.copy(DATA / trace.name, trace)
        runs.append(import_trace(trace, tmp_path / "runs", label=name, price_per_hour=usd, report=False))
    assert set(MONEY_COLUMNS) <= set(COMPARE_COLUMNS)
    table = compare(*runs).set_index("variant")
    for run in runs:
        row = table.loc[run.label]
        assert row["cost_per_1k_steps_usd"] == pytest.approx(run.summary["cost_per_1k_steps_usd"])
        assert row["idle_cost_per_1k_steps_usd"] == pytest.approx(run.summary["idle_cost_per_1k_steps_usd"])
        assert pd.isna(row["energy_j"])  # a trace records no energy
    d = diff(*runs)
    money = d.money.set_index("field")
    assert money.loc["price_per_hour"].tolist() == [2.0, 4.0]
    assert money.loc["cost_usd", "b"] == pytest.approx(runs[1].summary["cost_usd"])
    assert "energy_j" not in money.index
    assert any(sentence.startswith("1 000 steps cost: $") for sentence in d.sentences)


def test_the_forecast_prices_n_steps_on_its_device():
    from swift_nb.analysis.forecast import forecast, parse_forecast_spec
    from swift_nb.record import load_run

    run = load_run(Path(__file__).parents[1] / "data" / "cost_run")  # batch 2 of 32 tokens
    step_s = run.summary["step_time_median_s"]
    h100 = devices.price_of("H100-80GB")
    f = forecast(run, **parse_forecast_spec("H100-80GB batch=16 steps=100000"))
    assert f.step_s == pytest.approx(step_s * 8)  # 8× the tokens per step
    assert f.price_per_hour == h100.usd_per_hour
    assert f.cost_usd == pytest.approx(100_000 * step_s * 8 / 3600 * h100.usd_per_hour, rel=1e-12)
    assert f.derivation[-1].startswith("cost of 100,000 steps:") and "not predicted" in f.derivation[-1]
    four = forecast(run, "H100-80GB", world_size=4, toggles=["fsdp"], steps=1000, price_per_hour=2.0)
    assert four.cost_usd == pytest.approx(1000 * step_s / 3600 * 4 * 2.0, rel=1e-12)
    t4 = forecast(run, "T4", steps=10)  # no list price for a T4
    assert t4.cost_usd is None and "give price_per_hour=" in t4.derivation[-1]
    assert forecast(run, "H100-80GB").cost_usd is None
    with pytest.raises(ConfigError, match="steps"):
        forecast(run, "H100-80GB", steps=0)
