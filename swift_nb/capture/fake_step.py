"""A training step of a model that is never allocated: built from its config on fake tensors
(``torch._subclasses.fake_tensor.FakeTensorMode``) and run forward, backward and through
the optimizer under PyTorch's own ``MemTracker``, which counts what the step would hold on
the device by category at its peak.

``fake_step(model, batch_size, seq_len, dtype, optimizer)``: ``model`` is a preset's name
(``swift_nb.core.model_presets``), a transformers ``PretrainedConfig`` that
``AutoModelForCausalLM`` knows, or a callable that builds an ``nn.Module``. The optimizer's
state is made first (an update of zero gradients), then one step is measured: the steady
step, with the state in place as from the second step of a real run on. The result's
categories are swift_nb's: parameters that train, frozen parameters (weights without
``requires_grad``, and buffers), gradients, optimizer state, activations (what forward keeps
for backward) and other (backward's temporaries).

The optimizer runs as torch runs it on CUDA by default (``foreach``): its update holds one
more copy of Adam's second moments (their square root) while it runs. MemTracker books what
the update allocates as optimizer state; the state itself (the moments) is counted apart
and the rest named in the notes.

``setup(module)``, a context manager, changes the fake model before its step (the toggles
that run on fake tensors: LoRA, gradient checkpointing) and yields the model to step.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from swift_nb.core.errors import ConfigError, MissingDependencyError
from swift_nb.core.model_presets import preset
from swift_nb.core.units import fmt_bytes

OPTIMIZERS = ("AdamW", "Adam", "SGD")
_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


@dataclass
class FakeStep:
    """What a fake step found: ``categories`` (bytes at its peak, by swift_nb's category),
    the model's ``params`` and ``trainable`` counts, ``matrices`` (the m×n weights of its
    linear layers and how many of each), ``blocks`` (its repeated layers), ``hidden`` and
    ``vocab``, the ``dtype`` and ``optimizer`` it ran with, ``seconds`` it took, and ``name``."""

    name: str
    categories: dict[str, float]
    params: int
    trainable: int
    matrices: dict[tuple[int, int], int]
    blocks: int
    hidden: int | None
    vocab: int | None
    dtype: str
    optimizer: str
    batch_size: int
    seq_len: int
    seconds: float
    notes: list[str] = field(default_factory=list)
    #: the fine-tuning the stepped model had (``swift_nb.capture.finetune.describe``)
    finetune: dict[str, Any] = field(default_factory=dict)
    #: bytes the optimizer's update allocated beyond its state (within ``optimizer_state``)
    update_bytes: float = 0.0
    #: the dtype of the parameters it trains (LoRA's fp32 adapters on a bf16 base)
    trained_dtype: str | None = None


#: what a setup gives ``fake_step``: a context manager around the step, yielding the model
Setup = Callable[[Any], AbstractContextManager[Any]]


def build(model: Any) -> tuple[str, Callable[[], Any]]:
    """(a name for the model, what builds it); ConfigError for what cannot be one."""
    if isinstance(model, str):
        found = preset(model)
        if found is None:
            from swift_nb.core.model_presets import PRESETS

            raise ConfigError("model", f"is no preset; presets are {', '.join(PRESETS)}", model)
        transformers = _transformers()
        try:
            config = getattr(transformers, found.config_class)(**found.fields)
        except Exception as e:
            raise ConfigError(
                "model", f"transformers cannot build {found.config_class} ({e})", model
            ) from None
        return found.name, lambda: transformers.AutoModelForCausalLM.from_config(config)
    if hasattr(model, "model_type") and hasattr(model, "to_dict"):  # a PretrainedConfig
        transformers = _transformers()

        def from_config():
            try:
                return transformers.AutoModelForCausalLM.from_config(model)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise ConfigError(
                    "model",
                    f"transformers cannot build a causal LM from this {type(model).__name__} ({e})",
                    model.model_type,
                ) from None

        return f"{type(model).__name__.removesuffix('Config')} ({model.model_type})", from_config
    if callable(model):
        return getattr(model, "__name__", type(model).__name__), model
    raise ConfigError(
        "model",
        "must be a preset's name, a transformers config or a callable that builds an nn.Module",
        type(model).__name__,
    )


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        raise MissingDependencyError(
            f"a model from a config needs transformers ({e}): pip install transformers"
        ) from None
    return transformers


def fake_step(
    model: Any,
    batch_size: int = 1,
    seq_len: int = 2048,
    dtype: str = "bfloat16",
    optimizer: str = "AdamW",
    progress: Callable[[str], None] | None = None,
    setup: Setup | None = None,
) -> FakeStep:
    """One steady training step of ``model`` on fake tensors, measured (see the module);
    ``setup`` changes the model before it (toggles)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from swift_nb.capture.memory.peak_tracker import check_internals

    if optimizer not in OPTIMIZERS:
        raise ConfigError(
            "optimizer", f"must be one of {', '.join(OPTIMIZERS)} for a model from its config", optimizer
        )
    if dtype not in _DTYPES:
        raise ConfigError("dtype", f"must be one of {', '.join(sorted(set(_DTYPES.values())))}", dtype)
    name, make = build(model)
    check_internals()
    say = progress or (lambda line: None)
    t0 = time.perf_counter()
    torch_dtype = getattr(torch, _DTYPES[dtype])
    with FakeTensorMode(allow_non_fake_inputs=True):
        say(f"building {name} on fake tensors …")
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch_dtype)  # built in its dtype: fake parameters cannot be cast after
        try:
            module = make()
        except ConfigError:
            raise
        except Exception as e:
            raise ConfigError("model", f"building it raised {type(e).__name__}: {e}", name) from None
        finally:
            torch.set_default_dtype(default)
        if not isinstance(module, torch.nn.Module):
            raise ConfigError("model", "must build an nn.Module", type(module).__name__)
        found = _shapes(module)  # the model's own layers, before any adapter
        with _moves_in_place(), setup(module) if setup else contextlib.nullcontext(module) as stepped:
            found.update(_counts(stepped))
            with _quiet_module_tracking():
                ran = _run(
                    stepped, optimizer, batch_size, seq_len, found["vocab"], found["hidden"], say, name
                )
    seconds = time.perf_counter() - t0
    say(f"{name}: done in {seconds:.1f} s")
    notes = []
    if ran.fell_back is not None:
        notes.append(
            f"{FELL_BACK} ({ran.fell_back}): parameters, gradients and the optimizer's state by formula, "
            "exact; the activations and temporaries are not counted (0): the peak is a lower bound"
        )
    elif ran.update_bytes:
        notes.append(
            f"{optimizer}'s update, as torch runs it on CUDA by default (foreach), holds {fmt_bytes(ran.update_bytes)} "
            "beyond its state while it runs (the second moments' square root); fused=True holds none"
        )
    return FakeStep(
        notes=notes,
        finetune=ran.finetune,
        update_bytes=ran.update_bytes,
        name=name,
        categories=ran.categories,
        dtype=_DTYPES[dtype],
        optimizer=optimizer,
        batch_size=batch_size,
        seq_len=seq_len,
        seconds=seconds,
        **found,
    )


@contextlib.contextmanager
def _moves_in_place() -> Iterator[None]:
    """``nn.Module.to`` on fake tensors, as toggles call it (peft moves each adapter to its
    base layer's device): torch replaces a fake parameter by swapping it with its copy, and
    refuses (the fake tensor is weakly referenced). On fake tensors every tensor already is
    where the step runs, so a move changes only the dtype, in place."""
    import torch

    original = torch.nn.Module.to

    def to(self, *args, **kwargs):
        _, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None:
            for t in itertools.chain(self.parameters(), self.buffers()):
                if t.is_floating_point() and t.dtype != dtype:
                    t.data = t.data.to(dtype)
        return self

    torch.nn.Module.to = to  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.to = original  # type: ignore[method-assign]


def _counts(module: Any) -> dict[str, Any]:
    """The parameters the stepped model holds, those it trains and their dtype."""
    trained = [p for p in module.parameters() if p.requires_grad]
    return {
        "params": sum(p.numel() for p in module.parameters()),
        "trainable": sum(p.numel() for p in trained),
        "trained_dtype": str(trained[0].dtype).removeprefix("torch.") if trained else None,
    }


def _shapes(module: Any) -> dict[str, Any]:
    import torch

    matrices: dict[tuple[int, int], int] = {}
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            key = (int(m.out_features), int(m.in_features))
            matrices[key] = matrices.get(key, 0) + 1
    cfg = getattr(module, "config", None)
    emb = next((m for m in module.modules() if isinstance(m, torch.nn.Embedding)), None)
    vocab = getattr(cfg, "vocab_size", None) or (emb.num_embeddings if emb is not None else None)
    hidden = getattr(cfg, "hidden_size", None) or (emb.embedding_dim if emb is not None else None)
    blocks = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    return {
        "matrices": matrices,
        "blocks": blocks,
        "hidden": hidden,
        "vocab": vocab,
    }


@contextlib.contextmanager
def _quiet_module_tracking() -> Iterator[None]:
    """MemTracker's module tracker warns ("The module hierarchy tracking maybe be messed
    up", twice a step on a transformers Llama) and sets ``warnings.formatwarning`` for the
    whole process. It concerns the per-module statistics, which the fake step does not keep
    (``capture.memory.peak_tracker``: the step's peak alone): the warning stays out of the user's cell,
    and the process's formatter is put back."""
    import warnings

    formatter = warnings.formatwarning
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The module hierarchy tracking maybe be messed up")
        try:
            yield
        finally:
            warnings.formatwarning = formatter


@dataclass
class _Ran:
    categories: dict[str, float]
    fell_back: str | None  # why the step fell back to the formula (None: it ran)
    finetune: dict[str, Any]
    update_bytes: float = 0.0


def _run(
    module, optimizer: str, batch: int, seq: int, vocab: int | None, hidden: int | None, say, name: str
) -> _Ran:
    """The step's categories at its peak (see ``_Ran``)."""
    import torch

    from swift_nb.capture.finetune import describe
    from swift_nb.capture.memory.logits import find_head
    from swift_nb.capture.memory.peak_tracker import PeakTracker

    trained = [p for p in module.parameters() if p.requires_grad]
    opt = getattr(torch.optim, optimizer)(trained, lr=1e-4, foreach=True)
    finetune = describe({"model": module}, [opt])
    # the optimizer's state made first (as a first step makes it), so one tracked step is a
    # steady one: forward, backward and the update with the state in place; what the update
    # holds beyond the state while it runs is read from this first one
    for p in trained:
        p.grad = torch.zeros_like(p)
    first = PeakTracker()
    first.track_external(opt)
    with first:
        opt.step()
    update = max(0.0, _booked(first.get_tracker_snapshot("peak")).get("Optstate", 0.0) - _state_bytes(opt))
    opt.zero_grad(set_to_none=True)
    ids = torch.randint(0, vocab or 2, (batch, seq))
    tracker = PeakTracker()
    tracker.follow(module, *find_head(module))
    tracker.track_external(module, opt)
    for p in module.parameters():  # MemTracker hooks every parameter's gradient, and a frozen
        if not p.requires_grad:  # one (LoRA's base) has none to hook: marked as hooked already
            tracker._param_to_grad_hook_handles[p] = (_NO_HOOK, _NO_HOOK)
    with tracker:
        say(f"{name}: a fake step (batch {batch} × {seq} tokens) …")
        try:
            loss = _loss(module, ids, vocab)
            loss.backward()
            opt.step()
            opt.zero_grad()
        except _fake_limits() as e:  # the model's own step needs values fake tensors lack
            reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            say(f"{name}: its step cannot run on fake tensors ({reason}); weights by formula")
            return _Ran(_by_formula(module, opt), reason, finetune, update)
    by_kind = _booked(tracker.get_tracker_snapshot("peak"))
    frozen = sum(p.numel() * p.element_size() for p in module.parameters() if not p.requires_grad)
    params = by_kind.get("Parameter", 0.0)
    in_logits = tracker.logits_at_peak  # the loss's logits, a category of their own
    temp = by_kind.get("Temp", 0.0) + by_kind.get("Other", 0.0) - in_logits.get("Temp", 0.0)
    # the state alone: at a peak during the update MemTracker books the update's temporaries
    # as state too; they are ``update`` (the forecast adds them at the update's moment)
    state = min(by_kind.get("Optstate", 0.0), _state_bytes(opt))
    categories = {
        "parameters": params - frozen,
        "frozen_parameters": frozen + by_kind.get("Buffer", 0.0),
        "gradients": by_kind.get("Gradient", 0.0),
        "optimizer_state": state,
        "activations": by_kind.get("Activation", 0.0) - in_logits.get("Activation", 0.0),
        "logits": sum(in_logits.values()),
        "other": temp,
    }
    return _Ran(categories, None, finetune, update)


def _loss(module: Any, ids: Any, vocab: int | None) -> Any:
    """The step's loss: a Hugging Face model's own (given the tokens as labels); a model that
    takes the tokens alone, its output's cross-entropy against them where the output is as
    wide as the vocabulary (the log-probabilities an LM's loss holds), else its mean. The
    output itself (logits, a key/value cache) is let go before backward, as a loop keeping
    the loss alone (or Trainer's ``compute_loss``) lets it go."""
    import inspect

    import torch

    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        params = {}
    keywords = "input_ids" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    # (asked before the call: MemTracker counts a module called twice as two iterations)
    out = module(input_ids=ids, labels=ids) if keywords or not params else module(ids)
    loss = getattr(out, "loss", None)
    if loss is None:
        logits = getattr(out, "logits", out)
        logits = logits[0] if isinstance(logits, (tuple, list)) else logits
        if vocab and logits.dim() >= 2 and logits.shape[-1] == vocab and logits.shape[:-1] == ids.shape:
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, -2).float(), ids.flatten())
        else:
            loss = logits.float().mean()
    del out
    return loss


class _NoHook:
    """A hook handle for a parameter MemTracker is not to hook (see ``_run``)."""

    def remove(self) -> None:
        pass


_NO_HOOK = _NoHook()


def _booked(snapshot: dict) -> dict[str, float]:
    """A MemTracker snapshot's bytes by the kind it booked them as, over every device."""
    by_kind: dict[str, float] = {}
    for stats in snapshot.values():
        for kind, nbytes in stats.items():
            key = getattr(kind, "value", str(kind))
            by_kind[key] = by_kind.get(key, 0.0) + float(nbytes)
    return by_kind


def _state_bytes(opt) -> float:
    return float(
        sum(
            t.numel() * t.element_size()
            for s in opt.state.values()
            for t in s.values()
            if hasattr(t, "numel")
        )
    )


def _fake_limits() -> tuple[type[BaseException], ...]:
    """What fake tensors raise for a step they cannot run: an operation whose output depends
    on the values (``.item()``, ``nonzero``), or one without a fake implementation. Any
    other error inside the step is raised as it is, never taken for these."""
    from torch._subclasses import fake_tensor
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return (
        fake_tensor.DataDependentOutputException,
        fake_tensor.DynamicOutputShapeException,
        fake_tensor.UnsupportedOperatorException,
        GuardOnDataDependentSymNode,
    )


#: what ``fake_step`` notes when it fell back to the formula (read by ``FakeStep.notes``)
FELL_BACK = "its step could not run on fake tensors"


def _by_formula(module, opt) -> dict[str, float]:
    """The categories a step that cannot run on fake tensors still has exactly: the weights
    (trained and frozen) at their dtype, a gradient for each trained one, the optimizer's
    state as it was made; the activations unknown (0), which the forecast says."""
    trained = [p for p in module.parameters() if p.requires_grad]
    frozen = [p for p in module.parameters() if not p.requires_grad]
    state = _state_bytes(opt)
    nbytes = float(sum(p.numel() * p.element_size() for p in trained))
    return {
        "parameters": nbytes,
        "frozen_parameters": float(sum(p.numel() * p.element_size() for p in frozen))
        + float(sum(b.numel() * b.element_size() for b in module.buffers())),
        "gradients": nbytes,
        "optimizer_state": float(state),
        "activations": 0.0,
        "logits": 0.0,
        "other": 0.0,
    }


def on_stderr(line: str) -> None:
    """A progress line, overwritten by the next (a terminal or a notebook's stderr)."""
    sys.stderr.write("\r" + line.ljust(79))
    sys.stderr.flush()
