"""The tokens and the logits of a real fine-tune, profiled: a Qwen2-shaped model with Qwen's
vocabulary (151 936) built from its config, fed right-padded batches; and a plain-PyTorch
loop with a mask of its own. The padding share is the batches' own, the loss's logits are
their own category, and the findings name both."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

import swift_nb
from swift_nb.analysis import analyze
from swift_nb.record import load_run

VOCAB, T = 151_936, 64
LENGTHS = [64, 24, 16, 10]  # real tokens per row: 114 of 256, 55.5 % padding


def _qwen():
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


def _batch(lengths=LENGTHS, t=T):
    ids = torch.randint(0, 1000, (len(lengths), t))
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return ids, mask, ids.masked_fill(mask == 0, -100)


@pytest.fixture(scope="module")
def qwen_run(tmp_path_factory):
    model = _qwen()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids, mask, labels = _batch()
    with swift_nb.profile(out_dir=tmp_path_factory.mktemp("runs"), wait=0, warmup=1, active=2) as run:
        for _ in range(4):
            model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
            opt.step()
            opt.zero_grad()
    return run


def test_the_padding_share_is_the_batches_own(qwen_run):
    expected = 100 * (1 - sum(LENGTHS) / (len(LENGTHS) * T))
    found = load_run(qwen_run.path)  # as written to disk
    assert found.summary["padding_pct"] == pytest.approx(expected, abs=1.0)
    assert list(found.steps["tokens"]) == [256.0] * 4
    assert list(found.steps["real_tokens"]) == [float(sum(LENGTHS))] * 4
    assert found.context["tokens_from"] == "attention_mask" and found.context["vocab_size"] == VOCAB
    assert found.summary["real_tokens_per_s"] > 0


def test_the_logits_are_their_own_category_and_their_finding_leads(qwen_run):
    one_copy = len(LENGTHS) * T * VOCAB * 4
    found = load_run(qwen_run.path)
    recorded = found.steps.dropna(subset=["logits_bytes"])
    assert len(recorded) >= 1
    assert (recorded["logits_bytes"] >= one_copy).all()  # at least one fp32 B × T × V copy
    analysis = analyze(found)
    ids = [f.id for f in analysis.findings]
    assert "logits" in ids and "padding" in ids, ids
    logits = next(f for f in analysis.findings if f.id == "logits")
    assert logits.evidence["copies"] >= 1.0 and logits.evidence["vocab_size"] == VOCAB
    assert "151,936" in logits.title
    if "fp32_activations" in ids:  # the bf16 advice ranks below the logits' own
        assert ids.index("logits") < ids.index("fp32_activations")
    padding = next(f for f in analysis.findings if f.id == "padding")
    assert padding.title == "55.5 % of the tokens computed are padding"
    assert padding.toggle == "packing" and padding.time_cut > 0
    # the memory footprint shows them as their own category
    fp = analysis.footprint.set_index("category")["at_peak_bytes"]
    assert fp["logits"] >= one_copy and fp["logits"] > fp["activations"]


def test_a_plain_loop_with_a_mask_of_its_own(tmp_path):
    class LM(nn.Module):
        def __init__(self, vocab=2000, d=16):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.layer = nn.TransformerEncoderLayer(d, 2, 32, batch_first=True)
            self.head = nn.Linear(d, vocab)

        def forward(self, x, src_key_padding_mask):
            return self.head(self.layer(self.embed(x), src_key_padding_mask=src_key_padding_mask))

    torch.manual_seed(0)
    model = LM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids, mask, labels = _batch(t=32, lengths=[32, 20, 8, 4])
    pad = mask == 0
    with swift_nb.profile(out_dir=tmp_path, report=False) as run:
        for _ in range(3):
            logits = model(ids, src_key_padding_mask=pad)
            nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()
            opt.step()
            opt.zero_grad()
    assert run.summary["padding_pct"] == pytest.approx(100 * (1 - 64 / 128), abs=1.0)
    assert run.context["vocab_size"] == 2000 and run.context["tokens_from"] == "attention_mask"


def test_the_timeline_draws_each_steps_tokens(qwen_run):
    from swift_nb.analysis.timeline.query import Timeline

    tl = Timeline.of_run(load_run(qwen_run.path))
    counters = tl.counters(width_px=800)
    real = counters[counters["track"] == "Tokens per step: real"]
    computed = counters[counters["track"] == "Tokens per step: computed"]
    assert set(real["value"]) == {float(sum(LENGTHS))} and set(computed["value"]) == {256.0}
    units = dict(zip(tl.tracks["track"], tl.tracks["unit"], strict=False)) if "unit" in tl.tracks else {}
    assert units.get("Tokens per step: real", "tokens") == "tokens"
