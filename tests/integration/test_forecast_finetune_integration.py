"""swift_nb.analysis.forecast for fine-tuning (``forecast/finetune.py``, the LoRA formulas of
``analysis/effects.py``): frozen weights as a category priced at their dtype or 4-bit NF4,
the ``lora`` and ``qlora`` toggles on a full fine-tune and on a LoRA run, a run recorded
before frozen weights were measured, and what the section shows.

Synthetic runs (no trace, their linear layers set by hand) for the arithmetic; real peft
LoRA Llamas built from configs, profiled on the CPU, for the accuracy against a measured
peak.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import replace

import pytest
import torch

import swift_nb
from swift_nb.analysis.forecast import forecast, measure
from swift_nb.record import Run

SEQ, VOCAB = 64, 1024


def _profile(root, batch: int, lora: tuple[int, object] | None = None) -> Run:
    """A Llama (width 128, 2 blocks) fine-tuned for 5 steps, under LoRA (rank, targets) or fully."""
    import peft
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=SEQ,
    )
    model = transformers.LlamaForCausalLM(cfg)
    if lora is not None:
        model = peft.get_peft_model(model, peft.LoraConfig(r=lora[0], lora_alpha=16, target_modules=lora[1]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    x = torch.randint(0, VOCAB, (batch, SEQ))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        with swift_nb.profile(out_dir=root, wait=1, warmup=1, active=2, report=False) as run:
            for _ in range(5):
                model(input_ids=x, labels=x).loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    return swift_nb.load_run(run.path)


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory) -> dict[int, Run]:
    root = tmp_path_factory.mktemp("lora")
    return {b: _profile(root, b, (8, ["q_proj", "v_proj"])) for b in (2, 8)}


def test_four_times_the_batch_of_a_lora_run_lands_within_ten_percent(lora_runs):
    small, large = measure(lora_runs[2]), measure(lora_runs[8])
    assert (
        small.lora_rank == 8 and small.categories["frozen_parameters"] > 10 * small.categories["parameters"]
    )
    f = forecast(lora_runs[2], batch_size=8)
    assert f.categories["frozen_parameters"] == large.categories["frozen_parameters"]
    assert f.categories["parameters"] == large.categories["parameters"]
    assert f.total_bytes == pytest.approx(large.total, rel=0.10)


def test_a_loaded_run_without_frozen_weights_still_forecasts(lora_runs):
    old = lora_runs[2]
    old = replace(
        old,
        steps=old.steps.drop(columns=["frozen_parameters_bytes"]),
        memory=old.memory.drop(columns=["frozen_parameters_bytes"]),
        summary={
            **old.summary,
            "memory_categories_at_peak": {
                k: v for k, v in old.summary["memory_categories_at_peak"].items() if k != "frozen_parameters"
            },
        },
    )
    f = forecast(old, batch_size=8)
    assert f.categories["frozen_parameters"] == 0 and f.total_bytes > 0
    assert any("recorded before frozen weights were measured" in line for line in f.derivation)


def test_a_full_fine_tune_forecast_as_lora_meets_the_lora_run(tmp_path):
    full = _profile(tmp_path, 2)
    lora = measure(_profile(tmp_path, 2, (16, "all-linear")))
    f = forecast(full, toggles=["lora(r=16)"])
    assert f.categories["parameters"] == lora.categories["parameters"]  # exact: the trace's shapes
    assert f.categories["frozen_parameters"] == lora.categories["frozen_parameters"]
    assert f.total_bytes == pytest.approx(lora.total, rel=0.10)
