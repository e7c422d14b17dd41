"""``forecast()``: the arguments checked, the run measured, its growth found, the
configuration priced, the largest batch and sequence that fit searched for, and how far off
the total may be.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from swift_nb import vocabulary
from swift_nb.analysis import cost
from swift_nb.analysis.effects import OPTIMIZERS, Applied
from swift_nb.analysis.forecast.growth import growth
from swift_nb.analysis.forecast.measure import Measured, measure
from swift_nb.analysis.forecast.pricing import CategoryPricer
from swift_nb.analysis.forecast.result import SEARCH_LIMIT, Config, Forecast, Peak
from swift_nb.core.devices import (
    DEFAULT_DEVICE,
    DEVICES,
    ENV_PRICE_PER_HOUR,
    Device,
    price_of,
    resolve_device,
)
from swift_nb.core.errors import ConfigError, check_whole
from swift_nb.core.units import fmt_bytes, fmt_seconds
from swift_nb.record import Run, finetune_label
from swift_nb.vocabulary.forecast_spec import dtype_name, parse_toggles, toggle_label

#: How far off the total is expected to be (± %). Forecasts of another batch, sequence,
#: dtype or optimizer came within 0.5 % of the measured peak in benchmarks/forecast.py
#: (four models on CPU, 4× the batch, 2× the sequence, bf16, SGD); 5 % leaves room for what a
#: CPU run does not show (the CUDA allocator's 512-byte rounding, cuBLAS and cuDNN
#: workspaces). Each toggle adds its vocabulary entry's ``forecast_error_pct``.
ERROR_BASE_PCT = 5.0
ERROR_NO_TRACE_PCT = 10.0  # [.., T, T] tensors unseen: a longer sequence scaled linearly
ERROR_FAR_PCT = 5.0  # more than 16× the run's tokens per step


def forecast(
    run: Run | Measured,
    device: str | float = DEFAULT_DEVICE,
    batch_size: int | None = None,
    seq_len: int | None = None,
    dtype: str | None = None,
    toggles: str | Sequence[str] | Mapping[str, Mapping[str, Any]] = (),
    world_size: int | None = None,
    calibration: Run | Measured | None = None,
    optimizer: str | None = None,
    steps: int | None = None,
    price_per_hour: float | None = None,
) -> Forecast:
    """The peak tensor memory of a training step of ``run``'s model at ``batch_size``
    samples (per rank) of ``seq_len`` tokens, parameters in ``dtype``, with ``optimizer``
    and ``toggles``, over ``world_size`` ranks, on ``device``. Unset arguments are the run's
    own.

    Args:
        run: the run whose model is forecast (a Run, or what ``measure`` read of one).
        device: a preset of ``DEVICES``, a number of bytes, ``"80GB"`` or ``"24GiB"`` (default
            ``DEFAULT_DEVICE``, ``"A100-80GB"``).
        batch_size: samples per rank.
        seq_len: tokens per sample.
        dtype: the parameters' dtype.
        toggles: ``"grad_checkpointing"``, ``"flash_attention"``, ``"galore:rank=128"``,
            ``"sequence_parallel:sp_size=4"``, ``"bf16_autocast"``, ``"zero:stage=2"``,
            ``"fsdp"``, ``"lora(r=16)"``: the model's weights frozen and adapters trained,
            ``"qlora(r=16)"``: the same on a 4-bit base; on a LoRA run, another rank of its
            adapters (a string, a sequence of them, or ``{id: params}``; default none).
        world_size: the ranks the step is spread over.
        calibration: a run of the same model at another batch size or sequence length, to fit
            how activations grow instead of reading it from the trace.
        optimizer: a class name (default the run's).
        steps: price that many steps on ``device`` (``Forecast.cost_usd``) at ``price_per_hour``
            per device.
        price_per_hour: USD per device-hour (default ``$SWIFT_NB_PRICE_PER_HOUR``, else the
            device's list price: ``swift_nb.core.devices.PRICES_PER_HOUR``).

    Returns:
        A ``Forecast``: the peak by category, whether it fits on ``device``, the largest batch
        and sequence that fit, how far off the total may be, and (``steps``) the cost.

    Raises:
        ConfigError: a bad argument, or a run without memory categories.
    """
    dev = resolve_device(device)
    price_per_hour = cost.check_price("price_per_hour", price_per_hour)
    _check_positive(steps=steps)
    wanted = parse_toggles(toggles)
    _check_positive(batch_size=batch_size, seq_len=seq_len, world_size=world_size)
    dtype = dtype_name(dtype) if dtype is not None else None
    if optimizer is not None and optimizer not in OPTIMIZERS:
        raise ConfigError("optimizer", f"must be one of {', '.join(OPTIMIZERS)}", optimizer)
    m = run if isinstance(run, Measured) else measure(run)
    cal = calibration if isinstance(calibration, Measured) or calibration is None else measure(calibration)
    _check_against_run(m, cal, batch_size, seq_len)
    cfg = replace(
        _config(m, wanted, batch_size, seq_len, dtype, optimizer, world_size), cuda=target_is_cuda(m, dev)
    )
    pricer = CategoryPricer(m, growth(m, cal))
    peak = pricer.peak(cfg)
    usable = float(dev.capacity_bytes - dev.context_bytes)

    def fits(c: Config) -> bool:
        return pricer.peak(c).total <= usable

    max_batch = _largest(lambda b: fits(replace(cfg, batch_size=b)), cfg.batch_size) if m.batch_size else None
    max_seq = _largest(lambda t: fits(replace(cfg, seq_len=t)), cfg.seq_len) if m.seq_len else None
    out = _result(m, dev, cfg, peak, (max_batch, max_seq), _expected_error(m, cal, cfg))
    if steps is None:
        return out
    return priced(out, m, steps, m.step_s, price_per_hour)


def target_is_cuda(m: Measured, dev: Device | None) -> bool:
    """Whether the target runs CUDA's implementations (Liger's chunked loss, bitsandbytes'
    in-place 8-bit update) or the CPU's: a GPU preset is a GPU, ``"cpu"`` the CPU, a
    capacity alone (or no device) the run's own device."""
    if dev is not None and dev.kind == "cpu":
        return False
    if dev is not None and dev.name in DEVICES:
        return True
    return m.on_cuda


def _device_price(device: str, given: float | None) -> tuple[float | None, str]:
    """(USD per hour of one ``device``, where it comes from): given, else
    ``$SWIFT_NB_PRICE_PER_HOUR``, else its list price; (None, "") without any."""
    if given is not None:
        return given, "given"
    env = cost.check_price(ENV_PRICE_PER_HOUR, os.environ.get(ENV_PRICE_PER_HOUR) or None)
    if env is not None:
        return env, f"${ENV_PRICE_PER_HOUR}"
    listed = price_of(device)
    return (listed.usd_per_hour, f"{listed.source}, {listed.as_of}") if listed else (None, "")


def priced(fc: Forecast, m: Measured, steps: int, run_step_s: float | None, given: float | None) -> Forecast:
    """``fc`` with ``steps`` steps priced on its device: the run's median step scaled by the
    tokens per step (batch × sequence), over its ranks, at the given price, else
    ``$SWIFT_NB_PRICE_PER_HOUR``, else the device's list price."""

    def tokens(batch: int | None, seq: int | None) -> int:  # samples when there is no sequence
        return (batch or 1) * (seq or 1)

    scale = tokens(fc.batch_size, fc.seq_len) / tokens(m.batch_size or fc.batch_size, m.seq_len or fc.seq_len)
    step_s = run_step_s * scale if run_step_s else None
    price, source = _device_price(fc.device, given)
    if step_s is None or price is None:
        missing = (
            "the run has no step time"
            if step_s is None
            else f"no price for {fc.device}: give price_per_hour="
        )
        return replace(
            fc, steps=steps, step_s=step_s, derivation=[*fc.derivation, f"cost of {steps:,} steps: {missing}"]
        )
    usd = cost.cost_usd(steps * step_s, fc.world_size, price)
    line = (
        f"cost of {steps:,} steps: {fmt_seconds(step_s)} per step (the run's median {fmt_seconds(run_step_s)} × "
        f"{scale:.3g}, its tokens per step) × {fc.world_size} device(s) at {cost.fmt_usd(price)}/h ({source}) = "
        f"{cost.fmt_usd(usd)}; the step time on {fc.device} itself is not predicted"
    )
    return replace(
        fc, steps=steps, step_s=step_s, price_per_hour=price, cost_usd=usd, derivation=[*fc.derivation, line]
    )


def _config(
    m: Measured,
    wanted: dict[str, dict[str, int]],
    batch_size: int | None,
    seq_len: int | None,
    dtype: str | None,
    optimizer: str | None,
    world_size: int | None,
) -> Config:
    """The configuration to price: the arguments given, the run's own for the rest; checks
    what the toggles need of it."""
    world = target_world(m.world_size, wanted, world_size)
    applied = Applied(wanted)
    if "lora" in wanted and "qlora" in wanted:
        raise ConfigError(
            "toggles", "take one of lora and qlora (qlora is LoRA on a 4-bit base)", "lora,qlora"
        )
    if applied.lora is not None and applied.galore_rank is not None:
        raise ConfigError(
            "toggles",
            f"take one of galore and {applied.lora.name}: both shrink what the optimizer keeps, and GaLore "
            "projects the weights LoRA freezes",
            f"galore,{applied.lora.name}",
        )
    if applied.checkpointing and m.blocks < 1:
        raise ConfigError(
            "toggles",
            "gradient checkpointing needs the number of repeated blocks, and the trace shows no attention "
            "layers: profile with context={'n_layer': L}",
            ",".join(wanted),
        )
    return Config(
        batch_size=batch_size or m.batch_size or 1,
        seq_len=seq_len or m.seq_len or 1,
        dtype=dtype or m.dtype,
        optimizer=optimizer or m.optimizer,
        toggles=wanted,
        world_size=world,
    )


def target_world(run_world: int, wanted: Mapping[str, Mapping[str, Any]], world_size: int | None) -> int:
    """The ranks a configuration runs on: ``world_size``, else the run's; a one-process run
    sharded as a variant would be, over the variant's ranks. A ``ConfigError`` when the
    toggles shard over fewer than 2."""
    world = world_size or run_world
    if world_size is None and run_world == 1:
        world = max([world, *_variant_ranks(wanted)])
    if Applied(wanted).shard_stage and world < 2:
        raise ConfigError("world_size", f"must be at least 2 to shard with {', '.join(wanted)}", world)
    return world


def _variant_ranks(wanted: Mapping[str, Mapping[str, Any]]) -> list[int]:
    """The ranks the toggles' variants run on (``fsdp(world_size=4)``: 4)."""
    ranks = []
    for toggle, params in wanted.items():
        processes = vocabulary.entry(toggle).processes
        if processes == "world_size" and processes in params:
            ranks.append(int(params[processes]))
    return ranks


def _result(
    m: Measured,
    dev: Device,
    cfg: Config,
    peak: Peak,
    limits: tuple[int | None, int | None],
    error: tuple[float, str],
) -> Forecast:
    """The forecast of ``cfg`` on ``dev``: its priced peak, the largest batch and sequence
    that fit (``limits``) and the expected error (± %, why)."""
    usable = float(dev.capacity_bytes - dev.context_bytes)
    notes = [*m.notes]
    already = sorted(set(cfg.toggles) & m.toggles)
    if already:
        notes.append(f"the run already had {', '.join(already)}: its measurement includes the effect")
    return Forecast(
        run_id=m.run_id,
        device=dev.name,
        capacity_bytes=float(dev.capacity_bytes),
        context_bytes=float(dev.context_bytes),
        batch_size=cfg.batch_size,
        seq_len=cfg.seq_len if m.seq_len else None,
        dtype=cfg.dtype,
        optimizer=cfg.optimizer,
        toggles=tuple(toggle_label(k, v) for k, v in cfg.toggles.items()),
        world_size=cfg.world_size,
        categories=peak.categories,
        total_bytes=peak.total,
        usable_bytes=usable,
        fits=peak.total <= usable,
        headroom_bytes=usable - peak.total,
        max_batch_size=limits[0],
        max_seq_len=limits[1],
        derivation=[
            *peak.lines,
            f"device: {dev.name}, {fmt_bytes(dev.capacity_bytes)} ({dev.source}) − CUDA context "
            f"{fmt_bytes(dev.context_bytes)} = {fmt_bytes(usable)} for tensors",
            *notes,
        ],
        expected_error_pct=error[0],
        expected_error=error[1],
        measured={c: v for c, v in m.categories.items() if m.frozen_measured or c != "frozen_parameters"},
        measured_config={
            "batch_size": m.batch_size,
            "seq_len": m.seq_len,
            "dtype": m.dtype,
            "optimizer": m.optimizer,
            "world_size": m.world_size,
            "finetune": finetune_label(m.finetune),
        },
        device_source=dev.source,
    )


def _check_positive(**values: int | None) -> None:
    for name, value in values.items():
        if value is not None:
            check_whole(name, value)


def _check_against_run(
    m: Measured, cal: Measured | None, batch_size: int | None, seq_len: int | None
) -> None:
    if batch_size is not None and batch_size != m.batch_size and m.batch_size is None:
        raise ConfigError(
            "batch_size",
            "cannot be forecast: the run's batch size is unknown (no token or linear input in the trace); "
            "profile with context={'batch_size': B}",
            batch_size,
        )
    if seq_len is not None and seq_len != m.seq_len and m.seq_len is None:
        raise ConfigError(
            "seq_len",
            "cannot be forecast: the run's sequence length is unknown (no [batch, seq] token input in the "
            "trace); profile with context={'seq_len': T}",
            seq_len,
        )
    if cal is None:
        return
    if cal.shape == m.shape:
        raise ConfigError(
            "calibration", "must be a run at another batch size or sequence length than the run", cal.run_id
        )
    if m.params and abs(cal.params - m.params) > 0.1 * m.params:
        raise ConfigError(
            "calibration",
            f"must be a run of the same model ({m.params:,} parameters; it has {cal.params:,})",
            cal.run_id,
        )


def _largest(fits: Callable[[int], bool], start: int) -> int | None:
    """The largest n ≥ 1 with fits(n) (fits grows false with n): 0 when not even 1 fits, None
    when n = SEARCH_LIMIT still does."""
    if not fits(1):
        return 0
    lo, hi = 1, max(2, start)
    while fits(hi):
        if hi >= SEARCH_LIMIT:
            return None
        lo, hi = hi, min(SEARCH_LIMIT, hi * 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _expected_error(m: Measured, cal: Measured | None, cfg: Config) -> tuple[float, str]:
    """± % on the total, and why."""
    text = (
        f"± {ERROR_BASE_PCT:.0f} % for the sizes: forecasts of another batch, sequence, dtype or optimizer came "
        "within 0.5 % of the measured peak in benchmarks/forecast.py (four models on CPU), and a GPU adds its "
        "allocator's rounding and library workspaces; parameters, gradients and optimizer state are exact, "
        "activations extrapolated."
    )
    added = {
        t: vocabulary.TOGGLES[t].forecast_error_pct
        for t in cfg.toggles
        if vocabulary.TOGGLES[t].forecast_error_pct and t not in m.toggles
    }
    b0, t0 = m.shape
    stretch = (cfg.batch_size * (cfg.seq_len if m.seq_len else 1)) / (b0 * t0)
    if (
        not m.traced
        and cal is None
        and (cfg.seq_len != t0 or Applied(cfg.toggles).fused_attention)
        and m.seq_len
    ):
        added["no allocations in the trace"] = ERROR_NO_TRACE_PCT
    if stretch > 16:
        added[f"{stretch:.0f}× the run's tokens per step"] = ERROR_FAR_PCT
    if added:
        text += " Added for " + ", ".join(f"{k} (± {v:.0f} %)" for k, v in added.items()) + "."
    if stretch > 16:
        text += " Profile nearer the target to narrow it."
    text += (
        " On CUDA the caching allocator also reserves more than tensors hold (fragmentation, often 5–15 %): "
        "leave that much headroom."
    )
    total = ERROR_BASE_PCT + sum(added.values())
    return total, f"± {total:.0f} % on the total. " + text
