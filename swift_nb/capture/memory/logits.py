"""The loss's logits, known by where they come from: the output of the language model's head,
the tensors the loss computes from it (upcasts, copies, log-softmax, softmax) and their
gradients, down to the gradient of the head's output. Never by their size: a B·T × V
allocation has the size of an ordinary activation whenever B·T × V is a power-of-two
multiple of the hidden sizes (a 32 768 vocabulary; 32 000 with B·T a multiple of 125).

The head (``find_head``) is the model's output embeddings (``get_output_embeddings()``),
else a linear layer whose weight is an embedding's (tied), else a linear layer whose output
the model returns as it is (checked on each forward, by identity). Where none is found, the
run has no ``logits`` category and a note says why.

``Lineage`` follows the logits while the profiler records a step: a forward hook on the head
marks its output's storage and starts a dispatch mode that marks every new storage an
operation computes from a marked one; a hook on the output's gradient marks that gradient
and ends the lineage (the head's own backward, from there on, computes the hidden states'
gradient). Each marked storage is written into the trace as a zero-length event named
``MARK`` + its address in hex, after the allocation that made it; the replay
(``capture.memory.categories``) counts the latest allocation at that address before the
event as logits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode
from torch.utils._pytree import tree_flatten

from swift_nb.core.trace_names import LOGITS_MARK as MARK

#: the smallest vocabulary whose logits are their own category (below: a classifier's head)
MIN_VOCAB = 1000


def find_head(model: nn.Module, min_vocab: int = MIN_VOCAB) -> tuple[nn.Module | None, bool]:
    """``model``'s LM head and whether it is known by the model's own word (its output
    embeddings, or a weight tied to its input embeddings): such a head's output is the
    logits. A head found otherwise (the widest linear layer as wide as an embedding has rows)
    is a candidate only, its output the logits where the model returns it (``Lineage``).
    (None, False) for a model that is not a language model (of ``min_vocab`` tokens or more)."""
    get = getattr(model, "get_output_embeddings", None)
    try:
        head = get() if callable(get) else None
    except Exception:  # a model's own method: whatever it raises, no head from it
        head = None
    if isinstance(head, nn.Module) and _width(head) >= min_vocab:
        return head, True
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding) and m.num_embeddings >= min_vocab]
    weights = {id(m.weight) for m in embeddings}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    tied = [m for m in linears if id(m.weight) in weights]
    if tied:
        return tied[-1], True
    rows = {m.num_embeddings for m in embeddings}
    wide = [m for m in linears if m.out_features in rows]
    if wide:
        return max(wide, key=lambda m: m.out_features), False
    return None, False


def lm_shape(models: Iterable[nn.Module]) -> tuple[int, int] | None:
    """(vocabulary, hidden size) of the first language model's head among ``models``, of any
    vocabulary; None when none is a language model."""
    for model in models:
        head, _ = find_head(model, min_vocab=1)
        shape = head_shape(head) if head is not None else None
        if shape is not None:
            return shape
    return None


def _width(head: nn.Module) -> int:
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) and weight.dim() == 2 else 0


def head_shape(head: nn.Module) -> tuple[int, int] | None:
    """(vocabulary, hidden size) of a head: its weight's rows and columns."""
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[0]), int(weight.shape[1])
    return None


def _storages(tree: Any) -> list[torch.UntypedStorage]:
    found = []
    for t in tree_flatten(tree)[0]:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_meta:
            try:
                found.append(t.untyped_storage())
            except (RuntimeError, NotImplementedError):  # a tensor subclass without one
                pass
    return found


def _mark(ptrs: Iterable[int]) -> None:
    """A zero-length event in the trace naming storages just made (hex addresses)."""
    with torch.profiler.record_function(MARK + ",".join(f"{p:x}" for p in ptrs)):
        pass


class _Follow(TorchDispatchMode):
    """Marks what each operation computes from a marked storage, while its lineage is open;
    passes every operation through untouched otherwise."""

    def __init__(self, lineage: Lineage) -> None:
        super().__init__()
        self.lineage = lineage

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile compiles as if the mode were not there (a compiled loss, such as
        # fused_ce's, after the head), and runs its artifact under it
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.lineage.open:
            self.lineage.computed(args, kwargs, out)
        return out


class Lineage:
    """Follows the logits of the models' heads in the steps the profiler records
    (``armed``). ``note``: where a problem is told. Costs nothing outside armed steps but a
    hook call per head forward; inside, one Python call per operation from the head's
    forward until the optimizer steps (or the next step boundary)."""

    def __init__(self, note: Callable[[str], None]) -> None:
        self._note = note
        self.armed = False
        self.open = False
        self.heads: list[tuple[nn.Module, nn.Module, bool]] = []  # (root, head, known)
        self._marked: dict[int, StorageWeakRef] = {}
        self._handles: list[Any] = []
        self._step_hook: Any = None
        self._mode: _Follow | None = None
        self._candidate_out: Any = None  # a candidate head's latest output, until its root returns
        self.followed = 0  # lineages opened in armed steps
        self.failed: str | None = None

    # -- setup -----------------------------------------------------------------------------

    def watch(self, models: Iterable[nn.Module]) -> None:
        """Hook the heads of ``models`` (each head once)."""
        for model in models:
            head, known = find_head(model)
            if head is None or any(h is head for _, h, _ in self.heads):
                continue
            self.heads.append((model, head, known))
            self._handles.append(head.register_forward_hook(self._on_head))
            if not known:
                self._handles.append(model.register_forward_hook(self._on_root))
        if self.heads and self._step_hook is None:
            # the update reads no logits: the mode leaves before it
            self._step_hook = register_optimizer_step_pre_hook(lambda *_: self.close())

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
        self.close()

    def arm(self, armed: bool) -> None:
        """At a step boundary: whether the next step is recorded. Ends the lineage of the
        step before."""
        self.close()
        self.armed = armed and not self.failed

    def close(self) -> None:
        """Close the lineage and take the dispatch mode off the stack (where it is on top;
        else it stays, passing operations through, until it is)."""
        self.open = False
        self._marked.clear()
        self._candidate_out = None
        if self._mode is not None and _get_current_dispatch_mode() is self._mode:
            self._mode.__exit__(None, None, None)
            self._mode = None

    # -- the hooks -------------------------------------------------------------------------

    def _on_head(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self.armed or torch.compiler.is_compiling():
            return
        known = any(head is module and k for _, head, k in self.heads)
        if not known:
            self._candidate_out = output
            # a candidate's output counts once its root returns it: follow it provisionally
            # only for that check (no marks)
            return
        self._start(output)

    def _on_root(self, module: nn.Module, args: Any, output: Any) -> None:
        out, self._candidate_out = self._candidate_out, None
        if not self.armed or out is None or torch.compiler.is_compiling():
            return
        returned = {id(t) for t in tree_flatten(_fields(output))[0] if isinstance(t, torch.Tensor)}
        if isinstance(out, torch.Tensor) and id(out) in returned:
            self._start(out)

    def _start(self, output: Any) -> None:
        try:
            tensors = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
            if not tensors:
                return
            self._add(_storages(tensors))
            for t in tensors:
                if t.requires_grad:
                    t.register_hook(self._on_grad)
            self.open = True
            self.followed += 1
            if self._mode is None:
                self._mode = _Follow(self)
                self._mode.__enter__()
        except Exception as e:  # an odd head must never break the training step
            self._fail(e)

    def _on_grad(self, grad: torch.Tensor) -> None:
        if self.open:
            try:
                self._add(_storages(grad), always=True)
            except Exception as e:
                self._fail(e)
        self.open = False  # from here backward computes the hidden states' gradient
        return None

    def computed(self, args: Any, kwargs: Any, out: Any) -> None:
        """An operation ran while the lineage is open: its new storages are logits where it
        read a marked one."""
        try:
            if any(self._is_marked(s) for s in _storages((args, kwargs))):
                self._add(_storages(out))
        except Exception as e:
            self._fail(e)

    # -- bookkeeping -----------------------------------------------------------------------

    def _is_marked(self, s: torch.UntypedStorage) -> bool:
        ref = self._marked.get(s.data_ptr())
        return ref is not None and not ref.expired() and ref.cdata == s._cdata

    def _add(self, storages: list[torch.UntypedStorage], always: bool = False) -> None:
        new = []
        for s in storages:
            ptr = s.data_ptr()
            if ptr and (always or not self._is_marked(s)):
                self._marked[ptr] = StorageWeakRef(s)
                new.append(ptr)
        if new:
            _mark(new)

    def _fail(self, e: BaseException) -> None:
        self.failed = f"{type(e).__name__}: {e}"
        self.armed = False
        self.open = False
        self._note(f"the loss's logits could not be followed ({self.failed}); no logits category")


def _fields(output: Any) -> Any:
    """A model output's tensors: a ``ModelOutput``'s values, else the output itself."""
    values = getattr(output, "values", None)
    if callable(values) and not isinstance(output, torch.Tensor):
        try:
            return list(values())
        except Exception:
            return output
    return output
