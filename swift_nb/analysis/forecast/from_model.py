"""What a forecast reads of a model that never ran for real: a step on fake tensors
(``swift_nb.capture.fake_step``), as a ``Measured``, so that the forecast prices it as it
prices a measured run: another batch or sequence, dtype, optimizer, toggles, device.

The fake step holds no [.., T, T] tensors apart (its trace is not recorded): its
activations, the loss's logits and other tensors scale with the tokens.
Nothing calibrates it unless a measured proxy run is given (the forecast says so)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from swift_nb.analysis.effects import step_factor
from swift_nb.analysis.forecast.measure import Measured, ScoreBytes, _compute_dtype, _frozen, _split
from swift_nb.core.units import fmt_bytes
from swift_nb.record import MEMORY_CATEGORIES
from swift_nb.vocabulary.forecast_spec import DTYPE_BYTES, dtype_name


class Stepped(Protocol):
    """What a fake step found (``swift_nb.capture.fake_step.FakeStep``)."""

    name: str
    categories: dict[str, float]
    params: int
    trainable: int
    matrices: dict[tuple[int, int], int]
    blocks: int
    hidden: int | None
    vocab: int | None
    dtype: str
    optimizer: str
    batch_size: int
    seq_len: int
    seconds: float
    finetune: dict[str, Any]
    trained_dtype: str | None
    update_bytes: float


def measured_from(
    step: Stepped,
    proxy: Measured | None = None,
    on_fake: Sequence[str] = (),
    by_formula: Sequence[str] = (),
    proxy_peaks: tuple[float, float, float] | str | None = None,
) -> Measured:
    """``step`` as a forecast reads a run. ``proxy``: a measured run of the same family,
    whose peak beyond its categories (the CUDA allocator's workspaces) is carried over.
    ``on_fake``: the toggles the step ran with (their effect is in its numbers);
    ``by_formula``: the toggles the forecast prices by ``swift_nb.analysis.effects``;
    ``proxy_peaks``: the proxy's own step measured, on fake tensors, and of that what varies
    with the step (activations and other tensors): the difference scales the step's own
    activations and other tensors (or why there is none)."""
    cats = {c: float(step.categories.get(c, 0.0)) for c in MEMORY_CATEGORIES}
    ratio, ratio_line = _ratio(proxy_peaks)
    for c in VARYING:
        cats[c] *= ratio
    row = _split([cats[c] for c in MEMORY_CATEGORIES], [0.0, 0.0, 0.0, 0.0])
    # the moment before the update: every gradient alive, the activations gone (where a
    # step peaks once checkpointing or a smaller batch shrinks the activations)
    update = dict.fromkeys(MEMORY_CATEGORIES, 0.0)
    for c in ("parameters", "frozen_parameters", "optimizer_state"):
        update[c] = cats[c]
    update["gradients"] = cats["parameters"]
    before_update = _split([update[c] for c in MEMORY_CATEGORIES], [0.0, 0.0, 0.0, 0.0])
    frozen = step.params - step.trainable
    notes = [
        f"{step.name}: one training step on fake tensors ({step.seconds:.1f} s), counted by PyTorch's "
        "MemTracker; nothing was allocated",
    ]
    notes += list(getattr(step, "notes", []))
    if on_fake:
        notes.append(f"run on the fake model, by their own code: {', '.join(on_fake)}")
    if by_formula:
        notes.append(f"priced by formula (they do not run on fake tensors): {', '.join(by_formula)}")
    if proxy is None:
        notes.append(
            "uncalibrated: fake tensors count what the step's tensors hold; a device adds its allocator's "
            "workspaces and fragmentation (profile a smaller model of the family on it and pass run= to carry them)"
        )
    else:
        notes.append(
            f"calibrated by the run {proxy.run_id}: {proxy.untracked_bytes / 2**20:.1f} MiB its peak held beyond "
            "its categories (the allocator's workspaces) carried over"
        )
        notes.append(ratio_line)
    finetune = dict(getattr(step, "finetune", None) or {})
    dtype = dtype_name(getattr(step, "trained_dtype", None) or step.dtype)
    frozen_dtype, _ = _frozen(finetune, step.dtype, cats["frozen_parameters"])
    return Measured(
        run_id=f"model:{step.name}",
        categories=cats,
        timeline=np.array([row, before_update], dtype=float),
        batch_size=step.batch_size,
        seq_len=step.seq_len,
        dtype=dtype,
        element_bytes=DTYPE_BYTES.get(dtype, 2),
        params=step.trainable,
        optimizer=step.optimizer,
        world_size=1,
        scores=ScoreBytes(),
        matrices=dict(step.matrices),
        blocks=step.blocks,
        blocks_from="config",
        hidden=step.hidden,
        toggles=set(on_fake),
        traced=False,
        untracked_bytes=proxy.untracked_bytes if proxy is not None else 0.0,
        notes=notes,
        vocab=step.vocab,
        frozen_params=frozen,
        frozen_dtype=frozen_dtype,
        compute_dtype=_compute_dtype(finetune, dtype, frozen_dtype),
        finetune=finetune,
        update_bytes=float(getattr(step, "update_bytes", 0.0)),
        on_cuda=proxy.on_cuda if proxy is not None else False,
    )


#: what varies with a step's shape, which the proxy's own fake step calibrates
VARYING = ("activations", "logits", "other")


def peak_of(m: Measured) -> float:
    """The peak of a fake step read as a run, as the forecast prices it unchanged: its
    peak's row, or the moment before the update with what the update holds."""
    rows = m.timeline.sum(axis=1)
    return float(max(rows[0], rows[-1] + m.update_bytes))


def _ratio(peaks: tuple[float, float, float] | str | None) -> tuple[float, str]:
    """What scales the step's activations and other tensors (1: nothing), and its line."""
    if peaks is None or isinstance(peaks, str):
        return 1.0, f"the proxy's own step not compared on fake tensors: {peaks or 'no proxy run'}"
    measured, fake, variable = peaks
    if not variable:
        return 1.0, "the proxy's own step on fake tensors holds nothing that varies with the step to scale"
    # what the proxy's fake step missed, as a share of what varies with its step
    ratio = max(0.0, 1.0 + (measured - fake) / variable)
    return ratio, (
        f"the proxy's own step on fake tensors counts {fmt_bytes(fake)}, measured {fmt_bytes(measured)} "
        f"({(measured / fake - 1) * 100:+.1f} %): activations, logits and other tensors × {ratio:.3f}"
    )


def step_flops(m: Measured) -> float:
    """A training step's matmul FLOPs, the usual estimate: per token, 6 per parameter
    (forward 2, backward 4; the embedding's lookup none) and attention's 12 · layers · width ·
    sequence (its scores and their use, forward and backward)."""
    tokens = (m.batch_size or 1) * (m.seq_len or 1)
    params = m.params + m.frozen_params - (m.vocab or 0) * (m.hidden or 0)
    return float(tokens * (6 * max(params, 0) + 12 * m.blocks * (m.hidden or 0) * (m.seq_len or 0)))


def step_time(
    target: Measured, proxy: Measured | None, toggles: Sequence[str], cuda: bool
) -> tuple[float | None, str]:
    """The target's step on the proxy's card: the proxy's measured median step scaled by
    ``step_flops`` (both models plain), times the toggles' factors
    (``effects.step_factor``); None without a proxy's step time, and the line that says so."""
    if proxy is None or not proxy.step_s:
        return None, "step time: not predicted (a proxy run of the family on the card gives one, by FLOPs)"
    mine, theirs = step_flops(target), step_flops(proxy)
    if not theirs:
        return None, "step time: not predicted (the proxy's FLOPs are unknown)"
    factor, why = step_factor(toggles, cuda, has=(), real_share=1.0)  # scores unknown: fused
    value = proxy.step_s * mine / theirs * factor
    text = f"step time: the proxy's median {proxy.step_s * 1e3:.1f} ms × its FLOPs ratio {mine / theirs:.3g}"
    if why:
        text += f" × {factor:.2f} ({'; '.join(why)})"
    return value, (
        f"{text} = {value * 1e3:.1f} ms, an estimate by FLOPs on the card the proxy ran on, not on another"
    )


def describe(step: Any) -> dict[str, Any]:
    """The fake step's own figures, for a forecast's record."""
    return {"model": step.name, "params": step.params, "seconds": round(step.seconds, 2)}
