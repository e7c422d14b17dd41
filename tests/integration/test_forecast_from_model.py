"""``swift_nb.forecast(model=...)``: a model forecast from its config, one training step on
fake tensors (nothing allocated), against the same model profiled for real; a model four
times larger forecast with the small one's run as its proxy, plain, under LoRA and under
gradient checkpointing (both run on the fake model); QLoRA's base at NF4's packed size; a
7B preset's exact parameters; and the errors of bad input."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers
from support.llama_proxy import B, T, config, profiled, step_peak

import swift_nb
from swift_nb.core.errors import ConfigError


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def proxy(out):
    return profiled(out, config(128, 2))


def _fake(cfg, run=None, toggles=()):
    return swift_nb.forecast(
        run, model=cfg, dtype="fp32", batch_size=B, seq_len=T, toggles=list(toggles), progress=False
    )


def test_the_proxy_forecast_from_its_config_is_its_measured_peak(proxy):
    formatter = warnings.formatwarning
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        f = _fake(config(128, 2))
    # MemTracker's module tracker warns twice a step and swaps the process's formatter:
    # neither reaches the user's cell (the fake step keeps no per-module statistics)
    assert not [w for w in seen if "module hierarchy" in str(w.message)]
    assert warnings.formatwarning is formatter
    measured = proxy.summary["memory_categories_at_peak"]
    assert f.total_bytes == pytest.approx(step_peak(proxy), rel=0.02)
    # category by category, the loss's logits told apart by their shape as the capture does
    for category, value in measured.items():
        assert f.categories[category] == pytest.approx(value, rel=0.02, abs=1024), category
    assert f.categories["logits"] > 0
    assert any("fake tensors" in line for line in f.derivation)
    assert any(line.startswith("uncalibrated") for line in f.derivation)
    # the update's foreach copy of the second moments, measured apart, is in the peak: the
    # proxy's step peaks while AdamW updates
    (update,) = [line for line in f.derivation if line.startswith("the update (other, at its moment)")]
    assert "foreach" in update
    assert f.categories["optimizer_state"] == pytest.approx(measured["optimizer_state"], rel=0.001)


@pytest.mark.parametrize(
    "toggles", [(), ("lora(r=16)",), ("grad_checkpointing",)], ids=["plain", "lora", "ckpt"]
)
def test_a_model_four_times_larger_with_the_proxys_run(out, proxy, toggles):
    """Within 2 % (the target is 10 %): LoRA and checkpointing run on the fake model by their
    own code, and the proxy's own fake step agrees with its measurement."""
    big = config(256, 4)
    measured = profiled(out, big, [t.replace("(r=16)", ":r=16") for t in toggles])
    f = _fake(big, run=proxy, toggles=toggles)
    assert f.total_bytes == pytest.approx(step_peak(measured), rel=0.02)
    assert any(line.startswith("calibrated by the run") for line in f.derivation)
    (own,) = [line for line in f.derivation if line.startswith("the proxy's own step on fake tensors counts")]
    assert "(+0.0 %)" in own and "× 1.000" in own
    if toggles:
        ran = toggles[0].split("(")[0]
        assert f"run on the fake model, by their own code: {ran}" in f.derivation


def test_the_step_time_comes_from_the_proxys_by_flops_or_not_at_all(proxy):
    """With a proxy run, the target's step on the proxy's machine: its median step × the
    FLOPs ratio (6 per parameter but the embedding's, 12·L·d·T of attention, per token), and
    steps priced from it; without one, no step time, and steps= is refused."""
    big, small = config(256, 4), config(128, 2)

    def flops(cfg):
        real = transformers.LlamaForCausalLM(cfg)
        n = sum(p.numel() for p in real.parameters()) - cfg.vocab_size * cfg.hidden_size
        return B * T * (6 * n + 12 * cfg.num_hidden_layers * cfg.hidden_size * T)

    f = _fake(big, run=proxy)
    assert f.step_s == pytest.approx(
        proxy.summary["step_time_median_s"] * flops(big) / flops(small), rel=1e-6
    )
    (line,) = [x for x in f.derivation if x.startswith("step time:")]
    assert "by FLOPs on the card the proxy ran on" in line
    priced = swift_nb.forecast(
        proxy, model=big, dtype="fp32", batch_size=B, seq_len=T, steps=100, price_per_hour=2.0, progress=False
    )
    assert priced.cost_usd == pytest.approx(100 * f.step_s / 3600 * 2.0, rel=1e-6)
    alone = _fake(big)
    assert alone.step_s is None and any(x.startswith("step time: not predicted") for x in alone.derivation)
    with pytest.raises(ConfigError, match="needs a step time"):
        swift_nb.forecast(model=big, steps=100, progress=False)


def test_qlora_prices_its_base_at_nf4s_packed_size_and_other_toggles_say_they_are_formulas():
    """QLoRA's adapters run on the fake model as LoRA's; its 4-bit base cannot be quantized on
    fake tensors: every linear layer but the output's at NF4 (two weights a byte, an fp32
    absmax per 64), the rest in bf16. An 8-bit optimizer is priced by formula, and says so."""
    cfg = config(256, 4)
    f = swift_nb.forecast(model=cfg, batch_size=B, seq_len=T, toggles=["qlora(r=16)"], progress=False)
    real = transformers.LlamaForCausalLM(cfg)
    linear = [
        m.weight.numel() for n, m in real.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"
    ]
    rest = sum(p.numel() for p in real.parameters()) - sum(linear)
    nf4 = sum(n / 2 + n / 64 * 4 for n in linear)
    # (+ the rotary embedding's few buffers)
    assert f.categories["frozen_parameters"] == pytest.approx(nf4 + rest * 2, rel=0.01)
    assert "run on the fake model, by their own code: lora" in f.derivation
    g = swift_nb.forecast(model=cfg, batch_size=B, seq_len=T, toggles=["optim_8bit"], progress=False)
    assert "priced by formula (they do not run on fake tensors): optim_8bit" in g.derivation
    assert any(
        line.endswith("AdamW8bit updates in one CUDA kernel, holding nothing beyond its state")
        for line in g.derivation
    )


def test_the_7b_preset_has_its_exact_parameters():
    f = swift_nb.forecast(model="llama-2-7b", device="H100-80GB", progress=False)
    assert f.categories["parameters"] == 6_738_415_616 * 2
    assert f.categories["gradients"] > 0 and f.categories["optimizer_state"] >= 2 * 6_738_415_616 * 2
    assert f.dtype == "bfloat16" and (f.batch_size, f.seq_len) == (1, 2048)


def test_bad_models_are_errors_that_say_what():
    with pytest.raises(ConfigError, match="is no preset; presets are llama-2-7b"):
        swift_nb.forecast(model="llama-9-1t", progress=False)

    def broken():
        raise RuntimeError("no such layer")

    with pytest.raises(ConfigError, match="building it raised RuntimeError: no such layer"):
        swift_nb.forecast(model=broken, progress=False)
    with pytest.raises(ConfigError, match="give a profiled run, or model="):
        swift_nb.forecast()


def test_a_plain_module_taking_the_tokens_alone_is_stepped_with_its_cross_entropy():
    """A callable building a plain ``nn.Module`` whose forward takes the token ids alone and
    returns logits: stepped on fake tensors (not the formula), its loss the cross-entropy of
    the logits against the tokens, whose fp32 log-probabilities the peak holds."""

    class TinyLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(1000, 32)
            self.block = torch.nn.Sequential(
                torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)
            )
            self.head = torch.nn.Linear(32, 1000)

        def forward(self, ids):
            return self.head(self.block(self.embed(ids)))

    f = swift_nb.forecast(model=TinyLM, dtype="fp32", batch_size=4, seq_len=64, progress=False)
    assert not any("could not run on fake tensors" in line for line in f.derivation)
    params = 1000 * 32 + 32 * 64 + 64 + 64 * 32 + 32 + 32 * 1000 + 1000
    assert f.categories["parameters"] == params * 4
    assert f.total_bytes > 4 * params * 4 + 4 * 64 * 1000 * 4  # weights, grads, state, a B·T × V copy


def test_a_step_fake_tensors_cannot_run_falls_back_to_the_formula_and_says_so():
    class DataDependent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(100, 16)
            self.head = torch.nn.Linear(16, 100)

        def forward(self, input_ids, labels=None):
            if input_ids.sum().item() > 0:  # a value fake tensors do not have
                return self.head(self.embed(input_ids))
            return self.head(self.embed(input_ids)) * 2

    f = swift_nb.forecast(model=DataDependent, dtype="fp32", batch_size=2, seq_len=8, progress=False)
    params = 100 * 16 + 16 * 100 + 100
    assert f.categories["parameters"] == params * 4 and f.categories["gradients"] == params * 4
    assert f.categories["optimizer_state"] >= 2 * params * 4
    (said,) = [line for line in f.derivation if "could not run on fake tensors" in line]
    assert "DataDependentOutputException" in said and "lower bound" in said


def test_plan_for_a_model_from_its_config(proxy):
    """plan(model=): the toggles tried on a model never run here, its step on fake tensors
    at the target shape (bf16 AdamW), this run its proxy; on a 24 GB card a 4× larger
    Llama fits as it is, and LoRA and 8-bit moments are among the plans."""
    cfg = config(512, 4)
    table = swift_nb.plan(proxy, "RTX4090-24GB", batch_size=B, seq_len=T, model=cfg, progress=False)
    plans = set(table["toggles"])
    assert {"none", "optim_8bit", "lora"} <= plans
    assert table.loc[table["toggles"] == "none", "fits"].item()
    tiny = swift_nb.plan(proxy, memory_bytes=1e6, batch_size=B, seq_len=T, model=cfg, progress=False)
    assert not tiny["fits"].any()
