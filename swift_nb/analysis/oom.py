"""Why a run ran out of memory, and what would have made its failed step fit.

From the post-mortem (``Run.oom``, read at the failure by ``swift_nb.capture.memory.oom``):

- the step's need: what was live at the failure, with the activations still to come.
  Failing in the forward pass inside block i of n, the activations are scaled by n / i
  (the blocks still to run keep as much again) and the request is added; in the backward
  pass or the optimizer, what was live plus the request is a lower bound. The optimizer's
  own step needs parameters + gradients + its state, the state sized for the optimizer
  when the first step never allocated it (Adam: two per parameter). Frozen weights (a LoRA
  base, a frozen encoder) are there throughout, with no gradient or state.
- the room: the capacity less what is not tensors (the CUDA context; the process's own
  memory on CPU), less a margin (``MARGIN``) for the allocator's rounding and
  fragmentation; never more than what was live plus the request that failed, less the
  same margin (that much did not fit).
- each fix changes one term, by the formulas of ``swift_nb.analysis.effects``: FlashAttention
  drops the ``[.., T, T]`` score activations; gradient checkpointing keeps one block's
  activations plus each block's input (taken as large as one block's activations);
  bf16 autocast halves fp32 activations; GaLore shrinks Adam's state to its low-rank
  projections (weights taken as square); half the batch halves the activations. A fix
  fits when the need it leaves is within the room. Each says its formula.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swift_nb.analysis import effects
from swift_nb.core.units import fmt_bytes
from swift_nb.record import OutOfMemory, Run

MARGIN = 0.05  # of the room, kept for the allocator's rounding and fragmentation


@dataclass(frozen=True)
class Fix:
    """One change and the failed step's need with it."""

    toggle: str | None  # a swift_nb toggle id, or None for a setting (the batch size)
    change: str
    need_bytes: int
    fits: bool
    formula: str


@dataclass(frozen=True)
class Diagnosis:
    """need_bytes: the failed step's estimated peak tensor memory; room_bytes: what
    tensors could use (None when the capacity is unknown); fixes, those that fit first;
    device: the device that ran out (``cpu``, ``cuda:0``; None: not said)."""

    need_bytes: int
    room_bytes: int | None
    formula: str
    fixes: list[Fix] = field(default_factory=list)
    device: str | None = None

    @property
    def compare_line(self) -> str | None:
        """The magic line that measures the fixes that fit (toggles only)."""
        ids = [f.toggle for f in self.fixes if f.fits and f.toggle and "," not in f.toggle]
        return f"%%swift_profile --compare {','.join(ids)}" if ids else None


def _activations(oom: OutOfMemory) -> tuple[float, float, str]:
    """(activations the step needs, the square part of it, how it was scaled)."""
    act = float(oom.categories.get("activations", 0)) + float(oom.requested_bytes or 0)
    square = float(oom.square_bytes)
    if oom.requested_bytes and _request_is_square(oom):
        square += oom.requested_bytes
    if oom.phase == "forward" and oom.blocks and oom.blocks_reached:
        scale = oom.blocks / oom.blocks_reached
        how = (
            f"activations at the failure + the request, × {oom.blocks}/{oom.blocks_reached} "
            f"(failed in block {oom.blocks_reached} of {oom.blocks} of the forward pass)"
        )
        return act * scale, square * scale, how
    if oom.phase == "forward":
        return (
            act,
            square,
            "activations at the failure + the request (a lower bound: the forward pass had not ended)",
        )
    return act, square, f"activations at the failure + the request (in the {oom.phase}: a lower bound)"


def _request_is_square(oom: OutOfMemory) -> bool:
    """Whether the failed request is the size of a ``[.., T, T]`` activation already live
    (the next layer's attention scores)."""
    for t in oom.top_tensors:
        shape = t.get("shape") or []
        if len(shape) >= 3 and shape[-1] == shape[-2] and t.get("bytes") == oom.requested_bytes:
            return True
    return False


def _fp32_activations(oom: OutOfMemory) -> bool:
    acts = [t for t in oom.top_tensors if t.get("category") == "activations"]
    return bool(acts) and all(t.get("dtype") == "float32" for t in acts)


def diagnose(oom: OutOfMemory, optimizer: str | None = None) -> Diagnosis:
    """The failed step's need, the room, and the fixes (those that fit first)."""
    c = {k: float(v) for k, v in oom.categories.items()}
    params, frozen, grads, state, other = (
        c.get(k, 0.0) for k in ("parameters", "frozen_parameters", "gradients", "optimizer_state", "other")
    )
    act, square, how = _activations(oom)
    # optimizer state per parameter byte, when the failure came before the state existed
    per_param = effects.states_per_parameter(optimizer)
    full_state = state if state > 0 or not per_param else per_param * params

    def need(act_bytes: float, state_bytes: float = full_state) -> float:
        return frozen + max(params + grads + state + act_bytes + other, 2 * params + state_bytes)

    room = None
    if oom.capacity_bytes:
        room = int((oom.capacity_bytes - (oom.outside_tensors_bytes or 0)) * (1 - MARGIN))
    # what was live plus the request did not fit: the room is below it, whatever the
    # capacity less the rest measured (the process's own memory moves with its threads and
    # arenas on CPU; fragmentation takes its share on CUDA)
    failed_at = sum(c.values()) + float(oom.requested_bytes or 0)
    bounded = bool(oom.requested_bytes) and room is not None and failed_at * (1 - MARGIN) < room
    if bounded:
        room = int(failed_at * (1 - MARGIN))
    formula = (
        f"need = frozen parameters {fmt_bytes(frozen)} + max(parameters + gradients + optimizer state + "
        f"activations + other, the optimizer's step: 2 × parameters + state {fmt_bytes(full_state)}); "
        f"activations {fmt_bytes(act)} = {how}"
    )
    if bounded:
        formula += (
            f"; room = (what was live + the request that failed, {fmt_bytes(failed_at)}) × {1 - MARGIN:g}"
        )
    elif room is not None:
        formula += (
            f"; room = ({fmt_bytes(oom.capacity_bytes)} capacity − {fmt_bytes(oom.outside_tensors_bytes or 0)} "
            f"not in tensors) × {1 - MARGIN:g}"
        )
    candidates: list[tuple[str | None, str, float, str]] = [
        (fix.toggles, fix.change, need(fix.activations, fix.state), fix.formula)
        for fix in effects.step_fixes(
            act, square, oom.blocks, _fp32_activations(oom), full_state, params, optimizer
        )
    ]
    candidates.append((None, "half the batch size", need(act / 2), "activations × ½"))
    fixes = [Fix(t, change, int(n), room is not None and n <= room, f) for t, change, n, f in candidates]
    fixes.sort(key=lambda f: (not f.fits, f.need_bytes))
    return Diagnosis(int(need(act)), room, formula, fixes, oom.device)


def diagnosis_of(run: Run) -> Diagnosis | None:
    """``diagnose`` of a run that ran out of memory; None for any other run."""
    if run.oom is None:
        return None
    return diagnose(run.oom, run.context.get("optimizer"))
