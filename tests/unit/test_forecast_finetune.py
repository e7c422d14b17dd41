"""swift_nb.analysis.forecast for fine-tuning (``forecast/finetune.py``, the LoRA formulas of
``analysis/effects.py``): frozen weights as a category priced at their dtype or 4-bit NF4,
the ``lora`` and ``qlora`` toggles on a full fine-tune and on a LoRA run, a run recorded
before frozen weights were measured, and what the section shows.

Synthetic runs (no trace, their linear layers set by hand) for the arithmetic; real peft
LoRA Llamas built from configs, profiled on the CPU, for the accuracy against a measured
peak.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import pytest

from swift_nb.analysis import effects
from swift_nb.analysis.forecast import forecast, measure, parse_forecast_spec
from swift_nb.core.errors import ConfigError
from swift_nb.record import MEMORY_CATEGORIES, Run
from swift_nb.render.forecast import forecast_figure, forecast_section

MIB = 1 << 20


D, L, V = 1024, 4, 8192  # width, blocks, vocabulary of the synthetic model


#: one block's linear layers (out, in): q, k, v, o and a 4d MLP; then the output layer
BLOCK = {(D, D): 4, (4 * D, D): 1, (D, 4 * D): 1}


LINEAR = {s: k * L for s, k in BLOCK.items()} | {(V, D): 1}


N_LINEAR = sum(a * b * k for (a, b), k in LINEAR.items())


P = N_LINEAR + V * D + 2 * L * D  # + the embedding and the norms


def _run(categories: dict[str, float], **context) -> Run:
    """A run whose two recorded steps peak at ``categories`` (bytes; no trace)."""
    steps = pd.DataFrame(
        [{"step": k, "phase": "active", **{f"{c}_bytes": v for c, v in categories.items()}} for k in (2, 3)]
    )
    memory = pd.DataFrame(
        [{"t_s": 0.1, "step": k, **{f"{c}_bytes": v for c, v in categories.items()}} for k in (2, 3)]
    )
    ctx = {"optimizer": "AdamW", "dtype": "float32", "batch_size": 8, "seq_len": 512, **context}
    return Run(id="synthetic", context=ctx, steps=steps, memory=memory)


def _shaped(run: Run, matrices: dict[tuple[int, int], int]):
    """The measured run with the linear layers, width, vocabulary and blocks a trace shows."""
    return replace(measure(run), matrices=matrices, hidden=D, vocab=V, blocks=L, blocks_from="the test")


def full_run(**context):
    """A full fine-tune of the synthetic model: every parameter trains under AdamW (fp32)."""
    peak = {
        "parameters": 4 * P,
        "frozen_parameters": 512.0,  # buffers (rotary frequencies)
        "gradients": 4 * P,
        "optimizer_state": 8 * P,
        "activations": 200 * MIB,
        "other": 20 * MIB,
    }
    ft = {"method": "full", "trainable_params": P, "total_params": P, "base_dtype": "float32", **context}
    return _shaped(_run(peak, params=P, finetune=ft), LINEAR)


R0 = 8


ADAPTED = {(D, D): 2 * L}  # q_proj and v_proj of each block


ADAPTERS = effects.lora_params(ADAPTED, R0)


def lora_run(**context):
    """The synthetic model under LoRA r=8 on q_proj and v_proj: its weights frozen (fp32)."""
    peak = {
        "parameters": 4 * ADAPTERS,
        "frozen_parameters": 4 * P + 512,
        "gradients": 4 * ADAPTERS,
        "optimizer_state": 8 * ADAPTERS,
        "activations": 150 * MIB,
        "other": 20 * MIB,
    }
    ft = {
        "method": "lora",
        "rank": R0,
        "target_modules": ["q_proj", "v_proj"],
        "trainable_params": ADAPTERS,
        "total_params": ADAPTERS + P,
        "base_dtype": "float32",
        **context,
    }
    # the trace's linear layers: the base's and the adapters' A (r×in) and B (out×r)
    traced = {**LINEAR, (R0, D): 2 * L, (D, R0): 2 * L}
    return _shaped(_run(peak, params=ADAPTERS, finetune=ft), traced)


def test_lora_and_nf4_formulas():
    assert effects.lora_params({(4096, 4096): 32, (11008, 4096): 1}, 16) == 16 * (32 * 8192 + 15104)
    n = 4096 * 4096
    assert effects.nf4_bytes({(4096, 4096): 1}) == n / 2 + 4 * n / 64 + 64
    assert effects.nf4_bytes({(4096, 4096): 2}) == 2 * (n / 2 + 4 * n / 64 + 64)
    double = effects.nf4_bytes({(4096, 4096): 1}, double_quant=True)
    assert double == n / 2 + n / 64 + 4 * math.ceil(n / 64 / 256) + 64 + 1028
    assert effects.nf4_bits_per_element() == 4.5
    assert 8 * double / n == pytest.approx(effects.nf4_bits_per_element(True), rel=1e-3)
    # x·A per token per layer; with dropout its output and mask over the inputs
    assert effects.lora_activations(100, 8, 3, 4) == 100 * 8 * 3 * 4
    assert effects.lora_activations(100, 8, 3, 2, dropout_inputs=3 * 64) == 100 * (8 * 3 * 2 + 3 * 64 * 3)


def test_frozen_weights_are_a_category_priced_at_their_dtype():
    m = lora_run()
    same = forecast(m)
    assert list(same.categories) == MEMORY_CATEGORIES
    assert same.categories["frozen_parameters"] == 4 * P + 512
    assert f"frozen weights: {P:,} × 4 B (float32) + 512 B of buffers as measured" in same.derivation[1]
    bf16 = forecast(m, dtype="bf16")
    assert bf16.categories["frozen_parameters"] == 2 * P + 512  # buffers kept as measured
    assert bf16.categories["parameters"] == 2 * ADAPTERS
    assert f"{P:,} × 2 B (bfloat16)" in bf16.derivation[1]
    # a 7B-sized fp32 base does not fit a 24 GB device, however small its adapters
    seven = 7_000_000_000
    big = _run(
        {**{c: 0.0 for c in MEMORY_CATEGORIES}, "parameters": 4 * ADAPTERS, "frozen_parameters": 4.0 * seven},
        params=ADAPTERS,
        finetune={
            "method": "lora",
            "rank": 8,
            "trainable_params": ADAPTERS,
            "total_params": ADAPTERS + seven,
        },
    )
    assert not forecast(big, "L4").fits
    assert forecast(big, "L4", dtype="bf16").categories["frozen_parameters"] == 2 * seven


def test_a_lora_run_at_a_larger_batch_keeps_its_frozen_weights():
    m = lora_run()
    f = forecast(m, batch_size=32)
    assert f.categories["frozen_parameters"] == m.categories["frozen_parameters"]
    assert f.categories["parameters"] == 4 * ADAPTERS and f.categories["optimizer_state"] == 8 * ADAPTERS
    assert f.categories["activations"] == pytest.approx(4 * 150 * MIB)


def test_lora_on_a_full_fine_tune_freezes_the_weights_and_trains_adapters():
    full = full_run()
    f = forecast(full, toggles=["lora(r=16)"])
    auto = {s: k for s, k in LINEAR.items() if V not in s}  # targets=auto: every layer but the output
    adapters = effects.lora_params(auto, 16)
    assert f.categories["parameters"] == 4 * adapters
    assert f.categories["frozen_parameters"] == 4 * P + 512  # the former parameters, and the buffers
    assert f.categories["gradients"] == 4 * adapters and f.categories["optimizer_state"] == 8 * adapters
    weights = f.categories["gradients"] + f.categories["optimizer_state"]
    assert weights < 0.05 * (full.categories["gradients"] + full.categories["optimizer_state"])
    # the adapters' own activations: x·A, r per token per adapted layer
    layers = sum(auto.values())
    assert f.categories["activations"] == pytest.approx(200 * MIB + 8 * 512 * 16 * layers * 4)
    assert f"LoRA r=16 adapters on {layers} linear layers (shapes from the trace)" in f.derivation[0]
    assert "the model's" in f.derivation[1] and "now frozen, × 4 B (float32)" in f.derivation[1]
    assert "approximate" in f.derivation[4]
    # named targets without recorded names: d×d layers in each block
    named = forecast(full, toggles=["lora(r=16,targets=q_proj|v_proj)"])
    assert named.categories["parameters"] == 4 * effects.lora_params({(D, D): 2 * L}, 16)
    assert "assumed: q_proj, v_proj each a 1024×1024 layer in each of the 4 blocks" in named.derivation[0]


def test_recorded_linear_shapes_make_named_targets_exact():
    rows = [["q_proj", D, D, L], ["k_proj", D // 4, D, L], ["v_proj", D // 4, D, L], ["lm_head", V, D, 1]]
    full = full_run(linear_shapes=rows)
    f = forecast(full, toggles=["lora(r=8,targets=k_proj|v_proj)"])
    assert f.categories["parameters"] == 4 * effects.lora_params({(D // 4, D): 2 * L}, 8)
    assert "(shapes recorded by the capture)" in f.derivation[0]
    auto = forecast(full, toggles=["lora(r=8)"])  # every recorded layer but the output
    assert auto.categories["parameters"] == 4 * effects.lora_params({(D, D): L, (D // 4, D): 2 * L}, 8)
    with pytest.raises(ConfigError, match=r"must name linear layers of the model \(k_proj, lm_head"):
        forecast(full, toggles=["lora(targets=gate_proj)"])


def test_qlora_prices_the_frozen_base_at_four_and_a_half_bits():
    full = full_run()
    f = forecast(full, toggles=["qlora(r=16)"])
    quantized = {s: k for s, k in LINEAR.items() if V not in s}
    n = sum(a * b * k for (a, b), k in quantized.items())
    rest = P - n  # embedding, output layer and norms in bf16
    assert f.categories["frozen_parameters"] == pytest.approx(effects.nf4_bytes(quantized) + 2 * rest + 512)
    assert 8 * effects.nf4_bytes(quantized) / n == pytest.approx(4.5, rel=1e-3)
    assert "in 4-bit NF4" in f.derivation[1] and "without double quantization" in f.derivation[1]
    assert f.categories["activations"] == pytest.approx(
        (200 * MIB + 8 * 512 * 16 * sum(quantized.values()) * 2 * 2) / 2
    )  # computed in bf16
    assert any(line.startswith("QLoRA: each 4-bit layer dequantizes") for line in f.derivation)
    # on a LoRA run: its base quantized, its adapters at the new rank
    q = forecast(lora_run(), toggles=["qlora(r=16)"])
    assert q.categories["parameters"] == 4 * ADAPTERS * 2
    assert q.categories["frozen_parameters"] == pytest.approx(effects.nf4_bytes(quantized) + 2 * rest + 512)


def test_lora_on_a_lora_run_changes_the_rank_of_its_adapters():
    m = lora_run()
    f = forecast(m, toggles=["lora(r=16)"])
    assert f.categories["parameters"] == 4 * 2 * ADAPTERS
    assert f.categories["optimizer_state"] == 8 * 2 * ADAPTERS
    assert f.categories["frozen_parameters"] == m.categories["frozen_parameters"]
    assert f.categories["activations"] == pytest.approx(150 * MIB)  # its adapters' own already measured
    assert "the run's LoRA adapters (q_proj, v_proj, 8 layers) at rank 16 instead of 8" in f.derivation[0]


def test_a_run_recorded_before_frozen_weights_still_forecasts():
    run = _run(
        {
            "parameters": 4 * P,
            "gradients": 4 * P,
            "optimizer_state": 8 * P,
            "activations": 200 * MIB,
            "other": 20 * MIB,
        },
        params=P,
    )
    run.steps["frozen_parameters_bytes"] = float("nan")  # as an old folder reads back
    f = forecast(run, batch_size=16)
    assert f.categories["frozen_parameters"] == 0 and f.total_bytes == pytest.approx(16 * P + 440 * MIB)
    assert any("recorded before frozen weights were measured" in line for line in f.derivation)
    assert forecast(run, toggles=["lora"]).categories["frozen_parameters"] == 4 * P


def test_toggles_that_do_not_go_together_are_refused():
    full = full_run()
    with pytest.raises(ConfigError, match="take one of lora and qlora"):
        forecast(full, toggles=["lora", "qlora"])
    with pytest.raises(ConfigError, match="take one of galore and lora"):
        forecast(full, toggles=["lora", "galore"])
    blockless = replace(full, blocks=0)
    with pytest.raises(ConfigError, match=r"named targets need the number of repeated blocks.*n_layer"):
        forecast(blockless, toggles=["lora(targets=q_proj)"])


def test_the_spec_line_and_the_section_show_the_frozen_weights():
    spec = parse_forecast_spec("L4 batch=4 toggles=lora(r=16)")
    assert spec == {"device": "L4-24GB", "batch_size": 4, "toggles": ("lora(r=16)",)}
    f = forecast(full_run(), **spec)
    assert f.device == "L4-24GB" and f.toggles == ("lora:r=16",)
    table = f.table()
    assert list(table["category"]) == [*MEMORY_CATEGORIES, "total"]
    html = forecast_section([f], figure=False)
    assert "frozen parameters" in html and "lora:r=16" in html
    labels = forecast_figure([f]).legends[0].get_texts()
    assert "frozen parameters" in [t.get_text() for t in labels]


SEQ, VOCAB = 64, 1024
