"""Packing priced as it runs: off FlashAttention's variable-length kernel, the packed row's
N real tokens attend through [.., N, N] tensors (eager's scores, the mask), which grow as
N², not as the B·T² of the padded batch scaled by the real share. At N = 4 096 on eager
attention the forecast from the padded run lands on the packed run's measured peak. And
what packing cannot read is refused, per-token inputs packed with the tokens."""

from __future__ import annotations

import pytest
import torch
import transformers

import swift_nb
from swift_nb import toggles
from swift_nb.analysis.forecast import forecast
from swift_nb.core.errors import ConfigError
from swift_nb.record import load_run

VOCAB, T = 1000, 1024
LENGTHS = [1024, 768, 640, 512, 448, 384, 192, 128]  # N = 4 096 real tokens of 8 × 1 024


def _model(attn: str = "eager", **more):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=T,
        attn_implementation=attn,
        **more,
    )
    return transformers.LlamaForCausalLM(cfg)


def _batch(lengths=LENGTHS, t=T):
    ids = torch.randint(0, VOCAB, (len(lengths), t), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return ids, mask, ids.masked_fill(mask == 0, -100)


def _profiled(out_dir, with_toggles=()):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids, mask, labels = _batch()
    with swift_nb.profile(
        out_dir=out_dir, wait=0, warmup=1, active=2, report=False, toggles=with_toggles
    ) as run:
        for _ in range(4):
            model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
            opt.step()
            opt.zero_grad()
    return load_run(run.path)


def test_the_forecast_of_a_packed_row_of_4096_tokens_on_eager_attention(tmp_path):
    padded, packed = _profiled(tmp_path), _profiled(tmp_path, ("packing",))
    assert float(packed.steps["real_tokens"].dropna().iloc[0]) == sum(LENGTHS) == 4096
    measured = float(packed.steps["peak_tensor_bytes"].dropna().median())
    f = forecast(padded, device="cpu", toggles=["packing"])
    assert f.total_bytes == pytest.approx(measured, rel=0.15), (f.total_bytes / 2**20, measured / 2**20)
    # the scores grew as N²: the packed step holds more than the padded one, whose forecast
    # scaled by the real share alone would have halved it
    assert measured > float(padded.steps["peak_tensor_bytes"].dropna().median())
    assert any("B·T² → N²" in line for line in f.derivation)


def test_extra_positional_arguments_are_refused_and_per_token_inputs_packed():
    model = _model(type_vocab_size=2)
    ids, mask, labels = _batch([6, 3], t=8)
    seen = {}
    original = model.model.forward

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return original(*args, **kwargs)

    model.model.forward = spy
    toggle = toggles.get("packing")
    toggle.apply({"model": model})
    try:
        with pytest.raises(ConfigError, match=r"3 positional arguments.*pass the others as keywords"):
            model(ids, mask, labels)
        types = torch.arange(16).view(2, 8) % 2
        model(input_ids=ids, attention_mask=mask, labels=labels, token_type_ids=types)
    finally:
        toggle.undo()
    assert seen["input_ids"].shape == (1, 9)
    # the token types of the 9 real tokens, in the same order as the tokens
    assert seen["token_type_ids"].tolist() == [[0, 1, 0, 1, 0, 1, 0, 1, 0]]
