"""The fused_ce toggle on a real Hugging Face causal LM with Qwen's vocabulary: the same
loss, a fraction of the peak, the forecast's prediction of it, an exact undo, and a clear
refusal of a model that is no language model or whose logits are not its output layer's:
scaled (Granite, Cohere, Falcon-H1), or post-processed where no config says so. Soft-capped
logits (Gemma 2, RecurrentGemma) are reproduced: the same loss as the model's own."""

from __future__ import annotations

import cut_cross_entropy
import pytest
import torch
import transformers
from torch import nn

import swift_nb
from swift_nb import toggles
from swift_nb.analysis.forecast import forecast
from swift_nb.core.errors import ConfigError

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
    predicted = forecast(base, device="cpu", toggles=["fused_ce"])  # measured here, on the CPU
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


def _tiny(config: str, **extra):
    """A causal LM of ``transformers.<config>``'s architecture, tiny, with random weights."""
    torch.manual_seed(0)
    sizes = dict(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return transformers.AutoModelForCausalLM.from_config(getattr(transformers, config)(**{**sizes, **extra}))


@pytest.mark.parametrize(
    ("config", "extra", "named"),
    [
        ("GraniteConfig", {"logits_scaling": 8.0}, r"config\.logits_scaling = 8\.0"),
        ("CohereConfig", {}, r"config\.logit_scale = 0\.0625"),  # Cohere's default
        ("FalconH1Config", {"lm_head_multiplier": 4.0}, r"config\.lm_head_multiplier = 4\.0"),
    ],
)
def test_a_model_whose_logits_are_scaled_is_refused_naming_the_attribute(config, extra, named):
    model = _tiny(config, **extra)
    toggle = toggles.get("fused_ce")
    try:
        with pytest.raises(ConfigError, match=named):
            toggle.apply({"model": model})
        assert toggle.report is None and "forward" not in model.__dict__  # nothing stays applied
    finally:
        toggle.undo()  # where it was not refused, its hooks must not outlive the test


def test_a_scale_of_one_changes_nothing_and_is_accepted():
    model = _tiny("GraniteConfig", logits_scaling=1.0)
    toggle = toggles.get("fused_ce")
    toggle.apply({"model": model})
    assert toggle.undo().applied


@pytest.mark.parametrize(
    ("config", "extra"),
    [
        ("Gemma2Config", {"head_dim": 16, "final_logit_softcapping": 2.0}),
        (
            "RecurrentGemmaConfig",
            {
                "logits_soft_cap": 2.0,
                "lru_width": 32,
                "num_hidden_layers": 2,
                "block_types": ["recurrent", "attention"],
            },
        ),
    ],
)
def test_soft_capped_logits_give_the_models_own_loss(config, extra):
    model = _tiny(config, **extra)
    head = model.get_output_embeddings()
    with torch.no_grad():
        head.weight.mul_(100)  # logits of several units, well past the cap of 2
    ids, mask, labels = _batch()
    ids, labels = ids % 128, labels.where(labels < 0, labels % 128)
    own = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    toggle = toggles.get("fused_ce")
    toggle.apply({"model": model})
    try:
        fused = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    finally:
        assert toggle.undo().details["fused_calls"] == 1
    assert fused.item() == pytest.approx(own.item(), rel=1e-4)
    # the cap matters here: the same loss without it is another number
    hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    uncapped = cut_cross_entropy.linear_cross_entropy(
        hidden, head.weight, labels, shift=True, impl="torch_compile"
    )
    assert abs(uncapped.item() - own.item()) > 0.05 * own.item()


def test_logits_post_processed_where_no_config_says_so_are_refused_at_the_first_loss():
    model = _tiny("Qwen2Config")
    # as MiniCPM's remote code does: the hidden states scaled on their way into the output layer
    model.lm_head.register_forward_pre_hook(lambda module, args: (args[0] / 4,))
    ids, mask, labels = _batch()
    ids, labels = ids % 128, labels.where(labels < 0, labels % 128)
    toggle = toggles.get("fused_ce")
    toggle.apply({"model": model})
    try:
        with pytest.raises(
            ConfigError, match=r"`model` \(Qwen2ForCausalLM\).* logits .*not its output layer's"
        ):
            model(input_ids=ids, attention_mask=mask, labels=labels)
    finally:
        toggle.undo()
