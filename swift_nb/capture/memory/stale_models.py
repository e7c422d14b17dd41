"""Models alive in the kernel that the run does not use: a notebook keeps the models of
earlier cells, and their memory, until their variables go.

Of the root models a run finds (``swift_nb.capture.models``) it uses those that
- hold a parameter of an optimizer that stepped in the run, or
- ran forward (any of their modules) since they were watched: a frozen teacher, a reference.
The others are only alive (stale). Whether a model ran is told by a forward pre-hook on each
of its modules, all of them removed the first time one fires: a model that runs pays one
call. A model is stale only once it was watched over a whole step without running: those
found when the run starts from its first step, those the first boundary finds (built in
the cell) from the second; until then it counts as used.

A stale model's bytes (``stale_entry``) are those of its parameters and buffers that
nothing the run uses holds too; the memory by category counts them as ``other``, not
``frozen_parameters``, and the run's summary names them (``STALE_MODELS_KEY``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from swift_nb.capture.memory.categories import quantization_state
from swift_nb.core.units import fmt_bytes
from swift_nb.record import FINETUNE_KEY, STALE_MODELS_KEY


class ModelUse:
    """Which root models ran forward since ``watch`` saw them; ``boundary()`` at each step's
    end, ``stop()`` removes what hooks are left. Holds no model alive (weak references)."""

    def __init__(self) -> None:
        self._watched: dict[int, tuple[weakref.ref[nn.Module], int]] = {}  # id -> (model, since boundary)
        self._handles: dict[int, list[Any]] = {}
        self._ran: set[int] = set()
        self._boundaries = 0

    def watch(self, models: Iterable[nn.Module]) -> None:
        """Hook the modules of each model not watched yet (again safe)."""
        for model in models:
            known = self._watched.get(id(model))
            if known is not None and known[0]() is model:
                continue
            key = id(model)
            self._ran.discard(key)  # an id a freed model had
            hook = torch.compiler.disable(self._hook(key))  # never traced into a compiled forward
            handles = self._handles[key] = []
            try:
                for m in model.modules():
                    handles.append(m.register_forward_pre_hook(hook))
            except Exception:  # a module that takes no hooks (a ScriptModule): never called stale
                self._watched.pop(key, None)
                for handle in self._handles.pop(key):
                    handle.remove()
                continue
            self._watched[key] = (weakref.ref(model), self._boundaries)

    def _hook(self, key: int):
        def ran(module: nn.Module, args: Any) -> None:
            self._ran.add(key)
            for handle in self._handles.pop(key, ()):
                handle.remove()

        return ran

    def boundary(self) -> None:
        self._boundaries += 1

    def unused(self, model: nn.Module) -> bool:
        """Whether ``model`` was watched over a whole step and never ran."""
        known = self._watched.get(id(model))
        if known is None or known[0]() is not model:
            return False
        return id(model) not in self._ran and self._boundaries > known[1]

    def stop(self) -> None:
        for handles in self._handles.values():
            for handle in handles:
                handle.remove()
        self._handles.clear()


def untrained(
    models: Mapping[str, nn.Module], optimizers: Iterable[torch.optim.Optimizer]
) -> dict[str, nn.Module]:
    """The models of ``models`` that hold no parameter of the optimizers."""
    held = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
    return {name: m for name, m in models.items() if not any(id(p) in held for p in m.parameters())}


def split(
    models: Mapping[str, nn.Module], optimizers: Iterable[torch.optim.Optimizer], use: ModelUse
) -> tuple[dict[str, nn.Module], dict[str, nn.Module]]:
    """``models`` as (used, stale): stale ones are ``untrained`` and ``use.unused``."""
    stale = {name: m for name, m in untrained(models, optimizers).items() if use.unused(m)}
    return {name: m for name, m in models.items() if name not in stale}, stale


def _storages(model: nn.Module) -> dict[int, tuple[int, str]]:
    """Data pointer -> (bytes, device) of the storages of the model's parameters, buffers
    and quantization state."""
    out: dict[int, tuple[int, str]] = {}
    for t in (*model.parameters(), *model.buffers()):
        for part in (t, *quantization_state(t)):
            if isinstance(part, torch.Tensor) and part.device.type != "meta":
                st = part.untyped_storage()
                if st.data_ptr():
                    out.setdefault(st.data_ptr(), (st.nbytes(), str(part.device)))
    return out


def entries(
    stale: Mapping[str, nn.Module],
    used: Mapping[str, nn.Module],
    optimizers: Iterable[torch.optim.Optimizer] = (),
) -> list[dict[str, Any]]:
    """The summary's ``stale_models``: ``{variable, class, bytes, device, device_bytes}`` of
    each stale model holding bytes that no used model or optimizer holds too (``device``:
    where most of them are; ``device_bytes``: how many on each device), the largest first."""
    shared = {ptr for m in used.values() for ptr in _storages(m)}
    for opt in optimizers:
        for t in (*(p for g in opt.param_groups for p in g["params"]), *_state_tensors(opt)):
            if isinstance(t, torch.Tensor):
                shared.add(t.untyped_storage().data_ptr())
    out = []
    for name, model in stale.items():
        own = {ptr: v for ptr, v in _storages(model).items() if ptr not in shared}
        shared |= own.keys()  # two stale names of one storage: counted once
        if not own:
            continue
        by_device: dict[str, int] = {}
        for nbytes, device in own.values():
            by_device[device] = by_device.get(device, 0) + nbytes
        out.append(
            {
                "variable": name,
                "class": type(model).__name__,
                "bytes": sum(by_device.values()),
                "device": max(by_device, key=by_device.__getitem__),
                "device_bytes": dict(sorted(by_device.items())),
            }
        )
    return sorted(out, key=lambda e: -e["bytes"])


def _state_tensors(opt: torch.optim.Optimizer) -> list[Any]:
    return [t for state in opt.state.values() for t in state.values()]


def note(found: list[dict[str, Any]]) -> str:
    """The run's note naming the stale models."""
    each = [f"`{e['variable']}` ({e['class']}, {fmt_bytes(e['bytes'])})" for e in found]
    names = each[0] if len(each) == 1 else ", ".join(each[:-1]) + f" and {each[-1]}"
    alive, them = ("is", "it") if len(found) == 1 else ("are", "them")
    return (
        f"{names} {alive} alive in the kernel but the run neither trained nor ran {them}: "
        "counted as other in memory by category, not as frozen_parameters"
    )


def name_in(
    run: Any,
    models: Mapping[str, nn.Module],
    optimizers: Iterable[torch.optim.Optimizer],
    used_in_run: Any,
    say: Callable[[str], None],
) -> None:
    """The models only alive in the kernel (``split``), named in ``run``'s summary
    (``STALE_MODELS_KEY``) and notes, and left out of its fine-tuning's ``frozen_models``;
    what could not be read is a note."""
    optimizers = list(optimizers)
    try:
        used, stale = split(models, optimizers, used_in_run)
        found = entries(stale, used, optimizers)
    except Exception as e:  # an odd model must not cost the run its record
        say(f"the models alive in the kernel could not be read ({type(e).__name__}: {e})")
        return
    ft = run.context.get(FINETUNE_KEY)
    if stale and isinstance(ft, dict) and isinstance(ft.get("frozen_models"), list):
        kept = [m for m in ft["frozen_models"] if not (isinstance(m, dict) and m.get("variable") in stale)]
        ft.pop("frozen_models")
        if kept:
            ft["frozen_models"] = kept
    if found:
        run.summary[STALE_MODELS_KEY] = found
        say(note(found))
