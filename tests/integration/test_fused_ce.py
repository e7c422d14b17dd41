"""The fused_ce toggle on a real Hugging Face causal LM with Qwen's vocabulary: the same
loss, a fraction of the peak, the forecast's prediction of it, an exact undo, and a clear
refusal of a model that is no language model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import swift_nb
from swift_nb import toggles
from swift_nb.analysis.forecast import forecast
from swift_nb.core.errors import ConfigError

transformers = pytest.importorskip("transformers")
pytest.importorskip("cut_cross_entropy")

VOCAB, T = 151_936, 64
LENGTHS = [64, 24, 16, 10]


def _model():
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return transformers.Qwen2ForCausalLM(cfg)


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1000, (len(LENGTHS), T), generator=g)
    mask = torch.zeros(len(LENGTHS), T, dtype=torch.long)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1
    return ids, mask, ids.masked_fill(mask == 0, -100)


def _train(out_dir, with_toggles):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids, mask, labels = _batch()
    losses = []
    with swift_nb.profile(out_dir=out_dir, toggles=with_toggles, wait=0, warmup=1, active=2) as run:
        for _ in range(4):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            losses.append(loss.item())
            loss.backward()
            opt.step()
            opt.zero_grad()
    return run, losses, model


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    return _train(out, []), _train(out, ["fused_ce"])


def test_the_loss_is_the_models_own_and_the_peak_a_fraction(runs):
    (base, base_losses, _), (fused, fused_losses, model) = runs
    assert fused_losses[0] == pytest.approx(base_losses[0], rel=1e-3)
    assert fused_losses == pytest.approx(base_losses, rel=1e-3)  # the same training, step after step
    assert fused.summary["peak_mem_bytes"] <= 0.6 * base.summary["peak_mem_bytes"]
    (report,) = fused.context["toggles"]
    assert report["toggle"] == "fused_ce" and report["applied"] and report["details"]["fused_calls"] == 4
    assert "forward" not in model.__dict__  # undone: the model's own forward again


def test_the_forecast_predicts_the_fused_peak(runs):
    (base, _, _), (fused, _, _) = runs
    predicted = forecast(base, toggles=["fused_ce"])
    measured = fused.summary["peak_mem_bytes"]
    assert abs(predicted.total_bytes - measured) <= 0.15 * measured, (predicted.total_bytes, measured)
    assert predicted.categories["logits"] < 0.25 * base.summary["memory_categories_at_peak"]["logits"]
    assert any(line.startswith("logits under fused_ce") for line in predicted.derivation)


def test_a_model_with_no_lm_head_is_refused_naming_what_was_looked_for():
    toggle = toggles.get("fused_ce")
    with pytest.raises(ConfigError, match=r"looked for .*get_output_embeddings\(\)"):
        toggle.apply({"net": nn.Sequential(nn.Linear(4, 4))})
    assert toggle.report is None  # nothing stays applied


def test_outputs_without_labels_and_tuples_keep_their_shape():
    model = _model()
    ids, mask, labels = _batch()
    toggle = toggles.get("fused_ce")
    toggle.apply({"model": model})
    try:
        assert model(input_ids=ids, attention_mask=mask).logits.shape == (len(LENGTHS), T, VOCAB)
        loss, *_ = model(input_ids=ids, attention_mask=mask, labels=labels, return_dict=False)
        assert loss.ndim == 0
    finally:
        toggle.undo()
    reference = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert loss.item() == pytest.approx(reference.item(), rel=1e-4)
