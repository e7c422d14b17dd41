"""The ``model_forecast`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

from ..common import Ctx, apart_pct, device_memory_bytes, mib, step_peak, within

TITLE = "a 1B Llama forecast from its config (a smaller proxy profiled on the card) against its measured peak"

#: Llama-3.2-1B's shape (random weights); the proxy a quarter of its width and layers
GPU_TARGET = {
    "vocab_size": 128_256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": True,
}
GPU_PROXY = {
    **GPU_TARGET,
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
}
SMOKE_TARGET = {
    "vocab_size": 2000,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
SMOKE_PROXY = {**SMOKE_TARGET, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2}
TOLERANCE_PCT = 5.0


def check(ctx: Ctx) -> None:
    """A Llama config of Llama-3.2-1B's shape (random weights; the smoke: a tiny one) in bf16
    on CUDA (fp32 off it) with AdamW, at 4 × 2048 tokens (the smoke: 2 × 128): forecast by
    ``swift_nb.forecast(proxy, model=config)`` from one step on fake tensors, a proxy of a
    quarter of its width and layers profiled on the same card first (its carried bytes and
    its own fake step's ratio), then profiled itself: the forecast within 5 % of its measured
    step peak, the parameters exact, and the fake step within the time the card's run took."""
    import time

    import swift_nb

    cuda = ctx.cuda
    dtype = "bfloat16" if cuda else "float32"
    b, t = (4, 2048) if cuda else (2, 128)
    proxy = _profiled(ctx, "proxy", SMOKE_PROXY if not cuda else GPU_PROXY, dtype, b // 2 or 1, t // 2)
    target_cfg = _config(GPU_TARGET if cuda else SMOKE_TARGET)
    t0 = time.perf_counter()
    f = swift_nb.forecast(
        proxy,
        device_memory_bytes(ctx),
        model=target_cfg,
        batch_size=b,
        seq_len=t,
        dtype=dtype,
        progress=False,
    )
    fake_s = time.perf_counter() - t0
    target = _profiled(ctx, "target", GPU_TARGET if cuda else SMOKE_TARGET, dtype, b, t)
    measured = step_peak(target)
    params = int(target.context.get("params") or 0)
    ctx.details.update(
        proxy_run=str(proxy.path),
        target_run=str(target.path),
        shape={"batch": b, "seq": t, "dtype": dtype},
        forecast_mib=mib(f.total_bytes),
        forecast_categories_mib={c: mib(v) for c, v in f.categories.items()},
        measured_step_peak_mib=mib(measured),
        measured_categories_mib={
            c: mib(v) for c, v in (target.summary.get("memory_categories_at_peak") or {}).items()
        },
        error_pct=apart_pct(f.total_bytes, measured),
        fake_step_s=round(fake_s, 2),
        derivation=f.derivation,
    )
    ctx.expect(
        f"the forecast from the config is within {TOLERANCE_PCT:g} % of the measured step peak",
        within(f.total_bytes, measured, TOLERANCE_PCT),
    )
    ctx.expect(
        "the forecast's parameters are the model's, exactly",
        not params or f.categories["parameters"] == params * (2 if cuda else 4),
    )
    ctx.expect(
        "the proxy's own fake step was compared with its measurement",
        any(line.startswith("the proxy's own step on fake tensors counts") for line in f.derivation),
    )


def _config(fields):
    import transformers

    return transformers.LlamaConfig(**fields)


def _profiled(ctx: Ctx, name: str, fields, dtype: str, batch: int, seq: int):
    """The config's model trained on the device (AdamW, foreach: torch's CUDA default, and
    what the forecast assumes) under ``swift_nb.profile``."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config(fields)).to(ctx.device, getattr(torch, dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, fields["vocab_size"], (batch, seq), generator=g).to(ctx.device)

    held = {"model": model, "opt": opt}

    def cell() -> None:
        for _ in range(ctx.sizes.steps):
            held["model"](input_ids=ids, labels=ids).loss.backward()
            held["opt"].step()
            held["opt"].zero_grad()

    run = ctx.profiled(f"model-forecast-{name}", cell, namespace=held)
    del model, opt
    held.clear()  # the card's memory free for the next model
    if ctx.cuda:
        torch.cuda.empty_cache()
    return run
