"""The models a training cell holds, found where its optimizers are: the variables of the
frames on the call stack (a notebook cell's globals, a training function's locals, one
level inside their lists, tuples and dicts) and the framework driving the loop (a
Trainer's ``model`` and the frozen models it keeps beside it: DPO's ``ref_model``, a
distillation ``teacher_model``; Lightning's module).

Only root modules are kept (a module held inside another one found is that one's part),
by the name they were found under. The memory snapshot counts their parameters and
buffers that no optimizer trains as ``frozen_parameters``; the OOM post-mortem names
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
    scopes = [frame.f_locals]
    if with_globals:
        scopes.append(frame.f_globals)
    for scope in scopes:
        for name, value in list(scope.items()):
            yield name, value
            if isinstance(value, (list, tuple)) and len(value) <= 64:
                for i, v in enumerate(value):
                    yield f"{name}[{i}]", v
            elif isinstance(value, dict) and len(value) <= 64 and name != "__builtins__":
                for k, v in list(value.items()):
                    if isinstance(k, str):
                        yield f"{name}[{k!r}]", v


def is_library(frame: FrameType) -> bool:
    """Code of torch or of an installed package (its globals are not the user's)."""
    path = frame.f_code.co_filename
    return path.startswith(_TORCH_DIR) or "site-packages" in path or "dist-packages" in path


def roots(found: dict[int, tuple[str, nn.Module]]) -> dict[str, nn.Module]:
    """The modules of ``found`` (id -> (name, module)) that no other one found contains."""
    inner = {id(m) for _, root in found.values() for m in root.modules() if m is not root}
    return {name: m for key, (name, m) in found.items() if key not in inner}


def in_frames(frames: list[FrameType]) -> dict[str, nn.Module]:
    """The root models the frames hold, by variable name (the frames' own order first)."""
    found: dict[int, tuple[str, nn.Module]] = {}

    def add(name: str, value: Any) -> None:
        if isinstance(value, nn.Module) and id(value) not in found:
            found[id(value)] = (name, value)

    for frame in frames:
        for name, v in values(frame, with_globals=not is_library(frame)):
            if name == "self":
                continue
            add(name, v)
            if frameworks.is_trainer(v) or frameworks.is_lightning_trainer(v):
                for attr in FRAMEWORK_MODELS:
                    add(f"{name}.{attr}", getattr(v, attr, None))
        owner = frame.f_locals.get("self")
        if frameworks.is_trainer(owner) or frameworks.is_lightning_trainer(owner):
            for attr in FRAMEWORK_MODELS:
                add(f"trainer.{attr}", getattr(owner, attr, None))
    return roots(found)


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
