"""What every check works with: the sizes of its work (``GPU_SIZES``, ``SMOKE_SIZES`` for
``--cpu-smoke``), its context (``Ctx``: device, sizes, run folders, what it found), the
quickstart's training loop, and the readings of a run's memory that several checks share."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Sizes:
    """How large each check's work is. ``model``: changes to ``quickstart_config()`` (eager
    attention, 1024 tokens) for the checks of memory, attention and the forecast; ``batch``:
    their batch (the forecast runs at half of it, then at it); ``cost_model``: the
    ``GPTConfig`` of the cost check (SDPA attention, steps long enough to time);
    ``cost_limit``: the profiled/bare ratio it must stay under (None: only measured)."""

    model: dict[str, Any]
    batch: int
    steps: int  # steps of each profiled cell (the schedule records steps 3-5)
    quickstart_steps: int
    oom_batch: int
    oom_limit_bytes: int
    cost_model: dict[str, Any]
    cost_batch: int
    cost_steps: int  # profiled steps; each of the two bare rounds runs half as many
    cost_limit: float | None
    lora_model: dict[str, Any]  # the LlamaConfig of the LoRA check
    lora_batch: int
    energy_steps: int = 200  # steps of the cost model in the energy check (a few seconds on a GPU)
    tolerance_pct: float = 10.0  # how far apart two measures of one peak may be
    edge_tolerance_pct: float = 2.0  # the categories' sum at a step edge against memory_allocated


GPU_SIZES = Sizes(
    model={},
    batch=8,
    steps=10,
    quickstart_steps=150,
    oom_batch=64,  # ≈ 5 GiB of [64, 4, 1024, 1024] scores and probabilities, against 1 GiB
    oom_limit_bytes=1 << 30,
    cost_model={"vocab_size": 1024, "seq_len": 512, "n_layer": 6, "n_head": 8, "d_model": 512},
    cost_batch=16,
    cost_steps=300,
    # benchmarks/cost.py measured 1.05-1.07x on CPU, where the bare cells alone vary by a few %
    cost_limit=1.10,
    lora_model={
        "vocab_size": 8192,
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "max_position_embeddings": 1024,
    },
    lora_batch=2,
)
SMOKE_SIZES = Sizes(
    model={"vocab_size": 128, "seq_len": 64, "n_layer": 2, "n_head": 2, "d_model": 32},
    batch=4,
    steps=8,
    quickstart_steps=8,
    oom_batch=0,
    oom_limit_bytes=0,
    cost_model={"vocab_size": 128, "seq_len": 64, "n_layer": 2, "n_head": 2, "d_model": 32},
    cost_batch=2,
    cost_steps=16,
    cost_limit=None,  # a shared CPU running tiny steps says nothing about the cost
    lora_model={
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
    },
    lora_batch=2,
)


# -- what a check works with -------------------------------------------------------------------


@dataclass
class Ctx:
    """One check's device, sizes and folder of run folders, and what it found: ``details``
    (numbers, names) and ``held`` (each statement tested → whether it held)."""

    device: Any  # torch.device
    sizes: Sizes
    runs: Path
    details: dict[str, Any] = field(default_factory=dict)
    held: dict[str, bool] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def expect(self, statement: str, holds: Any) -> bool:
        self.held[statement] = bool(holds)
        return bool(holds)

    def config(self, **changes: Any):
        from swift_nb.demo import quickstart_config

        return replace(quickstart_config(), **{**self.sizes.model, **changes})

    def model_and_optimizer(self, cfg):
        import torch

        from swift_nb.demo import GPT

        torch.manual_seed(0)
        model = GPT(cfg).to(self.device)
        return model, torch.optim.AdamW(model.parameters(), lr=3e-4)

    def batch(self, cfg, batch_size: int):
        """One batch of synthetic tokens on the device: inputs and targets shifted by one."""
        import torch

        g = torch.Generator().manual_seed(0)
        data = torch.randint(0, cfg.vocab_size, (batch_size, cfg.seq_len + 1), generator=g)
        return data[:, :-1].contiguous().to(self.device), data[:, 1:].contiguous().to(self.device)

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def profiled(self, label: str, cell: Callable[[], None], **options: Any):
        """``cell`` run under ``swift_nb.profile``; the run as read back from its folder. No
        report.html unless ``report=True``: the checks read the record (a check of the report
        asks for one), and each report would cost a check seconds."""
        import swift_nb

        options.setdefault("report", False)
        prof = swift_nb.profile(out_dir=self.runs, label=label, **options)
        with prof:
            cell()
            self.sync()
        return swift_nb.load_run(prof.run.path)


def train(model, opt, x, y, steps: int, autocast=None, marks: list[float] | None = None) -> None:
    """The quickstart's training loop on one batch; ``marks`` gets the time after each
    ``opt.step()`` (where swift_nb ends a step). ``loss.item()`` syncs every step, as a loop
    that logs its loss does, so that host step times are device step times."""
    import contextlib

    import torch

    for _ in range(steps):
        with torch.autocast(x.device.type, dtype=autocast) if autocast else contextlib.nullcontext():
            loss = model(x, y)
        loss.backward()
        opt.step()
        if marks is not None:
            marks.append(time.perf_counter())
        opt.zero_grad(set_to_none=True)
        loss.item()


CATEGORY_COLUMNS = [
    f"{c}_bytes"
    for c in ("parameters", "frozen_parameters", "gradients", "optimizer_state", "activations", "other")
]


def recorded_steps(run):
    """The steps with memory by category, as ``memory_footprint`` takes them: those that
    follow another recorded step where there are such."""
    steps = run.steps
    if not set(CATEGORY_COLUMNS) <= set(steps.columns):
        return steps.iloc[0:0]
    recorded = steps.dropna(subset=CATEGORY_COLUMNS)
    followers = recorded[recorded["step"].isin(recorded["step"] + 1)]
    return followers if len(followers) else recorded


def step_peak(run) -> float | None:
    """The step's peak tensor bytes as swift_nb recorded it (CUDA: max_memory_allocated,
    reset at every step boundary; CPU: the memory replay's peak), median over the recorded
    steps ``recorded_steps`` picks."""
    peaks = recorded_steps(run)["peak_tensor_bytes"].dropna()
    return float(peaks.median()) if len(peaks) else None


def categories_total(run) -> float:
    """The sum of the memory categories at the recorded steps' peak (``memory_footprint``)."""
    from swift_nb.analysis.memory import memory_footprint

    return float(memory_footprint(run)["at_peak_bytes"].sum())


def apart_pct(a: float | None, b: float | None) -> float | None:
    """How far ``a`` is from ``b``, in percent of ``b``."""
    if a is None or b is None or not b:
        return None
    return 100.0 * (a - b) / b


def within(a: float | None, b: float | None, tolerance_pct: float) -> bool:
    gap = apart_pct(a, b)
    return gap is not None and abs(gap) <= tolerance_pct


def mib(n: float | None) -> float | None:
    return None if n is None else round(n / 2**20, 2)


def device_memory_bytes(ctx: Ctx) -> int:
    if ctx.cuda:
        import torch

        return int(torch.cuda.get_device_properties(ctx.device).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)
