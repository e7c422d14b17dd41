"""Fine-tuning seen whole (``capture/finetune.py``, ``capture/models.py``): the frozen weights
of the cell's models are a memory category, and the context names the method.

Real peft and transformers models built from configs (random weights, nothing downloaded),
profiled on the CPU for a few steps; one run per model, shared by the module's tests.
"""

from __future__ import annotations

import warnings

import pandas as pd
import peft
import pytest
import torch
import transformers

import swift_nb
from swift_nb.record import finetune_label

VOCAB, SEQ, BATCH, STEPS = 256, 32, 2, 6


def _llama():
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    return transformers.LlamaForCausalLM(cfg)


def _qwen2():
    """Qwen2-shaped: grouped-query attention (2 key/value heads for 8 query heads), q/k/v biases."""
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
    )
    return transformers.Qwen2ForCausalLM(cfg)


def _stored_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total


def _profile_lm(model, tmp_path_factory, label: str, **opt_kwargs):
    """Profile STEPS language-model steps of ``model`` (its trainable parameters under AdamW)."""
    torch.manual_seed(0)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, **opt_kwargs)
    x = torch.randint(0, VOCAB, (BATCH, SEQ))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with swift_nb.profile(out_dir=tmp_path_factory.mktemp(label), label=label, report=False) as run:
            for _ in range(STEPS):
                model(input_ids=x, labels=x).loss.backward()
                opt.step()
                opt.zero_grad()
    return swift_nb.load_run(run.path)


def _frozen(model) -> int:
    return _stored_bytes([p for p in model.parameters() if not p.requires_grad] + list(model.buffers()))


def _trainable(model) -> int:
    return _stored_bytes([p for p in model.parameters() if p.requires_grad])


@pytest.fixture(scope="module")
def lora_llama(tmp_path_factory):
    torch.manual_seed(0)
    config = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(_llama(), config)
    return model, _profile_lm(model, tmp_path_factory, "lora-llama")


@pytest.fixture(scope="module")
def lora_qwen2(tmp_path_factory):
    torch.manual_seed(0)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = peft.get_peft_model(_qwen2(), config)
    return model, _profile_lm(model, tmp_path_factory, "lora-qwen2")


@pytest.fixture(scope="module")
def full_llama(tmp_path_factory):
    torch.manual_seed(0)
    model = _llama()
    return model, _profile_lm(model, tmp_path_factory, "full-llama")


def _at_peak(run) -> dict[str, float]:
    return run.summary["memory_categories_at_peak"]


@pytest.mark.parametrize("fixture", ["lora_llama", "lora_qwen2"])
def test_frozen_base_is_counted_and_adapters_are_the_parameters(fixture, request):
    model, run = request.getfixturevalue(fixture)
    cats = _at_peak(run)
    assert cats["frozen_parameters"] == pytest.approx(_frozen(model), rel=0.01)
    assert cats["parameters"] == _trainable(model)
    recorded = run.steps.dropna(subset=["frozen_parameters_bytes"])
    assert len(recorded) >= 1
    # the peak holds both: the base and the adapters are alive through the whole step
    assert (
        recorded["peak_tensor_bytes"] >= recorded["frozen_parameters_bytes"] + recorded["parameters_bytes"]
    ).all()
    assert "frozen_parameters_bytes" in run.memory.columns
    assert (run.memory["frozen_parameters_bytes"] > 0).all()


def test_lora_context_is_exact(lora_llama):
    model, run = lora_llama
    ft = run.context["finetune"]
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert ft["method"] == "lora" and ft["library"] == "peft"
    assert (ft["rank"], ft["alpha"], ft["dropout"]) == (8, 16, 0.05)
    assert ft["target_modules"] == ["q_proj", "v_proj"]
    assert (ft["trainable_params"], ft["total_params"]) == (trainable, total)
    assert ft["trainable_pct"] == pytest.approx(100 * trainable / total)
    assert ft["base_model"]["class"] == "LlamaForCausalLM"
    assert ft["quantization"] is None and ft["base_dtype"] == "float32"
    # the base's linear layers by name, the adapters' own left out (what lora(targets=…) forecasts)
    shapes = {row[0]: row[1:] for row in ft["linear_shapes"]}
    assert (
        shapes["q_proj"] == [64, 64, 2]
        and shapes["down_proj"] == [64, 128, 2]
        and shapes["lm_head"] == [VOCAB, 64, 1]
    )
    assert not any(name.startswith("lora_") for name in shapes)
    assert finetune_label(ft) == f"LoRA r=8 · {100 * trainable / total:.2g} %"


def test_full_finetune_is_full_and_has_no_frozen_weights_but_buffers(full_llama):
    model, run = full_llama
    ft = run.context["finetune"]
    assert ft["method"] == "full" and ft["trainable_pct"] == 100.0 and ft["library"] is None
    # only the rotary embedding's buffer is frozen in a full fine-tune of Llama
    assert _at_peak(run)["frozen_parameters"] == pytest.approx(_stored_bytes(model.buffers()), rel=0.01)
    assert _at_peak(run)["parameters"] == _trainable(model)


def test_frozen_layers_without_peft_and_a_frozen_teacher(tmp_path):
    """Partial fine-tuning: the first layer frozen by hand, a teacher model beside it."""
    torch.manual_seed(0)
    student = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    teacher = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
    student[0].requires_grad_(False)
    teacher.requires_grad_(False)
    opt = torch.optim.SGD(student[2].parameters(), lr=0.1)
    with swift_nb.profile(out_dir=tmp_path, label="partial", report=False) as r:
        for _ in range(STEPS):
            x = torch.randn(16, 64)
            with torch.no_grad():
                target = teacher(x)
            torch.nn.functional.mse_loss(student(x), target).backward()
            opt.step()
            opt.zero_grad()
    run = swift_nb.load_run(r.path)
    cats = _at_peak(run)
    expected = _stored_bytes([*student[0].parameters(), *teacher.parameters()])
    assert cats["frozen_parameters"] == pytest.approx(expected, rel=0.01)
    assert cats["parameters"] == _stored_bytes(student[2].parameters())
    ft = run.context["finetune"]
    assert ft["method"] == "partial" and ft["model_variable"] == "student"
    assert ft["frozen_models"] == [
        {"variable": "teacher", "class": "Sequential", "params": 64 * 512 + 512 + 512 * 8 + 8}
    ]


def test_a_run_written_before_frozen_parameters_reads_it_as_unknown(lora_llama, tmp_path):
    _, run = lora_llama
    import shutil

    old = tmp_path / "old"
    shutil.copytree(run.path, old)
    for name in ("steps.csv", "memory.csv"):
        table = pd.read_csv(old / name).drop(columns=["frozen_parameters_bytes"])
        table.to_csv(old / name, index=False)
    back = swift_nb.load_run(old)
    assert back.steps["frozen_parameters_bytes"].isna().all()
    assert back.memory["frozen_parameters_bytes"].isna().all()
    assert back.steps["parameters_bytes"].notna().any()


def test_summary_and_list_name_the_finetuning(lora_llama):
    from swift_nb.render.tables import runs_text, summary_rows

    _, run = lora_llama
    rows = dict(summary_rows(run))
    assert rows["Fine-tuning"].startswith("LoRA r=8 · ")
    assert rows["Adapted layers"] == "q_proj, v_proj" and rows["Base model"].startswith("LlamaForCausalLM")
    listed = swift_nb.runs(run.path.parent)
    assert listed["finetune"].iloc[0].startswith("LoRA r=8 · ")
    assert "fine-tuning" in runs_text(listed)


def test_bytes_carried_from_the_steps_start_are_other_from_its_start():
    """CUDA's allocator holds tensors the replay never saw made (cuBLAS's workspace, the
    batch): the snapshot's CARRIED entry starts ``other`` at them, and a free of one of them
    during the step comes out of it rather than below zero."""
    from swift_nb.capture.memory import categories as memcat

    snap = {100: ("parameters", 1000), memcat.CARRIED: ("other", 5000)}
    mem = [(10, 2000, 200), (20, -3000, 300), (30, -2000, 200)]  # 300: carried, freed in the step
    events = [{"ph": "X", "name": "ProfilerStep#3", "ts": 0, "dur": 100}] + [
        {"name": "[memory]", "ts": ts, "args": {"Device Type": 1, "Bytes": n, "Addr": a}} for ts, n, a in mem
    ]
    (m,) = memcat.step_memory(events, {3: snap, 4: snap}, 1).values()
    assert m.carried == 5000
    assert m.at_peak["parameters"] == 1000 and m.at_peak["other"] == 7000 and m.peak == 8000
    assert m.timeline[0, 1:].sum() == 6000  # the step's start: parameters and what it carried
    assert m.timeline[:, 1 + memcat.CATEGORIES.index("other")].tolist() == [5000, 7000, 4000, 2000]
    # on the CPU there is no allocator to ask: nothing is carried
    model = torch.nn.Linear(4, 4)
    assert memcat.CARRIED not in memcat.snapshot([torch.optim.SGD(model.parameters(), lr=0.1)], carried=True)


def test_dpo_reference_model_is_frozen_weights(tmp_path):
    """TRL's DPOTrainer with a reference model: the policy trains in full, the reference is
    frozen weights beside it, found on the trainer."""
    import datasets
    import tokenizers
    import trl

    vocab = {"<pad>": 0, "<unk>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(61)}}
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    g = torch.Generator().manual_seed(0)

    def text(n: int) -> str:
        return " ".join(f"w{int(i)}" for i in torch.randint(0, 61, (n,), generator=g))

    data = datasets.Dataset.from_dict(
        {k: [text(8 if k == "prompt" else 6) for _ in range(32)] for k in ("prompt", "chosen", "rejected")}
    )
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, pad_token_id=0, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    policy, reference = transformers.LlamaForCausalLM(cfg), transformers.LlamaForCausalLM(cfg)
    args = trl.DPOConfig(
        output_dir=str(tmp_path / "dpo"), max_steps=4, per_device_train_batch_size=4, logging_strategy="no",
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, bf16=False,
        gradient_checkpointing=False,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dpo = trl.DPOTrainer(
            model=policy, ref_model=reference, args=args, train_dataset=data, processing_class=tok
        )
        with swift_nb.profile(out_dir=tmp_path / "runs", label="dpo", report=False) as r:
            dpo.train()
    run = swift_nb.load_run(r.path)
    assert run.summary["steps"] == 4
    cats = _at_peak(run)
    expected = _stored_bytes([*reference.parameters(), *reference.buffers(), *policy.buffers()])
    assert cats["frozen_parameters"] == pytest.approx(expected, rel=0.01)
    assert cats["parameters"] == _trainable(policy)
    ft = run.context["finetune"]
    assert ft["method"] == "full" and ft["trainable_pct"] == 100.0
    assert ft["frozen_models"] == [
        {
            "variable": "trainer.ref_model",
            "class": "LlamaForCausalLM",
            "params": sum(p.numel() for p in reference.parameters()),
        }
    ]
    assert run.context["trainer"]["arguments_class"] == "DPOConfig"


def test_a_4bit_base_counts_packed_with_its_quantization_state(tmp_path):
    """QLoRA's base as bitsandbytes stores it (NF4, two weights a byte, double-quantized
    absmax and codes beside it), on the CPU: frozen at its packed bytes plus its state, the
    method qlora."""
    import bitsandbytes as bnb

    class Block(torch.nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.q_proj, self.up, self.down = (
                torch.nn.Linear(d, d),
                torch.nn.Linear(d, 4 * d),
                torch.nn.Linear(4 * d, d),
            )

        def forward(self, x):
            return x + self.down(torch.relu(self.up(self.q_proj(x))))

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(Block(128) for _ in range(2))
    fp32_bytes = sum(
        p.numel() * 4 for b in blocks for n in ("q_proj", "up", "down") for p in [getattr(b, n).weight]
    )
    for b in blocks:
        for name in ("q_proj", "up", "down"):
            lin = getattr(b, name)
            q = bnb.nn.Linear4bit(
                lin.in_features, lin.out_features, compute_dtype=torch.float32, quant_type="nf4"
            )
            q.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, quant_type="nf4")
            q.bias = torch.nn.Parameter(lin.bias.data, requires_grad=False)
            setattr(b, name, q.to("cpu"))  # quantized here
    del lin, q  # the last fp32 layer, held by a variable, would count: it is memory the cell holds
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(
            torch.nn.Sequential(*blocks), peft.LoraConfig(r=4, target_modules=["q_proj"])
        )
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with swift_nb.profile(out_dir=tmp_path, label="qlora-cpu", report=False) as r:
        for _ in range(STEPS):
            model(torch.randn(8, 128)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    run = swift_nb.load_run(r.path)
    weights = [getattr(b, n).weight for b in blocks for n in ("q_proj", "up", "down")]
    state = []
    for w in weights:
        qs = w.quant_state
        while qs is not None:
            state += [v for v in vars(qs).values() if isinstance(v, torch.Tensor)]
            qs = getattr(qs, "state2", None)
    biases = [getattr(b, n).bias for b in blocks for n in ("q_proj", "up", "down")]
    expected = _stored_bytes([*weights, *state, *biases])
    frozen = _at_peak(run)["frozen_parameters"]
    assert frozen == pytest.approx(expected, rel=0.01)
    assert _stored_bytes(weights) == fp32_bytes // 8  # 4 bits of a 32-bit weight
    assert frozen < fp32_bytes / 5  # packed, with its state: not the dequantized weights
    ft = run.context["finetune"]
    assert (ft["method"], ft["quantization"], ft["base_dtype"]) == ("qlora", "nf4", "float32")
    assert ft["total_params"] == sum(b.numel() for b in biases) + fp32_bytes // 4 + ft["trainable_params"]
