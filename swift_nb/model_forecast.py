"""A model forecast from its config, composed: its training step on fake tensors
(``swift_nb.capture.fake_step``) with the toggles that run there applied by their own code,
a measured proxy's corrections, read as a run (``swift_nb.analysis.forecast.from_model``)
that the forecast and the planner price as they price a profiled one.

What a proxy run gives: the bytes its peak held beyond its categories (the CUDA allocator's
workspaces), and, where it recorded its model's config, the ratio of what it measured to
what its own step on fake tensors counts: the fake step misses what only the device makes
(a kernel's workspace, an implementation's buffers), and what it misses grows with the step
as activations and temporaries do; they are scaled by it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from swift_nb import vocabulary
from swift_nb.analysis.forecast import forecast, measure
from swift_nb.analysis.forecast.from_model import VARYING, measured_from, peak_of, step_time
from swift_nb.analysis.forecast.measure import Measured
from swift_nb.analysis.forecast.predict import priced, target_world
from swift_nb.analysis.forecast.result import Forecast
from swift_nb.capture.fake_step import _DTYPES as FAKE_DTYPES
from swift_nb.capture.fake_step import OPTIMIZERS, fake_step, on_stderr
from swift_nb.capture.fake_step import build as build_model
from swift_nb.core.errors import ConfigError
from swift_nb.record import Run
from swift_nb.toggles import applied, build
from swift_nb.vocabulary.forecast_spec import dtype_name, parse_toggles


def on_fake_model(toggle_id: str) -> str | None:
    """The toggle a model forecast from its config runs on the fake model itself, by its own
    code, in ``toggle_id``'s place (``Entry.on_fake_model``; QLoRA runs LoRA: a 4-bit base
    cannot be quantized on fake tensors, so its frozen weights are priced at NF4's packed
    size); None: priced by formula."""
    entry = vocabulary.TOGGLES.get(toggle_id)
    return entry.on_fake_model if entry is not None else None


def forecast_model(
    model: Any,
    proxy: Run | None,
    device: str | float,
    batch_size: int | None,
    seq_len: int | None,
    dtype: str | None,
    toggles: Any,
    world_size: int | None,
    optimizer: str | None,
    steps: int | None,
    price_per_hour: float | None,
    progress: bool,
) -> Forecast:
    """``swift_nb.forecast(model=...)``: the model's step on fake tensors priced as a run on
    ``device``; with a proxy that has a step time, the target's step on the proxy's card by
    FLOPs (and ``steps`` priced), else no step time. What only a model from its config
    cannot take is refused before the proxy is measured or the model built."""
    wanted = parse_toggles(toggles)
    target_world(1, wanted, world_size)  # the fake step is one process's
    if steps is not None and proxy is None:
        raise _no_step_time(steps)
    dtype, optimizer = check_model(model, dtype, optimizer)
    pm = measure(proxy) if proxy is not None else None
    measured = measured_model(model, pm, batch_size or 1, seq_len or 2048, dtype, optimizer, wanted, progress)
    fc = forecast(measured, device, toggles=wanted, world_size=world_size)
    step_s, line = step_time(measured, pm, list(wanted), cuda=pm is not None and pm.on_cuda)
    fc = replace(fc, step_s=step_s, derivation=[*fc.derivation, line])
    if steps is None:
        return fc
    if step_s is None:
        raise _no_step_time(steps)
    return priced(fc, measured, steps, step_s, price_per_hour)


def check_model(model: Any, dtype: str | None, optimizer: str | None) -> tuple[str, str]:
    """(the dtype, the optimizer) a fake step of ``model`` takes, bf16 and AdamW by default;
    a ``ConfigError`` for a model that is no preset, config or callable, or a dtype or an
    optimizer the fake step does not run (a preset's config is built: transformers is imported)."""
    name = dtype_name(dtype or "bfloat16")
    if name not in FAKE_DTYPES:
        kinds = ", ".join(sorted(set(FAKE_DTYPES.values())))
        raise ConfigError("dtype", f"must be one of {kinds} for a model from its config", dtype)
    optimizer = optimizer or "AdamW"
    if optimizer not in OPTIMIZERS:
        raise ConfigError(
            "optimizer", f"must be one of {', '.join(OPTIMIZERS)} for a model from its config", optimizer
        )
    build_model(model)
    return name, optimizer


def _no_step_time(steps: int) -> ConfigError:
    return ConfigError(
        "steps", "needs a step time: pass a proxy run of the family profiled on the card", steps
    )


def measured_model(
    model: Any,
    proxy: Run | Measured | None,
    batch_size: int,
    seq_len: int,
    dtype: str,
    optimizer: str,
    toggles: Any = (),
    progress: bool = True,
) -> Measured:
    """``model``'s step on fake tensors at the target configuration, with the ``toggles``
    that run on fake tensors applied (the others are the forecast's to price, said so),
    calibrated by ``proxy`` (see the module), read as a run."""
    wanted = parse_toggles(toggles)
    dtype, optimizer = check_model(model, dtype, optimizer)
    setup, on_fake = _setup(wanted)
    say = on_stderr if progress else None
    step = fake_step(model, batch_size, seq_len, dtype, optimizer, progress=say, setup=setup)
    pm = proxy if isinstance(proxy, Measured) or proxy is None else measure(proxy)
    ratio = _proxy_ratio(pm, say) if pm is not None else None
    if progress:
        sys.stderr.write("\n")
    by_formula = [t for t in wanted if on_fake_model(t) is None]
    return measured_from(step, pm, on_fake, by_formula, ratio)


def _setup(wanted: Mapping[str, Mapping[str, Any]]) -> tuple[Callable[[Any], Any] | None, list[str]]:
    """What changes the fake model before its step (``fake_step``'s ``setup``): the toggles
    of ``wanted`` that run on fake tensors, applied to it and undone after; and their ids."""
    on_fake = {run: dict(p) for t, p in wanted.items() if (run := on_fake_model(t)) is not None}
    if not on_fake:
        return None, []
    built = build(on_fake)  # refused here, before the model is built, when they cannot be

    @contextlib.contextmanager
    def setup(module: Any) -> Iterator[Any]:
        namespace = {"model": module}
        with applied(namespace, built):
            yield namespace["model"]

    return setup, list(on_fake)


def _proxy_ratio(pm: Measured, say: Callable[[str], None] | None) -> tuple[float, float, float] | str:
    """(what ``pm`` measured, what its own step on fake tensors counts, of that what varies
    with the step: activations, logits, other): its categories' totals at the peak; or why
    they are not compared."""
    config = (pm.finetune.get("base_model") or {}).get("config")
    if not config:
        return "the proxy run did not record its model's config (a transformers model records it)"
    if pm.toggles or pm.finetune.get("method") not in (None, "full"):
        return f"the proxy run trained with {', '.join(sorted(pm.toggles)) or pm.finetune.get('method')}"
    if not (pm.batch_size and pm.seq_len) or (pm.optimizer or "") not in OPTIMIZERS:
        return "the proxy run's batch, sequence or optimizer is not one a fake step takes"
    from transformers import AutoConfig

    rebuilt = AutoConfig.for_model(**config)
    own = fake_step(rebuilt, pm.batch_size, pm.seq_len, pm.dtype, pm.optimizer or "AdamW", progress=say)
    mine = measured_from(own)
    return pm.total, peak_of(mine), sum(mine.categories[c] for c in VARYING)
