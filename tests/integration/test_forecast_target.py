"""A forecast prices the implementation of the device it targets, not the measured run's:
bitsandbytes' 8-bit update holds each tensor's moments in fp32 on the CPU and nothing on
CUDA; fused_ce is cut-cross-entropy's whole fp32 copy on the CPU and Liger's chunks on CUDA.
A CPU run forecast for ``device="cpu"`` with optim_8bit lands on its measured peak."""

from __future__ import annotations

import pytest
import torch
import transformers

import swift_nb
from swift_nb.analysis import effects
from swift_nb.record import load_run

VOCAB, HIDDEN = 8192, 256


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    return transformers.LlamaForCausalLM(cfg)


def _profiled(out_dir, toggles=()):
    model = _llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, VOCAB, (2, 128), generator=torch.Generator().manual_seed(1))
    with swift_nb.profile(out_dir=out_dir, wait=0, warmup=1, active=2, report=False, toggles=toggles) as run:
        for _ in range(4):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    return load_run(run.path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    return _profiled(out), _profiled(out, ("optim_8bit",))


def test_optim_8bit_on_the_cpu_is_forecast_with_its_update(runs):
    plain, eight = runs
    measured = float(eight.steps["peak_tensor_bytes"].dropna().median())
    f = swift_nb.forecast(plain, device="cpu", toggles="optim_8bit")
    assert f.total_bytes == pytest.approx(measured, rel=0.10), (f.total_bytes / 2**20, measured / 2**20)
    assert any("CPU update" in line for line in f.derivation)
    # the same run for a GPU: bitsandbytes updates in place there
    gpu = swift_nb.forecast(plain, device="H100-80GB", toggles="optim_8bit")
    assert gpu.categories["other"] < f.categories["other"] - 0.9 * 20 * VOCAB * HIDDEN
    assert any("one CUDA kernel" in line for line in gpu.derivation)


def test_fused_ce_is_priced_for_the_target(runs):
    plain, _ = runs
    tokens = 2 * 128
    lines = {}
    for device in ("cpu", "H100-80GB"):
        f = swift_nb.forecast(plain, device=device, toggles="fused_ce")
        (lines[device],) = [line for line in f.derivation if line.startswith("logits under fused_ce")]
    one_copy = effects.fused_ce_logits(tokens, VOCAB, HIDDEN, cuda=False)
    liger = effects.fused_ce_logits(tokens, VOCAB, HIDDEN, cuda=True)
    assert one_copy == tokens * VOCAB * 4 and liger < one_copy
    assert "cut-cross-entropy, CPU" in lines["cpu"] and f"{tokens:,} real tokens" in lines["cpu"]
    assert "Liger, CUDA" in lines["H100-80GB"]
