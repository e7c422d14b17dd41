"""Models alive in the kernel (``capture/memory/stale_models.py``, the advisor's ``stale_models``
rule): a model that the run neither trains nor runs is named with its bytes, counted as
``other`` (never ``frozen_parameters``), and freed by the finding's advice; the fine-tuning
record describes the trained model however many others are alive, a lora toggle's run too.

Real torch on the CPU, a few steps of tiny models beside a 24 MiB one."""

from __future__ import annotations

import warnings

import pytest
import torch
from support.lora import SEQ, VOCAB, demo, step
from torch import nn

import swift_nb
from swift_nb.analysis import analyze
from swift_nb.analysis.advisor import Thresholds

#: nn.Linear(2048, 3072) in fp32: its weight and bias
STALE_BYTES = (2048 * 3072 + 3072) * 4
STEPS = 4


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))


def _train(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    for _ in range(STEPS):
        model(torch.randn(8, 32)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


@pytest.fixture(scope="module")
def stale_run(tmp_path_factory):
    """A small MLP trained beside a 24 MiB model built earlier and never used."""
    torch.manual_seed(0)
    old_model = nn.Linear(2048, 3072)
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with swift_nb.profile(
        out_dir=tmp_path_factory.mktemp("stale"), wait=0, warmup=1, active=2, report=False
    ) as r:
        _train(model, opt)
    del old_model
    return swift_nb.load_run(r.path)


def test_an_unused_model_is_named_with_its_bytes(stale_run):
    (entry,) = stale_run.summary["stale_models"]
    assert (entry["variable"], entry["class"], entry["device"]) == ("old_model", "Linear", "cpu")
    assert entry["bytes"] == pytest.approx(STALE_BYTES, rel=0.01)
    assert any("`old_model` (Linear, 24.0 MiB) is alive in the kernel" in n for n in stale_run.notes)


def test_its_bytes_are_other_not_frozen_parameters(stale_run):
    cats = stale_run.summary["memory_categories_at_peak"]
    assert cats["frozen_parameters"] == 0  # the MLP trains every parameter and has no buffers
    assert cats["other"] >= STALE_BYTES
    assert cats["other"] - STALE_BYTES < 0.05 * STALE_BYTES  # the rest: the batch and temporaries
    recorded = stale_run.steps.dropna(subset=["other_bytes"])
    assert len(recorded) and (recorded["other_bytes"] >= STALE_BYTES).all()
    assert (recorded["frozen_parameters_bytes"] == 0).all()


def test_the_finding_says_how_to_free_them(stale_run):
    (finding,) = [f for f in analyze(stale_run).findings if f.id == "stale_models"]
    assert finding.title == "`old_model` holds 24.0 MiB nobody trains: `del old_model; gc.collect()`"
    assert "empty_cache" not in finding.title  # a CPU run
    assert finding.severity == "warning"  # it fits: not the difference between fitting and not
    assert finding.evidence["stale_bytes"] == pytest.approx(STALE_BYTES, rel=0.01)
    peak = finding.evidence["peak_bytes"]
    assert finding.evidence["predicted_peak_bytes"] == pytest.approx(peak - STALE_BYTES, rel=0.01)


def test_it_is_critical_when_the_bytes_are_the_difference_between_fitting_and_not(stale_run):
    """A budget (the thresholds' memory limit) between the peak without them and with them."""
    peak = sum(stale_run.summary["memory_categories_at_peak"].values())
    limit = peak - STALE_BYTES / 2
    found = analyze(stale_run, thresholds=Thresholds(memory_limit_bytes=limit)).findings
    (finding,) = [f for f in found if f.id == "stale_models"]
    assert finding.severity == "critical" and found[0] is finding
    assert "within the" in finding.predicted_effect


def test_a_run_recorded_before_stale_models_loads_unchanged(stale_run, tmp_path):
    import json
    import shutil

    old = tmp_path / "old"
    shutil.copytree(stale_run.path, old)
    meta = json.loads((old / "run.json").read_text())
    meta["summary"].pop("stale_models")
    (old / "run.json").write_text(json.dumps(meta))
    back = swift_nb.load_run(old)
    assert "stale_models" not in back.summary and not back.problems
    assert not [f for f in analyze(back).findings if f.id == "stale_models"]


def test_an_out_of_memory_run_counts_them_as_other_and_is_critical(tmp_path):
    """An allocation failure (injected in the last step's forward) beside the 24 MiB model:
    the post-mortem counts it as other, and freeing it is what the finding leads with."""
    torch.manual_seed(0)
    old_model = nn.Linear(2048, 3072)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def fail(module, args):
        if fail.armed:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB.")

    fail.armed = False
    model[2].register_forward_pre_hook(fail)
    with pytest.raises(torch.OutOfMemoryError), swift_nb.profile(out_dir=tmp_path, report=False) as r:
        for i in range(STEPS):
            fail.armed = i == STEPS - 1
            model(torch.randn(8, 32)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    run = swift_nb.load_run(r.path)
    assert run.status == "oom"
    assert run.oom.categories["frozen_parameters"] == 0
    assert run.oom.categories["other"] >= STALE_BYTES
    assert [e["variable"] for e in run.summary["stale_models"]] == ["old_model"]
    findings = analyze(run).findings
    assert findings[0].id == "stale_models" and findings[0].severity == "critical"
    del old_model


def test_the_trained_model_is_described_among_several_alive(tmp_path):
    """A student trained in part, a teacher it learns from (run, never trained), and two
    models alive that nothing uses, one of them of the student's own class."""
    torch.manual_seed(0)
    old_student = _mlp()
    spare = nn.Linear(128, 128)
    student = _mlp()
    teacher = _mlp()
    student[0].requires_grad_(False)
    teacher.requires_grad_(False)
    opt = torch.optim.SGD(student[2].parameters(), lr=0.1)
    with swift_nb.profile(out_dir=tmp_path, wait=0, warmup=1, active=2, report=False) as r:
        for _ in range(STEPS):
            x = torch.randn(8, 32)
            with torch.no_grad():
                target = teacher(x)
            nn.functional.mse_loss(student(x), target).backward()
            opt.step()
            opt.zero_grad()
    run = swift_nb.load_run(r.path)
    ft = run.context["finetune"]
    assert (ft["method"], ft["model_variable"]) == ("partial", "student")
    assert (ft["trainable_params"], ft["total_params"]) == (65, 64 * 32 + 64 + 65)
    assert ft["frozen_models"] == [{"variable": "teacher", "class": "Sequential", "params": 2177}]
    stale = {e["variable"]: e["bytes"] for e in run.summary["stale_models"]}
    assert stale == {"spare": (128 * 128 + 128) * 4, "old_student": 2177 * 4}
    frozen = (64 * 32 + 64 + 2177) * 4  # the student's frozen layer and the teacher
    assert run.summary["memory_categories_at_peak"]["frozen_parameters"] == frozen
    del old_student, spare


#: an earlier cell: a model of the trained one's class, under the name the cell's
#: training function gives its own, and a model without repeated blocks
EARLIER_CELL = """
model = demo()
spare = torch.nn.Linear(256, 256)
"""
#: the profiled cell, training a model it builds at the top level or in a function
CELLS = {
    "top level": """
trained = demo()
opt = torch.optim.AdamW(trained.parameters(), lr=1e-3)
with swift_nb.profile(out_dir=out, wait=0, warmup=1, active=1, toggles=["lora(r=4)"], report=False) as r:
    for _ in range(3):
        step(trained, opt, idx)
""",
    "function": """
def train():
    model = demo()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        step(model, opt, idx)
    return model

with swift_nb.profile(out_dir=out, wait=0, warmup=1, active=1, toggles=["lora(r=4)"], report=False) as r:
    trained = train()
""",
}
#: r=4 adapters on qkv (64 → 192), proj (64 → 64), mlp.0 (64 → 256), mlp.2 (256 → 64) of 2 blocks
ADAPTERS = 2 * 4 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))


@pytest.mark.parametrize(("cell", "variable"), [("top level", "trained"), ("function", "step.model")])
def test_a_lora_run_describes_the_adapted_model_with_others_alive(tmp_path, cell, variable):
    """The lora toggle adapts every model in the notebook's namespace; the record describes
    the one that trained, even when a function's local shares its name with an earlier
    cell's model (the local is then named after the innermost function holding it: the
    step helper's ``model``), and the others are stale.
    The cells run in a namespace of their own, as IPython runs a notebook's."""
    import peft  # noqa: F401 (the lora toggle's adapters: missing, it fails here by name)

    torch.manual_seed(0)
    ns = {"torch": torch, "swift_nb": swift_nb, "demo": demo, "step": step, "out": tmp_path}
    ns["idx"] = torch.randint(0, VOCAB, (2, SEQ))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(EARLIER_CELL, ns)
        exec(CELLS[cell], ns)
    run = swift_nb.load_run(ns["r"].path)
    ft = run.context["finetune"]
    base = sum(p.numel() for p in ns["trained"].parameters())  # the toggle undone: the base alone
    assert (ft["method"], ft["library"], ft["rank"]) == ("lora", "peft", 4)
    assert (ft["trainable_params"], ft["total_params"]) == (ADAPTERS, base + ADAPTERS)
    assert ft["model_variable"] == variable and "frozen_models" not in ft
    (toggle,) = run.context["toggles"]
    assert toggle["applied"] and any(c.startswith("`model` (GPT): LoRA r=4") for c in toggle["changes"])
    assert {e["variable"] for e in run.summary["stale_models"]} == {"model", "spare"}
    cats = run.summary["memory_categories_at_peak"]
    assert cats["frozen_parameters"] == base * 4  # the trained model's base alone
    assert cats["parameters"] == ADAPTERS * 4
