"""Where a step goes by module, captured inside the traced window only.

While a recorded step runs, each module of the models the run uses marks its forward in
the trace as a named range (``trace_names.MODULE_PREFIX`` + its path: the module's own
``named_modules`` path, the model's variable name for its root), and the tensors its
forward saves for backward are counted (a ``saved_tensors_hooks`` pair: each saved tensor's
storage, once per module and step, to the innermost module running; parameters and buffers
are not activations and are left out). The backward of a module is found later in the
trace: each backward node carries the autograd sequence number of the forward op it
differentiates (``swift_nb.analysis.modules``).

The hooks are global module hooks and one saved-tensors pair, installed when a recorded
step begins and removed when the window ends: outside it a step pays nothing. A compiled
model runs as one graph (its modules are not called one by one) and a hook on it would
make dynamo recompile, so nothing is installed for a run that compiles; that is said in
the run's notes.

``describe`` gives each module's own parameters, the gradients they get and the optimizer
state they hold, and the saved bytes per recorded step: the rows the analysis completes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.hooks import RemovableHandle

from swift_nb.capture.memory.logits import find_head
from swift_nb.core import trace_names as tn

#: the most modules scoped (a model with more is scoped to this many, the shallowest first:
#: every scope costs a few microseconds per call)
MAX_MODULES = 4096


def _tensor_bytes(t: torch.Tensor) -> tuple[int, int] | None:
    """(storage address, storage bytes) of a tensor with storage; None for one without
    (a fake or functional tensor)."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None


def _local_bytes(t: torch.Tensor) -> int:
    """A tensor's bytes on this process: a DTensor's (FSDP2's sharded parameters and their
    optimizer state) local shard, not the whole it stands for."""
    local = t.to_local() if callable(getattr(t, "to_local", None)) else t
    return local.numel() * local.element_size()


def _state_bytes(state: Any) -> int:
    if isinstance(state, torch.Tensor):
        return _local_bytes(state)
    if isinstance(state, Mapping):
        return sum(_state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_state_bytes(v) for v in state)
    return 0


class ModuleScopes:
    """Module scopes and saved bytes of the models ``watch`` names, in the recorded steps."""

    def __init__(self, note: Callable[[str], None]) -> None:
        self.note = note
        self._paths: dict[int, str] = {}
        self._modules: dict[str, tuple[nn.Module, str, int]] = {}  # path → (module, parent, depth)
        self._roles: dict[int, str] = {}  # id(module) → ROLES' word, for the modules that have one
        self._own: set[int] = set()  # storages of parameters and buffers
        self._stack: list[tuple[nn.Module, Any]] = []
        self._handles: list[RemovableHandle] = []
        self._saved: saved_tensors_hooks | None = None
        self._step: dict[str, dict[int, int]] = {}
        # per recorded step: path → (bytes its own ops saved, bytes its subtree saved: a
        # storage saved by two of its children, as a norm's output by q, k and v, once)
        self.saved_steps: list[dict[str, tuple[int, int]]] = []
        self.failed: str | None = None
        self.skipped: str | None = None

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    def watch(self, models: Mapping[str, nn.Module]) -> None:
        """The models to scope (by the names they were found under); the first call wins."""
        if self._modules or not models:
            return
        many = len(models) > 1
        rows: list[tuple[int, str, nn.Module, str]] = []
        for name, model in models.items():
            named = list(model.named_modules(remove_duplicate=True))
            # the root is the model's variable (a Hugging Face model's own child may be
            # called "model" too)
            root = name if many or name not in {p for p, _ in named} else f"{name} (root)"
            for path, module in named:
                full = (f"{name}.{path}" if many else path) if path else root
                parent = "" if not path else (root if "." not in path else full.rsplit(".", 1)[0])
                rows.append((path.count(".") + 1 if path else 0, full, module, parent))
            self._roles.update(_roles(model))
        rows.sort(key=lambda r: r[0])
        for depth, full, module, parent in rows[:MAX_MODULES]:
            if id(module) in self._paths:
                continue
            self._paths[id(module)] = full
            self._modules[full] = (module, parent, depth)
        if len(rows) > MAX_MODULES:
            self.note(f"modules: {len(rows)} modules, the {MAX_MODULES} shallowest scoped")

    def at_boundary(
        self, recorded: bool, models: Callable[[], Mapping[str, nn.Module]], compiled: bool = False
    ) -> None:
        """A step ends (the one before is kept) and the next begins: scoped when the
        profiler records it (``models``: the models the run uses, asked for once), never
        once the run has compiled something (``compiled``)."""
        self.step_done()
        if compiled and not self.skipped:
            self.skipped = (
                "the run compiles with torch.compile: its modules run as graphs, so time and memory by module "
                "were not recorded (profile it without torch.compile to see them)"
            )
            self.note(f"modules: {self.skipped}")
        if not recorded or self.skipped:
            self.stop()
        elif not self.installed:
            self.watch(models())
            self.start()

    def add_to(self, context: dict[str, Any], optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """``context["modules"]``: ``describe``'s rows, when a step was scoped."""
        if not self.saved_steps:
            return
        try:
            context["modules"] = self.describe(optimizers)
        except Exception as e:  # an odd model must not cost the run its record
            self.note(f"modules: could not be described ({type(e).__name__}: {e})")

    def start(self) -> None:
        """Install the hooks (a recorded step begins)."""
        if self.installed or not self._modules or self.failed or self.skipped:
            return
        compiled = [p for p, (m, _, _) in self._modules.items() if _is_compiled(m)]
        if compiled:
            self.skipped = (
                f"{compiled[0]} is compiled: its modules run as one graph, so time and memory by "
                "module were not recorded (profile it without torch.compile to see them)"
            )
            self.note(f"modules: {self.skipped}")
            return
        try:
            self._own = {
                ptr
                for m, _, _ in self._modules.values()
                for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))
                if (ptr := (_tensor_bytes(t) or (0, 0))[0])
            }
            self._handles = [
                nn.modules.module.register_module_forward_pre_hook(self._enter),
                nn.modules.module.register_module_forward_hook(self._exit, always_call=True),
            ]
            self._saved = saved_tensors_hooks(self._pack, _unpack)
            self._saved.__enter__()
        except Exception as e:  # an odd model must never break the training loop
            self.failed = f"{type(e).__name__}: {e}"
            self.note(f"modules: the scopes could not be installed ({self.failed})")
            self.stop()

    def step_done(self) -> None:
        """A recorded step ended: its saved bytes are kept."""
        if not self.installed:
            return
        subtree: dict[str, dict[int, int]] = {}
        for path, saved in self._step.items():
            up = path
            while up:
                subtree.setdefault(up, {}).update(saved)
                up = self._modules[up][1]
        self.saved_steps.append(
            {p: (sum(self._step.get(p, {}).values()), sum(s.values())) for p, s in subtree.items()}
        )
        self._step = {}

    def stop(self) -> None:
        """Remove every hook (the window ended, or the run did)."""
        if not self._handles and self._saved is None and not self._stack:
            return
        for h in self._handles:
            h.remove()
        self._handles = []
        while self._stack:  # a forward that raised left its scopes open
            self._stack.pop()[1].__exit__(None, None, None)
        if self._saved is not None:
            try:
                self._saved.__exit__(None, None, None)
            except RuntimeError as e:  # another thread's, or popped by someone else
                self.note(f"modules: the saved-tensor hooks could not be removed ({e})")
            self._saved = None
        self._step = {}

    # -- hooks (hot path: only inside the window) --------------------------------------------

    def _enter(self, module: nn.Module, args: Any) -> None:
        path = self._paths.get(id(module))
        if path is None:
            return
        scope = torch.autograd.profiler.record_function(tn.MODULE_PREFIX + path)
        scope.__enter__()
        self._stack.append((module, scope))

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        if id(module) not in self._paths or not any(m is module for m, _ in self._stack):
            return
        while self._stack:
            m, scope = self._stack.pop()
            scope.__exit__(None, None, None)
            if m is module:
                break

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if self._stack:
            found = _tensor_bytes(t)
            if found is not None and found[0] not in self._own:
                path = self._paths[id(self._stack[-1][0])]
                self._step.setdefault(path, {})[found[0]] = found[1]
        return t

    # -- the record ------------------------------------------------------------------------

    def describe(self, optimizers: Iterable[torch.optim.Optimizer]) -> list[dict[str, Any]]:
        """One row per scoped module: path, parent, class, depth, its own parameters' bytes,
        the gradients they get (those that require grad, at their dtype), the optimizer
        state they hold, and the bytes its own ops and its subtree saved per recorded step
        (means; a storage counted once however many of its ops saved it)."""
        state: dict[int, int] = {}
        for opt in optimizers:
            for p, s in getattr(opt, "state", {}).items():
                if isinstance(p, torch.Tensor):
                    state[id(p)] = state.get(id(p), 0) + _state_bytes(s)
        steps = max(1, len(self.saved_steps))
        rows = []
        for path, (module, parent, depth) in self._modules.items():
            own = list(module.parameters(recurse=False))
            rows.append(
                {
                    "path": path,
                    "parent": parent,
                    "class": _class_name(module),
                    "depth": depth,
                    "role": self._roles.get(id(module), ""),
                    "dtype": _dtype(own),
                    "parameter_bytes": sum(_local_bytes(p) for p in own),
                    "gradient_bytes": sum(_local_bytes(p) for p in own if p.requires_grad),
                    "state_bytes": sum(state.get(id(p), 0) for p in own),
                    "saved_self_bytes": sum(s.get(path, (0, 0))[0] for s in self.saved_steps) / steps,
                    "saved_bytes": sum(s.get(path, (0, 0))[1] for s in self.saved_steps) / steps,
                }
            )
        return rows


#: what a module is to the analyses beside its class: the model's LM head (its output
#: embeddings, ``capture.memory.logits.find_head``), a part of a peft adapter (LoRA's A and B,
#: their dropout: trained apart from the frozen base), or a unit FSDP2 shards (``fully_shard``)
ROLES = ("lm_head", "adapter", "sharded")


def _roles(model: nn.Module) -> dict[int, str]:
    """id(module) → its role (``ROLES``) for the modules of ``model`` that have one."""
    roles: dict[int, str] = {}
    for m in model.modules():
        if type(m).__name__.startswith("FSDP") and hasattr(m, "reshard"):  # fully_shard's class
            roles[id(m)] = "sharded"
    head, known = find_head(model)
    if head is not None and known:
        roles[id(head)] = "lm_head"
    for m in model.modules():
        # a peft tuner layer names the attributes holding its adapters (lora_A, lora_B, …)
        names = (*getattr(m, "adapter_layer_names", ()), *getattr(m, "other_param_names", ()))
        for name in names if isinstance(names, tuple) else ():
            part = getattr(m, name, None)
            if isinstance(part, nn.Module):
                roles.update((id(sub), "adapter") for sub in part.modules())
    return roles


def _class_name(module: nn.Module) -> str:
    """The module's class; the model's own for a module FSDP2 wrapped (``FSDPLlamaDecoderLayer``
    is a ``LlamaDecoderLayer``)."""
    cls = type(module)
    if cls.__name__.startswith("FSDP") and hasattr(module, "reshard"):
        own = [c for c in cls.__mro__[1:] if c.__name__ == cls.__name__[4:]]
        if own:
            return own[0].__name__
    return cls.__name__


def _dtype(params: list[torch.Tensor]) -> str:
    """The element type of a module's own parameters (``bfloat16``), ``mixed`` when they
    differ, empty without any."""
    kinds = {str(p.dtype).removeprefix("torch.") for p in params}
    return kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "")


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _is_compiled(module: nn.Module) -> bool:
    """A module ``torch.compile`` wraps, ``module.compile()`` compiled, or whose forward is a
    function ``torch.compile`` returned."""
    forward = module.__dict__.get("forward")
    return (
        type(module).__name__ == "OptimizedModule"
        or getattr(module, "_compiled_call_impl", None) is not None
        or hasattr(forward, "_torchdynamo_orig_callable")
        or hasattr(forward, "_torchdynamo_inline")
    )
