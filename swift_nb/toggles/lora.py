"""lora: LoRA adapters (Hu et al., 2021) on the cell's model for one run; qlora: the same on
a 4-bit NF4 base (Dettmers et al., 2023).

Uses ``peft`` (``pip install peft``); ``qlora`` also ``bitsandbytes`` and a CUDA device.

The adapters are injected in place (``peft.inject_adapter_in_model``): each targeted layer
becomes peft's LoRA layer around the original one, so the variables of the notebook keep
pointing at the same model object. ``targets=auto`` targets the linear layers (``nn.Linear``,
and transformers' ``Conv1D`` of GPT-2 and its relatives) inside the repeated blocks (the
attention and MLP projections of the transformer layers), never the embeddings or the LM
head; named targets (``q_proj|v_proj``) match module paths by their last components, anywhere
in the model (a model with none of them is left alone; a name that no model has, or that one
lacks beside names it has, is refused). Every base parameter is frozen for the run.

Optimizers that hold the model's parameters (in the namespace, or built while applied: moved
at their first step) are moved onto the adapters: each parameter group keeps its
hyperparameters and holds the adapters of the layers whose parameters it held. Their state
starts empty for the run.

``undo()`` puts the original layers back, drops the adapters and restores ``requires_grad``;
each optimizer gets back its own parameter groups and state objects (keeping each group's
last learning rate, which a scheduler may have moved). The base weights did not train, so
they are bitwise what they were.

qlora also replaces every ``nn.Linear`` of the repeated blocks (targeted or not) by a
bitsandbytes ``Linear4bit`` (NF4 weights, bfloat16 compute) before adding the adapters; the
original weights wait on the CPU for the run and come back with their layers on undo.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from swift_nb.capture.models import repeated_blocks
from swift_nb.core.errors import ConfigError, MissingDependencyError
from swift_nb.core.quiet import quiet_import
from swift_nb.toggles.base import Toggle, ToggleReport, find_models, find_optimizers


def linear_layer(module: nn.Module) -> bool:
    """A linear layer: ``nn.Linear``, or transformers' ``Conv1D`` (the same map with its
    weight stored transposed, in GPT-2 and its relatives)."""
    cls = type(module)
    return isinstance(module, nn.Linear) or (
        cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers.")
    )


def peft_adapters(model: nn.Module) -> str | None:
    """What peft adapters ``model`` carries (``"LoRA adapters (r=8)"``), or None when it is
    no peft model (checked without importing peft)."""
    layers = [m for m in model.modules() if type(m).__module__.startswith("peft.")]
    if not layers and not hasattr(model, "peft_config"):
        return None
    lora = [m for m in layers if type(m).__module__.startswith("peft.tuners.lora")]
    ranks = sorted({r for m in lora if isinstance(getattr(m, "r", None), dict) for r in m.r.values()})
    what = "LoRA adapters" if lora else "peft adapters"
    return f"{what} (r={', '.join(map(str, ranks))})" if ranks else what


def _peft(toggle_id: str) -> tuple[Any, list[str]]:
    """peft, and what importing it logged (it imports bitsandbytes, which warns about
    optional CPU kernels): kept for the run's notes, not printed under the cell."""
    try:
        peft, said = quiet_import("peft", "bitsandbytes")
    except ImportError as e:
        raise MissingDependencyError(
            f"the {toggle_id} toggle needs the peft package ({e}): pip install peft"
        ) from None
    return peft, said


def _short(path: str) -> str:
    """A layer's name for the report: its last path component, with its parent's when the
    last is an index (``mlp.0``)."""
    parts = path.split(".")
    return ".".join(parts[-2:]) if parts[-1].isdigit() and len(parts) > 1 else parts[-1]


def _listing(names: list[str], most: int = 8) -> str:
    unique = list(dict.fromkeys(names))
    return ", ".join(unique[:most]) + (", …" if len(unique) > most else "")


def _linear_names(model: nn.Module) -> str:
    return _listing([_short(p) for p, m in model.named_modules() if linear_layer(m)])


class LoRA(Toggle):
    id = "lora"
    watches_models = True

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        self._peft, self._said = _peft(self.id)  # fail before any work when peft is missing
        self._names = [n.strip() for n in self.values["targets"].split("|") if n.strip()]
        self._adapters: dict[int, list[nn.Parameter]] = {}  # id(base parameter) -> its layer's adapters
        self._frozen: set[int] = set()  # base parameters that do not train in the run
        self._adapter_ids: set[int] = set()
        self._moved: set[int] = set()  # optimizers moved onto adapters
        self._unmoved: dict[int, int] = {}  # optimizer -> injections when it held none of their models
        self._injections = 0

    def apply(self, namespace: Mapping[str, Any] | None = None) -> ToggleReport:
        checked = [  # every refusal before any change
            (name, model, self._targets(model, name))
            for name, model in find_models(namespace or {})
            if peft_adapters(model) is None and next(model.parameters(), None) is not None
        ]
        if self._names != ["auto"] and checked and not any(targets for _, _, targets in checked):
            name, model, _ = max(checked, key=lambda c: sum(p.numel() for p in c[1].parameters()))
            raise self._unknown(model, name, self._names[0])
        self._prepare()
        report = super().apply(namespace)
        self._hooks.append(register_optimizer_step_pre_hook(self._before_step).remove)
        return report

    def _prepare(self) -> None:
        """Checks and imports that need no model, once the models found passed theirs."""

    # -- models ----------------------------------------------------------------------------

    def _targets(self, model: nn.Module, name: str) -> list[tuple[str, nn.Module]]:
        """``(path, layer)`` of the layers of ``model`` to adapt; empty when it has none
        (``auto``: no repeated blocks) or none of the names. A ConfigError names a target
        that is no linear layer, or that is missing where others were found (a typo)."""
        modules = list(model.named_modules())
        if self._names == ["auto"]:
            found = repeated_blocks(model)
            inside = {id(m) for block in (found[1] if found else []) for m in block.modules()}
            return [(p, m) for p, m in modules if id(m) in inside and linear_layer(m)]
        out: list[tuple[str, nn.Module]] = []
        missing = []
        for target in self._names:
            matched = [(p, m) for p, m in modules if p and (p == target or p.endswith("." + target))]
            other = next((m for _, m in matched if not linear_layer(m)), None)
            if other is not None:
                raise ConfigError(
                    f"{self.id} targets",
                    f"must name linear layers of `{name}`: {target} is a {type(other).__name__}; "
                    f"linear layers are {_linear_names(model)}",
                    self.values["targets"],
                )
            if not matched:
                missing.append(target)
            out += [(p, m) for p, m in matched if all(p != q for q, _ in out)]
        if out and missing:
            raise self._unknown(model, name, missing[0])
        return out

    def _unknown(self, model: nn.Module, name: str, target: str) -> ConfigError:
        return ConfigError(
            f"{self.id} targets",
            f"must name modules of `{name}`: no module named {target}; "
            f"linear layers are {_linear_names(model) or 'none'}",
            self.values["targets"],
        )

    def _apply_model(self, model: nn.Module, name: str) -> None:
        assert self.report is not None
        what = f"`{name}` ({type(model).__name__})"
        carried = peft_adapters(model)
        if carried is not None:
            self.report.note(f"{what} already carries {carried}: left alone")
            return
        targets = self._targets(model, name)
        if not targets:
            self.report.note(
                f"{what} has no repeated blocks with linear layers for targets=auto: "
                "name the layers to adapt (targets=q_proj|v_proj)"
                if self._names == ["auto"]
                else f"{what} has no module named {' or '.join(self._names)}: left alone"
            )
            return
        base = sum(p.numel() for p in model.parameters())  # counted before qlora packs them
        layers = self._inject(model, what, targets)
        self._injections += 1
        trainable = sum(p.numel() for ps in layers.values() for p in ps)
        total = base + trainable
        r = self.values["r"]
        self.report.change(
            f"{what}: LoRA r={r} on {len(layers)} modules ({_listing([_short(p) for p, _ in targets])}): "
            f"{100 * trainable / total:.3g} % of parameters train"
        )
        d = self.report.details
        d["trainable_params"] = d.get("trainable_params", 0) + trainable
        d["total_params"] = d.get("total_params", 0) + total
        d["targets"] = d.get("targets", 0) + len(layers)
        for opt_name, opt in find_optimizers(self._namespace):
            self._move(opt, opt_name)

    def _inject(
        self, model: nn.Module, what: str, targets: list[tuple[str, nn.Module]]
    ) -> dict[str, list[nn.Parameter]]:
        """Put LoRA layers at the ``targets`` paths of ``model`` (``what`` in the report)
        and freeze the rest; returns each adapted path's adapter parameters."""
        children = [
            (parent, key, child) for parent in model.modules() for key, child in parent._modules.items()
        ]
        trainable = [(p, p.requires_grad) for p in model.parameters()]
        had_config = "peft_config" in model.__dict__

        def restore() -> None:
            for parent, key, child in children:
                if parent._modules.get(key) is not child:
                    parent._modules[key] = child
            if not had_config:
                model.__dict__.pop("peft_config", None)
            for p, flag in trainable:
                p.requires_grad_(flag)

        self._undo.append(restore)
        config = self._peft.LoraConfig(
            r=self.values["r"],
            lora_alpha=self.values["alpha"],
            lora_dropout=self.values["dropout"],
            target_modules=[p for p, _ in targets],
            fan_in_fan_out=not any(isinstance(m, nn.Linear) for _, m in targets),  # GPT-2's Conv1D
        )
        self._peft.inject_adapter_in_model(config, model)
        base = {id(p) for p, _ in trainable}
        for p in model.parameters():
            if id(p) in base:
                p.requires_grad_(False)
        self._frozen |= base
        layers: dict[str, list[nn.Parameter]] = {}
        for path, _ in targets:
            layer = model.get_submodule(path)
            adapters = [p for p in layer.parameters() if id(p) not in base]
            for p in adapters:  # fp32 adapters on a half-precision base, as get_peft_model makes them
                if p.dtype in (torch.float16, torch.bfloat16):
                    p.data = p.data.float()
            layers[path] = adapters
            self._adapter_ids |= {id(p) for p in adapters}
            for p in layer.get_base_layer().parameters():
                self._adapters.setdefault(id(p), []).extend(adapters)
        return layers

    # -- optimizers ------------------------------------------------------------------------

    def _apply_optimizer(self, opt: torch.optim.Optimizer, name: str) -> None:
        self._move(opt, name)

    def _before_step(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """An optimizer built while applied (or holding a model adapted since it was seen)
        is moved before its first step."""
        if id(opt) not in self._moved and self._unmoved.get(id(opt)) != self._injections:
            self._move(opt, self._name_of(opt))

    def _move(self, opt: torch.optim.Optimizer, name: str) -> None:
        """Point ``opt``'s parameter groups at the adapters of the base parameters they hold
        (frozen ones dropped, others kept), with the same options; back on undo."""
        assert self.report is not None
        if id(opt) in self._moved:
            return
        groups = opt.param_groups
        held = [p for g in groups for p in g["params"]]
        if not any(id(p) in self._frozen for p in held):
            if any(id(p) in self._adapter_ids for p in held):  # built from the adapters alone
                self._moved.add(id(opt))
            else:
                self._unmoved[id(opt)] = self._injections
            return
        seen: set[int] = set()
        new_groups = []
        for g in groups:
            params = []
            for p in g["params"]:
                for q in self._adapters.get(id(p), [] if id(p) in self._frozen else [p]):
                    if id(q) not in seen:
                        seen.add(id(q))
                        params.append(q)
            new_groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": params})
        saved = {k: opt.__dict__[k] for k in ("param_groups", "state")}
        opt.param_groups = new_groups
        opt.state = defaultdict(dict)
        self._moved.add(id(opt))

        def restore() -> None:
            for old, new in zip(saved["param_groups"], new_groups, strict=False):
                if "lr" in new:
                    old["lr"] = new["lr"]
            opt.__dict__.update(saved)

        self._undo.append(restore)
        count = sum(p.numel() for g in new_groups for p in g["params"])
        self.report.change(
            f"`{name}` ({type(opt).__name__}): trains {len(seen)} adapter tensors ({count:,} parameters) "
            f"in place of its {len(held)} tensors, with the same hyperparameters; its state starts empty"
        )

    def _finalize(self, report: ToggleReport) -> None:
        if self._injections and not self._moved:
            report.note(
                "no optimizer holding the adapted model's parameters was found or stepped: "
                "the adapters did not train"
            )

    def _nothing_found(self) -> str:
        return "no model was found or ran a forward pass while the toggle was applied"


class QLoRA(LoRA):
    id = "qlora"

    def _targets(self, model: nn.Module, name: str) -> list[tuple[str, nn.Module]]:
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise ConfigError(
                self.id, f"needs a CUDA device: the model's parameters are on {device.type}", name
            )
        return super()._targets(model, name)

    def _prepare(self) -> None:
        if not torch.cuda.is_available():
            raise ConfigError(self.id, "needs a CUDA device: torch sees none", torch.__version__)
        try:
            import bitsandbytes
        except ImportError as e:
            raise MissingDependencyError(
                f"the qlora toggle needs the bitsandbytes package ({e}): pip install bitsandbytes"
            ) from None
        self._bnb = bitsandbytes

    def _inject(
        self, model: nn.Module, what: str, targets: list[tuple[str, nn.Module]]
    ) -> dict[str, list[nn.Parameter]]:
        assert self.report is not None
        quantized = self._quantize(model)
        if quantized:
            before = sum(o.weight.numel() * o.weight.element_size() for o, _ in quantized)
            after = sum(q.weight.numel() * q.weight.element_size() for _, q in quantized)
            self.report.change(
                f"{what}: {len(quantized)} nn.Linear layers of its blocks in 4-bit NF4 (bitsandbytes "
                f"Linear4bit, bfloat16 compute): their weights {before:,} → {after:,} bytes"
            )
            d = self.report.details
            d["quantized_layers"] = d.get("quantized_layers", 0) + len(quantized)
        else:
            self.report.note(
                f"{what} has no nn.Linear in its repeated blocks to quantize: LoRA on its own weights"
            )
        had_flag = "is_loaded_in_4bit" in model.__dict__
        model.is_loaded_in_4bit = True  # what peft reads to wrap Linear4bit layers
        if not had_flag:
            self._undo.append(lambda: model.__dict__.pop("is_loaded_in_4bit", None))
        layers = super()._inject(model, what, targets)
        for original, q in quantized:
            self._frozen.add(id(original.weight))
            self._adapters[id(original.weight)] = self._adapters.get(id(q.weight), [])
        return layers

    def _quantize(self, model: nn.Module) -> list[tuple[nn.Linear, nn.Module]]:
        """Replace each ``nn.Linear`` of the repeated blocks by an NF4 ``Linear4bit`` sharing
        its bias; the original weights move to the CPU until undo."""
        found = repeated_blocks(model)
        inside = {id(m) for block in (found[1] if found else []) for m in block.modules()}
        done: dict[int, tuple[nn.Linear, nn.Module]] = {}
        places = []
        for parent in model.modules():
            for key, child in parent._modules.items():
                if id(child) in inside and isinstance(child, nn.Linear):
                    if id(child) not in done:
                        done[id(child)] = (child, self._nf4(child))
                    places.append((parent, key, child))
        offloaded: list[tuple[nn.Parameter, torch.device]] = []

        def restore() -> None:
            for weight, device in offloaded:
                weight.data = weight.data.to(device)
            for parent, key, child in places:
                parent._modules[key] = child

        self._undo.append(restore)
        for original, _ in done.values():
            offloaded.append((original.weight, original.weight.device))
            original.weight.data = original.weight.data.to("cpu")
        for parent, key, child in places:
            parent._modules[key] = done[id(child)][1]
        return list(done.values())

    def _nf4(self, linear: nn.Linear) -> nn.Module:
        bnb = self._bnb
        q = bnb.nn.Linear4bit(
            linear.in_features,
            linear.out_features,
            bias=False,
            compute_dtype=torch.bfloat16,
            quant_type="nf4",
            device="meta",
        )
        device = linear.weight.device
        q.weight = bnb.nn.Params4bit(linear.weight.data, requires_grad=False, quant_type="nf4", module=q).to(
            device
        )
        q.bias = linear.bias
        return q
