"""swift_nb.analysis.forecast and swift_nb.render.forecast: exact scaling of parameters,
gradients and optimizer state, the activations' linear and quadratic parts, toggles,
devices, the search for the largest batch and sequence, errors, and what the section says."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

import swift_nb
from swift_nb.analysis.forecast import (
    forecast,
    measure,
)
from swift_nb.core.units import fmt_bytes
from swift_nb.demo import make_model
from swift_nb.render.forecast import TITLE


def _profile(tmp_path, batch: int, seq: int):
    torch.manual_seed(0)
    model = make_model(n_layer=2, n_head=2, d_model=32, vocab_size=128, seq_len=256, attn_impl="eager")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 128, (batch, seq))
    with contextlib.redirect_stdout(io.StringIO()):
        prof = swift_nb.profile(
            out_dir=tmp_path, wait=1, warmup=1, active=2, profile_memory=True, report=False
        )
        with prof as run:
            for _ in range(5):
                model(x, x).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    return swift_nb.load_run(run.path)


def test_a_profiled_eager_attention_run_forecasts_a_longer_sequence(tmp_path):
    base = measure(_profile(tmp_path, 2, 128))
    assert base.batch_size == 2 and base.seq_len == 128 and base.blocks == 2 and base.hidden == 32
    assert base.scores.activations_per_sample > 0  # [2, 2, 128, 128] probabilities kept for backward
    assert base.scores.activations_batch_free == 2 * 128 * 128  # the two layers' boolean [T, T] masks
    assert set(base.matrices) == {(96, 32), (32, 32), (128, 32), (32, 128)}
    measured = measure(_profile(tmp_path, 2, 256))
    f = forecast(base, seq_len=256)
    assert f.categories["parameters"] == measured.categories["parameters"]
    assert f.categories["optimizer_state"] == measured.categories["optimizer_state"]
    assert f.total_bytes == pytest.approx(measured.total, rel=0.10)


def _page_text(path) -> str:
    import html
    import re

    page = re.sub(r"<(script|style)\b.*?</\1>", " ", path.read_text(), flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


def _tiny_loop(**options):
    torch.manual_seed(0)
    model = make_model(vocab_size=128, seq_len=64, n_layer=2, n_head=2, d_model=32, attn_impl="eager")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 128, (2, 64))
    with swift_nb.profile(wait=0, warmup=1, active=2, **options) as run:
        for _ in range(4):
            model(x, x).backward()
            opt.step()
            opt.zero_grad()
    return run


def test_a_run_asked_for_forecasts_reports_them(tmp_path):
    run = _tiny_loop(
        out_dir=tmp_path, forecast=["T4-16GB batch=64 seq=512", "80GB batch=2 toggles=flash_attention"]
    )
    assert run.context["forecast"] == ["T4-16GB batch=64 seq=512", "80GB batch=2 toggles=flash_attention"]
    text = _page_text(run.path / "report.html")
    assert f"{TITLE} T4-16GB · batch 64 × 512 · float32" in text
    assert (
        "On T4-16GB (batch 64 × 512 tokens, float32, AdamW, no toggles, 1 rank), a training step would peak at about"
        in text
    )
    expected = forecast(run, "T4-16GB", batch_size=64, seq_len=512)
    assert f"peak at about {fmt_bytes(expected.total_bytes)} of tensors" in text
    assert "flash_attention" in text
    # the CLI rewrites the same section from the record alone
    from swift_nb import cli

    assert cli.main(["report", str(run.path)]) == cli.OK
    assert f"{TITLE} T4-16GB · batch 64 × 512 · float32" in _page_text(run.path / "report.html")


def test_a_run_without_memory_says_why_it_has_no_forecast(tmp_path):
    run = _tiny_loop(out_dir=tmp_path, forecast=["T4-16GB batch=8"], profile_memory=False)
    text = _page_text(run.path / "report.html")
    assert f"{TITLE} No forecast — " in text and "profile_memory" in text


def test_the_panel_form_forecasts_without_rerunning(tmp_path):
    from swift_nb.notebook.forecast_form import ForecastForm
    from swift_nb.notebook.panel import TABS, results_panel

    run = _tiny_loop(out_dir=tmp_path, report=False)
    form = ForecastForm(run)
    # the run's own configuration to start from: the traced batch and sequence, its dtype and optimizer
    assert (form.batch.value, form.seq.value, form.dtype.value, form.optimizer.value) == (
        2,
        64,
        "float32",
        "AdamW",
    )
    form.device.value, form.batch.value = "T4-16GB", 64
    first = form.press()
    assert first is not None and first == forecast(
        run, "T4-16GB", batch_size=64, dtype="float32", optimizer="AdamW"
    )
    form.toggles.value = ("flash_attention",)
    form.press()
    shown = form.output.value
    assert "On T4-16GB (batch 64" in shown and "flash_attention" in shown and len(form.forecasts) == 2
    form.reset()
    assert form.forecasts == [] and "press Forecast" in form.output.value
    # another model, from its config on fake tensors, with this run as its proxy
    form.model.value, form.device.value, form.toggles.value = "llama-2-7b", "RTX4090-24GB", ("qlora",)
    form.batch.value, form.seq.value, form.dtype.value = 1, 512, "bfloat16"
    seven = form.press()
    assert seven is not None and seven.run_id == "model:llama-2-7b" and seven.fits
    # QLoRA's adapters run on the fake model (trained in fp32, as peft makes them on a bf16 base)
    assert "On RTX4090-24GB (batch 1 × 512 tokens" in form.output.value
    assert any(line.startswith("llama-2-7b: one training step on fake tensors") for line in seven.derivation)
    assert "run on the fake model, by their own code: lora" in seven.derivation
    panel = results_panel(run, [])
    memory_tab = panel.children[1].children[TABS.index("Memory")]
    assert any("swift-nb-forecast" in w._dom_classes for w in memory_tab.children)
