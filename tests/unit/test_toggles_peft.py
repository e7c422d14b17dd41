"""The model toggles on models under peft's LoRA adapters (``PeftModel`` → ``LoraModel`` →
the model): a transformers Llama (eager and SDPA attention) and the demo GPT, with real
peft and random weights. grad_checkpointing must use the inner model's own switch (the
layers wrapped from outside recomputed with the kv cache the forward had filled: keys
twice as long as the mask), give the same training and keep fewer tensors for backward;
flash_attention, bf16_autocast and torch_compile must reach the model inside; all undo."""

from __future__ import annotations

import pytest
import torch
from support.toggles_peft import batches, inner_checkpointing, loss_of, peft_model
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from swift_nb import toggles

VOCAB, SEQ = 128, 16


MODELS = ["llama-eager", "llama-sdpa", "llama-causal-lm", "gpt"]


def train(model: nn.Module, steps: int = 3) -> tuple[list[float], list[torch.Tensor]]:
    """The losses of ``steps`` AdamW steps on the adapters, and the adapters' gradients of
    the last one (in parameter order: checkpoint_wrapper changes the names, not the order)."""
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=1e-2)
    losses: list[float] = []
    for idx in batches(steps):
        loss = loss_of(model, idx)
        loss.backward()
        losses.append(loss.item())
        last = [p.grad.clone() for p in trained]
        opt.step()
        opt.zero_grad()
    return losses, last


def saved_bytes(model: nn.Module) -> int:
    """Bytes of the storages one forward keeps for backward, parameters and buffers left out
    (tensors a non-reentrant checkpoint keeps for its recompute go through its own hooks)."""
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(model, batches(1)[0])
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(kept.values())


@pytest.mark.parametrize("kind", MODELS)
def test_grad_checkpointing_trains_the_same_with_fewer_saved_tensors(kind):
    expected_losses, expected_grads = train(peft_model(kind))
    model = peft_model(kind)
    without = saved_bytes(model)
    toggle = toggles.get("grad_checkpointing")
    toggle.apply({"model": model})
    try:
        with_it = saved_bytes(model)
        losses, grads = train(model)
    finally:
        report = toggle.undo()
    assert report is not None and report.applied, str(report)
    torch.testing.assert_close(losses, expected_losses)
    assert len(grads) == len(expected_grads) > 0
    assert all(g.norm() > 0 for g in grads), "every adapter weight gets a gradient"
    torch.testing.assert_close(grads, expected_grads)
    assert with_it < 0.5 * without, (with_it, without)
    if kind == "gpt":
        assert "2 of 2 Block blocks in `model.base_model.model.blocks` checkpointed (non-reentrant)" in str(
            report
        )
    else:
        assert (
            "`model.base_model.model` (LlamaForCausalLM): gradient_checkpointing_enable() on its 2 layers "
            "(non-reentrant)" in report.changes
        )
    assert report.details["checkpointed_blocks"] == 2


def test_grad_checkpointing_undo_turns_the_inner_switch_off_and_removes_the_input_grad_hook():
    model = peft_model()
    base = model.get_base_model()
    embed = base.get_input_embeddings()
    hooks = dict(embed._forward_hooks)
    with toggles.applied({"model": model}, [toggles.get("grad_checkpointing")]):
        assert base.is_activation_checkpointing
        assert len(embed._forward_hooks) == len(hooks) + 1, "the embeddings' output must require grad"
    assert not base.is_activation_checkpointing and not inner_checkpointing(model)
    assert embed._forward_hooks.keys() == hooks.keys()
    assert "_require_grads_hooks" not in vars(base) and "_require_grads_hook" not in vars(base)
    torch.testing.assert_close(train(model), train(peft_model()))


def test_grad_checkpointing_leaves_an_input_grad_hook_the_user_added():
    model = peft_model()
    base = model.get_base_model()
    base.enable_input_require_grads()
    theirs = list(base._require_grads_hooks)
    with toggles.applied({"model": model}, [toggles.get("grad_checkpointing")]):
        train(model, steps=1)
    assert base._require_grads_hooks == theirs and base._require_grads_hook is theirs[0]
    assert list(base.get_input_embeddings()._forward_hooks) == [theirs[0].id]


def test_grad_checkpointing_reaches_a_peft_model_built_while_applied():
    expected, _ = train(peft_model())
    with toggles.applied({}, [toggles.get("grad_checkpointing")]) as reports:
        model = peft_model()
        losses, _ = train(model)
        assert model.get_base_model().is_activation_checkpointing
    torch.testing.assert_close(losses, expected)
    assert "`new PeftModel.base_model.model` (LlamaForCausalLM)" in str(reports[0])
    assert not inner_checkpointing(model)


def test_grad_checkpointing_every_n_counts_the_layers_it_checkpoints():
    model = peft_model()
    with toggles.applied({"model": model}, [toggles.get("grad_checkpointing", every_n=2)]) as reports:
        layers = model.get_base_model().model.layers
        assert [layer.gradient_checkpointing for layer in layers] == [True, False]
        train(model, steps=1)
    assert "gradient_checkpointing_enable() on 1 of its 2 layers (non-reentrant)" in str(reports[0])
    assert reports[0].details["checkpointed_blocks"] == 1


def _compiled(model: nn.Module) -> bool:
    return hasattr(vars(model).get("forward"), "_torchdynamo_orig_callable")


# toggle spec → (what holds while it is applied, what holds after undo)
OTHERS = {
    "flash_attention": (
        lambda m: m.get_base_model().config._attn_implementation == "sdpa",
        lambda m: m.get_base_model().config._attn_implementation == "eager",
    ),
    "bf16_autocast": (
        lambda m: torch.is_autocast_enabled("cpu"),
        lambda m: not torch.is_autocast_enabled("cpu"),
    ),
    "torch_compile(backend=eager)": (_compiled, lambda m: "forward" not in vars(m)),
}


@pytest.mark.parametrize("spec", OTHERS)
def test_other_model_toggles_apply_to_a_peft_model_and_undo(spec):
    during, after = OTHERS[spec]
    model = peft_model()
    torch._dynamo.reset()
    with toggles.applied({"model": model}, toggles.build([spec])) as reports:
        assert during(model)
        losses, grads = train(model, steps=1)
    assert reports[0].applied, str(reports[0])
    assert after(model)
    assert torch.isfinite(torch.tensor(losses)).all() and any(g.norm() > 0 for g in grads)
    assert torch.isfinite(torch.tensor(train(model, steps=1)[0])).all(), "trains after undo"
    text = str(reports[0])
    if spec == "flash_attention":
        assert "`model.base_model.model` (LlamaForCausalLM, 2 attention layers): eager → sdpa" in text
        assert reports[0].details["sdpa_calls"] == 2
    if spec.startswith("torch_compile"):
        assert "`model` (PeftModel) compiled (backend=eager, mode=default)" in text
        assert sum(torch._dynamo.utils.counters["frames"].values()) > 0


def test_flash_attention_chooses_by_the_model_inside_the_adapters(monkeypatch):
    """On CUDA with flash-attn installed a transformers model gets flash_attention_2; the
    wrapper must not hide that it is one (here flash-attn is missing: the switch says so)."""
    from swift_nb.toggles import flash_attention

    monkeypatch.setattr(flash_attention, "_flash_attn_usable", lambda model: True)
    model = peft_model()
    with toggles.applied({"model": model}, [toggles.get("flash_attention")]) as reports:
        pass
    assert any(
        "`model.base_model.model` (LlamaForCausalLM) cannot use flash_attention_2" in n
        for n in reports[0].notes
    ), str(reports[0])
    assert model.get_base_model().config._attn_implementation == "eager"
