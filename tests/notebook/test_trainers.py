"""Real trainers in a real kernel: ``%%swift_profile`` around a Hugging Face Trainer's
``train()`` (built in an earlier cell) and around an accelerate loop — one step per
optimizer step under gradient accumulation, toggles on ``trainer.model`` and on the
optimizer the Trainer creates, reruns that replay the cells that built the Trainer, the
Trainer's settings in the run's context and the advisor naming the TrainingArguments field
to change. Then the Trainer notebook, executed headless."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from support.common import Kernel, kernel_env

import swift_nb
from swift_nb.analysis.trace.tables import load_trace

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "02_hf_trainer.ipynb"
FLAGS = "--no-widgets --wait 1 --warmup 1 --active 2"
MAX_STEPS, ACCUMULATION, MICRO_BATCH = 6, 4, 4

SETUP = """\
import time
import torch, transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
transformers.logging.set_verbosity_error()
torch.set_num_threads(1)  # the test machine's cores are shared: no thread waits on a busy one

class Tokens(torch.utils.data.Dataset):
    \"\"\"Random token sequences; __getitem__ sleeps sleep_s (tokenising, say).\"\"\"
    def __init__(self, n, seq, sleep_s=0.0):
        self.x = torch.randint(0, 256, (n, seq), generator=torch.Generator().manual_seed(0))
        self.sleep_s = sleep_s
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return {"input_ids": self.x[i], "labels": self.x[i]}

def tiny_gpt2(seq):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=seq,
                        bos_token_id=0, eos_token_id=0)
    config._attn_implementation = "eager"
    return GPT2LMHeadModel(config)

def tiny_trainer(max_steps=6, accumulation=4, batch=4, seq=32, sleep_s=0.0):
    args = TrainingArguments(output_dir="hf_out", max_steps=max_steps, per_device_train_batch_size=batch,
                             gradient_accumulation_steps=accumulation, save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, use_cpu=True, report_to="none")
    return Trainer(model=tiny_gpt2(seq), args=args, train_dataset=Tokens(256, seq, sleep_s))
"""


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Kernel:
    """One kernel for the module: a rerun replays the whole session, so it holds only
    this module's cells; ``trainer`` is built in a cell of its own."""
    k = Kernel(tmp_path_factory.mktemp("trainers"))
    for code in ("%load_ext swift_nb", SETUP, "trainer = tiny_trainer()"):
        res = k.execute(code)
        assert res.status == "ok", res.outputs
    yield k
    k.close()


def _ok(res) -> None:
    assert res.status == "ok", [(e["ename"], e["evalue"], e["traceback"][-3:]) for e in res.of_type("error")]


def _html(res) -> str:
    return "".join(o["data"].get("text/html", "") for o in res.of_type("display_data"))


def _only_run(folder: Path) -> swift_nb.Run:
    (path,) = swift_nb.runs(folder).path
    return swift_nb.load_run(path)


def test_compare_replays_the_cells_that_built_the_trainer(hf, tmp_path):
    res = hf.execute(
        f"%%swift_profile {FLAGS} --out {tmp_path} --compare flash_attention,grad_checkpointing\ntrainer.train()",
        timeout=600,
    )
    _ok(res)
    by_variant = {r.context["variant"]: r for r in map(swift_nb.load_run, swift_nb.runs(tmp_path).path)}
    assert sorted(by_variant) == ["baseline", "flash_attention", "grad_checkpointing"]
    for name, run in by_variant.items():
        assert run.status == "ok", (name, run.notes)
        assert run.summary["steps"] == MAX_STEPS, name
        assert run.context["trainer"]["variable"] == "trainer"
    # each worker replayed `trainer = tiny_trainer()`; its toggles reached trainer.model
    (flash,) = by_variant["flash_attention"].context["toggles"]
    assert "`trainer.model` (GPT2LMHeadModel, 2 attention layers): eager → sdpa" in flash["changes"]
    (ckpt,) = by_variant["grad_checkpointing"].context["toggles"]
    assert ckpt["changes"] == [
        "`trainer.model` (GPT2LMHeadModel): gradient_checkpointing_enable() on its 2 layers (non-reentrant)"
    ]
    # what the model was running at the first step, as each run recorded it
    models = {n: r.context["trainer"]["model"] for n, r in by_variant.items()}
    assert models["baseline"] == {
        "class": "GPT2LMHeadModel",
        "attn_implementation": "eager",
        "checkpointing": False,
    }
    assert models["flash_attention"]["attn_implementation"] == "sdpa"
    assert models["grad_checkpointing"]["checkpointing"] is True
    assert "Comparison" in _html(res)
    # the kernel's own trainer never trained and was never changed
    assert hf.eval(
        "(trainer.state.global_step, trainer.model.config._attn_implementation, "
        "trainer.model.is_activation_checkpointing)"
    ) == (0, "eager", False)


def test_one_step_per_optimizer_step_under_gradient_accumulation(hf, tmp_path):
    _ok(hf.execute(f"%%swift_profile {FLAGS} --out {tmp_path}\ntrainer.train()"))
    run = _only_run(tmp_path)
    assert hf.eval("trainer.state.global_step") == MAX_STEPS
    assert len(run.steps) == run.summary["steps"] == MAX_STEPS  # not MAX_STEPS × ACCUMULATION
    assert run.steps["trigger"].eq("optimizer").all()
    # the profiler's windows are optimizer steps: each recorded step holds its 4 micro-batches'
    # forward passes (2 embedding lookups each: tokens and positions)
    assert run.summary["recorded_steps"] == [2, 3]
    events = load_trace(run).events
    lookups = events[(events["name"] == "aten::embedding") & (events["step"] >= 0)].groupby("step").size()
    assert lookups.to_dict() == {2: 2 * ACCUMULATION, 3: 2 * ACCUMULATION}
    assert run.context["trainer"] == {
        "framework": "transformers",
        "class": "Trainer",
        "variable": "trainer",
        "version": hf.eval("transformers.__version__"),
        "checkpointing_field": run.context["trainer"]["checkpointing_field"],
        "arguments_class": "TrainingArguments",
        "arguments": {
            "per_device_train_batch_size": MICRO_BATCH,
            "gradient_accumulation_steps": ACCUMULATION,
            "dataloader_num_workers": 0,
            "dataloader_persistent_workers": False,
            "dataloader_prefetch_factor": None,
            "dataloader_pin_memory": False,
            "bf16": False,
            "fp16": False,
            "torch_compile": False,
            "optim": hf.eval("trainer.args.optim.value"),
            "max_steps": MAX_STEPS,
            "world_size": 1,
            run.context["trainer"]["checkpointing_field"]: False,
        },
        "model": {"class": "GPT2LMHeadModel", "attn_implementation": "eager", "checkpointing": False},
    }
    assert run.context["trainer"]["checkpointing_field"] in (
        "activation_checkpointing",
        "gradient_checkpointing",
    )
    # samples per optimizer step, for throughput: micro-batch × accumulation
    assert run.context["batch_size"] == MICRO_BATCH * ACCUMULATION and run.context["num_workers"] == 0


SFT = """\
import datasets, peft, tokenizers
from trl import SFTConfig, SFTTrainer

def slow(batch):  # tokenising in __getitem__: 30 ms a sample
    time.sleep(0.03 * len(batch["input_ids"]))
    return batch

sft_data = datasets.Dataset.from_dict(
    {"input_ids": torch.randint(3, 256, (64, 32), generator=torch.Generator().manual_seed(0)).tolist()}
).with_transform(slow)
words = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<pad>": 0, "<unk>": 1, "</s>": 2}, unk_token="<unk>"))
sft_tokenizer = transformers.PreTrainedTokenizerFast(
    tokenizer_object=words, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
)
llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, pad_token_id=0, eos_token_id=2,
))
sft_args = SFTConfig(
    output_dir="sft_out", max_steps=6, per_device_train_batch_size=4, logging_strategy="no", save_strategy="no",
    report_to="none", use_cpu=True, disable_tqdm=True, max_length=32, bf16=False, gradient_checkpointing=False,
    dataset_kwargs={"skip_prepare_dataset": True},
)
sft = SFTTrainer(
    model=llama, args=sft_args, train_dataset=sft_data, processing_class=sft_tokenizer,
    peft_config=peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
)
"""


def test_sft_trainer_with_a_peft_config(hf, tmp_path):
    """TRL's SFTTrainer wrapping the model in LoRA adapters itself: its steps, the LoRA it
    made, and advice in SFTConfig's fields."""
    pytest.importorskip("trl")
    _ok(hf.execute(SFT, timeout=300))
    _ok(hf.execute(f"%%swift_profile {FLAGS} --out {tmp_path}\nsft.train()", timeout=600))
    run = _only_run(tmp_path)
    assert hf.eval("sft.state.global_step") == len(run.steps) == run.summary["steps"] == 6
    ft = run.context["finetune"]
    assert (ft["method"], ft["library"], ft["rank"], ft["alpha"]) == ("lora", "peft", 8, 16)
    assert ft["target_modules"] == ["q_proj", "v_proj"]
    assert ft["trainable_params"] == hf.eval(
        "sum(p.numel() for p in sft.model.parameters() if p.requires_grad)"
    )
    assert run.context["trainer"]["class"] == "SFTTrainer"
    assert run.context["trainer"]["arguments_class"] == "SFTConfig"
    cats = run.summary["memory_categories_at_peak"]
    assert cats["frozen_parameters"] > 10 * cats["parameters"] > 0  # the base is frozen, the adapters train
    (loading,) = [f for f in swift_nb.report(run).analysis.findings if f.id == "data_loading"]
    assert "set SFTConfig(dataloader_num_workers=" in loading.suggestion
    assert "TrainingArguments" not in loading.suggestion


def test_toggles_act_on_trainer_model_and_the_optimizer_train_creates(hf, tmp_path):
    _ok(hf.execute("fresh = tiny_trainer()"))
    state = (
        "(fresh.model.config._attn_implementation, fresh.model.is_activation_checkpointing, "
        "type(fresh.optimizer.optimizer).__module__ if fresh.optimizer is not None else None)"
    )
    res = hf.execute(
        f"%%swift_profile {FLAGS} --out {tmp_path} --flash-attn --grad-ckpt --galore rank=16\n"
        f"fresh.train()\ninside = {state}"
    )
    _ok(res)
    assert hf.eval("inside") == ("sdpa", True, "galore_torch.adamw")
    assert hf.eval(state) == ("eager", False, "torch.optim.adamw")  # restored
    out = res.text("stdout")
    assert "flash_attention: `fresh.model` (GPT2LMHeadModel, 2 attention layers): eager → sdpa" in out
    assert "grad_checkpointing: `fresh.model` (GPT2LMHeadModel): gradient_checkpointing_enable()" in out
    # GPT-2's linear layers are transformers' Conv1D: 4 per block, and the (tied) LM head
    assert "galore: `fresh.optimizer` (AdamW → GaLore AdamW): 9 weight matrices projected to rank 16" in out
    assert "galore: `fresh.optimizer` is the optimizer fresh.train() created (optim=" in out
    run = _only_run(tmp_path)
    assert run.summary["steps"] == MAX_STEPS
    assert [t["toggle"] for t in run.context["toggles"] if t["applied"]] == [
        "flash_attention",
        "grad_checkpointing",
        "galore",
    ]


def test_advisor_names_the_training_arguments_to_change(hf, tmp_path):
    # 16 samples per step at 20 ms each: loading is most of the step (however busy the
    # machine's cores are), and in the main process
    _ok(hf.execute("slow = tiny_trainer(sleep_s=0.02)"))
    res = hf.execute(f"%%swift_profile {FLAGS} --out {tmp_path / 'slow'}\nslow.train()")
    _ok(res)
    html = _html(res)
    assert "data-bound" in html
    assert (
        "The Trainer builds this DataLoader from its arguments: set TrainingArguments(dataloader_num_workers=4, "
        "dataloader_persistent_workers=True, dataloader_prefetch_factor=4) (`slow` has dataloader_num_workers=0"
    ) in html
    assert "DataLoader(num_workers=4" not in html  # not the plain PyTorch advice

    # long sequences, no accumulation: fp32 activations fill the peak
    _ok(hf.execute("big = tiny_trainer(max_steps=4, accumulation=1, batch=8, seq=128)"))
    res = hf.execute(
        f"%%swift_profile --no-widgets --wait 0 --warmup 1 --active 2 --out {tmp_path / 'big'}\nbig.train()"
    )
    _ok(res)
    html = _html(res).replace("&#x27;", "'")
    field = _only_run(tmp_path / "big").context["trainer"]["checkpointing_field"]
    assert f"set TrainingArguments({field}=True) (`big` has {field}=False)" in html
    assert "set TrainingArguments(bf16=True) (`big` has bf16=False)" in html
    assert "Activations are kept in fp32" in html


ACCELERATE_SETUP = """\
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=4, cpu=True)
model = tiny_gpt2(32)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
dl = torch.utils.data.DataLoader(Tokens(96, 32), batch_size=4)
model, opt, dl = accelerator.prepare(model, opt, dl)
"""

ACCELERATE_LOOP = """\
for batch in dl:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        opt.step()
        opt.zero_grad()
"""


def test_accelerate_loop_is_one_step_per_optimizer_step(hf, tmp_path):
    _ok(hf.execute(ACCELERATE_SETUP))
    _ok(hf.execute(f"%%swift_profile {FLAGS} --out {tmp_path}\n{ACCELERATE_LOOP}"))
    run = _only_run(tmp_path)
    assert run.summary["steps"] == 96 // 4 // 4  # 24 batches, 4 per optimizer step
    trainer = run.context["trainer"]
    assert trainer["framework"] == "accelerate" and trainer["variable"] == "accelerator"
    assert trainer["arguments"]["gradient_accumulation_steps"] == 4
    assert trainer["arguments"]["mixed_precision"] == "no"
    assert trainer["dataloader"] == {"batch_size": 4, "num_workers": 0}
    assert run.context["batch_size"] == 16


def test_trainer_notebook_runs_headless(tmp_path):
    shutil.copy(NOTEBOOK, tmp_path)
    nb = nbformat.read(tmp_path / NOTEBOOK.name, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit it unexecuted"
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    # one thread per process: the test machine's cores are shared (the notebook sets none)
    client.execute(env={**kernel_env(), "OMP_NUM_THREADS": "1"})
    cells = {c.source.partition("\n")[0]: c for c in nb.cells if c.source.startswith("%%swift_profile")}
    profiled = cells["%%swift_profile --label trainer --steps 8"]
    compared = cells["%%swift_profile --compare grad_checkpointing"]
    html = "".join(o.get("data", {}).get("text/html", "") for o in profiled.outputs)
    # what the notebook's text tells the reader to look for
    assert "data-bound" in html
    assert "set TrainingArguments(dataloader_num_workers=4, dataloader_persistent_workers=True" in html
    assert "DataLoader(num_workers=4" not in html
    runs = {
        r.context.get("variant") or r.label: r
        for r in map(swift_nb.load_run, swift_nb.runs(tmp_path / "swift_nb_runs").path)
    }
    assert sorted(runs) == ["baseline", "grad_checkpointing", "trainer"]
    field = runs["trainer"].context["trainer"]["checkpointing_field"]
    assert f"set TrainingArguments({field}=True)" in html and "set TrainingArguments(bf16=True)" in html
    assert all(
        r.summary["steps"] == runs["trainer"].context["trainer"]["arguments"]["max_steps"]
        for r in runs.values()
    )
    assert "Comparison" in "".join(o.get("data", {}).get("text/html", "") for o in compared.outputs)
    table = swift_nb.compare(runs["baseline"], runs["grad_checkpointing"]).set_index("variant")
    assert table.loc["grad_checkpointing", "peak_mem_ratio"] < 0.8, table.T
