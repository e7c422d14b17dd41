"""The lora and qlora toggles (peft adapters for one run, undone to the same objects), and
GaLore's refusal on a model that trains adapters. Models are built from configs with random
weights; nothing is downloaded."""

from __future__ import annotations

import sys

import peft
import pytest
import torch
from support.lora import demo, loss_of, step
from torch import nn

from swift_nb import toggles
from swift_nb.core.errors import ConfigError, MissingDependencyError
from swift_nb.toggles.lora import LoRA, QLoRA, peft_adapters

VOCAB, SEQ = 128, 16


def llama() -> nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
    )
    return transformers.LlamaForCausalLM(cfg)


def gpt2() -> nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(cfg)


MODELS = {"llama": llama, "gpt2": gpt2, "demo": demo}


def snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """What undo must give back: weights, trainability, structure, groups and state."""
    return {
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "modules": [(n, type(m)) for n, m in model.named_modules()],
        "attrs": {n: set(m.__dict__) for n, m in model.named_modules()},
        "groups": [
            (list(g["params"]), {k: v for k, v in g.items() if k != "params"}) for g in opt.param_groups
        ],
        "state": opt.state,
        "state_values": {id(p): dict(s) for p, s in opt.state.items()},
    }


def assert_restored(model: nn.Module, opt: torch.optim.Optimizer, before: dict) -> None:
    after = model.state_dict()
    assert after.keys() == before["weights"].keys()
    assert all(torch.equal(after[k], v) for k, v in before["weights"].items())
    assert {n: p.requires_grad for n, p in model.named_parameters()} == before["requires_grad"]
    assert [(n, type(m)) for n, m in model.named_modules()] == before["modules"]
    assert {n: set(m.__dict__) for n, m in model.named_modules()} == before["attrs"]
    assert peft_adapters(model) is None
    assert len(opt.param_groups) == len(before["groups"])
    for g, (params, options) in zip(opt.param_groups, before["groups"], strict=True):
        assert len(g["params"]) == len(params) and all(
            a is b for a, b in zip(g["params"], params, strict=True)
        )
        assert {k: v for k, v in g.items() if k != "params"} == options
    assert opt.state is before["state"]
    assert {id(p): s for p, s in opt.state.items()}.keys() == before["state_values"].keys()
    for p, s in opt.state.items():
        assert all(s[k] is v for k, v in before["state_values"][id(p)].items())


@pytest.mark.parametrize("kind", list(MODELS))
def test_trains_only_the_adapters_and_undo_gives_back_the_same_objects(kind):
    model = MODELS[kind]()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    idx = torch.randint(0, VOCAB, (2, SEQ))
    step(model, opt, idx)  # state before the run, which undo must give back
    next(model.parameters()).requires_grad_(False)  # a frozen embedding stays frozen
    before = snapshot(model, opt)

    lora = toggles.get("lora", r=4)
    lora.apply({"model": model, "opt": opt})
    assert peft_adapters(model) == "LoRA adapters (r=4)"
    trainable = [p for p in model.parameters() if p.requires_grad]
    held = [p for g in opt.param_groups for p in g["params"]]
    assert {id(p) for p in held} == {id(p) for p in trainable}
    assert sum(p.numel() for p in held) == sum(p.numel() for p in trainable) > 0
    assert opt.param_groups[0]["weight_decay"] == 0.05 and not opt.state
    losses = [step(model, opt, idx) for _ in range(3)]
    assert losses[-1] < losses[0], losses
    report = lora.undo()

    assert_restored(model, opt, before)
    d = report.details
    assert d["trainable_params"] == sum(p.numel() for p in trainable)
    assert d["total_params"] == sum(p.numel() for p in model.parameters()) + d["trainable_params"]
    assert d["targets"] == {"llama": 14, "gpt2": 8, "demo": 8}[kind]
    assert report.changes[0].startswith(
        f"`model` ({type(model).__name__}): LoRA r=4 on {d['targets']} modules ("
    )
    assert f"{100 * d['trainable_params'] / d['total_params']:.3g} % of parameters train" in report.changes[0]
    step(model, opt, idx)  # still a working AdamW on the whole model


def test_auto_targets_the_blocks_linear_layers_never_embeddings_or_head():
    model = llama()
    lora = toggles.get("lora")
    report = lora.apply({"model": model})
    adapted = sorted(n for n, m in model.named_modules() if hasattr(m, "lora_A"))
    lora.undo()
    assert all(n.startswith("model.layers.") for n in adapted) and len(adapted) == 14
    assert "(q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)" in report.changes[0]
    assert "LoRA r=8 on 14 modules" in report.changes[0]


def test_named_targets_and_their_aliases():
    model = llama()
    lora = toggles.get("lora", rank=2, target_modules="q_proj|v_proj", alpha=4, dropout=0.1)
    lora.apply({"model": model})
    adapted = {n: m for n, m in model.named_modules() if hasattr(m, "lora_A")}
    assert sorted(n.rsplit(".", 1)[-1] for n in adapted) == ["q_proj", "q_proj", "v_proj", "v_proj"]
    layer = next(iter(adapted.values()))
    assert layer.r["default"] == 2 and layer.scaling["default"] == 2.0
    assert layer.lora_dropout["default"].p == 0.1
    report = lora.undo()
    assert report.details["targets"] == 4
    assert peft_adapters(model) is None


def test_named_targets_leave_other_models_alone():
    model, probe = llama(), nn.Linear(4, 4)
    lora = toggles.get("lora", targets="q_proj|v_proj")
    lora.apply({"model": model, "probe": probe})
    report = lora.undo()
    assert report.details["targets"] == 4
    assert report.notes[0] == "`probe` (Linear) has no module named q_proj or v_proj: left alone"


def test_built_while_applied_are_adapted_at_first_forward_and_moved_at_first_step():
    ns: dict = {}
    lora = toggles.get("lora", r=4)
    lora.apply(ns)
    model = demo()  # built after apply, as a training cell does
    base = {id(p) for p in model.parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    groups = opt.param_groups
    idx = torch.randint(0, VOCAB, (2, SEQ))
    loss_of(model, idx).backward()  # the first forward adds the adapters
    assert peft_adapters(model) == "LoRA adapters (r=4)"
    opt.step()  # the first step moves the optimizer
    held = [p for g in opt.param_groups for p in g["params"]]
    assert held and not any(id(p) in base for p in held) and all(p.requires_grad for p in held)
    assert opt.param_groups[0]["momentum"] == 0.9
    report = lora.undo()
    assert report.changes[0].startswith("`new GPT` (GPT): LoRA r=4 on 8 modules")
    assert report.changes[1].startswith("`new SGD` (SGD): trains 16 adapter tensors")
    assert opt.param_groups is groups and peft_adapters(model) is None
    assert all(p.requires_grad for p in model.parameters())
    # a model built after undo is left alone
    other = demo()
    loss_of(other, idx)
    assert peft_adapters(other) is None


def test_bad_parameters_are_refused_before_any_change():
    with pytest.raises(ConfigError) as e:
        toggles.get("lora", r=0)
    assert "lora r must be ≥ 1; got 0" in str(e.value)

    model = llama()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    for targets in ("nonexistent", "q_proj|nonexistent"):  # named by no model; missing beside a found one
        lora = toggles.get("lora", targets=targets)
        with pytest.raises(ConfigError) as e:
            lora.apply({"model": model, "probe": nn.Linear(4, 4)})
        msg = str(e.value)
        assert msg.startswith("lora targets must name modules of `model`: no module named nonexistent; ")
        assert (
            "linear layers are q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head" in msg
        )
    with pytest.raises(ConfigError, match="mlp is a LlamaMLP"):
        toggles.get("lora", targets="mlp").apply({"model": model})
    assert peft_adapters(model) is None and lora.report is None
    assert all(p.requires_grad for p in model.parameters())
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


def test_qlora_on_the_cpu_is_refused_before_any_change():
    model = demo()
    opt = torch.optim.AdamW(model.parameters())
    before = snapshot(model, opt)
    qlora = toggles.get("qlora")
    with pytest.raises(ConfigError) as e:
        qlora.apply({"model": model, "opt": opt})
    assert "qlora needs a CUDA device: the model's parameters are on cpu" in str(e.value)
    assert_restored(model, opt, before)
    assert qlora.report is None
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="qlora needs a CUDA device: torch sees none"):
            toggles.get("qlora").apply({})


def test_qlora_quantizes_the_blocks_and_undo_restores_the_original_layers(monkeypatch):
    """The CUDA path's mechanics, run on the CPU (bitsandbytes quantizes there too) with the
    device checks bypassed."""
    bnb = pytest.importorskip("bitsandbytes")
    model = llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = snapshot(model, opt)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and ".layers." in n}
    qlora = toggles.get("qlora", r=4, targets="q_proj")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(QLoRA, "_targets", LoRA._targets)
    qlora.apply({"model": model, "opt": opt})
    monkeypatch.undo()
    quantized = [n for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(quantized) == len(linears) == 14  # every block's Linear, a target or not
    assert all(
        isinstance(model.get_submodule(n), peft.tuners.lora.bnb.Linear4bit) for n in linears if "q_proj" in n
    )
    idx = torch.randint(0, VOCAB, (2, SEQ))
    losses = [step(model, opt, idx) for _ in range(3)]
    assert losses[-1] < losses[0], losses
    report = qlora.undo()
    assert_restored(model, opt, before)
    assert all(model.get_submodule(n) is m for n, m in linears.items())
    assert "14 nn.Linear layers of its blocks in 4-bit NF4" in report.changes[0]
    assert report.details["quantized_layers"] == 14 and report.details["targets"] == 2


def test_a_peft_model_is_left_alone():
    model = peft.get_peft_model(llama(), peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    lora = toggles.get("lora")
    lora.apply({"model": model})
    report = lora.undo()
    assert not report.applied
    assert report.notes == [
        f"`model` ({type(model).__name__}) already carries LoRA adapters (r=8): left alone"
    ]


def test_galore_leaves_an_optimizer_of_lora_adapters_alone():
    model = peft.get_peft_model(llama(), peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    opt = torch.optim.AdamW(p for p in model.parameters() if p.requires_grad)
    galore = toggles.get("galore", rank=2)
    galore.apply({"model": model, "opt": opt})
    report = galore.undo()
    assert not report.applied and type(opt) is torch.optim.AdamW
    assert report.notes == [
        "`model` already trains LoRA adapters (r=8): GaLore is for full fine-tuning — its low-rank gradient "
        "projection has nothing to save on adapters that are already low-rank; `opt` left unchanged"
    ]
    # the same when this run's lora toggle added the adapters
    model = llama()
    opt = torch.optim.AdamW(model.parameters())
    ns = {"model": model, "opt": opt}
    with toggles.applied(ns, [toggles.get("lora", r=4), toggles.get("galore", rank=2)]) as reports:
        pass
    assert not reports[1].applied and "already trains LoRA adapters (r=4)" in reports[1].notes[0]


def test_a_model_without_blocks_is_named_in_a_note():
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    lora = toggles.get("lora")
    lora.apply({"mlp": mlp})
    report = lora.undo()
    assert not report.applied
    assert "`mlp` (Sequential) has no repeated blocks with linear layers for targets=auto" in report.notes[0]


def test_missing_peft_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(MissingDependencyError, match="pip install peft"):
        toggles.get("lora")
