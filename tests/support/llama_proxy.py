"""A small config-built Llama profiled for real: the proxy that forecasts from a model's config
are checked against (tests/integration/test_forecast_from_model.py) and measured with
(benchmarks/forecast_models.py)."""

from __future__ import annotations

import torch

import swift_nb
from swift_nb.record import Run

B, T = 2, 128


def config(hidden: int, layers: int):
    """A Llama of ``layers`` blocks of width ``hidden``, with a 2000-token vocabulary."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=2000,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
    )


def profiled(out, cfg, toggles=()) -> Run:
    """Five steps of ``cfg``'s model on B × T random tokens, three of them recorded."""
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    # foreach, as torch runs AdamW on CUDA and the forecast from a config assumes (on the
    # CPU torch would update one tensor at a time)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids = torch.randint(0, cfg.vocab_size, (B, T))
    with swift_nb.profile(
        out_dir=out, wait=0, warmup=1, active=3, report=False, toggles=list(toggles)
    ) as run:
        for _ in range(5):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    return run


def step_peak(run: Run) -> float:
    """The measured peak of a typical step: the median over the recorded steps (one step of a
    CPU run may hold some tensors of the one before a little longer: +0.5 MiB was seen once)."""
    return float(run.steps["peak_tensor_bytes"].dropna().median())
