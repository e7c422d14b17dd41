"""The loss's logits are known by where they come from, not by their size: two Mistral-shaped
models identical but for the vocabulary, one a power of two (32 768, whose B·T × V
allocations have the same sizes as ordinary power-of-two activations) and one 32 000 with
B·T = 1 000 (a multiple of 125, so B·T × 32 000 is a power-of-two multiple too), profiled.
Their logits differ by the vocabularies' ratio, their activations agree, and their
``fused_ce`` forecasts agree. A plain-PyTorch model whose head is not tied and whose output
is not the logits (it returns its loss alone) gets no logits category and a note."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

import swift_nb
from swift_nb.record import load_run

B, T = 4, 250  # B·T = 1 000


def _mistral(vocab: int) -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        attn_implementation="eager",
    )
    return transformers.MistralForCausalLM(cfg)


def _profiled(model: nn.Module, out_dir, vocab: int):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(1))
    with swift_nb.profile(out_dir=out_dir, wait=0, warmup=1, active=1, report=False) as run:
        for _ in range(3):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    return load_run(run.path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    return {v: _profiled(_mistral(v), out, v) for v in (32_768, 32_000)}


def _at_peak(run) -> dict[str, float]:
    row = run.steps.dropna(subset=["logits_bytes"]).iloc[-1]
    return {c: float(row[f"{c}_bytes"]) for c in ("activations", "logits", "other")}


def test_the_logits_scale_with_the_vocabulary_and_the_activations_do_not(runs):
    pow2, other = _at_peak(runs[32_768]), _at_peak(runs[32_000])
    one_copy = B * T * 32_768 * 4  # one fp32 B·T × V tensor
    assert pow2["logits"] >= one_copy, pow2
    assert pow2["logits"] / other["logits"] == pytest.approx(32_768 / 32_000, rel=0.05), (pow2, other)
    assert pow2["activations"] == pytest.approx(other["activations"], rel=0.10), (pow2, other)
    assert pow2["activations"] > 10 * 2**20  # two blocks' saved tensors, not a rounding error


def test_the_fused_ce_forecasts_agree(runs):
    peaks = {}
    for v, run in runs.items():
        peaks[v] = swift_nb.forecast(run, device="80GB", toggles="fused_ce").total_bytes
    assert peaks[32_768] == pytest.approx(peaks[32_000], rel=0.10), peaks


class _LossOnly(nn.Module):
    """A plain LM whose head is its own weight (not tied) and whose forward returns the loss
    alone: nothing tells which tensor holds its logits."""

    def __init__(self, vocab: int = 4096, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.mlp(self.embed(ids)))
        return nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())


class _ReturnsLogits(_LossOnly):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp(self.embed(ids)))


def _plain(model: nn.Module, out_dir, returns_logits: bool):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 4096, (8, 64))
    with swift_nb.profile(out_dir=out_dir, wait=0, warmup=1, active=1, report=False) as run:
        for _ in range(3):
            out = model(ids)
            loss = nn.functional.cross_entropy(out.flatten(0, 1), ids.flatten()) if returns_logits else out
            loss.backward()
            opt.step()
            opt.zero_grad()
    return load_run(run.path)


def test_a_plain_lm_whose_output_is_its_logits(tmp_path):
    run = _plain(_ReturnsLogits(), tmp_path, returns_logits=True)
    row = run.steps.dropna(subset=["logits_bytes"]).iloc[-1]
    # at most the head's output (kept by the loop), its log-softmax, and the gradients of
    # both in backward: four fp32 8·64 × 4 096 copies
    copy = 8 * 64 * 4096 * 4
    assert copy <= row["logits_bytes"] <= 4 * copy + 512


def test_no_logits_category_where_the_head_cannot_be_told(tmp_path):
    run = _plain(_LossOnly(), tmp_path, returns_logits=False)
    assert (run.steps["logits_bytes"].fillna(0) == 0).all()
    assert any("logits" in n for n in run.notes), run.notes
