"""The ``lora`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

from typing import Any

from ..common import CATEGORY_COLUMNS, Ctx, apart_pct, device_memory_bytes, mib, step_peak, within

TITLE = (
    "a peft LoRA model: frozen base and adapters by category, memory_allocated at step edges, "
    "4x batch forecast"
)


def check(ctx: Ctx) -> None:
    """A peft LoRA Llama (random weights, built from a config): the frozen base and the
    adapters by category; on CUDA the categories' sum at each recorded step's start against
    ``torch.cuda.memory_allocated()`` read at that edge (right after ``opt.step()``); and the
    forecast of 4× the batch against a run at 4× the batch."""
    import swift_nb

    runs, edges, expected = {}, {}, {}
    for batch in (ctx.sizes.lora_batch, 4 * ctx.sizes.lora_batch):
        runs[batch], edges[batch], expected[batch] = profiled_at(ctx, batch)
    b = ctx.sizes.lora_batch
    run = runs[b]
    cats = run.summary.get("memory_categories_at_peak") or {}
    ft = run.context.get("finetune") or {}
    at_start = categories_at_step_start(run)
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


def build(ctx: Ctx):
    """The LoRA Llama of ``ctx.sizes.lora_model`` on the device, and AdamW over its adapters."""
    import peft
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**ctx.sizes.lora_model, attn_implementation="sdpa")
    base = transformers.LlamaForCausalLM(cfg).to(ctx.device)
    lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(base, lora)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model, opt


def stored(tensors) -> int:
    """The bytes of the storages behind ``tensors``, each storage once."""
    ptrs = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(ptrs.values())


def profiled_at(ctx: Ctx, batch: int) -> tuple[Any, dict[int, int], dict[str, int]]:
    """A fresh LoRA model trained ``ctx.sizes.steps`` steps at ``batch`` under the profiler:
    the run; on CUDA ``memory_allocated()`` at each step edge (step → bytes); the frozen
    base's and the adapters' bytes."""
    import torch

    seq = ctx.sizes.lora_model["max_position_embeddings"] // 2
    model, opt = build(ctx)
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

    run = ctx.profiled(f"lora-batch-{batch}", cell)
    expected = {
        "frozen": stored([p for p in model.parameters() if not p.requires_grad] + list(model.buffers())),
        "adapters": stored([p for p in model.parameters() if p.requires_grad]),
    }
    del model, opt, x
    if ctx.cuda:
        torch.cuda.empty_cache()
    return run, at_edge, expected


def categories_at_step_start(run) -> dict[int, float]:
    """The memory categories' sum at each recorded step's first memory sample (step → bytes)."""
    starts = run.memory.groupby("step", sort=True).first() if len(run.memory) else None
    cols = [c for c in CATEGORY_COLUMNS if starts is not None and c in starts.columns]
    return {int(k): float(row[cols].sum()) for k, row in starts.iterrows()} if starts is not None else {}
