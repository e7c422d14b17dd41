"""A small GPT-style model and synthetic token data for demos, tests and benchmarks.

Everything is built from a config with random weights; nothing is downloaded.

The model follows the Hugging Face conventions swift_nb's toggles read, so it needs no
special case there: ``model.config._attn_implementation`` ("eager" or "sdpa") is read by
every attention layer at each forward (see :mod:`swift_nb.toggles._attention`),
``config.num_attention_heads`` gives the heads and ``forward`` takes ``position_ids``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

AttentionImpl = Literal["eager", "sdpa"]


@dataclass
class GPTConfig:
    vocab_size: int = 1024
    seq_len: int = 256
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    dropout: float = 0.0
    attn_impl: AttentionImpl = "sdpa"

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        _check_attn_impl(self.attn_impl)

    @property
    def _attn_implementation(self) -> AttentionImpl:
        """``attn_impl`` under Hugging Face's name; setting it switches every layer."""
        return self.attn_impl

    @_attn_implementation.setter
    def _attn_implementation(self, impl: str) -> None:
        _check_attn_impl(impl)
        self.attn_impl = impl  # type: ignore[assignment]

    @property
    def num_attention_heads(self) -> int:
        return self.n_head


def _check_attn_impl(impl: str) -> None:
    if impl not in ("eager", "sdpa"):
        raise ValueError(f"attn_impl must be 'eager' or 'sdpa'; got {impl!r}")


class CausalSelfAttention(nn.Module):
    """Causal multi-head self-attention; ``config.attn_impl`` chooses, at each call, between
    F.scaled_dot_product_attention and the same computation written out."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.n_head = cfg.n_head
        self.head_dim = cfg.d_model // cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    @property
    def attn_impl(self) -> AttentionImpl:
        return self.config.attn_impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, self.head_dim).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        if self.attn_impl == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            # Materialises the [b, heads, t, t] score matrix: memory quadratic in t.
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
            y = F.dropout(scores.softmax(dim=-1), p) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only transformer: token + position embeddings, `n_layer` blocks, tied head.

    ``cfg`` is copied: switching one model's attention leaves other models built from the
    same config as they are."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        cfg = self.cfg = replace(cfg)
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # GPT-2's init: small weights keep the tied head's initial logits near zero.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @property
    def config(self) -> GPTConfig:
        """``cfg`` under Hugging Face's name."""
        return self.cfg

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ):
        """The loss when ``targets`` are given, else the logits. ``position_ids`` ([1 or
        batch, t]; default ``0..t-1``) place a slice of a longer sequence."""
        t = idx.shape[1]
        if position_ids is None:
            if t > self.cfg.seq_len:
                raise ValueError(f"sequence length {t} exceeds the model's seq_len {self.cfg.seq_len}")
            position_ids = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(position_ids)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class SyntheticTokens(torch.utils.data.Dataset):
    """Random token sequences; the target is the input shifted by one token."""

    def __init__(self, n_samples: int, seq_len: int, vocab_size: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab_size, (n_samples, seq_len + 1), generator=g)

    def __len__(self) -> int:
        return self.data.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.data[i]
        return row[:-1], row[1:]


def quickstart_config() -> GPTConfig:
    """The quickstart notebook's model: explicit ("eager") attention over 1024 tokens with
    a small width and few layers, so the [heads, 1024, 1024] score matrices each layer keeps
    for backward make up most of the activations: the case FlashAttention and gradient
    checkpointing are for. Train it at batch size 1 (a step takes about 0.25 s on 2 CPU cores)."""
    return GPTConfig(vocab_size=256, seq_len=1024, n_layer=4, n_head=4, d_model=64, attn_impl="eager")


def make_model(**overrides) -> GPT:
    """A GPT built from `GPTConfig(**overrides)` with random weights."""
    return GPT(GPTConfig(**overrides))


def make_loader(
    cfg: GPTConfig, batch_size: int = 8, n_samples: int = 256, seed: int = 0, **loader_kwargs
) -> torch.utils.data.DataLoader:
    """A DataLoader of synthetic token sequences matching `cfg`."""
    ds = SyntheticTokens(n_samples, cfg.seq_len, cfg.vocab_size, seed=seed)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, **loader_kwargs)
