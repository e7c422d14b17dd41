"""Tokens counted from what the model receives (swift_nb.capture.tokens), the logits'
allocations told apart by the trace's marks (capture.memory.categories.logits_allocations),
and the run's token figures (record.write.token_summary)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from torch import nn

from swift_nb.capture.memory.categories import logits_allocations, replay
from swift_nb.capture.memory.logits import find_head, lm_shape
from swift_nb.capture.tokens import TokenCounter, count, read_inputs
from swift_nb.core.trace_names import LOGITS_MARK, logits_addresses
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
    assert lm_shape([TinyLM(vocab=300, hidden=8)]) == (300, 8)
    assert lm_shape([nn.Sequential(nn.Linear(4, 4))]) is None
    assert find_head(TinyLM(vocab=300, hidden=8)) == (None, False)  # a classifier's width


def test_a_head_is_known_by_the_model_or_by_its_tied_weight_else_a_candidate():
    class Plain(nn.Module):
        def __init__(self, tie: bool) -> None:
            super().__init__()
            self.embed = nn.Embedding(4096, 32)
            self.up = nn.Linear(32, 4096)  # as wide as the vocabulary: not the head
            self.head = nn.Linear(32, 4096, bias=False)
            if tie:
                self.head.weight = self.embed.weight

    head, known = find_head(Plain(tie=True))
    assert known and head is not None and head.weight.shape == (4096, 32)
    _, known = find_head(Plain(tie=False))
    assert not known  # a candidate: its output is the logits only where the model returns it


def test_a_mark_names_the_latest_allocation_at_its_address_not_every_one_of_its_size():
    v = 32_768
    size = 8 * v * 4  # the size of a (8 × 32 768) fp32 activation too
    events = [
        (1.0, size, 10),  # an activation of the logits' size
        (2.0, size, 20),  # an earlier tensor at the address the logits get later
        (3.0, -size, 20),
        (4.0, size, 20),  # the logits
        (6.0, -size, 20),
        (7.0, size, 20),  # after the mark: another tensor at that address
    ]
    assert logits_allocations(events, [(4.5, 20)]) == {3}
    assert logits_allocations(events, [(4.0, 20)]) == {3}  # the same microsecond
    assert logits_allocations(events, [(0.5, 20)]) == set()  # nothing there yet
    name = LOGITS_MARK + f"{0x7F00:x},{0x10:x}"
    assert logits_addresses(name) == [0x7F00, 0x10] and logits_addresses("aten::mm") == []


def test_the_replay_counts_logits_apart_from_activations_and_temporaries():
    v = 32_000
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
    m = replay(events, {}, {}, 4.0, {1, 2, 3})
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
    # real tokens per step × steps per second: 1 / the step time, the compiling step left out
    assert got["real_tokens_per_s"] == pytest.approx(50 / 1.0)
    assert got["tokens_per_step"] == 100 and got["real_tokens_per_step"] == 50
    assert token_summary(steps.drop(columns=["tokens", "real_tokens"])) == {}
    none = steps.assign(tokens=math.nan, real_tokens=math.nan)
    assert token_summary(none) == {}
