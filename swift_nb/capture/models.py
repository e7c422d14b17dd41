"""The models a training cell holds, found where its optimizers are: the variables of the
frames on the call stack (a notebook cell's globals, a training function's locals, one
level inside their lists, tuples and dicts) and the framework driving the loop (a
Trainer's ``model`` and the frozen models it keeps beside it: DPO's ``ref_model``, a
distillation ``teacher_model``; Lightning's module).

Only root modules are kept (a module held inside another one found is that one's part),
by the name they were found under, one name per model. Of those the run uses (see
``swift_nb.capture.memory.stale_models``: they hold what the optimizers train, or they run), the
memory snapshot counts the parameters and buffers that no optimizer trains as
``frozen_parameters``; the others are only alive in the kernel. The OOM post-mortem names
tensors by their module paths.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Any

import torch
from torch import nn

from swift_nb.capture import frameworks

_TORCH_DIR = os.path.dirname(torch.__file__)
#: attributes of a training framework that hold models besides the one it trains
FRAMEWORK_MODELS = ("model", "ref_model", "teacher_model", "reward_model", "lightning_module")


def values(frame: FrameType, with_globals: bool) -> Iterator[tuple[str, Any]]:
    """The frame's variables (and, for user code, its globals), and one level inside the
    lists, tuples and dicts among them."""
    for name, value, _ in scoped_values(frame, with_globals):
        yield name, value


def scoped_values(frame: FrameType, with_globals: bool) -> Iterator[tuple[str, Any, bool]]:
    """``values`` with whether each is a global (a module-level frame's variables are)."""
    scopes = [(frame.f_locals, frame.f_code.co_name == "<module>")]
    if with_globals:
        scopes.append((frame.f_globals, True))
    for scope, is_global in scopes:
        for name, value in list(scope.items()):
            yield name, value, is_global
            if isinstance(value, (list, tuple)) and len(value) <= 64:
                for i, v in enumerate(value):
                    yield f"{name}[{i}]", v, is_global
            elif isinstance(value, dict) and len(value) <= 64 and name != "__builtins__":
                for k, v in list(value.items()):
                    if isinstance(k, str):
                        yield f"{name}[{k!r}]", v, is_global


def is_library(frame: FrameType) -> bool:
    """Code of torch or of an installed package (its globals are not the user's)."""
    path = frame.f_code.co_filename
    return path.startswith(_TORCH_DIR) or "site-packages" in path or "dist-packages" in path


def roots(found: dict[int, tuple[str, nn.Module]]) -> dict[str, nn.Module]:
    """The modules of ``found`` (id -> (name, module)) that no other one found contains."""
    inner = {id(m) for _, root in found.values() for m in root.modules() if m is not root}
    return {name: m for key, (name, m) in found.items() if key not in inner}


def in_frames(frames: list[FrameType]) -> dict[str, nn.Module]:
    """The root models the frames hold, by variable name (the frames' own order first).

    A model met under several names goes by the first global (the notebook's variables are
    what its user sees), else the first local, names of IPython's output cache (``_``,
    ``_3``, ``Out[3]``) last. Two models under one name (a function's local ``model`` beside
    the notebook's global ``model`` from an earlier cell) both stay: the global keeps the
    name, the local is named after its function (``train.model``)."""
    found: dict[int, tuple[str, nn.Module, str | None]] = {}  # id -> (name, model, function of a local)

    def add(name: str, value: Any, function: str | None) -> None:
        if not isinstance(value, nn.Module):
            return
        known = found.get(id(value))
        if known is None or _rank(name, function) < _rank(known[0], known[2]):
            found[id(value)] = (name, value, function)

    for frame in frames:
        library = is_library(frame)
        for name, v, is_global in scoped_values(frame, with_globals=not library):
            if name == "self":
                continue
            function = None if is_global else frame.f_code.co_name
            add(name, v, function)
            if frameworks.is_trainer(v) or frameworks.is_lightning_trainer(v):
                for attr in FRAMEWORK_MODELS:
                    add(f"{name}.{attr}", getattr(v, attr, None), function)
        owner = frame.f_locals.get("self")
        if frameworks.is_trainer(owner) or frameworks.is_lightning_trainer(owner):
            for attr in FRAMEWORK_MODELS:
                add(f"trainer.{attr}", getattr(owner, attr, None), frame.f_code.co_name)
    return roots(_unique_names(found))


def _rank(name: str, function: str | None) -> tuple[bool, bool]:
    """How a model's name is preferred, lowest first: not one of IPython's output cache
    (``_``, ``__``, ``_3``, ``Out[3]``) or a private one, then a global."""
    return name.startswith(("_", "Out[")), function is not None


def _unique_names(found: dict[int, tuple[str, nn.Module, str | None]]) -> dict[int, tuple[str, nn.Module]]:
    """One name per model: globals first keep theirs, then locals, a local whose name is
    taken prefixed with its function, then a number."""
    taken: set[str] = set()
    out: dict[int, tuple[str, nn.Module]] = {}
    ordered = sorted(found.items(), key=lambda kv: kv[1][2] is not None)  # stable: globals first
    for key, (name, model, function) in ordered:
        chosen = name
        if chosen in taken and function is not None:
            chosen = f"{function}.{name}"
        n = 2
        while chosen in taken:
            chosen, n = f"{name}#{n}", n + 1
        taken.add(chosen)
        out[key] = (chosen, model)
    return {key: out[key] for key in found}


def in_namespace(namespace: Mapping[str, Any]) -> dict[str, nn.Module]:
    """The root models among a namespace's variables (one level inside its containers)."""
    found: dict[int, tuple[str, nn.Module]] = {}
    for name, value in list(namespace.items()):
        if name.startswith("_"):
            continue
        items = [(name, value)]
        if isinstance(value, (list, tuple)) and len(value) <= 64:
            items += [(f"{name}[{i}]", v) for i, v in enumerate(value)]
        for key, v in items:
            if isinstance(v, nn.Module) and id(v) not in found:
                found[id(v)] = (key, v)
    return roots(found)


def on_stack(frame: FrameType | None) -> dict[str, nn.Module]:
    """``in_frames`` of ``frame`` and every frame that called it, innermost first."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return in_frames(frames)


def repeated_blocks(model: nn.Module) -> tuple[str, list[nn.Module]] | None:
    """The ``(path, blocks)`` of the container of ≥ 2 same-type modules holding the most
    parameters (the transformer blocks), or None."""
    best: tuple[int, str, list[nn.Module]] | None = None
    for path, mod in model.named_modules():
        if not isinstance(mod, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(mod.children())
        if len(children) < 2 or len({type(c) for c in children}) != 1:
            continue
        size = sum(p.numel() for p in mod.parameters())
        if size and (best is None or size > best[0]):
            best = (size, path, children)
    return None if best is None else (best[1], best[2])


def block_count(models: Mapping[str, nn.Module]) -> dict[str, Any] | None:
    """The repeated blocks of the largest of ``models`` that has some (``repeated_blocks``):
    ``{"count", "class", "path"}`` for the record (``context["repeated_blocks"]``), or None."""
    best: tuple[int, dict[str, Any]] | None = None
    for name, model in models.items():
        found = repeated_blocks(model)
        if found is None:
            continue
        path, blocks = found
        size = sum(p.numel() for b in blocks for p in b.parameters())
        if best is None or size > best[0]:
            where = f"{name}.{path}" if path else name
            best = (size, {"count": len(blocks), "class": type(blocks[0]).__name__, "path": where})
    return None if best is None else best[1]
