"""Every CUDA path of swift_nb, checked on one GPU; what held is written as JSON.

    python scripts/gpu_check.py OUT_DIR [--cpu-smoke] [--budget-s 420]

``bash scripts/gpu_check.sh`` sets up a Python with a CUDA build of torch and calls this.
The checks (``CHECKS``) profile the demo GPT of ``swift_nb.demo`` (random weights, synthetic
tokens; nothing is downloaded). Each runs in a child process of its own (``--one NAME``)
under its time limit, so a check that fails, hangs or leaves the device unusable costs only
itself; the parent rewrites ``OUT_DIR/gpu_check.json`` after every check, so a run killed
half-way keeps what it measured. Each check's record is ``{name, title, ok, skipped,
seconds, details, error}``: ``details["held"]`` maps each statement the check tests to
whether it held, beside the numbers behind it; ``ok`` is whether all held (None when
skipped); ``error`` names those that did not, or the exception that stopped the check.

``--cpu-smoke`` runs the same driver on the CPU with tiny sizes, to test the script itself on
a machine without a GPU: the CUDA-only checks are skipped (``"skipped": "no CUDA device"``),
the others run as on a GPU, with the statements that only a device can make left out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

RESULT_FILE = "gpu_check.json"
ENVIRONMENT = "environment"  # the child that reads the environment's facts (not a check)
ENVIRONMENT_LIMIT_S = 90.0
MIN_START_S = 10.0  # a check is not started with less of the overall budget left
DEFAULT_BUDGET_S = 420.0  # the checks together; setup comes on top (≤ 8 minutes in all)


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
        """``cell`` run under ``swift_nb.profile``; the run as read back from its folder."""
        import swift_nb

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


# -- the checks --------------------------------------------------------------------------------


def check_quickstart_nvml(ctx: Ctx) -> None:
    """The quickstart notebook's profiled cell (its model, loader and loop; the batch moved
    to the GPU) with NVML's series in ``run.samples``."""
    from swift_nb.demo import make_loader

    n = ctx.sizes.quickstart_steps
    cfg = ctx.config()
    model, opt = ctx.model_and_optimizer(cfg)
    loader = make_loader(cfg, batch_size=ctx.sizes.batch, n_samples=ctx.sizes.batch * n)
    dev = ctx.device

    def cell() -> None:
        for x, y in loader:
            x, y = x.to(dev), y.to(dev)
            loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        print(f"final loss {loss.item():.3f}")

    run = ctx.profiled("quickstart", cell, interval_ms=50)
    samples = run.samples

    def columns(pattern: str) -> list[str]:
        return [c for c in samples.columns if re.fullmatch(pattern, c)]

    util, used = columns(r"gpu\d+_util_pct"), columns(r"gpu\d+_mem_used_bytes")
    allocated = columns(r"cuda\d+_allocated_bytes")
    filled = {c: int(samples[c].notna().sum()) for c in util + used + allocated}
    ctx.details.update(
        run=str(run.path),
        status=run.status,
        steps=len(run.steps),
        samples=len(samples),
        sample_columns=list(samples.columns),
        values_per_column=filled,
        util_pct_max=max((float(samples[c].max()) for c in util), default=None),
        util_pct_mean=max((float(samples[c].mean()) for c in util), default=None),
        mem_used_max_mib=mib(max((float(samples[c].max()) for c in used), default=None)),
        summary={
            k: run.summary.get(k) for k in ("steps", "step_time_median_s", "mean_util_pct", "util_source")
        },
        notes=run.notes,
    )
    ctx.expect("the run ended ok", run.status == "ok")
    ctx.expect(f"every one of the {n} training steps is in run.steps", len(run.steps) >= n)
    ctx.expect(
        "run.samples has NVML's GPU utilisation (gpuN_util_pct) with values", any(filled[c] for c in util)
    )
    ctx.expect(
        "run.samples has NVML's GPU memory (gpuN_mem_used_bytes) with values", any(filled[c] for c in used)
    )
    ctx.expect(
        "run.samples has the CUDA allocator's bytes (cudaN_allocated_bytes)",
        any(filled[c] for c in allocated),
    )
    ctx.expect(
        "the trace and report.html were written",
        run.trace_path is not None and run.trace_path.exists() and (run.path / "report.html").exists(),
    )


def check_max_memory(ctx: Ctx) -> None:
    """``torch.cuda.max_memory_allocated`` against the memory categories at the peak: as
    swift_nb recorded it per step, and for a bare step after the run."""
    import torch

    cfg = ctx.config()
    model, opt = ctx.model_and_optimizer(cfg)
    x, y = ctx.batch(cfg, ctx.sizes.batch)
    run = ctx.profiled("max-memory", lambda: train(model, opt, x, y, ctx.sizes.steps))
    recorded = recorded_steps(run)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    train(model, opt, x, y, 1)
    torch.cuda.synchronize()
    bare = float(torch.cuda.max_memory_allocated())
    recorded_peak, total = step_peak(run), categories_total(run)
    tol = ctx.sizes.tolerance_pct
    ctx.details.update(
        run=str(run.path),
        per_recorded_step=[
            {
                "step": int(r["step"]),
                "peak_tensor_mib": mib(r["peak_tensor_bytes"]),
                "categories_mib": mib(sum(r[c] for c in CATEGORY_COLUMNS)),
            }
            for _, r in recorded.iterrows()
        ],
        categories_at_peak_mib=mib(total),
        recorded_max_memory_allocated_mib=mib(recorded_peak),
        bare_step_max_memory_allocated_mib=mib(bare),
        categories_vs_recorded_pct=apart_pct(total, recorded_peak),
        categories_vs_bare_pct=apart_pct(total, bare),
        recorded_vs_bare_pct=apart_pct(recorded_peak, bare),
        tolerance_pct=tol,
    )
    ctx.expect("the profiler recorded steps with memory by category", len(recorded) > 0)
    ctx.expect(
        f"the categories' sum at the peak is within {tol:g} % of the step's max_memory_allocated as recorded",
        within(total, recorded_peak, tol),
    )
    ctx.expect(
        f"the categories' sum at the peak is within {tol:g} % of a bare step's max_memory_allocated",
        within(total, bare, tol),
    )
    ctx.expect(
        f"the recorded step peak is within {tol:g} % of a bare step's max_memory_allocated",
        within(recorded_peak, bare, tol),
    )


def check_cuda_oom(ctx: Ctx) -> None:
    """A batch too large for a memory fraction fails inside ``swift_nb.profile``: the run is
    saved as ``oom`` with its post-mortem, and ``diagnosis_of`` lists fixes."""
    import torch

    import swift_nb
    from swift_nb.analysis.oom import diagnosis_of

    limit = ctx.sizes.oom_limit_bytes
    # set_per_process_memory_fraction takes an index or an indexed device, never plain 'cuda'
    index = torch.cuda.current_device() if ctx.device.index is None else ctx.device.index
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(limit / total, index)
    raised = None
    try:
        cfg = ctx.config()
        model, opt = ctx.model_and_optimizer(cfg)
        small = ctx.batch(cfg, 2)
        big = ctx.batch(cfg, ctx.sizes.oom_batch)
        prof = swift_nb.profile(out_dir=ctx.runs, label="cuda-oom")
        try:
            with prof:
                train(model, opt, *small, 2)  # two steps fit; the third asks for too much
                train(model, opt, *big, 1)
        except torch.OutOfMemoryError as e:
            raised = f"{type(e).__name__}: {str(e)[:300]}"
        del model, opt, small, big
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
        torch.cuda.empty_cache()
    restored = torch.empty(2 * limit, dtype=torch.uint8, device=ctx.device).numel() == 2 * limit
    run = swift_nb.load_run(prof.run.path)
    o, diagnosis = run.oom, diagnosis_of(run)
    ctx.details.update(
        run=str(run.path),
        fraction=limit / total,
        limit_mib=mib(limit),
        raised=raised,
        status=run.status,
        oom={k: v for k, v in asdict(o).items() if k != "top_tensors"} if o else None,
        top_tensors=o.top_tensors[:3] if o else None,
        # the post-mortem's capacity is the device's: it does not know the fraction
        capacity_is_the_fraction=bool(
            o and o.capacity_bytes and abs(o.capacity_bytes - limit) < 0.05 * limit
        ),
        diagnosis=None
        if diagnosis is None
        else {
            "need_mib": mib(diagnosis.need_bytes),
            "room_mib": mib(diagnosis.room_bytes),
            "formula": diagnosis.formula,
            "fixes": [
                {"toggle": f.toggle, "change": f.change, "need_mib": mib(f.need_bytes), "fits": f.fits}
                for f in diagnosis.fixes
            ],
            "compare_line": diagnosis.compare_line,
        },
    )
    ctx.expect("the cell raised torch.OutOfMemoryError", raised)
    ctx.expect("the run's status is oom", run.status == "oom")
    ctx.expect("run.oom is filled, on the CUDA device", o is not None and o.device.startswith("cuda"))
    ctx.expect(
        "run.oom says the request, the step, the phase and the module",
        o is not None and o.requested_bytes and o.step == 2 and o.phase and o.module,
    )
    ctx.expect(
        "run.oom has the allocator's reserved and allocated bytes",
        o and o.reserved_bytes and o.allocated_bytes,
    )
    ctx.expect("diagnosis_of(run) lists fixes", diagnosis is not None and len(diagnosis.fixes) > 0)
    ctx.expect("the memory fraction was restored (twice the limit allocates)", restored)


BACKEND_OPS = [  # torch's SDPA dispatches to one of these operators, named by its backend
    ("cudnn", "aten::_scaled_dot_product_cudnn_attention"),
    ("flash", "aten::_scaled_dot_product_flash_attention"),  # the CPU's is "…_for_cpu"
    ("efficient", "aten::_scaled_dot_product_efficient_attention"),
    ("math", "aten::_scaled_dot_product_attention_math"),
]
BACKEND_KERNELS = [  # cuDNN's kernels may say "flash" too: it is tried first
    ("cudnn", re.compile(r"cudnn.*(?:sdpa|fmha|attn|attention)", re.I)),
    ("flash", re.compile(r"flash", re.I)),
    ("efficient", re.compile(r"fmha|efficient_attention|mem_?eff", re.I)),
]
FUSED = ("flash", "efficient", "cudnn")


def sdpa_backend(trace) -> dict[str, Any]:
    """Which attention ran, read from a trace: the SDPA backend from its operators and from
    its kernels' names; ``eager`` when no SDPA operator ran at all."""
    ev = trace.events
    ops = set(ev.loc[ev["cat"] == "cpu_op", "name"])
    kernels = sorted(set(ev.loc[ev["cat"] == "kernel", "name"]))
    from_ops = next((b for b, op in BACKEND_OPS if any(o.startswith(op) for o in ops)), None)
    if from_ops is None:
        from_ops = "unknown" if any("scaled_dot_product" in o for o in ops) else "eager"
    matched = {b: [k[:160] for k in kernels if rx.search(k)] for b, rx in BACKEND_KERNELS}
    from_kernels = next((b for b, _ in BACKEND_KERNELS if matched[b]), None)
    return {
        "backend": from_kernels or from_ops,
        "from_operators": from_ops,
        "from_kernels": from_kernels,
        "sdpa_operators": sorted(o for o in ops if "scaled_dot_product" in o),
        "attention_kernels": (matched[from_kernels] if from_kernels else [])[:6],
    }


def check_flash_attention(ctx: Ctx) -> None:
    """The flash_attention toggle on the eager-attention model, in fp32 and under bf16
    autocast: which SDPA backend ran, and the step's peak with it and without."""
    import torch

    from swift_nb.analysis.trace.tables import load_trace

    cfg = ctx.config()
    variants = {
        "eager": (None, None),
        "flash_attention": (["flash_attention"], None),
        "flash_attention_bf16": (["flash_attention"], torch.bfloat16),
    }
    found: dict[str, dict[str, Any]] = {}
    for name, (toggles, autocast) in variants.items():
        model, opt = ctx.model_and_optimizer(cfg)
        x, y = ctx.batch(cfg, ctx.sizes.batch)
        run = ctx.profiled(
            name,
            lambda model=model, opt=opt, x=x, y=y, autocast=autocast: train(
                model, opt, x, y, ctx.sizes.steps, autocast
            ),
            toggles=toggles,
            namespace={"model": model, "opt": opt},
        )
        found[name] = {
            "run": str(run.path),
            **sdpa_backend(load_trace(run)),
            "step_peak_mib": mib(step_peak(run)),
            "toggle_report": run.context.get("toggles"),
            "attn_impl_after": model.config.attn_impl,
        }
    ctx.details.update(found)
    eager, flash, bf16 = (found[n] for n in variants)
    peak_ratio = (flash["step_peak_mib"] or math.nan) / (eager["step_peak_mib"] or math.nan)
    ctx.details["peak_with_over_without"] = peak_ratio
    ctx.expect("without the toggle attention runs eager (no SDPA operator)", eager["backend"] == "eager")
    ctx.expect("with the toggle a fused SDPA backend runs in fp32", flash["backend"] in FUSED)
    ctx.expect("with the toggle under bf16 autocast the flash backend runs", bf16["backend"] == "flash")
    ctx.expect("the toggle lowers the step's peak (fp32)", peak_ratio < 1.0)
    ctx.expect(
        "the toggle is undone after each run (attention back to eager)",
        all(f["attn_impl_after"] == "eager" for f in found.values()),
    )


def check_forecast(ctx: Ctx) -> None:
    """``swift_nb.forecast`` from a run at batch B, for 2B, against a run at 2B."""
    import swift_nb

    b = ctx.sizes.batch // 2
    cfg = ctx.config()
    runs = {}
    for batch in (b, 2 * b):
        model, opt = ctx.model_and_optimizer(cfg)
        x, y = ctx.batch(cfg, batch)
        runs[batch] = ctx.profiled(
            f"batch-{batch}", lambda model=model, opt=opt, x=x, y=y: train(model, opt, x, y, ctx.sizes.steps)
        )
    capacity = device_memory_bytes(ctx)
    same = swift_nb.forecast(runs[b], capacity)
    double = swift_nb.forecast(runs[b], capacity, batch_size=2 * b)
    measured = {k: {"step_peak": step_peak(r), "categories": categories_total(r)} for k, r in runs.items()}
    tol = ctx.sizes.tolerance_pct
    ctx.details.update(
        runs={k: str(r.path) for k, r in runs.items()},
        capacity_mib=mib(capacity),
        read_from_run=double.measured_config,
        measured_mib={k: {m: mib(v) for m, v in d.items()} for k, d in measured.items()},
        forecast_at_b_mib=mib(same.total_bytes),
        forecast_at_2b_mib=mib(double.total_bytes),
        forecast_at_2b_categories_mib={c: mib(v) for c, v in double.categories.items()},
        error_at_b_pct=apart_pct(same.total_bytes, measured[b]["step_peak"]),
        error_at_2b_pct=apart_pct(double.total_bytes, measured[2 * b]["step_peak"]),
        error_at_2b_vs_categories_pct=apart_pct(double.total_bytes, measured[2 * b]["categories"]),
        expected_error_pct=double.expected_error_pct,
        expected_error=double.expected_error,
        derivation=double.derivation,
        tolerance_pct=tol,
    )
    ctx.expect(f"the forecast read the run's batch ({b})", double.measured_config.get("batch_size") == b)
    ctx.expect(
        f"the forecast at B is within {tol:g} % of the measured step peak at B",
        within(same.total_bytes, measured[b]["step_peak"], tol),
    )
    ctx.expect(
        f"the forecast at 2B is within {tol:g} % of the measured step peak at 2B",
        within(double.total_bytes, measured[2 * b]["step_peak"], tol),
    )


def check_lora(ctx: Ctx) -> None:
    """A peft LoRA Llama (random weights, built from a config): the frozen base and the
    adapters by category; on CUDA the categories' sum at each recorded step's start against
    ``torch.cuda.memory_allocated()`` read at that edge (right after ``opt.step()``); and the
    forecast of 4× the batch against a run at 4× the batch."""
    import peft
    import torch
    import transformers

    import swift_nb

    seq = ctx.sizes.lora_model["max_position_embeddings"] // 2

    def build():
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(**ctx.sizes.lora_model, attn_implementation="sdpa")
        base = transformers.LlamaForCausalLM(cfg).to(ctx.device)
        lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
        model = peft.get_peft_model(base, lora)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        return model, opt

    def stored(tensors) -> int:
        ptrs = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(ptrs.values())

    runs, edges, expected = {}, {}, {}
    for batch in (ctx.sizes.lora_batch, 4 * ctx.sizes.lora_batch):
        model, opt = build()
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, ctx.sizes.lora_model["vocab_size"], (batch, seq), generator=g).to(ctx.device)
        at_edge: dict[int, int] = {}

        def cell(model=model, opt=opt, x=x, at_edge=at_edge) -> None:
            for k in range(ctx.sizes.steps):
                model(input_ids=x, labels=x).loss.backward()
                opt.step()  # swift_nb's step boundary: step k + 1 begins here
                if ctx.cuda:
                    torch.cuda.synchronize()
                    at_edge[k + 1] = torch.cuda.memory_allocated()
                opt.zero_grad(set_to_none=True)

        runs[batch] = ctx.profiled(f"lora-batch-{batch}", cell)
        edges[batch] = at_edge
        expected[batch] = {
            "frozen": stored([p for p in model.parameters() if not p.requires_grad] + list(model.buffers())),
            "adapters": stored([p for p in model.parameters() if p.requires_grad]),
        }
        del model, opt, x
        if ctx.cuda:
            torch.cuda.empty_cache()
    b = ctx.sizes.lora_batch
    run = runs[b]
    cats = run.summary.get("memory_categories_at_peak") or {}
    ft = run.context.get("finetune") or {}
    starts = run.memory.groupby("step", sort=True).first() if len(run.memory) else None
    cols = [c for c in CATEGORY_COLUMNS if starts is not None and c in starts.columns]
    at_start = {int(k): float(row[cols].sum()) for k, row in starts.iterrows()} if starts is not None else {}
    edge_pct = {k: apart_pct(v, edges[b].get(k)) for k, v in at_start.items() if k in edges[b]}
    capacity = device_memory_bytes(ctx)
    four = swift_nb.forecast(run, capacity, batch_size=4 * b)
    measured_4b = step_peak(runs[4 * b])
    tol, edge_tol = ctx.sizes.tolerance_pct, ctx.sizes.edge_tolerance_pct
    ctx.details.update(
        runs={k: str(r.path) for k, r in runs.items()},
        finetune=ft,
        expected_frozen_mib=mib(expected[b]["frozen"]),
        frozen_at_peak_mib=mib(cats.get("frozen_parameters")),
        expected_adapters_bytes=expected[b]["adapters"],
        parameters_at_peak_bytes=cats.get("parameters"),
        categories_at_peak_mib={c: mib(v) for c, v in cats.items()},
        categories_at_step_start_mib={k: mib(v) for k, v in at_start.items()},
        memory_allocated_at_edge_mib={k: mib(v) for k, v in edges[b].items()},
        edge_apart_pct=edge_pct,
        forecast_4b_mib=mib(four.total_bytes),
        forecast_4b_categories_mib={c: mib(v) for c, v in four.categories.items()},
        measured_4b_step_peak_mib=mib(measured_4b),
        forecast_4b_error_pct=apart_pct(four.total_bytes, measured_4b),
        derivation=four.derivation,
    )
    ctx.expect(
        "the run records LoRA r=8 from peft's config", ft.get("method") == "lora" and ft.get("rank") == 8
    )
    ctx.expect(
        "frozen_parameters at the peak is the frozen base's bytes (±1 %)",
        within(cats.get("frozen_parameters"), expected[b]["frozen"], 1.0),
    )
    ctx.expect(
        "parameters at the peak are the adapters' bytes", cats.get("parameters") == expected[b]["adapters"]
    )
    if ctx.cuda:
        ctx.expect(
            f"at every recorded step's start the categories sum to memory_allocated() within {edge_tol:g} %",
            bool(edge_pct) and all(v is not None and abs(v) <= edge_tol for v in edge_pct.values()),
        )
    ctx.expect(
        f"the forecast of 4× the batch is within {tol:g} % of the measured step peak",
        within(four.total_bytes, measured_4b, tol),
    )


def device_memory_bytes(ctx: Ctx) -> int:
    if ctx.cuda:
        import torch

        return int(torch.cuda.get_device_properties(ctx.device).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)


def check_cost_ratio(ctx: Ctx) -> None:
    """The median step time of a profiled cell against the same steps bare, after the
    profiler's window (wait + warmup + active steps); bare rounds before and after it."""
    import torch

    from swift_nb.demo import GPT, GPTConfig
    from swift_nb.vocabulary.options import ProfileOptions

    n = ctx.sizes.cost_steps
    torch.manual_seed(0)
    cfg = GPTConfig(**ctx.sizes.cost_model, attn_impl="sdpa")
    model = GPT(cfg).to(ctx.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    x, y = ctx.batch(cfg, ctx.sizes.cost_batch)
    train(model, opt, x, y, 10)  # warm: kernels chosen, allocator and optimizer state settled

    def bare(steps: int) -> list[float]:
        marks = [time.perf_counter()]
        train(model, opt, x, y, steps, marks=marks)
        return [b - a for a, b in itertools.pairwise(marks)]

    o = ProfileOptions()
    window = o.wait + o.warmup + o.active
    before = bare(n // 2)
    run = ctx.profiled("cost", lambda: train(model, opt, x, y, n))
    after = bare(n // 2)
    steps = run.steps[run.steps["trigger"] != "end"].sort_values("step")  # not the span after the loop
    profiled = steps["duration_s"].astype(float).tolist()
    bare_after_window = before[window:] + after[window:]
    ratio = statistics.median(profiled[window:]) / statistics.median(bare_after_window)
    ctx.details.update(
        run=str(run.path),
        steps=n,
        window_steps=window,
        bare_median_ms=1e3 * statistics.median(bare_after_window),
        profiled_median_ms=1e3 * statistics.median(profiled[window:]),
        profiled_in_window_median_ms=1e3 * statistics.median(profiled[:window]),
        profiled_last_half_median_ms=1e3 * statistics.median(profiled[n // 2 :]),
        bare_rounds_median_ms=[1e3 * statistics.median(r[window:]) for r in (before, after)],
        ratio=ratio,
        ratio_limit=ctx.sizes.cost_limit,
        hook_overhead_ms_median=1e3 * float(run.steps["overhead_s"].median()),
    )
    ctx.expect("the profiled run recorded every step", len(profiled) >= n)
    if ctx.sizes.cost_limit is None:
        ctx.expect("a cost ratio was measured", math.isfinite(ratio) and ratio > 0)
    else:
        ctx.expect(
            f"the profiled cell's median step after the window is under {ctx.sizes.cost_limit}x the bare one's",
            ratio < ctx.sizes.cost_limit,
        )


def check_energy(ctx: Ctx) -> None:
    """Energy per step from NVML's total energy counter: gpuN_energy_j in run.samples, the
    summary's energy_j, energy_per_step_j and avg_power_w, the power within the card's
    enforced limit, and the counter's joules against the sampled power integrated."""
    import pynvml
    import torch

    from swift_nb.capture.resources.sampler import _nvml_handle
    from swift_nb.demo import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(**ctx.sizes.cost_model, attn_impl="sdpa")
    model = GPT(cfg).to(ctx.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    x, y = ctx.batch(cfg, ctx.sizes.cost_batch)
    train(model, opt, x, y, 5)
    run = ctx.profiled(
        "energy", lambda: train(model, opt, x, y, ctx.sizes.energy_steps), interval_ms=50, price_per_kwh=0.2
    )
    pynvml.nvmlInit()
    try:
        limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(_nvml_handle(pynvml, ctx.device.index or 0)) / 1000.0
    finally:
        pynvml.nvmlShutdown()
    s, samples = run.summary, run.samples
    energy_cols = [c for c in samples.columns if re.fullmatch(r"gpu\d+_energy_j", c)]
    power_cols = [c.replace("_energy_j", "_power_w") for c in energy_cols]
    t = samples["t_s"].astype(float)
    integrated = sum(
        float(
            (
                (samples[p].iloc[1:].to_numpy() + samples[p].iloc[:-1].to_numpy())
                / 2
                * t.diff().iloc[1:].to_numpy()
            ).sum()
        )
        for p in power_cols
    )
    ctx.details.update(
        run=str(run.path),
        steps=len(run.steps),
        energy_columns=energy_cols,
        energy_j=s.get("energy_j"),
        energy_per_step_j=s.get("energy_per_step_j"),
        avg_power_w=s.get("avg_power_w"),
        power_w_max=max((float(samples[p].max()) for p in power_cols), default=None),
        power_limit_w=limit_w,
        power_integrated_j=integrated,
        energy_cost_usd=s.get("energy_cost_usd"),
        notes=[n for n in run.notes if "energy" in n or "RAPL" in n],
    )
    ctx.expect("run.samples has gpuN_energy_j", bool(energy_cols))
    ctx.expect(
        "each GPU's energy only grows", all(samples[c].dropna().is_monotonic_increasing for c in energy_cols)
    )
    ctx.expect("energy per step > 0", (s.get("energy_per_step_j") or 0) > 0)
    ctx.expect(
        "the run's energy > 0 and priced",
        (s.get("energy_j") or 0) > 0 and s.get("energy_cost_usd") is not None,
    )
    ctx.expect(
        "the average power is within the card's enforced limit",
        0 < (s.get("avg_power_w") or 0) <= limit_w * 1.02,
    )
    ctx.expect(
        "NVML's counter is read (no power integration note)",
        not any("no total energy counter" in n for n in run.notes),
    )
    ctx.expect(
        "the counter's joules are within 25 % of the sampled power integrated",
        within(s.get("energy_j"), integrated, 25.0),
    )


DEVICE_FIGURES = ("device_idle_pct", "device_compute_pct", "device_non_compute_pct")


def check_import_trace(ctx: Ctx) -> None:
    """A profiled run's own trace imported as a run and analyzed: the device's figures, the
    verdict and the findings, against the captured run's own analysis."""
    import swift_nb
    from swift_nb.analysis import analyze
    from swift_nb.analysis.trace.tables import load_trace

    cfg = ctx.config()
    model, opt = ctx.model_and_optimizer(cfg)
    x, y = ctx.batch(cfg, ctx.sizes.batch)
    run = ctx.profiled("captured", lambda: train(model, opt, x, y, ctx.sizes.steps))
    imported = swift_nb.import_trace(run.trace_path, ctx.runs / "imported", label="imported")
    a, captured = analyze(imported), analyze(run)
    traced = len(load_trace(run).steps)
    ctx.details.update(
        run=str(run.path),
        imported=str(imported.path),
        traced_steps=traced,
        imported_steps=len(imported.steps),
        device=a.device,
        captured_device=captured.device,
        kernel_kinds=a.kernel_kinds.to_dict("records")[:10],
        idle_causes=a.idle_causes.to_dict("records")[:10],
        verdict={"kind": a.verdict.kind, "reason": a.verdict.reason},
        captured_verdict={"kind": captured.verdict.kind, "reason": captured.verdict.reason},
        findings=[{"id": f.id, "title": f.title, "toggle": f.toggle} for f in a.findings],
        captured_findings=[f.id for f in captured.findings],
    )
    ctx.expect("the import holds every traced step", traced > 0 and len(imported.steps) == traced)
    ctx.expect("report.html was written for the import", (imported.path / "report.html").exists())
    if ctx.cuda:
        ctx.expect(
            "analysis.device has the idle, compute and non-compute percentages",
            all(isinstance(a.device.get(k), float) for k in DEVICE_FIGURES),
        )
    ctx.expect(
        "the import's device figures are the captured run's (±0.5 points)",
        all(same_figure(a.device.get(k), captured.device.get(k)) for k in DEVICE_FIGURES),
    )
    ctx.expect("a verdict was drawn", bool(a.verdict.kind and a.verdict.reason))


def same_figure(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= 0.5)


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    run: Callable[[Ctx], None]
    cuda_only: bool
    limit_s: float  # on a GPU; the smoke's sizes take far less


CHECKS = [
    Check(
        "quickstart_nvml",
        "the quickstart's profiled cell on CUDA, with NVML series in run.samples",
        check_quickstart_nvml,
        cuda_only=True,
        limit_s=120,
    ),
    Check(
        "max_memory_allocated",
        "torch.cuda.max_memory_allocated against the run's memory categories at the peak",
        check_max_memory,
        cuda_only=True,
        limit_s=90,
    ),
    Check(
        "cuda_oom",
        "a CUDA out-of-memory post-mortem under torch.cuda.set_per_process_memory_fraction",
        check_cuda_oom,
        cuda_only=True,
        limit_s=90,
    ),
    Check(
        "energy",
        "energy per step from NVML's total energy counter, the power within the card's limit",
        check_energy,
        cuda_only=True,
        limit_s=90,
    ),
    Check(
        "flash_attention",
        "the flash_attention toggle: the SDPA backend that runs, and the peak with vs without",
        check_flash_attention,
        cuda_only=False,
        limit_s=150,
    ),
    Check(
        "forecast",
        "the forecast from a run at batch B against the measured peak at 2B",
        check_forecast,
        cuda_only=False,
        limit_s=120,
    ),
    Check(
        "lora",
        "a peft LoRA model: frozen base and adapters by category, memory_allocated at step edges, 4x batch forecast",
        check_lora,
        cuda_only=False,
        limit_s=150,
    ),
    Check(
        "cost_ratio",
        "a profiled cell's cost: median step time profiled vs bare, after the profiler's window",
        check_cost_ratio,
        cuda_only=False,
        limit_s=150,
    ),
    Check(
        "import_trace",
        "the run's own trace imported and analyzed: device figures, verdict and findings",
        check_import_trace,
        cuda_only=False,
        limit_s=120,
    ),
]
BY_NAME = {c.name: c for c in CHECKS}


# -- in a child: one check, or the environment ---------------------------------------------------


def environment() -> dict[str, Any]:
    """The versions and the device the checks ran on."""
    import torch

    facts: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    for dist, module in (("swift_nb", "swift_nb"), ("nvidia-ml-py", "pynvml"), ("orjson", "orjson")):
        facts[dist] = _version_of(dist, module)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(
            device_count=torch.cuda.device_count(),
            device=props.name,
            capability=f"{props.major}.{props.minor}",
            device_memory_bytes=int(props.total_memory),
            cudnn=torch.backends.cudnn.version(),
            nccl=_attempt(lambda: ".".join(map(str, _tuple(torch.cuda.nccl.version())))),
            driver=_attempt(_driver_version),
        )
    return facts


def _version_of(dist: str, module: str) -> str:
    """The installed version of ``dist``, or what stands in for it (gpu_check.sh's orjson)."""
    from importlib import metadata

    try:
        m = __import__(module)
    except Exception as e:
        return f"not importable ({type(e).__name__}: {e})"
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return (
            getattr(m, "__version__", None) or f"importable, not installed ({getattr(m, '__file__', None)})"
        )


def _tuple(v: Any) -> tuple:
    return v if isinstance(v, tuple) else (v,)


def _driver_version() -> str:
    import pynvml

    pynvml.nvmlInit()
    try:
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    finally:
        pynvml.nvmlShutdown()


def _attempt(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:
        return f"unknown ({type(e).__name__}: {e})"


def run_one(name: str, runs: Path, smoke: bool) -> dict[str, Any]:
    """One check in this process: its record (never raises)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    check = BY_NAME[name]
    record = {"name": name, "title": check.title, "ok": False, "skipped": None, "seconds": 0.0, "error": None}
    t0 = time.perf_counter()
    ctx, stopped = None, None
    try:
        import torch

        device = torch.device("cpu" if smoke else "cuda")
        ctx = Ctx(device, SMOKE_SIZES if smoke else GPU_SIZES, runs)
        check.run(ctx)
        failed = [s for s, held in ctx.held.items() if not held]
        record["ok"] = not failed
        record["error"] = "did not hold: " + "; ".join(failed) if failed else None
    except BaseException as e:  # recorded: the statements tested until then stay in details
        record["error"] = f"{type(e).__name__}: {e}"[:2000]
        stopped = traceback.format_exc()[-6000:]
    record["seconds"] = round(time.perf_counter() - t0, 2)
    record["details"] = {"held": ctx.held, **ctx.details} if ctx is not None else {}
    if stopped is not None:
        record["details"]["traceback"] = stopped
    return record


# -- in the parent: every check in a child, the JSON after each ----------------------------------


def clean(obj: Any) -> Any:
    """``obj`` as plain JSON: numpy and pandas scalars as numbers, NaN as null, paths as text."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and not isinstance(obj, (str, bytes)):
        try:
            obj = obj.item()
        except (TypeError, ValueError):
            return str(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)


def write_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(clean(doc), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def in_child(name: str, out: Path, smoke: bool, limit_s: float) -> tuple[dict[str, Any] | None, str | None]:
    """Run ``--one name`` in a child process of its own under ``limit_s``: (its record,
    None), or (None, why there is none: killed at its limit, or ended without one)."""
    (out / "logs").mkdir(exist_ok=True)
    result = out / "results" / f"{name}.json"
    result.parent.mkdir(exist_ok=True)
    result.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), str(out), "--one", name]
    log_path = out / "logs" / f"{name}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd + (["--cpu-smoke"] if smoke else []),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed whole at its limit
        )
        try:
            proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None, f"killed at its time limit of {limit_s:.0f} s (log: {log_path})"
    if result.exists():
        return json.loads(result.read_text(encoding="utf-8")), None
    tail = log_path.read_text(errors="replace")[-1500:]
    return None, f"the child ended with exit code {proc.returncode} and no result; its log ends: {tail}"


def run_all(out: Path, smoke: bool, budget_s: float, only: list[str] | None = None) -> int:
    """Every check (or those named in ``only``), each in a child; the JSON rewritten after
    each. Exit status 0 when every check that ran held, 1 otherwise."""
    start = time.monotonic()
    checks = [c for c in CHECKS if not only or c.name in only]
    doc: dict[str, Any] = {
        "mode": "cpu-smoke" if smoke else "cuda",
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "finished_at": None,
        "complete": False,
        "budget_s": budget_s,
        "setup": os.environ.get("SWIFT_NB_GPU_CHECK_SETUP", "").splitlines(),  # what gpu_check.sh did
        "environment": {},
        "checks": [],
        "pending": [c.name for c in checks],
        "summary": {},
    }
    path = out / RESULT_FILE
    write_json(path, doc)
    env, why = in_child(ENVIRONMENT, out, smoke, ENVIRONMENT_LIMIT_S)
    doc["environment"] = env if env is not None else {"error": why}
    cuda = bool(doc["environment"].get("cuda_available"))
    print(f"environment: {json.dumps(clean(doc['environment']))}", flush=True)
    write_json(path, doc)
    for check in checks:
        left = budget_s - (time.monotonic() - start)
        record = _record(check, out, smoke, cuda, left)
        doc["checks"].append(record)
        doc["pending"].remove(check.name)
        doc["summary"] = summary(doc["checks"])
        write_json(path, doc)
        print(_line(record), flush=True)
    doc.update(complete=True, finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    doc["wall_s"] = round(time.monotonic() - start, 1)
    write_json(path, doc)
    s = doc["summary"]
    print(f"{s['held']} held, {s['failed']} failed, {s['skipped']} skipped in {doc['wall_s']} s; {path}")
    return 0 if s["failed"] == 0 and (smoke or cuda) else 1


def _record(check: Check, out: Path, smoke: bool, cuda: bool, left_s: float) -> dict[str, Any]:
    base = {
        "name": check.name,
        "title": check.title,
        "ok": None,
        "skipped": None,
        "seconds": 0.0,
        "error": None,
    }
    if check.cuda_only and (smoke or not cuda):
        return {**base, "skipped": "no CUDA device" if not cuda else "--cpu-smoke: CPU only", "details": {}}
    if left_s < MIN_START_S:
        why = f"not started: {left_s:.0f} s of the overall budget were left"
        return {**base, "ok": False, "error": why, "details": {}}
    t0 = time.monotonic()
    record, why = in_child(check.name, out, smoke, min(check.limit_s, left_s))
    if record is None:
        return {**base, "ok": False, "seconds": round(time.monotonic() - t0, 2), "error": why, "details": {}}
    return record


def summary(checks: list[dict[str, Any]]) -> dict[str, int]:
    return {
        "held": sum(c["ok"] is True for c in checks),
        "failed": sum(c["ok"] is False for c in checks),
        "skipped": sum(c["skipped"] is not None for c in checks),
    }


def _line(record: dict[str, Any]) -> str:
    if record["skipped"]:
        return f"[skipped] {record['name']}: {record['skipped']}"
    mark = "ok" if record["ok"] else "FAILED"
    text = f"[{mark}] {record['name']} ({record['seconds']} s): {record['title']}"
    return text + (f"\n    {record['error']}" if record.get("error") else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for gpu_check.json, the logs and the run folders")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU: tests this script")
    parser.add_argument(
        "--budget-s", type=float, default=DEFAULT_BUDGET_S, help="all checks together, seconds"
    )
    parser.add_argument("--one", choices=[ENVIRONMENT, *BY_NAME], help=argparse.SUPPRESS)
    parser.add_argument("--only", default="", help="comma-separated check names: run these alone")
    args = parser.parse_args(argv)
    only = [n for n in args.only.split(",") if n]
    unknown = [n for n in only if n not in BY_NAME]
    if unknown:
        parser.error(f"no check named {', '.join(unknown)}; checks are {', '.join(BY_NAME)}")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.one is None:
        return run_all(out, args.cpu_smoke, args.budget_s, only)
    if args.one == ENVIRONMENT:
        record = environment()
    else:
        record = run_one(args.one, out / "runs" / args.one, args.cpu_smoke)
    write_json(out / "results" / f"{args.one}.json", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
