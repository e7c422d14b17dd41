"""The advisor's fine-tuning rules (``rules/frozen_fp32.py``, ``lora_small_batch.py``,
``lora_activations.py``, ``frozen_grad.py``), and GaLore and LoRA offered to full fine-tunes
only (``rules/optimizer_state.py``), LoRA's predicted state against ``--compare lora``'s.

Real runs profiled on the CPU (peft LoRA and full fine-tunes of a Llama built from a config,
random weights; a model whose encoder only the optimizer leaves out; a frozen encoder beside
a trained head), one per module, for the memory rules; hand-built evidence for thresholds
and for overhead, whose timings a test cannot pin."""

from __future__ import annotations

import shutil
import warnings

import pandas as pd
import pytest
import torch
from support.finetune_rules import peft, transformers

import swift_nb
from swift_nb.analysis import advisor, effects
from swift_nb.analysis.advisor.rules import (
    optimizer_state,
)
from swift_nb.analysis.forecast import finetune as forecast_finetune
from swift_nb.analysis.forecast.measure import measure

VOCAB, SEQ, BATCH, STEPS = 512, 64, 4, 6

TARGETS = ["q_proj", "v_proj"]


def _llama():
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return transformers.LlamaForCausalLM(cfg)


def _profile(tmp_path_factory, label: str, step, params) -> swift_nb.Run:
    """STEPS steps of ``step()`` (which returns the loss) with AdamW on ``params``."""
    opt = torch.optim.AdamW(params, lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with swift_nb.profile(out_dir=tmp_path_factory.mktemp(label), label=label, report=False) as run:
            for _ in range(STEPS):
                step().backward()
                opt.step()
                opt.zero_grad()
    return swift_nb.load_run(run.path)


def _lm_run(model, tmp_path_factory, label: str) -> swift_nb.Run:
    x = torch.randint(0, VOCAB, (BATCH, SEQ))
    params = [p for p in model.parameters() if p.requires_grad]
    return _profile(tmp_path_factory, label, lambda: model(input_ids=x, labels=x).loss, params)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    torch.manual_seed(0)
    config = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=TARGETS)
    return _lm_run(peft.get_peft_model(_llama(), config), tmp_path_factory, "lora")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    torch.manual_seed(0)
    return _lm_run(_llama(), tmp_path_factory, "full")


class _Captioner(torch.nn.Module):
    """An encoder and a head: the head trains, the encoder is "frozen" by the optimizer alone."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(
            *(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()) for _ in range(4))
        )
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


@pytest.fixture(scope="module")
def encoder_left_out_run(tmp_path_factory):
    torch.manual_seed(0)
    captioner = _Captioner()
    x, y = torch.randn(256, 64), torch.randint(0, 10, (256,))
    run = _profile(
        tmp_path_factory,
        "left-out",
        lambda: torch.nn.functional.cross_entropy(captioner(x), y),
        captioner.head.parameters(),
    )
    return run, sum(p.numel() for p in captioner.encoder.parameters())


def _encoder_beside_a_head(tmp_path_factory, label: str, requires_grad: bool) -> swift_nb.Run:
    """A separate encoder that nothing trains, run with grad enabled beside the trained head;
    its parameters left requiring grad, or not."""
    torch.manual_seed(0)
    encoder = torch.nn.Sequential(
        *(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()) for _ in range(4))
    )
    encoder.requires_grad_(requires_grad)
    head = torch.nn.Linear(64, 10)
    x, y = torch.randn(256, 64), torch.randint(0, 10, (256,))

    def step():
        feats = encoder(x)
        return torch.nn.functional.cross_entropy(head(feats), y)

    return _profile(tmp_path_factory, label, step, head.parameters())


@pytest.fixture(scope="module")
def frozen_encoder_run(tmp_path_factory):
    return _encoder_beside_a_head(tmp_path_factory, "frozen-encoder", requires_grad=True)


def _tiny_llama_run(tmp_path_factory, label: str, toggles=None) -> swift_nb.Run:
    """STEPS steps of a full fine-tune (AdamW) of a 2-block Llama, under ``toggles``: its
    optimizer state ≈ 47 % of the peak (the peak at the optimizer's step)."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    model = transformers.LlamaForCausalLM(cfg)
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with swift_nb.profile(
            out_dir=tmp_path_factory.mktemp(label),
            label=label,
            report=False,
            toggles=toggles,
            namespace={"model": model, "opt": opt},
        ) as run:
            for _ in range(STEPS):
                model(input_ids=x, labels=x).loss.backward()
                opt.step()
                opt.zero_grad()
    return swift_nb.load_run(run.path)


@pytest.fixture(scope="module")
def tiny_full_and_lora(tmp_path_factory):
    """The same full fine-tune as measured, and as ``--compare lora`` reruns it (r=8, targets=auto)."""
    return (
        _tiny_llama_run(tmp_path_factory, "tiny-full"),
        _tiny_llama_run(tmp_path_factory, "tiny-lora", toggles=["lora"]),
    )


def _found(run) -> dict:
    return {f.id: f for f in advisor.advise(run)[1]}


def test_a_lora_run_gets_the_frozen_fp32_and_lora_activation_findings(lora_run):
    found = _found(lora_run)
    cats = lora_run.summary["memory_categories_at_peak"]
    peak = sum(cats.values())
    f = found["frozen_fp32"]
    assert f.evidence["frozen_parameters_bytes"] == cats["frozen_parameters"]
    assert f.evidence["frozen_pct"] == round(100 * cats["frozen_parameters"] / peak, 1) >= 20
    ft = lora_run.context["finetune"]
    base = 4.0 * (ft["total_params"] - ft["trainable_params"])
    assert f.evidence["base_frozen_bytes"] == base
    assert f.evidence["predicted_peak_bytes"] == pytest.approx(peak - base / 2)
    # a base built from its config: cast where the cell builds it, no checkpoint to load
    assert "cast the base before adding the adapters, base.to(torch.bfloat16)" in f.suggestion
    assert "from_pretrained" not in f.suggestion
    # a CPU run: 4-bit needs CUDA and is not offered
    assert f.evidence["tensors_on"] == "cpu" and "BitsAndBytesConfig" not in f.suggestion
    assert "4-bit" not in f.predicted_effect

    a = found["lora_activations"]
    assert "activations" not in found  # one finding for one cause
    assert a.toggle == "grad_checkpointing"
    assert a.evidence["blocks"] == 2 and a.evidence["lora_dropout"] == 0.05
    assert a.evidence["predicted_peak_bytes"] == effects.checkpointed_peak(peak, cats["activations"], 2)
    assert '"use_reentrant": False' in a.suggestion and "enable_input_require_grads()" in a.suggestion
    assert "lora_dropout=0 keeps none" in a.suggestion
    assert "frozen_grad" not in found
    # whether this CPU step is overhead-bound depends on the machine; never both findings
    assert not {"overhead", "lora_small_batch"} <= set(found)


def test_a_full_finetune_gets_none_of_them(full_run):
    found = _found(full_run)
    assert full_run.context["finetune"]["method"] == "full"
    assert not {"frozen_fp32", "lora_activations", "lora_small_batch", "frozen_grad"} & set(found)
    if "optimizer_state" in found:  # a full fine-tune keeps GaLore
        assert found["optimizer_state"].toggle == "galore"


def test_an_older_run_without_frozen_parameters_gets_no_frozen_finding(lora_run, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(lora_run.path, old)
    for name in ("steps.csv", "memory.csv"):
        table = pd.read_csv(old / name).drop(columns=["frozen_parameters_bytes"])
        table.to_csv(old / name, index=False)
    assert "frozen_fp32" not in _found(swift_nb.load_run(old))


def test_an_encoder_the_optimizer_leaves_out_is_certain(encoder_left_out_run):
    run, encoder_params = encoder_left_out_run
    f = _found(run)["frozen_grad"]
    assert f.evidence["untrained_params"] == encoder_params
    assert f.evidence["untrained_gradient_bytes"] == 4 * encoder_params
    assert f.evidence["confidence"].startswith("certain")
    assert f.title.startswith(f"{encoder_params:,} parameters of `captioner` require grad")
    assert "torch.no_grad()" in f.suggestion and "requires_grad_(False)" in f.suggestion
    assert f.severity == "warning"


def test_a_frozen_model_beside_dominant_activations_is_likely(frozen_encoder_run):
    f = _found(frozen_encoder_run)["frozen_grad"]
    assert f.evidence["confidence"].startswith("indirect")
    assert [m["variable"] for m in f.evidence["frozen_models"]] == ["encoder"]
    assert f.suggestion.startswith("Likely when encoder's parameters still require grad")
    assert "out.grad_fn is not None" in f.suggestion and "del feats" in f.suggestion
    assert f.severity == "info"


def test_a_frozen_model_that_records_no_graph_is_left_alone(tmp_path_factory):
    """The same encoder with requires_grad off: autograd records nothing of its forward, only
    the head's input is kept, and the activations no longer dominate the peak."""
    run = _encoder_beside_a_head(tmp_path_factory, "no-graph", requires_grad=False)
    assert run.context["finetune"]["frozen_models"][0]["variable"] == "encoder"
    assert "frozen_grad" not in _found(run)


def test_lora_offered_to_a_full_finetune_predicts_the_state_compare_lora_measures(tiny_full_and_lora):
    full, lora = tiny_full_and_lora
    f = _found(full)["optimizer_state"]
    assert full.context["finetune"]["method"] == "full"
    assert f.toggle == "galore" and "the lora toggle: r=8" in f.suggestion
    (applied,) = lora.context["toggles"]
    assert applied["toggle"] == "lora" and applied["applied"]
    adapters = applied["details"]["trainable_params"]  # 14 layers, Σ 8·(in + out) = 17,408
    measured = lora.summary["memory_categories_at_peak"]["optimizer_state"]
    opt, peak = f.evidence["optimizer_state_bytes"], f.evidence["peak_bytes"]

    # the rule's function on the layers targets=auto adapts, as the capture recorded them (the
    # forecast's: q, k, v, o, gate, up, down of both blocks, the lm_head left out): exact
    layers, how = forecast_finetune.base_layers(measure(full))
    assert sum(layers.values()) == 14 and how == "(shapes recorded by the capture)"
    exact = optimizer_state.lora_alternative(layers, how, opt, peak, full.context)
    assert exact["lora_adapter_params"] == adapters
    assert exact["lora_optimizer_state_bytes"] == pytest.approx(measured, rel=0.10)  # −0.08 %: step counters
    assert exact["lora_saved_bytes"] == opt - exact["lora_optimizer_state_bytes"]
    assert exact["lora_saved_pct"] == round(100 * exact["lora_saved_bytes"] / peak, 1)

    # the finding itself, on the linear layers the capture recorded: the same layers, exact
    assert f.evidence["lora_adapter_params"] == adapters
    assert f.evidence["lora_optimizer_state_bytes"] == pytest.approx(measured, rel=0.10)
    assert f.evidence["lora_shapes"].startswith("the 14 linear layers of the model but its output layer")
    # a run recorded without linear shapes: 2 blocks of ≈ 12·d² hold the model's 115,008
    # parameters, embeddings and lm_head (28 %) among them: d ≈ 69, not 64 (+14 %)
    assumed = effects.block_linears(full.context["finetune"]["total_params"], 2)
    estimate = optimizer_state.lora_alternative(assumed, "assumed", opt, peak, full.context)
    assert estimate["lora_optimizer_state_bytes"] == pytest.approx(measured, rel=0.15)
    assert "; with lora (r=8): optimizer state ≈ " in f.predicted_effect
    assert "(Adam's 2) × Σ r·(in + out)" in f.formula
