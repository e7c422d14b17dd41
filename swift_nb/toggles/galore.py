"""galore: GaLore AdamW (Zhao et al., 2024) in place of Adam/AdamW — the gradients of 2-D
weight matrices are projected to rank ``rank``, so their optimizer state is two r-column
moments plus the projection instead of two full-size moments.

Uses ``galore-torch``, the reference implementation (Hugging Face's Trainer uses it too):
``pip install 'swift_nb[galore]'``.

The optimizer object is converted in place rather than replaced, so everything that holds
it (a learning-rate scheduler, a training function, accelerate's ``AcceleratedOptimizer``
and so a Hugging Face Trainer) steps the GaLore version: its class becomes GaLore's AdamW
and its parameter groups become a GaLore group (weights of ``nn.Linear`` layers and of
transformers' ``Conv1D`` (GPT-2's linear layers), optionally only those whose module path
matches ``target``, and only matrices whose smaller side exceeds the rank — smaller ones
would not shrink) plus the remaining parameters with the same hyperparameters. A Trainer
creates its optimizer inside ``train()``: the one it creates while the toggle is applied
is converted as it is constructed, before the Trainer wraps it. Its state starts empty; ``undo``
restores the class, groups, defaults and state objects (keeping the last learning rate).
A learning-rate scheduler created before the toggle schedules only as many groups as the
optimizer had then. An optimizer that trains the adapters of a peft (LoRA) model of the
namespace is left alone: they are low-rank already.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from swift_nb.capture import frameworks
from swift_nb.core.errors import MissingDependencyError
from swift_nb.core.quiet import quiet_import
from swift_nb.toggles.base import Toggle, find_models
from swift_nb.toggles.lora import linear_layer, peft_adapters


def galore_adamw() -> tuple[type[torch.optim.Optimizer], list[str]]:
    """galore-torch's AdamW class and what importing it logged (bitsandbytes, imported by
    galore_torch for its 8-bit variant, warns about an optional CPU kernel package: kept for
    the run's notes), or an error that says how to install it."""
    try:
        galore_torch, said = quiet_import("galore_torch", "bitsandbytes")
    except ImportError as e:
        raise MissingDependencyError(
            f"the galore toggle needs the galore-torch package ({e}): pip install 'swift_nb[galore]'"
        ) from None
    return galore_torch.GaLoreAdamW, said


class GaLore(Toggle):
    id = "galore"
    watched_optimizers = (torch.optim.Adam, torch.optim.AdamW)

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        self._cls, self._said = galore_adamw()  # fail before any work when galore-torch is missing
        self._linear_weights: dict[int, str] = {}
        self._converted: list[tuple[torch.optim.Optimizer, set[int]]] = []

    def apply(self, namespace=None):
        report = super().apply(namespace)
        # Linear layers constructed while applied (a model built inside a function, which
        # the namespace never shows) are recognised when they register their weight.
        self._hooks.append(
            nn.modules.module.register_module_parameter_registration_hook(self._registered).remove
        )
        return report

    def _registered(self, module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and name == "weight" and linear_layer(module):
            self._linear_weights.setdefault(id(param), type(module).__name__)

    def _targets(self) -> dict[int, str]:
        """id(weight) → module path, for the Linear layers the projection may target."""
        pattern = self.values["target"]
        out: dict[int, str] = {}
        for name, model in find_models(self._namespace):
            for path, mod in model.named_modules():
                full = f"{name}.{path}" if path else name
                if linear_layer(mod) and (pattern is None or re.search(pattern, full)):
                    out.setdefault(id(mod.weight), full)
        if pattern is None:
            for k, v in self._linear_weights.items():
                out.setdefault(k, v)
        return out

    def _apply_optimizer(self, opt: torch.optim.Optimizer, name: str) -> None:
        assert self.report is not None
        if type(opt) not in (torch.optim.Adam, torch.optim.AdamW):
            self.report.note(
                f"`{name}` is {type(opt).__name__}: GaLore replaces only Adam and AdamW; left unchanged"
            )
            return
        groups = opt.param_groups
        if any(g.get("amsgrad") or g.get("maximize") for g in groups):
            self.report.note(f"`{name}` uses amsgrad or maximize, which GaLore AdamW has not; left unchanged")
            return
        lora = self._adapters_trained(opt, name)
        if lora is not None:
            self.report.note(lora)
            return
        rank = self.values["rank"]
        targets = self._targets()
        fallback = not targets
        if fallback:
            self.report.note(
                "no nn.Linear layer was found for the optimizer's parameters (the model is not in the "
                "namespace): every 2-D parameter is projected"
            )
        galore_ids: set[int] = set()
        small = 0
        new_groups: list[dict[str, Any]] = []
        for g in groups:
            keep, project = [], []
            for p in g["params"]:
                if p.dim() == 2 and (fallback or id(p) in targets):
                    if min(p.shape) > rank:
                        project.append(p)
                        continue
                    small += 1
                keep.append(p)
            base = {k: v for k, v in g.items() if k != "params"}
            base["correct_bias"] = True
            if project:
                galore_ids |= {id(p) for p in project}
                new_groups.append(
                    {
                        **base,
                        "params": project,
                        "rank": rank,
                        "update_proj_gap": self.values["update_proj_gap"],
                        "scale": self.values["scale"],
                        "proj_type": self.values["proj_type"],
                    }
                )
            if keep:
                new_groups.append({**base, "params": keep})
        if not galore_ids:
            self.report.note(
                f"`{name}`: no weight matrix has both sides larger than rank {rank}; left unchanged "
                "(use a smaller rank)"
            )
            return
        before = state_bytes(opt) if opt.state else adam_state_bytes(p for g in groups for p in g["params"])
        if type(opt) is torch.optim.Adam and any(g.get("weight_decay") for g in groups):
            self.report.note(f"`{name}`: Adam's L2 weight decay becomes decoupled (AdamW-style) under GaLore")
        old = type(opt).__name__
        self._convert(opt, new_groups)
        self._converted.append((opt, galore_ids))
        after = galore_state_bytes(opt, rank, self.values["proj_type"])
        n_params = sum(len(g["params"]) for g in new_groups if "rank" in g)
        self.report.change(
            f"`{name}` ({old} → GaLore AdamW): {n_params} weight "
            f"matrices projected to rank {rank}; optimizer state {before:,} → {after:,} bytes"
        )
        if small:
            self.report.note(f"{small} weight matrices with a side ≤ rank {rank} keep full Adam state")
        self._note_trainer(name)
        self.report.details.setdefault("optimizer_state_bytes_before", 0)
        self.report.details.setdefault("optimizer_state_bytes_after", 0)
        self.report.details["optimizer_state_bytes_before"] += before
        self.report.details["optimizer_state_bytes_after"] += after

    def _adapters_trained(self, opt: torch.optim.Optimizer, name: str) -> str | None:
        """Why ``opt`` is left alone when it trains a peft model's adapters (a model of the
        namespace that carries them and whose parameters it holds), else None."""
        held = {id(p) for g in opt.param_groups for p in g["params"]}
        for model_name, model in find_models(self._namespace):
            carried = peft_adapters(model)
            if carried is not None and any(id(p) in held for p in model.parameters()):
                return (
                    f"`{model_name}` already trains {carried}: GaLore is for full fine-tuning — its low-rank "
                    f"gradient projection has nothing to save on adapters that are already low-rank; `{name}` "
                    "left unchanged"
                )
        return None

    def _note_trainer(self, name: str) -> None:
        """Say so when the optimizer is the one a Trainer's ``train()`` is creating."""
        assert self.report is not None
        running = frameworks.running_trainer(sys._getframe(1))
        if running is None or getattr(running[1], "optimizer", None) is not None:
            return
        variable, trainer = running
        who = variable or type(trainer).__name__
        optim = frameworks.plain(getattr(getattr(trainer, "args", None), "optim", None))
        self.report.note(
            f"`{name}` is the optimizer {who}.train() created (optim={optim!r}): converted as it was "
            f"constructed, before the Trainer wrapped it; {who}.args.optim still reads {optim!r}"
        )

    def _convert(self, opt: torch.optim.Optimizer, new_groups: list[dict[str, Any]]) -> None:
        cls = type(opt)
        saved = {k: opt.__dict__[k] for k in ("param_groups", "defaults", "state")}
        opt.__class__ = self._cls
        opt.param_groups = new_groups
        opt.defaults = {**saved["defaults"], "correct_bias": True}
        opt.state = defaultdict(dict)
        # torch wraps an optimizer class's step on first construction so step hooks (ours
        # among them) run; GaLore's class may never have been constructed.
        opt._patch_step_function()

        def restore() -> None:
            lr = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
            for g in saved["param_groups"]:
                if g["params"] and id(g["params"][0]) in lr:
                    g["lr"] = lr[id(g["params"][0])]
            opt.__class__ = cls
            opt.__dict__.update(saved)

        self._undo.append(restore)

    def _finalize(self, report) -> None:
        measured = sum(state_bytes(opt) for opt, _ in self._converted if any(opt.state.values()))
        if measured:
            report.details["optimizer_state_bytes_measured"] = measured

    def _nothing_found(self) -> str:
        return "no Adam or AdamW optimizer was found or constructed"


def _tensors(value: Any):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif hasattr(value, "ortho_matrix"):  # galore-torch's GaLoreProjector
        yield from _tensors(value.ortho_matrix)


def state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in the optimizer's state, projection matrices included
    (scalar step counters excluded)."""
    return sum(
        t.numel() * t.element_size()
        for state in opt.state.values()
        for v in state.values()
        for t in _tensors(v)
        if t.dim() > 0
    )


def adam_state_bytes(params) -> int:
    """Adam's state once it has stepped: two moments the size of each parameter."""
    return sum(2 * p.numel() * p.element_size() for p in params if p.requires_grad)


def galore_shapes(m: int, n: int, rank: int, proj_type: str) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    """(shape of each projected moment, shapes of the projection matrices) of an m×n
    weight under galore-torch's projector."""
    r = min(rank, m, n)
    right = ((m, r), [(r, n)])
    left = ((r, n), [(m, r)])
    if proj_type == "std":
        return right if m >= n else left
    if proj_type == "reverse_std":
        return left if m >= n else right
    if proj_type == "right":
        return right
    if proj_type == "left":
        return left
    return (r, r), [(m, r), (r, n)]


def galore_state_bytes(opt: torch.optim.Optimizer, rank: int, proj_type: str) -> int:
    """Analytic state size of a converted optimizer once every parameter has a gradient."""
    total = 0
    for g in opt.param_groups:
        for p in g["params"]:
            if not p.requires_grad:
                continue
            size = p.element_size()
            if "rank" in g:
                moment, proj = galore_shapes(*p.shape, rank, proj_type)
                total += size * (2 * moment[0] * moment[1] + sum(a * b for a, b in proj))
            else:
                total += 2 * p.numel() * size
    return total
