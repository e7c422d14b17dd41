"""What each toggle does to memory, one formula each (``swift_nb.analysis.effects``): the
numbers the advisor, the OOM post-mortem, the forecast and the comparison all quote."""

from __future__ import annotations

import pytest

from swift_nb.analysis import effects
from swift_nb.analysis.effects import Applied

MIB = 1 << 20


def test_checkpointing_keeps_the_unchecked_blocks_and_recomputes_one():
    c = effects.checkpointing(80 * MIB, blocks=4)
    assert (c.kept, c.recomputed, c.checkpointed) == (0.0, 20 * MIB, 4)
    half = effects.checkpointing(80 * MIB, blocks=4, checkpointed=effects.every_nth(4, 2))
    assert (half.kept, half.activations) == (40 * MIB, 60 * MIB)
    # more checkpointed blocks than there are: all of them
    assert effects.checkpointing(80 * MIB, 4, 9).checkpointed == 4
    assert effects.checkpointed_peak(100 * MIB, 80 * MIB, 4) == 40 * MIB


def test_galore_projects_only_matrices_above_the_rank():
    g = effects.galore_state(
        {(1024, 4096): 2, (64, 64): 3}, params=2 * 1024 * 4096 + 3 * 64 * 64 + 10, rank=128
    )
    assert g.projected == 2 and g.projected_params == 2 * 1024 * 4096
    assert g.low_rank == 2 * (2 * 128 * 4096 + 1024 * 128)
    assert g.elements == g.low_rank + 2 * (3 * 64 * 64 + 10)
    # square d×d weights from the parameter count, d at least rank + 1
    assert effects.galore_square_ratio(4096 * 4096, rank=128) == pytest.approx(3 * 128 / (2 * 4096))
    assert effects.galore_square_ratio(10, rank=128) == pytest.approx(3 * 128 / (2 * 129))


def test_attention_autocast_and_sequence_parallel():
    shape = [2, 4, 1024, 1024]
    assert effects.score_matrix_bytes(shape) == 8 * 1024 * 1024 * 4
    assert effects.eager_score_bytes(shape, layers=3) == 5 * 8 * 1024 * 1024 * 4
    assert effects.without_scores(10.0, 12.0) == 0.0
    assert (
        effects.autocast_activations(8.0) == pytest.approx(4.8) and effects.autocast_weight_copies(8.0) == 4.0
    )
    assert effects.sequence_parallel_activations(8.0, 4) == 2.0


def test_the_optimizer_table():
    assert effects.states_per_parameter("AdamW") == 2 and effects.states_per_parameter("SGD") == 1
    assert effects.states_per_parameter("RMSprop") == 1 and effects.states_per_parameter("Lion") == 0
    assert effects.OPTIMIZERS["AdamW8bit"].element_bytes == 1


def test_a_step_that_did_not_fit_gets_each_toggles_share():
    fixes = effects.step_fixes(
        activations=800.0,
        scores=300.0,
        blocks=4,
        fp32_activations=True,
        state=200.0,
        parameters=4e6,
        optimizer="AdamW",
    )
    by = {f.toggles: f for f in fixes}
    assert by["flash_attention"].activations == 500.0
    assert by["grad_checkpointing"].activations == 400.0  # A/L kept again + each block's input, A/L
    assert by["flash_attention,grad_checkpointing"].activations == 250.0
    assert by["bf16_autocast"].activations == pytest.approx(480.0)
    assert by["galore"].state == pytest.approx(200.0 * effects.galore_square_ratio(1e6))
    # no scores, no blocks, bf16 already, SGD: nothing a toggle can do
    assert effects.step_fixes(800.0, 0.0, None, False, 200.0, 4e6, "SGD") == []


def test_a_measured_run_with_one_toggle():
    cats = {"activations_bytes": 80.0, "optimizer_state_bytes": 30.0}
    assert effects.toggle_peak("galore", 200.0, cats, {"optimizer_state_bytes_after": 10.0}, {}) == 180.0
    assert effects.toggle_peak("optim_8bit", 200.0, cats, {"optimizer_state_bytes_after": 8.0}, {}) == 178.0
    ckpt = effects.toggle_peak(
        "grad_checkpointing", 200.0, cats, {"checkpointed_blocks": 2}, {"activations": {"blocks": 4}}
    )
    assert ckpt == effects.checkpointed_peak(200.0, 80.0, 4, 2) == 180.0
    assert (
        effects.toggle_peak(
            "flash_attention", 200.0, cats, {}, {"eager_attention": {"peak_saved_bytes": 50.0}}
        )
        == 150.0
    )
    assert effects.toggle_peak("flash_attention", 200.0, cats, {}, {}) is None
    # a LoRA run's blocks are in the lora_activations finding, which takes the activations one's place
    on_lora = effects.toggle_peak(
        "grad_checkpointing", 200.0, cats, {"checkpointed_blocks": 2}, {"lora_activations": {"blocks": 4}}
    )
    assert on_lora == ckpt


def test_lora_adapters_and_their_optimizer_state():
    # r·(in + out) per layer, the optimizer's states in fp32 (the adapters'), or 8-bit
    assert effects.lora_params({(64, 64): 8, (128, 64): 4, (64, 128): 2}, 8) == 17_408
    assert effects.adapter_optimizer_state(17_408, "AdamW") == 2 * 17_408 * 4
    assert effects.adapter_optimizer_state(17_408, None) == 2 * 17_408 * 4  # Adam's when unknown
    assert effects.adapter_optimizer_state(17_408, "SGD") == 17_408 * 4
    assert effects.adapter_optimizer_state(17_408, "AdamW8bit") == 2 * 17_408
    # without shapes: transformer blocks of ≈ 12·d², d = √(P / 12·L)
    assert effects.block_linears(12 * 64 * 64 * 2, 2) == {(64, 64): 8, (256, 64): 2, (64, 256): 2}
    assert effects.block_linears(1_000, 0) == effects.block_linears(1_000, 1)


def test_a_configurations_toggles_as_the_formulas_ask():
    a = Applied(
        {"galore": {"rank": 64}, "grad_checkpointing": {"every_n": 2}, "zero": {"stage": 2}}, measured=()
    )
    assert a.galore_rank == 64 and a.checkpoint_every == 2 and not a.fused_attention
    assert a.shards(8) == (1, 8, 8)
    assert Applied({"fsdp": {}}).shards(4) == (4, 4, 4)
    assert Applied({}).shards(4) == (1, 1, 1) and Applied({}).sp_size == 1
    # a toggle the measured run had already is in its numbers: not applied twice
    measured = Applied(
        {"grad_checkpointing": {"every_n": 1}, "bf16_autocast": {}},
        measured=("grad_checkpointing", "bf16_autocast"),
    )
    assert measured.checkpoint_every is None and not measured.new_autocast and measured.autocast


def test_8bit_adam_state_is_its_real_layout():
    # a 1024×512 weight: two uint8 moments, two fp32 absmax per 256 elements; a 512 bias: fp32
    # moments; the two 256-entry fp32 quantization maps once (measured on bitsandbytes 0.50)
    assert effects.adam8bit_state([1024 * 512], 512) == 2 * 524_288 + 2 * 4 * 2048 + 2 * 4 * 512 + 2048
    assert effects.adam8bit_state([], 100) == 800  # nothing large: fp32 state, no maps


def test_step_factors_multiply_with_their_reasons():
    factor, why = effects.step_factor(["grad_checkpointing", "lora"], cuda=False, has=(), real_share=1.0)
    assert factor == pytest.approx(1.33 * 0.8) and why[0].startswith("grad_checkpointing ×1.33")
    assert effects.step_factor(["bf16_autocast"], True, (), 1.0)[0] == 0.6
    assert effects.step_factor(["bf16_autocast"], False, (), 1.0)[0] == 1.0  # no bf16 tensor cores
    assert effects.step_factor(["packing"], False, (), 0.25)[0] == 0.25
    assert effects.step_factor(["flash_attention"], True, (), 1.0)[0] == 1.0  # fused already
    assert effects.step_factor(["flash_attention"], True, ("attention_scores",), 1.0)[0] == 0.9
