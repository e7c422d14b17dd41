"""optim_8bit: the cell's Adam/AdamW replaced by bitsandbytes' ``AdamW8bit`` (Dettmers et
al., 2022), whose two moments are kept in 8 bits per element, quantized block-wise.

Its state's real layout, which the forecast prices (``effects.adam8bit_state``): a
parameter of at least 4 096 elements keeps two uint8 moments plus one fp32 absmax per block
of 256 for each; a smaller one keeps two fp32 moments (bitsandbytes' ``min_8bit_size``).
bitsandbytes runs it on the CPU (0.45 and later) as on CUDA.

As with galore, the optimizer object is converted in place, so whatever holds it (a
learning-rate scheduler, a training function, accelerate's wrapper, a Trainer) steps the
8-bit version: a fresh ``AdamW8bit`` is built over the same parameter groups with the same
hyper-parameters (learning rate, betas, eps, weight decay, and any extra keys of a group),
and the object takes its class and attributes, keeping its own step hooks. Its state starts
empty. ``undo`` gives back the user's optimizer: its class, groups, defaults and state
objects, with the last learning rate. Adam's L2 weight decay becomes decoupled (a note says
so); amsgrad, maximize and a tensor learning rate, which 8-bit AdamW lacks, leave the
optimizer unchanged with a note.
"""

from __future__ import annotations

from typing import Any

import torch

from swift_nb.analysis.effects import adam8bit_state
from swift_nb.core.errors import MissingDependencyError
from swift_nb.core.quiet import quiet_import
from swift_nb.core.units import MIN_8BIT_SIZE
from swift_nb.toggles.base import Toggle

_ADAM_KEYS = (
    "lr",
    "betas",
    "eps",
    "weight_decay",
    "amsgrad",
    "maximize",
    "foreach",
    "capturable",
    "differentiable",
    "fused",
    "decoupled_weight_decay",
)
#: instance attributes of a torch optimizer that are the user's, not the algorithm's
_OWN = (
    "_optimizer_step_pre_hooks",
    "_optimizer_step_post_hooks",
    "_optimizer_state_dict_pre_hooks",
    "_optimizer_state_dict_post_hooks",
    "_optimizer_load_state_dict_pre_hooks",
    "_optimizer_load_state_dict_post_hooks",
)


def adamw_8bit() -> tuple[type[torch.optim.Optimizer], list[str]]:
    """bitsandbytes' AdamW8bit class and what importing it logged, or an error that says
    how to install it."""
    try:
        bnb, lines = quiet_import("bitsandbytes")
    except ImportError as e:
        raise MissingDependencyError(
            f"the optim_8bit toggle needs the bitsandbytes package ({e}): pip install 'bitsandbytes>=0.45'"
        ) from None
    return bnb.optim.AdamW8bit, lines


def state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in ``opt``'s state, each storage once (bitsandbytes shares its
    quantization maps between parameters); scalar step counters excluded."""
    seen: set[int] = set()
    total = 0
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                key = v.untyped_storage().data_ptr()
                if key not in seen:
                    seen.add(key)
                    total += v.untyped_storage().nbytes()
    return total


def predicted_state_bytes(params: list[torch.Tensor]) -> int:
    """AdamW8bit's state for ``params`` once every one has stepped (``effects.adam8bit_state``)."""
    trained = [p for p in params if p.requires_grad]
    large = [p.numel() for p in trained if p.numel() >= MIN_8BIT_SIZE]
    small = sum(p.numel() for p in trained if p.numel() < MIN_8BIT_SIZE)
    return int(adam8bit_state(large, small))


class Optim8bit(Toggle):
    id = "optim_8bit"
    watched_optimizers = (torch.optim.Adam, torch.optim.AdamW)

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        self._cls, self._said = adamw_8bit()  # fail before any work when it is missing
        self._converted: list[torch.optim.Optimizer] = []

    def _apply_optimizer(self, opt: torch.optim.Optimizer, name: str) -> None:
        assert self.report is not None
        why = _unsupported(opt)
        if why:
            self.report.note(f"`{name}` {why}; left unchanged")
            return
        params = [p for g in opt.param_groups for p in g["params"]]
        before = _adam_state_bytes(opt, params)
        if type(opt) is torch.optim.Adam and any(g.get("weight_decay") for g in opt.param_groups):
            self.report.note(f"`{name}`: Adam's L2 weight decay becomes decoupled (AdamW-style) in AdamW8bit")
        old = type(opt).__name__
        self._convert(opt)
        after = predicted_state_bytes(params)
        self.report.change(
            f"`{name}` ({old} → bitsandbytes AdamW8bit): optimizer state {before:,} → {after:,} bytes "
            f"(8-bit moments for tensors of ≥ {MIN_8BIT_SIZE:,} elements)"
        )
        d = self.report.details
        d["optimizer_state_bytes_before"] = d.get("optimizer_state_bytes_before", 0) + before
        d["optimizer_state_bytes_after"] = d.get("optimizer_state_bytes_after", 0) + after

    def _convert(self, opt: torch.optim.Optimizer) -> None:
        groups = [_group(g) for g in opt.param_groups]
        new = self._cls(groups)
        cls, saved = type(opt), dict(opt.__dict__)
        scheduled = getattr(saved.get("step"), "_wrapped_by_lr_sched", False)
        opt.__class__ = type(new)
        opt.__dict__.clear()
        opt.__dict__.update(new.__dict__)
        opt.__dict__.update({k: saved[k] for k in _OWN if k in saved})
        if scheduled:  # a scheduler made before the toggle tracks calls of the class's step
            opt.step = _tracked(opt)
        self._converted.append(opt)

        def restore() -> None:
            lr = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
            for g in saved["param_groups"]:
                if g["params"] and id(g["params"][0]) in lr:
                    g["lr"] = lr[id(g["params"][0])]
            opt.__class__ = cls
            opt.__dict__.clear()
            opt.__dict__.update(saved)

        self._undo.append(restore)

    def _finalize(self, report) -> None:
        measured = sum(state_bytes(opt) for opt in self._converted if any(opt.state.values()))
        if measured:
            report.details["optimizer_state_bytes_measured"] = measured

    def _nothing_found(self) -> str:
        return "no Adam or AdamW optimizer was found or constructed"


def _unsupported(opt: torch.optim.Optimizer) -> str | None:
    """Why ``opt`` cannot become AdamW8bit, or None."""
    if type(opt) not in (torch.optim.Adam, torch.optim.AdamW):
        return f"is {type(opt).__name__}: optim_8bit replaces only Adam and AdamW"
    groups = opt.param_groups
    if any(g.get("amsgrad") or g.get("maximize") for g in groups):
        return "uses amsgrad or maximize, which AdamW8bit has not"
    if any(isinstance(g.get("lr"), torch.Tensor) for g in groups):
        return "has a tensor learning rate, which AdamW8bit does not take"
    return None


def _group(g: dict[str, Any]) -> dict[str, Any]:
    """An AdamW8bit parameter group with ``g``'s parameters and hyper-parameters, and any
    other key of ``g`` (a scheduler's ``initial_lr``, a group's name)."""
    out = {k: v for k, v in g.items() if k not in _ADAM_KEYS}
    out.update(lr=float(g["lr"]), betas=tuple(g["betas"]), eps=g["eps"], weight_decay=g["weight_decay"])
    return out


def _adam_state_bytes(opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> int:
    """The Adam state ``opt`` holds, or the two moments it will hold once it has stepped."""
    if any(opt.state.values()):
        return state_bytes(opt)
    return sum(2 * p.numel() * p.element_size() for p in params if p.requires_grad)


def _tracked(opt: torch.optim.Optimizer) -> Any:
    """``opt.step`` as a learning-rate scheduler tracks it (``_opt_called``), for the new class."""
    step = type(opt).step

    def tracked(*args: Any, **kwargs: Any) -> Any:
        opt._opt_called = True  # type: ignore[attr-defined]
        return step(opt, *args, **kwargs)

    tracked._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    return tracked
