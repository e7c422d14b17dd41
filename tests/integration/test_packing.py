"""The packing toggle on a real Hugging Face causal LM fed right-padded batches: the same
loss (no token attends across samples), no padding computed, the forecast's prediction of
its peak, its refusals; and the packed_attention finding, raised for a loop that packs with
transformers' own collator into sdpa, and not for the toggle's exact path."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

import swift_nb
from swift_nb import toggles
from swift_nb.analysis import analyze
from swift_nb.analysis.forecast import forecast
from swift_nb.core.errors import ConfigError

VOCAB, T = 32_000, 64
LENGTHS = [64, 24, 16, 10]  # 55.5 % padding


def _model(attn="sdpa"):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        attn_implementation=attn,
    )
    return transformers.LlamaForCausalLM(cfg)


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1000, (len(LENGTHS), T), generator=g)
    mask = torch.zeros(len(LENGTHS), T, dtype=torch.long)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1
    return ids, mask, ids.masked_fill(mask == 0, -100)


def _train(out_dir, with_toggles, attn="sdpa"):
    model = _model(attn)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids, mask, labels = _batch()
    losses = []
    with swift_nb.profile(out_dir=out_dir, toggles=with_toggles, wait=0, warmup=1, active=2) as run:
        for _ in range(4):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            losses.append(loss.item())
            loss.backward()
            opt.step()
            opt.zero_grad()
    return run, losses


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    return _train(out, []), _train(out, ["packing"])


def test_packing_keeps_the_loss_and_computes_only_real_tokens(runs):
    (base, base_losses), (packed, packed_losses) = runs
    assert packed_losses[0] == pytest.approx(base_losses[0], rel=1e-3)
    assert packed_losses == pytest.approx(base_losses, rel=1e-3)  # the same samples, step after step
    real = float(sum(LENGTHS))
    assert (
        list(base.steps["tokens"]) == [len(LENGTHS) * T] * 4 and list(base.steps["real_tokens"]) == [real] * 4
    )
    assert list(packed.steps["tokens"]) == [real] * 4 and list(packed.steps["real_tokens"]) == [real] * 4
    assert packed.summary["padding_pct"] == 0.0 and base.summary["padding_pct"] == pytest.approx(
        55.47, abs=0.01
    )
    assert packed.summary["peak_mem_bytes"] < 0.7 * base.summary["peak_mem_bytes"]
    (report,) = packed.context["toggles"]
    assert report["details"]["separated_by"] == "4d_mask" and report["details"]["padding_removed_pct"] > 55
    # its exact path is no packed-attention trap
    assert "packed_attention" not in [f.id for f in analyze(packed).findings]


def test_the_forecast_predicts_the_packed_peak(runs):
    (base, _), (packed, _) = runs
    predicted = forecast(base, toggles=["packing"]).total_bytes
    measured = packed.summary["peak_mem_bytes"]
    assert abs(predicted - measured) <= 0.10 * measured, (predicted, measured)


def test_the_padding_finding_offers_packing(runs):
    (base, _), _ = runs
    padding = next(f for f in analyze(base).findings if f.id == "padding")
    assert padding.toggle == "packing" and padding.evidence["padding_pct"] == pytest.approx(55.5, abs=0.1)


def test_packing_is_refused_where_pads_cannot_be_told_or_the_model_cannot_be_packed():
    with pytest.raises(ConfigError, match="position_ids"):
        toggles.get("packing").apply({"net": nn.Sequential(nn.Linear(4, 4))})
    model = _model()
    toggle = toggles.get("packing")
    toggle.apply({"model": model})
    try:
        with pytest.raises(ConfigError, match="neither an attention_mask nor labels"):
            model(input_ids=torch.randint(0, 100, (2, 8)))
    finally:
        toggle.undo()
    assert "forward" not in model.__dict__


def test_packed_rows_into_sdpa_are_the_critical_finding(tmp_path):
    model = _model("sdpa")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    collate = transformers.DataCollatorWithFlattening()
    g = torch.Generator().manual_seed(2)
    samples = [{"input_ids": torch.randint(0, 1000, (n,), generator=g).tolist()} for n in (20, 12, 9)]
    batch = collate(samples)
    assert "attention_mask" not in batch and int((batch["position_ids"] == 0).sum()) == 3
    with swift_nb.profile(out_dir=tmp_path, wait=0, warmup=1, active=1) as run:
        for _ in range(3):
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad()
    assert run.summary["packed_restarts"] == 3 * 2  # two restarts per step
    found = {f.id: f for f in analyze(run).findings}
    assert found["packed_attention"].severity == "critical"
    assert "attn_implementation='sdpa'" in found["packed_attention"].title
