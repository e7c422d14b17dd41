"""Helpers shared by the tiers of test_toggles_peft's tests."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from swift_nb.demo import GPT, make_model

VOCAB, SEQ = 128, 16

peft = pytest.importorskip("peft")


transformers = pytest.importorskip("transformers")


def peft_model(kind: str = "llama-eager") -> nn.Module:
    """A random-weight model under LoRA adapters on some of its linear layers."""
    torch.manual_seed(0)
    if kind == "gpt":
        gpt = make_model(n_layer=2, n_head=4, d_model=64, seq_len=SEQ, vocab_size=VOCAB, attn_impl="eager")
        return peft.get_peft_model(
            gpt, peft.LoraConfig(r=8, target_modules=["qkv", "proj", "mlp.0", "mlp.2"])
        )
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa" if kind == "llama-sdpa" else "eager",
    )
    lora = peft.LoraConfig(
        r=8,
        target_modules=["q_proj", "v_proj"],
        task_type="CAUSAL_LM" if kind == "llama-causal-lm" else None,
    )
    return peft.get_peft_model(transformers.LlamaForCausalLM(cfg), lora)


def batches(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (2, SEQ), generator=g) for _ in range(n)]


def loss_of(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    if isinstance(model.get_base_model(), GPT):
        return model(idx, idx.roll(-1, dims=1))
    return model(input_ids=idx, labels=idx).loss


def inner_checkpointing(model: nn.Module) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
