"""Helpers shared by the tiers of test_lora's tests."""

from __future__ import annotations

import torch
from torch import nn

from swift_nb.demo import make_model

VOCAB, SEQ = 128, 16


def demo() -> nn.Module:
    torch.manual_seed(0)
    return make_model(n_layer=2, n_head=4, d_model=64, seq_len=SEQ, vocab_size=VOCAB)


def loss_of(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    if hasattr(model, "cfg"):  # the demo GPT
        return model(idx, idx)
    return model(input_ids=idx, labels=idx).loss


def step(model: nn.Module, opt: torch.optim.Optimizer, idx: torch.Tensor) -> float:
    loss = loss_of(model, idx)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()
