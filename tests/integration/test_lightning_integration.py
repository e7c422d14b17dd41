"""PyTorch Lightning's Trainer around a profiled loop: ``trainer.fit`` under
``swift_nb.profile`` has one step per optimizer update under ``accumulate_grad_batches``,
records the Trainer's settings and its DataLoader in the run's context
(``swift_nb.capture.frameworks``) and counts the LightningModule's parameters; the advice
phrases its changes as the Trainer's arguments where Lightning has them
(``swift_nb.analysis.advisor.frameworks``), on hand-built contexts and evidence."""

from __future__ import annotations

import pytest
import torch

import swift_nb
from swift_nb.analysis.advisor import advise

MAX_STEPS, ACCUMULATION, MICRO_BATCH = 6, 2, 4


@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory):
    """A tiny MLP's ``fit`` on random tensors, profiled: (run, the LightningModule)."""
    import lightning

    class Regressor(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(128, 16), torch.randn(128, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=MICRO_BATCH)
    module = Regressor()
    # not named `trainer`: the record must name the cell's variable, not Lightning's own
    lit = lightning.Trainer(
        max_steps=MAX_STEPS,
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=ACCUMULATION,
    )
    with swift_nb.profile(out_dir=tmp_path_factory.mktemp("lightning"), report=False) as run:
        lit.fit(module, loader)
    assert run.status == "ok"
    return swift_nb.load_run(run.path), module


def test_fit_is_one_step_per_optimizer_update_with_the_trainer_in_the_context(lightning_run):
    import lightning

    run, _ = lightning_run
    assert run.summary["steps"] == MAX_STEPS  # 12 batches, 6 updates
    info = run.context["trainer"]
    assert {k: info[k] for k in ("framework", "class", "variable", "version")} == {
        "framework": "lightning",
        "class": "Trainer",
        "variable": "lit",
        "version": lightning.__version__,
    }
    arguments = info["arguments"]
    assert arguments["precision"] == "32-true"
    assert arguments["accumulate_grad_batches"] == ACCUMULATION
    assert arguments["strategy"] == "SingleDeviceStrategy"
    assert arguments["accelerator"] == "CPUAccelerator"
    assert arguments["num_devices"] == 1 and arguments["max_steps"] == MAX_STEPS
    assert info["model"] == {"class": "Regressor", "automatic_optimization": True}
    assert info["dataloader"] == {"batch_size": MICRO_BATCH, "num_workers": 0}
    assert run.context["batch_size"] == MICRO_BATCH * ACCUMULATION
    assert run.context["num_workers"] == 0


def test_the_lightning_modules_parameters_are_counted(lightning_run):
    run, module = lightning_run
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    at_peak = run.summary["memory_categories_at_peak"]
    assert at_peak["parameters"] == weights
    assert at_peak["frozen_parameters"] == 0


def test_advice_on_a_lightning_run_names_no_other_frameworks_settings(lightning_run):
    run, _ = lightning_run
    for finding in advise(run)[1]:
        assert "TrainingArguments" not in finding.suggestion, finding.id
        assert "Accelerator(" not in finding.suggestion, finding.id
