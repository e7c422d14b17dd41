"""Tokens counted from what the model receives (swift_nb.capture.tokens), the logits'
allocations told apart by size (capture.memory.categories.is_logits), and the run's token
figures (record.write.token_summary)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from torch import nn

from swift_nb.capture.memory.categories import is_logits, replay
from swift_nb.capture.tokens import TokenCounter, count, lm_head, read_inputs
from swift_nb.record.write import token_summary

LENGTHS = [16, 6, 4, 3]


def _padded(lengths=LENGTHS, t=16, left=False):
    ids = torch.randint(1, 50, (len(lengths), t))
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for i, n in enumerate(lengths):
        if left:
            mask[i, t - n :] = 1
        else:
            mask[i, :n] = 1
    return ids, mask


class TinyLM(nn.Module):
    def __init__(self, vocab=50, hidden=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids=None, attention_mask=None, labels=None, position_ids=None, **kw):
        return self.head(self.embed(input_ids))


def _real(found):
    computed, real, source, packed = count(found)
    return computed, (computed if real is None else int(real)), source, (0 if packed is None else int(packed))


@pytest.mark.parametrize("left", [False, True])
def test_the_attention_mask_counts_real_tokens_right_or_left_padded(left):
    ids, mask = _padded(left=left)
    assert _real(read_inputs((), {"input_ids": ids, "attention_mask": mask})) == (64, 29, "attention_mask", 0)


def test_positional_ids_and_mask_of_a_plain_loop():
    ids, mask = _padded()
    assert _real(read_inputs((ids, mask), {})) == (64, 29, "attention_mask", 0)
    # model(ids, targets): a second tensor of the ids' shape that is no mask
    targets = torch.randint(2, 50, ids.shape)
    assert _real(read_inputs((ids, targets), {}))[:2] == (64, 64)
    # a dict batch passed whole: model(batch)
    assert _real(read_inputs(({"input_ids": ids, "attention_mask": mask},), {}))[1] == 29


def test_a_key_padding_mask_is_true_at_the_pads():
    ids, mask = _padded()
    found = read_inputs((ids,), {"src_key_padding_mask": mask == 0})
    assert _real(found) == (64, 29, "attention_mask", 0)


def test_labels_alone_count_each_row_up_to_its_last_label():
    ids, mask = _padded()
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :2] = -100  # a masked prompt is real tokens all the same
    assert _real(read_inputs((), {"input_ids": ids, "labels": labels})) == (64, 29, "labels", 0)


def test_packed_rows_have_no_padding_and_their_restarts_are_counted():
    ids = torch.randint(1, 50, (1, 12))
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4]])
    assert _real(read_inputs((), {"input_ids": ids, "position_ids": pos})) == (12, 12, "packed", 2)
    cu = torch.tensor([0, 4, 7, 10], dtype=torch.int32)
    assert _real(read_inputs((), {"input_ids": ids, "cu_seq_lens_q": cu})) == (12, 10, "packed", 0)


def test_inputs_without_tokens_count_nothing():
    assert count(read_inputs((torch.randn(4, 3),), {})) is None  # (batch, features): no tokens
    assert count(read_inputs((torch.randint(0, 9, (4,)),), {})) is None
    assert count(read_inputs((), {"inputs_embeds": torch.randn(2, 5, 8)}))[0] == 10
    assert count(read_inputs((), {"pixel_values": torch.randn(2, 3, 8, 8)})) is None


def test_the_counter_sums_a_steps_forwards_and_skips_no_grad_and_nested_calls():
    model = TinyLM()
    ref = TinyLM()
    outer = nn.Sequential(model)  # a wrapper whose forward calls the hooked model
    counter = TokenCounter()
    counter.watch([model, ref, outer])
    ids, mask = _padded()
    for _ in range(2):  # gradient accumulation: two micro-batches in step 0
        model(input_ids=ids, attention_mask=mask)
    with torch.no_grad():
        ref(input_ids=ids, attention_mask=mask)  # a reference model: not the trained tokens
    counter.at_boundary(0)
    outer(ids)  # step 1: no mask, every token real; counted once, not once per hooked level
    counter.at_boundary(1)
    done = counter.finish()
    assert done == {0: (128, 58, 0), 1: (64, 64, 0)}
    assert counter.source == "attention_mask"
    model(input_ids=ids, attention_mask=mask)  # the hooks are gone
    assert counter.finish() == done


def test_a_failing_read_is_noted_and_never_breaks_the_step():
    class Odd(nn.Module):
        def forward(self, input_ids, attention_mask):
            return input_ids.float().sum()

    counter = TokenCounter()
    model = Odd()
    counter.watch([model])
    ids = torch.randint(1, 5, (2, 4))
    model(ids, attention_mask=torch.ones(3, 4))  # a mask of another shape: ignored
    counter.at_boundary(0)
    assert counter.finish() == {0: (8, 8, 0)} and counter.failed is None


def test_the_lm_head_is_found_on_hugging_face_and_plain_models():
    assert lm_head([TinyLM(vocab=300, hidden=8)]) == (300, 8)
    assert lm_head([nn.Sequential(nn.Linear(4, 4))]) is None


def test_logits_are_known_by_their_size_and_weights_of_the_vocabulary_are_not():
    v, h = 32_000, 64
    assert is_logits(4 * 128 * v * 4, (v, h))  # B×T×V fp32
    assert is_logits(4 * 127 * v * 2, (v, h))  # shifted, bf16
    assert is_logits(4 * 128 * v * 4 + 300, (v, h))  # rounded up by the allocator
    assert not is_logits(v * h * 4, (v, h))  # the LM head's gradient
    assert not is_logits(4 * 128 * 4096 * 4, (v, h))
    assert not is_logits(4 * 128 * v * 4, None)
    assert not is_logits(4 * 128 * 500 * 4, (500, h))  # a small vocabulary: a classifier


def test_the_replay_counts_logits_apart_from_activations_and_temporaries():
    v, h = 32_000, 16
    size = 64 * v * 4
    events = [
        (1.0, 1000, 10),  # an activation kept for backward
        (2.0, size, 20),  # the logits, kept for backward
        (3.0, size, 30),  # their log-softmax
        (5.0, size, 40),  # their gradient, in backward
        (6.0, -size, 40),
        (7.0, -size, 30),
        (8.0, -size, 20),
        (9.0, -1000, 10),
    ]
    m = replay(events, {}, {}, 4.0, (v, h))
    assert m.at_peak["logits"] == 3 * size and m.at_peak["activations"] == 1000
    plain = replay(events, {}, {}, 4.0)
    assert plain.at_peak["logits"] == 0 and plain.at_peak["activations"] == 1000 + 2 * size


def test_token_summary_counts_padding_and_real_tokens_per_second():
    steps = pd.DataFrame(
        {
            "step": [0, 1, 2],
            "trigger": ["optimizer"] * 3,
            "duration_s": [2.0, 1.0, 1.0],
            "compile_s": [1.5, 0.0, 0.0],
            "tokens": [100.0, 100.0, 100.0],
            "real_tokens": [40.0, 50.0, 60.0],
        }
    )
    got = token_summary(steps)
    assert got["padding_pct"] == pytest.approx(50.0)
    assert got["real_tokens_per_s"] == pytest.approx(110 / 2.0)  # the compiling step left out
    assert got["tokens_per_step"] == 100 and got["real_tokens_per_step"] == 50
    assert token_summary(steps.drop(columns=["tokens", "real_tokens"])) == {}
    none = steps.assign(tokens=math.nan, real_tokens=math.nan)
    assert token_summary(none) == {}
