"""torch_compile: the models the cell uses run under ``torch.compile`` for the run.

Each root model (in the namespace, or built by the cell and caught at its first forward)
is compiled in place: its ``forward`` is replaced, on the instance, by
``torch.compile(model.forward)``, while its parameters, submodules, hooks and state dict
stay the same objects, so optimizers and references the cell holds keep working.
(``nn.Module.compile``, which compiles ``_call_impl``, traced no graph in torch 2.13: the
backend was never called.) ``undo()`` puts the instance's previous ``forward`` back, and the
model runs eagerly again; its weights keep what training did to them. A model built inside
the cell runs its first call eagerly (the hook that finds it runs inside that call) and
compiled from its second.

Inductor generates C++ on CPU: without a C++ compiler it cannot work, and the toggle is
refused when built (``CompilerMissingError``), before any work, naming the compiler it looked
for. ``backend=aot_eager`` or ``eager`` compile graphs without generating code.

Compile time, recompiles and graph breaks are the capture's to measure
(``swift_nb.capture.compile``), not this toggle's.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

from swift_nb.core.errors import ConfigError
from swift_nb.toggles.base import Toggle


def cxx_compiler() -> str | None:
    """The C++ compiler Inductor would use on CPU (``$CXX``, else ``g++``/``c++``/``clang++``),
    as a path; None when there is none."""
    wanted = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"]
    return next((found for name in wanted if (found := shutil.which(name))), None)


_ABSENT = object()


def _compiled(fn: Any) -> bool:
    """Whether ``fn`` is a function ``torch.compile`` returned."""
    return hasattr(fn, "_torchdynamo_orig_callable") or hasattr(fn, "_torchdynamo_inline")


class CompilerMissingError(ConfigError):
    """Inductor was asked for and no C++ compiler exists here."""


class TorchCompile(Toggle):
    id = "torch_compile"
    watches_models = True

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        if self.values["backend"] == "inductor" and cxx_compiler() is None:
            looked = os.environ.get("CXX") or "g++, c++ or clang++"
            raise CompilerMissingError(
                "torch_compile backend",
                f"needs a C++ compiler for Inductor on CPU and none was found ({looked}); install one "
                "(e.g. apt-get install g++) or use backend=aot_eager",
                "inductor",
            )

    def _watch(self) -> None:
        """The base class's hook, made invisible to dynamo: traced inside a compiled forward
        (global hooks run for every submodule) its set of models seen would become a guard
        that fails whenever the set grows, as it does at each call of a backend's graph
        module (``aot_eager``), recompiling every step."""
        seen = self._seen_modules

        def hook(module: nn.Module, args: Any) -> None:
            if torch.compiler.is_compiling() or id(module) in seen:
                return
            self._model(module, self._name_of(module))

        handle = register_module_forward_pre_hook(hook)
        self._hooks.append(handle.remove)

    def _apply_model(self, model: nn.Module, name: str) -> None:
        assert self.report is not None
        if getattr(model, "_compiled_call_impl", None) is not None or _compiled(model.forward):
            self.report.note(f"`{name}` is compiled already: left as it is")
            return
        mode, dynamic, backend = self.values["mode"], self.values["dynamic"], self.values["backend"]
        own = model.__dict__.get("forward", _ABSENT)
        model.forward = torch.compile(
            model.forward, mode=None if mode == "default" else mode, dynamic=dynamic, backend=backend
        )

        def restore() -> None:
            if own is _ABSENT:
                del model.forward
            else:
                model.forward = own

        self._undo.append(restore)
        how = ", ".join(
            f"{k}={v}"
            for k, v in (("backend", backend), ("mode", mode), ("dynamic", dynamic))
            if v is not None
        )
        self.report.change(f"`{name}` ({type(model).__name__}) compiled ({how})")
        self.report.details["compiled_models"] = self.report.details.get("compiled_models", 0) + 1

    def _nothing_found(self) -> str:
        return "no model ran a forward pass while the toggle was applied: nothing was compiled"
