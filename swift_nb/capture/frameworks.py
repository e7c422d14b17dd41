"""Training frameworks swift_nb recognises around a profiled loop: Hugging Face's
``transformers.Trainer``, accelerate's ``Accelerator`` and PyTorch Lightning's ``Trainer``
(``lightning.pytorch`` or ``pytorch_lightning``).

Capture: at a run's first step boundary ``detect`` looks up the call stack for the Trainer
whose ``train()`` is running (a frame whose ``self`` is one), else the Lightning Trainer
whose ``fit()`` is running (a frame whose ``self`` is one or holds one as ``trainer``, as
Lightning's loops do), else a Trainer or an Accelerator that holds the optimizer that
stepped, in a variable of a frame on the stack (the cell's namespace, a training
function's locals), innermost first, and returns what the run's context records about it:
``context["trainer"]`` (the framework, the class, the variable, the settings that decide
speed and memory) and, unless the caller gave them, ``batch_size`` (samples per optimizer
step: micro-batch × gradient accumulation) and ``num_workers`` (the DataLoader's).

Lightning steps the optimizer once per ``accumulate_grad_batches`` batches (the other
batches run the closure alone), so its runs, too, have one step per optimizer update.

Advice reads it back from a run's context: ``swift_nb.analysis.advisor.frameworks``.

No framework is imported here: objects are recognised by their classes' modules, so
looking costs nothing when none is in use.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Any

import torch

from swift_nb.record import CHECKPOINTING_FIELDS, TRAINER_KEY

#: TrainingArguments fields recorded with a Trainer (the checkpointing switch is added
#: under the name the installed transformers gives it)
TRAINING_ARGUMENTS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "dataloader_num_workers",
    "dataloader_persistent_workers",
    "dataloader_prefetch_factor",
    "dataloader_pin_memory",
    "bf16",
    "fp16",
    "torch_compile",
    "optim",
    "max_steps",
    "world_size",
)

#: Lightning ``Trainer`` attributes recorded as they are (the strategy and accelerator are
#: recorded by their class names, the DataLoader apart)
LIGHTNING_ARGUMENTS = (
    "precision",
    "accumulate_grad_batches",
    "num_devices",
    "num_nodes",
    "world_size",
    "max_steps",
    "max_epochs",
    "gradient_clip_val",
    "gradient_clip_algorithm",
)
#: the modules of Lightning's two distributions (``lightning`` and ``pytorch_lightning``)
LIGHTNING_PACKAGES = ("lightning.", "pytorch_lightning.")


def _is_a(obj: Any, package: str | tuple[str, ...], name: str) -> bool:
    return any(c.__name__ == name and c.__module__.startswith(package) for c in type(obj).__mro__)


def is_trainer(obj: Any) -> bool:
    """A ``transformers.Trainer`` (or a subclass: ``Seq2SeqTrainer``, TRL's trainers)."""
    return _is_a(obj, "transformers.", "Trainer")


def is_accelerator(obj: Any) -> bool:
    return _is_a(obj, "accelerate.", "Accelerator")


def is_lightning_trainer(obj: Any) -> bool:
    """A PyTorch Lightning ``Trainer`` (or a subclass), from either distribution."""
    return _is_a(obj, LIGHTNING_PACKAGES, "Trainer")


# -- capture -----------------------------------------------------------------------------


def unwrap_optimizer(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer a wrapper steps (accelerate's ``AcceleratedOptimizer``, which
    ``accelerator.prepare`` returns and a Trainer holds, wraps one); itself otherwise."""
    while isinstance(getattr(opt, "optimizer", None), torch.optim.Optimizer):
        opt = opt.optimizer
    return opt


def _frames(frame: FrameType | None) -> Iterator[FrameType]:
    while frame is not None:
        yield frame
        frame = frame.f_back


def _variables(frame: FrameType) -> Mapping[str, Any]:
    """A frame's variables: a module's (a notebook cell's) globals, a function's locals."""
    return frame.f_globals if frame.f_code.co_name == "<module>" else frame.f_locals


def _held(frames: list[FrameType]) -> list[tuple[str, Any]]:
    """``(variable, object)`` of every framework object (a Trainer, an Accelerator, a
    Lightning Trainer) in the frames' variables, innermost frame first."""
    held = []
    for f in frames:
        for name, value in list(_variables(f).items()):
            if (
                not name.startswith("_")
                and name != "self"
                and (is_trainer(value) or is_accelerator(value) or is_lightning_trainer(value))
            ):
                held.append((name, value))
    return held


def _lightning_trainer_of(frame: FrameType) -> Any:
    """The Lightning Trainer a frame's ``self`` is, or holds as ``trainer`` (its loops do);
    read from the instance's own attributes, so no property runs."""
    owner = frame.f_locals.get("self")
    if is_lightning_trainer(owner):
        return owner
    held = getattr(owner, "__dict__", {}).get("trainer") if owner is not None else None
    return held if is_lightning_trainer(held) else None


def running_lightning(frame: FrameType | None) -> tuple[str | None, Any] | None:
    """``(variable, trainer)`` of the Lightning Trainer whose ``fit()`` runs the code at
    ``frame``: the variable that holds it in a frame outside Lightning (whose own functions
    call it ``trainer``), None when none does."""
    frames = list(_frames(frame))
    trainer = next((t for t in map(_lightning_trainer_of, frames) if t is not None), None)
    if trainer is None:
        return None
    outside = [f for f in frames if not str(f.f_globals.get("__name__", "")).startswith(LIGHTNING_PACKAGES)]
    return next((n for n, v in _held(outside) if v is trainer), None), trainer


def running_trainer(frame: FrameType | None) -> tuple[str | None, Any] | None:
    """``(variable, trainer)`` of the Trainer one of whose methods is running at ``frame``
    (``train()``, ``create_optimizer()`` …), the variable None when none holds it."""
    frames = list(_frames(frame))
    trainer = next((f.f_locals["self"] for f in frames if is_trainer(f.f_locals.get("self"))), None)
    if trainer is None:
        return None
    return next((n for n, v in _held(frames) if v is trainer), None), trainer


def _steps(obj: Any, optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``obj`` (a Trainer or an Accelerator) holds ``optimizer``, wrapped or not."""
    held = [getattr(obj, "optimizer", None)] if is_trainer(obj) else getattr(obj, "_optimizers", None) or []
    return any(isinstance(o, torch.optim.Optimizer) and unwrap_optimizer(o) is optimizer for o in held)


def find(
    frame: FrameType | None, optimizer: torch.optim.Optimizer | None = None
) -> tuple[str | None, Any] | None:
    """``(variable, object)`` of the framework driving the code at ``frame``: the Trainer
    whose method is running, else the Lightning Trainer whose ``fit()`` is, else the
    innermost Trainer or Accelerator held in a variable that holds ``optimizer`` (the one
    that stepped: a Trainer's ``optimizer``, what an Accelerator prepared); variable is None
    when no variable holds it. None when none: a framework object merely present in the
    namespace does not drive the loop."""
    running = running_trainer(frame) or running_lightning(frame)
    if running is not None or optimizer is None:
        return running
    return next(((n, v) for n, v in _held(list(_frames(frame))) if _steps(v, optimizer)), None)


def plain(value: Any) -> Any:
    """A setting as JSON holds it (enums by their value)."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(getattr(value, "value", value))


def _model_state(model: Any) -> dict[str, Any]:
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    out: dict[str, Any] = {"class": type(model).__name__}
    if isinstance(impl, str):
        out["attn_implementation"] = impl
    # read on the class first: transformers 5 warns on the old property's name
    for attr in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), attr):
            out["checkpointing"] = bool(getattr(model, attr))
            break
    return out


def _version(package: str) -> str | None:
    return getattr(sys.modules.get(package), "__version__", None)


def _loader_record(loader: Any) -> dict[str, Any]:
    """A DataLoader's batch size and workers (a loader that batches through a sampler of
    its own has batch_size None: the sampler's)."""
    sampler = getattr(loader, "batch_sampler", None)
    batch = getattr(loader, "batch_size", None) or getattr(sampler, "batch_size", None)
    return {"batch_size": plain(batch), "num_workers": plain(getattr(loader, "num_workers", None))}


def _first_loader(iterables: Any) -> torch.utils.data.DataLoader | None:
    """The first DataLoader of what ``trainer.fit`` was given: one, or a list or dict of them."""
    if isinstance(iterables, Mapping):
        iterables = list(iterables.values())
    if not isinstance(iterables, (list, tuple)):
        iterables = [iterables]
    return next((v for v in iterables if isinstance(v, torch.utils.data.DataLoader)), None)


def _read(obj: Any, attr: str) -> Any:
    """``obj.attr``, None where reading it fails (Lightning's properties raise when the
    Trainer is half set up)."""
    try:
        return getattr(obj, attr, None)
    except Exception:
        return None


def describe_trainer(trainer: Any, variable: str | None) -> dict[str, Any]:
    """A Trainer's record: its ``TRAINING_ARGUMENTS`` and checkpointing switch, and what
    its model runs (attention implementation, checkpointing on or off) at this moment."""
    args = trainer.args
    arguments = {f: plain(getattr(args, f)) for f in TRAINING_ARGUMENTS if hasattr(args, f)}
    field = next((f for f in CHECKPOINTING_FIELDS if hasattr(args, f)), CHECKPOINTING_FIELDS[-1])
    arguments[field] = bool(getattr(args, field, False))
    out: dict[str, Any] = {
        "framework": "transformers",
        "class": type(trainer).__name__,
        "variable": variable,
        "version": _version("transformers"),
        "checkpointing_field": field,
        # SFTConfig, DPOConfig …: TRL's trainers take their own subclass of TrainingArguments
        "arguments_class": type(args).__name__,
        "arguments": arguments,
    }
    if getattr(trainer, "model", None) is not None:
        out["model"] = _model_state(trainer.model)
    return out


def describe_accelerator(accelerator: Any, variable: str | None) -> dict[str, Any]:
    """An Accelerator's record: accumulation, mixed precision, compilation, processes, and
    the batch size and workers of the first DataLoader it prepared."""
    dynamo = getattr(getattr(accelerator.state, "dynamo_plugin", None), "backend", None)
    arguments = {
        "gradient_accumulation_steps": plain(accelerator.gradient_accumulation_steps),
        "mixed_precision": plain(accelerator.mixed_precision),
        "dynamo_backend": plain(dynamo),
        "num_processes": plain(accelerator.num_processes),
    }
    out: dict[str, Any] = {
        "framework": "accelerate",
        "class": type(accelerator).__name__,
        "variable": variable,
        "version": _version("accelerate"),
        "arguments": arguments,
    }
    # the DataLoaders accelerator.prepare() wrapped (accelerate keeps them for its checkpoints)
    loaders = getattr(accelerator, "_dataloaders", None) or []
    if loaders:
        out["dataloader"] = _loader_record(loaders[0])
    return out


def describe_lightning(trainer: Any, variable: str | None) -> dict[str, Any]:
    """A Lightning Trainer's record: its ``LIGHTNING_ARGUMENTS``, its strategy and
    accelerator by class, the LightningModule's class and optimization mode, and the batch
    size and workers of the DataLoader ``fit()`` got."""
    arguments = {a: plain(_read(trainer, a)) for a in LIGHTNING_ARGUMENTS}
    for attr in ("strategy", "accelerator"):  # objects: SingleDeviceStrategy, CPUAccelerator …
        value = _read(trainer, attr)
        arguments[attr] = None if value is None else type(value).__name__
    # the distribution of Lightning's own class, under a subclass of the cell's
    package = next(c.__module__ for c in type(trainer).__mro__ if c.__module__.startswith(LIGHTNING_PACKAGES))
    out: dict[str, Any] = {
        "framework": "lightning",
        "class": type(trainer).__name__,
        "variable": variable,
        "version": _version(package.split(".")[0]),
        "arguments": arguments,
    }
    module = _read(trainer, "lightning_module")
    if module is not None:
        out["model"] = {
            "class": type(module).__name__,
            "automatic_optimization": plain(_read(module, "automatic_optimization")),
        }
    loader = _first_loader(_read(trainer, "train_dataloader"))
    if loader is not None:
        out["dataloader"] = _loader_record(loader)
    return out


def detect(frame: FrameType | None, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """The run-context entries for the framework driving the code at ``frame``, where
    ``optimizer`` stepped (see the module's docstring and ``find``); empty when none."""
    found = find(frame, optimizer)
    if found is None:
        return {}
    variable, obj = found
    if is_trainer(obj):
        info = describe_trainer(obj, variable)
        a = info["arguments"]
        micro, workers = a.get("per_device_train_batch_size"), a.get("dataloader_num_workers")
    else:
        info = (
            describe_lightning(obj, variable)
            if is_lightning_trainer(obj)
            else describe_accelerator(obj, variable)
        )
        loader = info.get("dataloader", {})
        micro, workers = loader.get("batch_size"), loader.get("num_workers")
    out: dict[str, Any] = {TRAINER_KEY: info}
    a = info["arguments"]
    accumulation = a.get("gradient_accumulation_steps") or a.get("accumulate_grad_batches") or 1
    if isinstance(micro, int) and isinstance(accumulation, int):
        out["batch_size"] = micro * accumulation
    if isinstance(workers, int):
        out["num_workers"] = workers
    return out
