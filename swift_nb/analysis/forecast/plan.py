"""What would make it fit? Every combination of the toggles that change a step's memory,
priced by the forecast for a memory budget, with what each would cost in step time.

The toggles tried are the vocabulary's single-process ones that the forecast prices and
that could change this run: the device must run them (``Entry.cuda``: CUDA, and a compute
capability), the run must not have them already, and the run must have what they act on
(FlashAttention needs [.., T, T] scores, fused_ce and liger a Hugging Face causal LM's
logits, packing its padding, LoRA, QLoRA and GaLore a full fine-tune, GaLore and optim_8bit
an Adam/AdamW). Pairs the
vocabulary says clash are never combined, and a combination where one toggle frees nothing
beside the others is left out: it would only cost time.

Step time is an estimate: ``effects.step_factor`` multiplies each toggle's rule of thumb,
and the run's median step is scaled by the tokens per step. It is given in seconds only
where the run's own hardware is the target (a budget in bytes, or a CUDA run); on another
device only the factor is. Rows that fit come first; among them, those that keep the
training as it is (not LoRA, QLoRA or GaLore, which change what or how it trains) before
those that change it, each fastest first, then the surest forecast, then fewer toggles; rows
that do not fit follow,
the smallest peak first. A plan that fits by less than its forecast's expected error comes
after those that fit by more: it may not fit at all.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

import pandas as pd

from swift_nb import vocabulary
from swift_nb.analysis import effects
from swift_nb.analysis.forecast.growth import growth
from swift_nb.analysis.forecast.measure import Measured
from swift_nb.analysis.forecast.predict import _config, _expected_error, target_is_cuda
from swift_nb.analysis.forecast.pricing import CategoryPricer
from swift_nb.core.devices import Device, resolve_device
from swift_nb.core.errors import ConfigError, check_positive, check_whole
from swift_nb.core.units import fmt_bytes

#: toggles that change what the model trains or how it is updated
#: How the planner tells what a run has of what toggles act on (``vocabulary.ACTS_ON``, each
#: toggle's ``Entry.acts_on``): a toggle is proposed only where its target is there.
ACTS_ON: dict[str, Callable[[Measured], bool]] = {
    "attention_scores": lambda m: (
        m.scores.activations_per_sample + m.scores.activations_batch_free + m.scores.other_per_sample > 0
    ),
    "repeated_blocks": lambda m: m.blocks > 1,
    "lm_logits": lambda m: m.hf_causal_lm and m.categories.get("logits", 0.0) > 0,
    "lm_padding": lambda m: m.hf_causal_lm and m.real_share < 1.0,
    "fp32_compute": lambda m: m.compute_dtype == "float32",
    "full_training": lambda m: m.lora_rank is None and not m.quantization,
    "adam": lambda m: m.lora_rank is None and not m.quantization and m.optimizer in ("Adam", "AdamW"),
    "adam_state": lambda m: m.optimizer in ("Adam", "AdamW") and m.categories["optimizer_state"] > 0,
}
COLUMNS = [
    "toggles",
    "predicted_peak_bytes",
    "fits",
    "headroom_bytes",
    "step_factor",
    "predicted_step_s",
    "changes_training",
    "expected_error_pct",
    "why",
]


def plan(
    m: Measured,
    device: str | None = None,
    memory_bytes: float | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    toggles_allowed: str | Collection[str] | None = None,
    max_toggles: int = 3,
) -> pd.DataFrame:
    """One row per combination of toggles (``COLUMNS``), best first (see the module).

    ``device`` a preset (its capacity, less the CUDA context, is the budget; its CUDA
    capability decides which toggles can run) and/or ``memory_bytes``, a budget in bytes
    that overrides the preset's; ``batch_size``/``seq_len`` the target (the run's own by
    default); ``toggles_allowed`` the toggles to combine (default: every one that applies);
    ``max_toggles`` how many at once. Every argument is checked first (``ConfigError``).
    """
    max_toggles = check_whole("max_toggles", max_toggles, 1, 5)
    dev, usable = budget(device, memory_bytes)
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        if value is not None:
            check_whole(name, value)
    toggles_allowed = allowed_toggles(toggles_allowed)
    cuda, capability = _target(m, dev)
    ids = candidates(m, cuda, capability, toggles_allowed)
    pricer = CategoryPricer(m, growth(m, None))
    peaks: dict[frozenset[str], float] = {}
    rows = []
    for combo in _combinations(ids, max_toggles):
        wanted = {t: vocabulary.TOGGLES[t].defaults() for t in combo}
        cfg = replace(_config(m, wanted, batch_size, seq_len, None, None, None), cuda=cuda)
        peak = pricer.peak(cfg).total
        peaks[frozenset(combo)] = peak
        if any(peaks.get(frozenset(combo) - {t}, math.inf) <= peak * 1.005 for t in combo):
            continue  # one of them frees nothing beside the others
        rows.append(_row(m, combo, cfg, peak, usable, cuda, dev))
    table = pd.DataFrame(rows, columns=COLUMNS)
    table["_n"] = table["toggles"].map(lambda s: 0 if s == "none" else s.count("+") + 1)
    table["_unsure"] = (
        table["headroom_bytes"] < table["predicted_peak_bytes"] * table["expected_error_pct"] / 100
    )
    fitting = table[table["fits"]].sort_values(
        ["_unsure", "changes_training", "step_factor", "expected_error_pct", "_n", "predicted_peak_bytes"]
    )
    short = table[~table["fits"]].sort_values(["predicted_peak_bytes", "_n"])
    return pd.concat([fitting, short]).drop(columns=["_n", "_unsure"]).reset_index(drop=True)


def budget(device: str | float | None, memory_bytes: float | None) -> tuple[Device | None, float]:
    """(the target device, None for a budget alone; the bytes its tensors may take):
    ``memory_bytes`` where given, else the device's capacity less its CUDA context. A
    ``ConfigError`` for neither, a device that is no preset or capacity, a budget that is
    not a positive number of bytes, or a device whose context leaves no room."""
    if device is None and memory_bytes is None:
        raise ConfigError(
            "device",
            "give the target: a device preset (device='L4-24GB') or a budget (memory_bytes=24e9)",
            None,
        )
    dev = resolve_device(device) if device is not None else None
    if memory_bytes is not None:
        return dev, check_positive("memory_bytes", memory_bytes, "bytes, such as 24e9")
    assert dev is not None
    usable = float(dev.capacity_bytes - dev.context_bytes)
    if usable <= 0:
        raise ConfigError(
            "device",
            f"leaves no room for tensors: its {fmt_bytes(dev.capacity_bytes)} less the CUDA context's "
            f"{fmt_bytes(dev.context_bytes)}; give a larger device, or the budget itself as memory_bytes=",
            device,
        )
    return dev, usable


def allowed_toggles(allowed: str | Collection[str] | None) -> list[str] | None:
    """The toggles a plan may combine, as ids (``"fused_ce,packing"`` or a list); None: every
    one that applies. A ``ConfigError`` for a name that is no runnable toggle."""
    if allowed is None:
        return None
    names = vocabulary.split_list(allowed) if isinstance(allowed, str) else list(allowed)
    return [vocabulary.entry(t, runnable=True).id for t in names]


def candidates(
    m: Measured, cuda: bool, capability: tuple[int, int] | None, allowed: Collection[str] | None
) -> list[str]:
    """The toggles worth combining for ``m`` on a target that is (``cuda``) a GPU of
    ``capability`` (None: unknown); ``allowed`` narrows them (an unknown name is an error)."""
    if allowed is not None:
        for t in allowed:
            vocabulary.entry(t, runnable=True)
    out = []
    for e in vocabulary.TOGGLES.values():
        if not e.runnable or e.processes or e.acts_on is None or e.id in m.toggles:
            continue
        if allowed is not None and e.id not in allowed:
            continue
        if _runs_on(e.cuda, cuda, capability) and ACTS_ON[e.acts_on](m):
            out.append(e.id)
    return out


def _runs_on(least: tuple[int, int] | None, cuda: bool, capability: tuple[int, int] | None) -> bool:
    if least is None:
        return True
    if not cuda:
        return False
    return least == (0, 0) or (capability is not None and capability >= least)


def has(m: Measured) -> set[str]:
    """What ``m`` has of what toggles act on (``ACTS_ON``)."""
    return {name for name, present in ACTS_ON.items() if present(m)}


def _target(m: Measured, dev: Device | None) -> tuple[bool, tuple[int, int] | None]:
    """Whether the target is a GPU (``predict.target_is_cuda``), and its compute capability
    (None: unknown)."""
    return target_is_cuda(m, dev), dev.capability if dev is not None else None


def _combinations(ids: Sequence[str], most: int):
    """Every combination of up to ``most`` of ``ids`` with no clashing pair, smallest first."""
    for n in range(0, min(most, len(ids)) + 1):
        for combo in itertools.combinations(ids, n):
            if vocabulary.clashes(combo) is None:
                yield combo


def _row(
    m: Measured, combo: Sequence[str], cfg, peak: float, usable: float, cuda: bool, dev: Device | None
) -> dict:
    found = has(m)
    if not m.scores.activations_per_sample + m.scores.activations_batch_free:
        found.discard("attention_scores")  # FlashAttention saves the traffic of kept scores alone
    factor, reasons = effects.step_factor(combo, cuda, found, m.real_share)
    b0, t0 = m.shape
    tokens = cfg.batch_size * (cfg.seq_len if m.seq_len else 1) / (b0 * t0)
    same_hardware = dev is None or (m.on_cuda and cuda)
    step_s = m.step_s * tokens * factor if m.step_s and same_hardware else math.nan
    error, _ = _expected_error(m, None, cfg)
    fits = peak <= usable
    room = usable - peak
    head = (
        f"fits: {fmt_bytes(peak)} of {fmt_bytes(usable)} ({fmt_bytes(room)} to spare)"
        if fits
        else f"short by {fmt_bytes(-room)}: {fmt_bytes(peak)} for {fmt_bytes(usable)}"
    )
    if fits and room < peak * error / 100:
        head += f", within the forecast's ± {error:.0f} %"
    step = "step time as measured" if not combo else "step ×" + f"{factor:.2f} (" + "; ".join(reasons) + ")"
    if tokens != 1:
        step += f"; × {tokens:g} the tokens per step"
    return {
        "toggles": "+".join(combo) or "none",
        "predicted_peak_bytes": peak,
        "fits": fits,
        "headroom_bytes": room,
        "step_factor": factor * tokens,
        "predicted_step_s": step_s,
        "changes_training": any(vocabulary.TOGGLES[t].changes_training for t in combo),
        "expected_error_pct": error,
        "why": f"{head}; {step}",
    }


def applied_toggles(row: pd.Series) -> list[str]:
    """The toggle ids of a plan's row ("none": no toggle)."""
    return [] if row["toggles"] == "none" else str(row["toggles"]).split("+")


__all__ = ["COLUMNS", "allowed_toggles", "applied_toggles", "budget", "candidates", "plan"]
