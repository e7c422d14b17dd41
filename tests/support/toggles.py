"""Helpers shared by the tiers of test_toggles's tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from swift_nb.demo import make_model

VOCAB, SEQ = 128, 32


class PlainAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).split(d, dim=2))
        return self.out(
            F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        )


class PlainBlock(nn.Module):
    def __init__(self, d: int, heads: int, attention: type[nn.Module] = PlainAttention) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.attn = attention(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm(x))
        return x + self.mlp(x)


class PlainLM(nn.Module):
    """A transformer written in plain PyTorch with F.scaled_dot_product_attention."""

    def __init__(self, d: int = 64, heads: int = 4, layers: int = 3, attention=PlainAttention) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.layers = nn.ModuleList(PlainBlock(d, heads, attention) for _ in range(layers))
        self.head = nn.Linear(d, VOCAB)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for layer in self.layers:
            x = layer(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def _hf(kind: str) -> nn.Module:
    import transformers

    if kind == "llama":
        cfg = transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=SEQ,
            attn_implementation="eager",
        )
        return transformers.LlamaForCausalLM(cfg)
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
        # dropout draws different masks in eager and fused attention: compare without it
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(cfg)


class HFLoss(nn.Module):
    """Calls a Hugging Face LM the way training code does (labels → loss)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=idx, labels=targets).loss


def make(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "demo":
        return make_model(n_layer=2, n_head=4, d_model=64, seq_len=SEQ, vocab_size=VOCAB, attn_impl="eager")
    if kind == "plain":
        return PlainLM()
    return _hf(kind)


def loss_of(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return HFLoss(model)(idx, targets) if kind_of(model) == "hf" else model(idx, targets)


def kind_of(model: nn.Module) -> str:
    return "hf" if type(model).__module__.startswith("transformers.") else "torch"


def grads(model: nn.Module) -> tuple[float, dict[int, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, VOCAB, (2, SEQ), generator=g)
    model.train()
    model.zero_grad(set_to_none=True)
    loss = loss_of(model, idx, idx.roll(-1, dims=1))
    loss.backward()
    return loss.item(), {id(p): p.grad.clone() for p in model.parameters() if p.grad is not None}
