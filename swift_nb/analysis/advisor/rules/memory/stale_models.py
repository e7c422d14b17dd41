"""Models alive in the kernel that the run neither trained nor ran (the summary's
``stale_models``, ``swift_nb.capture.memory.stale_models``): a model built in an earlier cell
keeps its weights in memory nobody trains. The commonest notebook OOM: a cell re-run
builds a second model beside the first.

Only their bytes on the device that ran out of memory (the out-of-memory failure's, else
the one the run's tensors lived on) weigh on it: a model on the CPU is not the difference
for a CUDA out-of-memory, nor one on another GPU; a model split across devices counts its
bytes on each where they are (the entry's ``device_bytes``). They are critical when those
bytes are the difference between fitting and running out:
- the run ran out of memory and its failed step's need less them is within the room
  (``swift_nb.analysis.oom``; the room unknown: they are at least ``INFO_SHARE`` of the need);
- or its peak is above the device's capacity (or the limit the thresholds set) and the
  peak less them is not.
Otherwise a warning, or info when they are under ``INFO_SHARE`` of the peak; under
``MIN_BYTES`` in all, nothing is said."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.core.units import fmt_bytes

#: stale models holding less than this in all are not worth a finding (bytes)
MIN_BYTES = 1 << 20
#: under this share of the peak (0..1), and not decisive, the finding is info; of an
#: out-of-memory step's need whose room is unknown, not decisive
INFO_SHARE = 0.05


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    found = [m for m in ev.stale_models if m.get("bytes")]
    total = float(sum(m["bytes"] for m in found))
    if not found or total < MIN_BYTES:
        return None
    device = (ev.oom.device if ev.oom is not None else None) or ev.tensors_on
    on_device = float(sum(_bytes_on(m, device, ev.tensors_on) for m in found))
    cuda = ev.tensors_on == "cuda"
    fix = f"del {', '.join(str(m['variable']) for m in found)}; gc.collect()"
    if cuda:
        fix += "; torch.cuda.empty_cache()"
    decisive, effect = _effect(ev, on_device)
    peak = ev.peak_bytes
    severity = "critical" if decisive else "warning"
    if not decisive and (not peak or on_device < INFO_SHARE * peak):
        severity = "info"
    evidence: dict[str, Any] = {
        "stale_models": [dict(m) for m in found],
        "stale_bytes": total,
        "device": device,
        "on_device_bytes": on_device,
        "peak_bytes": peak,
        "confidence": "certain: these models held no parameter an optimizer stepped and ran no forward",
    }
    if peak:
        evidence["predicted_peak_bytes"] = max(0.0, peak - on_device)
    if ev.limit_bytes:
        evidence["limit_bytes"] = ev.limit_bytes
    if ev.oom is not None:
        evidence["oom_need_bytes"], evidence["oom_room_bytes"] = ev.oom.need_bytes, ev.oom.room_bytes
    return Finding(
        id="stale_models",
        title=f"{_holders(found)} nobody trains: `{fix}`",
        evidence=evidence,
        suggestion=(
            f"Free them before training: `{fix}`. A model built in an earlier cell stays alive while a variable "
            "holds it; IPython's output cache (`Out`, `_`) holds one a cell displayed too (`%reset -f out`)."
            + (" empty_cache() hands the cached blocks back to the device." if cuda else "")
        ),
        predicted_effect=effect,
        formula=(
            f"peak' = peak − the stale models' bytes on {device}, the device that "
            f"{'ran out' if ev.oom is not None else 'held the run'} (storages nothing the run used shares)"
        ),
        severity=severity,
    )


def _bytes_on(model: Mapping[str, Any], device: str, tensors_on: str) -> float:
    """A stale model's bytes on ``device`` (``cuda:0``; ``cuda``: any GPU): those its entry
    has there (``device_bytes``), else all of them where its ``device`` is that one (a
    record without one: where the run's tensors were)."""
    per_device = model.get("device_bytes")
    if not isinstance(per_device, Mapping):
        per_device = {model.get("device") or tensors_on: model["bytes"]}
    return float(sum(b for d, b in per_device.items() if _same_device(str(d), device)))


def _same_device(held_on: str, device: str) -> bool:
    """Whether memory on ``held_on`` is memory of ``device``: the same device (``cuda:1``),
    or the same kind where either has no index (``cuda``)."""
    if ":" in held_on and ":" in device:
        return held_on == device
    return held_on.split(":")[0] == device.split(":")[0]


def _holders(found: Sequence[Mapping[str, Any]]) -> str:
    """```old_model` holds 24.0 MiB``; ```a` (24.0 MiB) and `b` (1.0 MiB) hold 25.0 MiB``."""
    if len(found) == 1:
        return f"`{found[0]['variable']}` holds {fmt_bytes(found[0]['bytes'])}"
    each = [f"`{m['variable']}` ({fmt_bytes(m['bytes'])})" for m in found]
    listed = ", ".join(each[:-1]) + f" and {each[-1]}"
    return f"{listed} hold {fmt_bytes(sum(m['bytes'] for m in found))}"


def _effect(ev: Evidence, on_device: float) -> tuple[bool, str]:
    """Whether freeing ``on_device`` bytes makes the run fit, and the effect in words."""
    oom = ev.oom
    if oom is not None:
        need = oom.need_bytes - on_device
        if oom.room_bytes is None:
            return on_device >= INFO_SHARE * oom.need_bytes, (
                f"the failed step's need {fmt_bytes(oom.need_bytes)} → {fmt_bytes(need)}"
            )
        fits = need <= oom.room_bytes
        return fits, (
            f"the failed step's need {fmt_bytes(oom.need_bytes)} → {fmt_bytes(need)}, "
            f"{'within' if fits else 'still above'} the room of {fmt_bytes(oom.room_bytes)}"
        )
    peak, limit = ev.peak_bytes, ev.limit_bytes
    effect = f"peak tensor memory {fmt_bytes(peak)} → {fmt_bytes(max(0.0, peak - on_device))}"
    if not limit:
        return False, effect
    decisive = peak > limit >= peak - on_device
    return (
        decisive,
        effect + f" ({'within' if peak - on_device <= limit else 'above'} the {fmt_bytes(limit)} limit)",
    )
