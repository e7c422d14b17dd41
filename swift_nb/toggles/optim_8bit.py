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
and the object takes its class and attributes, keeping its own step hooks. Its defaults are
the user's, so a group added later (``add_param_group``) gets the user's hyper-parameters,
not bitsandbytes' (lr 1e-3, weight decay 1e-2). Its state starts empty. ``undo`` gives back
the user's optimizer: its class, groups (those added while converted too), defaults and
state objects, with the last learning rate, and the moments the 8-bit optimizer reached,
dequantised into Adam's state (a tensor it never stepped keeps the moments it had); where
they cannot be read back, that tensor's state is reset and a note says so. Adam's L2 weight
decay becomes decoupled (a note says so); amsgrad, maximize and a tensor learning rate,
which 8-bit AdamW lacks, leave the optimizer unchanged with a note.
"""

from __future__ import annotations

from typing import Any

import torch

from swift_nb.analysis.effects import adam8bit_state
from swift_nb.core.errors import MissingDependencyError
from swift_nb.core.quiet import quiet_import
from swift_nb.core.units import MIN_8BIT_SIZE
from swift_nb.toggles.base import Toggle, ToggleReport

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
#: elements per absmax of AdamW8bit's block-wise moments (bitsandbytes' ``init_state``)
_BLOCK = 256


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
        self._convert(opt, name)
        after = predicted_state_bytes(params)
        self.report.change(
            f"`{name}` ({old} → bitsandbytes AdamW8bit): optimizer state {before:,} → {after:,} bytes "
            f"(8-bit moments for tensors of ≥ {MIN_8BIT_SIZE:,} elements)"
        )
        d = self.report.details
        d["optimizer_state_bytes_before"] = d.get("optimizer_state_bytes_before", 0) + before
        d["optimizer_state_bytes_after"] = d.get("optimizer_state_bytes_after", 0) + after

    def _convert(self, opt: torch.optim.Optimizer, name: str) -> None:
        report = self.report
        assert report is not None
        groups = [_group(g) for g in opt.param_groups]
        new = self._cls(groups, **_hyper(opt.defaults))
        cls, saved = type(opt), dict(opt.__dict__)
        # keys bitsandbytes adds to a group (AdEMAMix's alpha, ...), which Adam's groups have not
        only_8bit = set(new.defaults) - set(saved["defaults"])
        scheduled = getattr(saved.get("step"), "_wrapped_by_lr_sched", False)
        opt.__class__ = type(new)
        opt.__dict__.clear()
        opt.__dict__.update(new.__dict__)
        opt.__dict__.update({k: saved[k] for k in _OWN if k in saved})
        if scheduled:  # a scheduler made before the toggle tracks calls of the class's step
            opt.step = _tracked(opt)
        self._converted.append(opt)

        def restore() -> None:
            reached = dict(opt.state)
            lr = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
            known = {id(p) for g in saved["param_groups"] for p in g["params"]}
            added = [g for g in opt.param_groups if not any(id(p) in known for p in g["params"])]
            for g in saved["param_groups"]:
                if g["params"] and id(g["params"][0]) in lr:
                    g["lr"] = lr[id(g["params"][0])]
            opt.__class__ = cls
            opt.__dict__.clear()
            opt.__dict__.update(saved)
            for g in added:
                opt.add_param_group({k: v for k, v in g.items() if k not in only_8bit})
            _give_back_moments(opt, reached, name, report)

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


def _hyper(defaults: dict[str, Any]) -> dict[str, Any]:
    """AdamW8bit's keyword arguments for the user's ``defaults``, which a group added later takes."""
    return {
        "lr": float(defaults["lr"]),
        "betas": tuple(defaults["betas"]),
        "eps": defaults["eps"],
        "weight_decay": defaults["weight_decay"],
    }


def _give_back_moments(
    opt: torch.optim.Optimizer, reached: dict[Any, dict[str, Any]], name: str, report: ToggleReport
) -> None:
    """Put the moments AdamW8bit ``reached`` into the restored Adam ``opt``'s state, in Adam's
    format; a tensor whose moments cannot be read back has its state reset, and a note says so."""
    group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
    # a tensor never stepped while converted has no 8-bit state: the moments it had are still its own
    stepped = {p: state8 for p, state8 in reached.items() if state8}
    lost = 0
    for p, state8 in stepped.items():
        moments = _adam_moments(state8, p, group_of[id(p)])
        if moments is None:
            opt.state.pop(p, None)
            lost += 1
            continue
        state = opt.state[p]  # the user's dict for it, where there was one
        state.clear()
        state.update(moments)
    if lost:
        report.note(
            f"`{name}`: undo could not read back the 8-bit moments of {lost} of {len(stepped)} "
            f"tensors (not the layout of AdamW8bit this toggle knows); their Adam state was reset, "
            f"so their moments start from zero at the next step"
        )


def _adam_moments(state8: dict[str, Any], p: torch.Tensor, group: dict[str, Any]) -> dict[str, Any] | None:
    """Adam's state for ``p`` (step, exp_avg, exp_avg_sq) from AdamW8bit's ``state8``: its
    fp32 moments as they are, its 8-bit ones dequantised block-wise; None when ``state8`` has
    another layout."""
    step, m, v = state8.get("step"), state8.get("state1"), state8.get("state2")
    if not isinstance(step, int) or not isinstance(m, torch.Tensor) or not isinstance(v, torch.Tensor):
        return None
    if m.dtype == torch.uint8 and v.dtype == torch.uint8:
        m = _dequantised(m, state8.get("absmax1"), state8.get("qmap1"))
        v = _dequantised(v, state8.get("absmax2"), state8.get("qmap2"))
        if m is None or v is None:
            return None
    elif m.dtype != torch.float32 or v.dtype != torch.float32:
        return None
    if m.numel() != p.numel() or v.numel() != p.numel():
        return None
    # as Adam makes its step counter: on the parameter's device only when fused or capturable
    on_device = bool(group.get("fused") or group.get("capturable"))
    wide = torch.get_default_dtype() == torch.float64 and not group.get("fused")
    return {
        "step": torch.tensor(
            float(step),
            dtype=torch.float64 if wide else torch.float32,
            device=p.device if on_device else torch.device("cpu"),
        ),
        "exp_avg": torch.empty_like(p, memory_format=torch.preserve_format).copy_(m.view(p.shape)),
        "exp_avg_sq": torch.empty_like(p, memory_format=torch.preserve_format).copy_(v.view(p.shape)),
    }


def _dequantised(q: torch.Tensor, absmax: Any, qmap: Any) -> torch.Tensor | None:
    """The fp32 values of AdamW8bit's block-wise quantised ``q`` (one ``absmax`` per block of
    ``_BLOCK``, the code ``qmap``), or None when those are not what it keeps."""
    import bitsandbytes.functional as bnb_f  # an optional dependency, there once converted

    blocks = -(-q.numel() // _BLOCK)
    if not isinstance(absmax, torch.Tensor) or not isinstance(qmap, torch.Tensor) or absmax.numel() != blocks:
        return None
    return bnb_f.dequantize_blockwise(q, absmax=absmax, code=qmap, blocksize=_BLOCK)


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
