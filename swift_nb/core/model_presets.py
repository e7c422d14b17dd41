"""The models people fine-tune, as configs typed in from their public shapes (nothing is
downloaded): what ``swift_nb.forecast(model="llama-3-8b")`` builds on fake tensors.

Each preset names its transformers config class and the fields that set its shape; the
parameter count is the model card's, which a forecast's parameters reproduce exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelPreset:
    """A model's shape: ``config_class`` (a transformers class name), ``fields`` (its
    constructor's keywords), ``params``: its parameter count as published."""

    name: str
    config_class: str
    fields: dict[str, Any] = field(default_factory=dict)
    params: int = 0


_LLAMA3 = {"vocab_size": 128_256, "rope_theta": 500_000.0, "max_position_embeddings": 8192}
PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            "llama-2-7b",
            "LlamaConfig",
            {
                "vocab_size": 32_000,
                "hidden_size": 4096,
                "intermediate_size": 11_008,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 32,
            },
            6_738_415_616,
        ),
        ModelPreset(
            "llama-3-8b",
            "LlamaConfig",
            {
                **_LLAMA3,
                "hidden_size": 4096,
                "intermediate_size": 14_336,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
            },
            8_030_261_248,
        ),
        ModelPreset(
            "llama-3-70b",
            "LlamaConfig",
            {
                **_LLAMA3,
                "hidden_size": 8192,
                "intermediate_size": 28_672,
                "num_hidden_layers": 80,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
            },
            70_553_706_496,
        ),
        ModelPreset(
            "qwen2.5-7b",
            "Qwen2Config",
            {
                "vocab_size": 152_064,
                "hidden_size": 3584,
                "intermediate_size": 18_944,
                "num_hidden_layers": 28,
                "num_attention_heads": 28,
                "num_key_value_heads": 4,
                "tie_word_embeddings": False,
            },
            7_615_616_512,
        ),
        ModelPreset(
            "qwen2.5-72b",
            "Qwen2Config",
            {
                "vocab_size": 152_064,
                "hidden_size": 8192,
                "intermediate_size": 29_568,
                "num_hidden_layers": 80,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "tie_word_embeddings": False,
            },
            72_706_203_648,
        ),
        ModelPreset(
            "mistral-7b",
            "MistralConfig",
            {
                "vocab_size": 32_768,
                "hidden_size": 4096,
                "intermediate_size": 14_336,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
            },
            7_248_023_552,
        ),
        ModelPreset(
            "gemma-2-9b",
            "Gemma2Config",
            {
                "vocab_size": 256_000,
                "hidden_size": 3584,
                "intermediate_size": 14_336,
                "num_hidden_layers": 42,
                "num_attention_heads": 16,
                "num_key_value_heads": 8,
                "head_dim": 256,
            },
            9_241_705_984,
        ),
    )
}


def preset(name: str) -> ModelPreset | None:
    """The preset named ``name`` (any case, ``_`` for ``-``), or None."""
    return PRESETS.get(name.strip().lower().replace("_", "-"))
