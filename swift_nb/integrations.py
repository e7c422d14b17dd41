"""Training frameworks swift_nb recognises around a profiled loop: Hugging Face's
``transformers.Trainer`` and accelerate's ``Accelerator``.

Capture: at a run's first step boundary ``detect`` looks up the call stack for the Trainer
whose ``train()`` is running (a frame whose ``self`` is one), else a Trainer or an
Accelerator that holds the optimizer that stepped, in a variable of a frame on the stack
(the cell's namespace, a training function's locals), innermost first, and returns what
the run's context records about it:
``context["trainer"]`` (the framework, the class, the variable, the settings that decide
speed and memory) and, unless the caller gave them, ``batch_size`` (samples per optimizer
step: micro-batch × gradient accumulation) and ``num_workers`` (the DataLoader's).

Advice: ``recorded`` reads it back from a run's context and ``fix`` phrases the change a
finding asks for as the setting to edit — ``TrainingArguments(dataloader_num_workers=4)``,
``Accelerator(mixed_precision='bf16')`` — or None, when the plain PyTorch advice stands.

Neither framework is imported here: objects are recognised by their classes' modules, so
looking costs nothing when neither is in use.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch

#: the run context's key for what ``detect`` found
CONTEXT_KEY = "trainer"

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
#: transformers 5 renamed ``gradient_checkpointing`` (a deprecated alias since) to this
CHECKPOINTING_FIELDS = ("activation_checkpointing", "gradient_checkpointing")


def _is_a(obj: Any, package: str, name: str) -> bool:
    return any(c.__name__ == name and c.__module__.startswith(package) for c in type(obj).__mro__)


def is_trainer(obj: Any) -> bool:
    """A ``transformers.Trainer`` (or a subclass: ``Seq2SeqTrainer``, TRL's trainers)."""
    return _is_a(obj, "transformers.", "Trainer")


def is_accelerator(obj: Any) -> bool:
    return _is_a(obj, "accelerate.", "Accelerator")


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
    """``(variable, object)`` of every Trainer and Accelerator in the frames' variables,
    innermost frame first."""
    held = []
    for f in frames:
        for name, value in list(_variables(f).items()):
            if not name.startswith("_") and name != "self" and (is_trainer(value) or is_accelerator(value)):
                held.append((name, value))
    return held


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
    whose method is running, else the innermost Trainer or Accelerator held in a variable
    that holds ``optimizer`` (the one that stepped: a Trainer's ``optimizer``, what an
    Accelerator prepared); variable is None when no variable holds it. None when none: a
    Trainer or Accelerator merely present in the namespace does not drive the loop."""
    running = running_trainer(frame)
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
        loader = loaders[0]
        # accelerate's loaders batch through a sampler of their own (batch_size None)
        sampler = getattr(loader, "batch_sampler", None)
        batch = getattr(loader, "batch_size", None) or getattr(sampler, "batch_size", None)
        out["dataloader"] = {
            "batch_size": plain(batch),
            "num_workers": plain(getattr(loader, "num_workers", None)),
        }
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
        info = describe_accelerator(obj, variable)
        loader = info.get("dataloader", {})
        micro, workers = loader.get("batch_size"), loader.get("num_workers")
    out: dict[str, Any] = {CONTEXT_KEY: info}
    accumulation = info["arguments"].get("gradient_accumulation_steps") or 1
    if isinstance(micro, int) and isinstance(accumulation, int):
        out["batch_size"] = micro * accumulation
    if isinstance(workers, int):
        out["num_workers"] = workers
    return out


# -- advice ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    """What a run's context says about its framework (see ``describe_trainer`` and
    ``describe_accelerator``)."""

    framework: str  # "transformers" | "accelerate"
    cls: str
    variable: str | None
    arguments: dict[str, Any]
    checkpointing_field: str = CHECKPOINTING_FIELDS[0]
    model: dict[str, Any] | None = None

    @property
    def is_trainer(self) -> bool:
        return self.framework == "transformers"

    @property
    def name(self) -> str:
        """How the advice names the object: its variable, else its class."""
        return f"`{self.variable}`" if self.variable else f"the {self.cls}"

    @property
    def micro_batch(self) -> int:
        """Samples per micro-batch (a Trainer's per_device_train_batch_size)."""
        return int(self.get("per_device_train_batch_size", 8))

    @property
    def accumulation(self) -> int:
        return int(self.get("gradient_accumulation_steps", 1))

    def get(self, key: str, default: Any = None) -> Any:
        value = self.arguments.get(key)
        return default if value is None else value

    def mixed_precision(self) -> bool | None:
        """Whether the forward runs in 16-bit (None: not recorded)."""
        if self.is_trainer:
            if "bf16" not in self.arguments and "fp16" not in self.arguments:
                return None
            return bool(self.get("bf16") or self.get("fp16"))
        mp = self.arguments.get("mixed_precision")
        return None if mp is None else mp != "no"

    def checkpointing(self) -> bool:
        """Whether activation checkpointing is on: the Trainer's switch or the model's."""
        return bool(self.get(self.checkpointing_field) or (self.model or {}).get("checkpointing"))


def recorded(context: Mapping[str, Any] | None) -> Recorded | None:
    """The framework a run's context recorded, or None (a plain PyTorch loop, or a record
    whose entry is not what ``detect`` writes)."""
    info = (context or {}).get(CONTEXT_KEY)
    if not isinstance(info, Mapping) or info.get("framework") not in ("transformers", "accelerate"):
        return None
    arguments = info.get("arguments")
    model = info.get("model")
    return Recorded(
        framework=info["framework"],
        cls=str(info.get("class") or ("Trainer" if info["framework"] == "transformers" else "Accelerator")),
        variable=info.get("variable") if isinstance(info.get("variable"), str) else None,
        arguments=dict(arguments) if isinstance(arguments, Mapping) else {},
        checkpointing_field=str(info.get("checkpointing_field") or CHECKPOINTING_FIELDS[0]),
        model=dict(model) if isinstance(model, Mapping) else None,
    )


def call(function: str, **fields: Any) -> str:
    """``TrainingArguments(a=1, b=True)``: how a reader writes the change."""
    return f"{function}(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


def _now(rec: Recorded, keys: Any) -> str:
    """``(`trainer` has a=0, b=False)``: the recorded values of ``keys``."""
    known = [f"{k}={rec.arguments[k]!r}" for k in keys if k in rec.arguments]
    return f" ({rec.name} has {', '.join(known)})" if known else ""


def _set(rec: Recorded, **fields: Any) -> str:
    return f"set {call('TrainingArguments', **fields)}{_now(rec, fields)}"


def _same_samples_larger_batch(rec: Recorded) -> dict[str, int]:
    """Twice the micro-batch, half the accumulation when there is some: the same samples
    per optimizer step in fewer, larger micro-batches."""
    micro, accumulation = rec.micro_batch, rec.accumulation
    fields = {"per_device_train_batch_size": 2 * micro}
    if accumulation >= 2:
        fields["gradient_accumulation_steps"] = accumulation // 2
    return fields


def _samples(rec: Recorded) -> str:
    """What ``_same_samples_larger_batch`` does to the samples per optimizer step, in words."""
    samples = rec.micro_batch * rec.accumulation
    if rec.accumulation >= 2:
        return f"(the same {samples} samples per optimizer step)"
    return f"({2 * samples} samples per optimizer step instead of {samples}: retune the learning rate)"


def _fix_data_loading(rec: Recorded) -> str | None:
    if not rec.is_trainer:
        return None
    workers = int(rec.get("dataloader_num_workers", 0))
    fields: dict[str, Any] = {"dataloader_num_workers": 2 * workers if workers else 4}
    if not rec.get("dataloader_persistent_workers", False):
        fields["dataloader_persistent_workers"] = True
    if int(rec.get("dataloader_prefetch_factor", 2)) < 4:
        fields["dataloader_prefetch_factor"] = 4
    return (
        f"The Trainer builds this DataLoader from its arguments: {_set(rec, **fields)}; move per-sample work "
        "(tokenising, decoding) out of the dataset's __getitem__ and the data collator, e.g. tokenise the dataset "
        "once with dataset.map(..., batched=True)."
    )


def _fix_overhead(rec: Recorded) -> str | None:
    """Fewer Python-level ops and larger micro-batches."""
    if rec.is_trainer:
        fields: dict[str, Any] = {}
        if not rec.get("torch_compile", False):
            fields["torch_compile"] = True
        fields.update(_same_samples_larger_batch(rec))
        compiled = "torch.compile fuses the model's small ops; " if "torch_compile" in fields else ""
        return f"{_set(rec, **fields)}: {compiled}larger micro-batches share each one's fixed cost {_samples(rec)}."
    parts = []
    if str(rec.get("dynamo_backend", "NO")).upper() in ("NO", "NONE"):
        parts.append(
            f"compile the prepared model with {call('Accelerator', dynamo_backend='inductor')} ({rec.name} has "
            f"dynamo_backend={rec.get('dynamo_backend', 'NO')!r})"
        )
    accumulation = rec.accumulation
    batch = "raise the DataLoader's batch_size"
    if accumulation >= 2:
        batch += (
            f" and lower {call('Accelerator', gradient_accumulation_steps=accumulation // 2)} "
            f"(now {accumulation}) to keep the samples per optimizer step"
        )
    parts.append(batch)
    return "; ".join(parts) + "."


def _fix_tiny_step(rec: Recorded) -> str | None:
    """A tiny step: larger micro-batches, and no worker processes for cheap loading."""
    if not rec.is_trainer:
        return None
    fields: dict[str, Any] = dict(_same_samples_larger_batch(rec))
    if int(rec.get("dataloader_num_workers", 0)) > 0:
        fields["dataloader_num_workers"] = 0
    if not rec.get("torch_compile", False):
        fields["torch_compile"] = True
    return f"{_set(rec, **fields)}, so each step's fixed costs are shared by more samples {_samples(rec)}."


def _fix_activations(rec: Recorded) -> str | None:
    if not rec.is_trainer:
        return None
    micro, accumulation = rec.micro_batch, rec.accumulation
    smaller = (
        f"halve the micro-batch and accumulate twice as many: "
        f"{_set(rec, per_device_train_batch_size=micro // 2, gradient_accumulation_steps=2 * accumulation)} "
        "— activations scale with the micro-batch, the samples per optimizer step stay the same"
        if micro >= 2
        else ""
    )
    if rec.checkpointing():
        return "Checkpointing is on already: " + (smaller or "free tensors you keep across steps") + "."
    field = rec.checkpointing_field
    checkpoint = (
        f"Recompute activations in backward instead of keeping them (the Trainer calls the model's own "
        f"{field}_enable()): {_set(rec, **{field: True})}"
    )
    return checkpoint + (f"; or {smaller}" if smaller else "") + "."


def _fix_precision(rec: Recorded) -> str | None:
    if rec.is_trainer:
        return (
            f"Train in mixed precision: {_set(rec, bf16=True)}. The forward then runs under autocast in "
            "bfloat16 and the activations it keeps for backward take half the bytes; weights, gradients and "
            "optimizer state stay fp32 (fp16=True instead on GPUs without bfloat16; on GPUs the matrix "
            "multiplies also run at the 16-bit rate)."
        )
    return (
        f"Train in mixed precision: {call('Accelerator', mixed_precision='bf16')} ({rec.name} has "
        f"mixed_precision={rec.get('mixed_precision', 'no')!r}). accelerator.prepare() then runs the model's "
        "forward under autocast in bfloat16 and the activations it keeps for backward take half the bytes; "
        "weights, gradients and optimizer state stay fp32."
    )


def _fix_optimizer_state(rec: Recorded) -> str | None:
    if not rec.is_trainer:
        return None
    return (
        f"Keep Adam's moments in a low-rank space: "
        f"{_set(rec, optim='galore_adamw', optim_target_modules=['attn', 'mlp'])} (GaLore on the nn.Linear "
        "weights of the modules those names match), or optim='adamw_bnb_8bit' for 8-bit moments."
    )


def _fix_communication(rec: Recorded) -> str | None:
    if not rec.is_trainer:
        accumulation = rec.accumulation
        return (
            f"With accelerate: {call('Accelerator', gradient_accumulation_steps=2 * accumulation)} (now "
            f"{accumulation}) inside `with accelerator.accumulate(model):` synchronises once per "
            f"{2 * accumulation} micro-batches."
        )
    accumulation = rec.accumulation
    return (
        f"The Trainer owns the DDP wrapper: {_set(rec, gradient_accumulation_steps=2 * accumulation)} "
        f"synchronises the gradients once per {2 * accumulation} micro-batches (the Trainer skips the "
        "all-reduce on the others), ddp_bucket_cap_mb=… sets the bucket size, and fsdp='full_shard' with "
        "bf16=True shards parameters, gradients and optimizer state."
    )


def _fix_attention(rec: Recorded) -> str | None:
    if not rec.is_trainer:
        return None
    impl = (rec.model or {}).get("attn_implementation")
    model = f"`{rec.variable}.model`" if rec.variable else "the Trainer's model"
    now = f" (it runs {impl!r})" if impl else ""
    return (
        f"{model}{now}: call {model.strip('`')}.set_attn_implementation('sdpa') before training, or load it "
        "with from_pretrained(..., attn_implementation='sdpa') ('flash_attention_2' with flash-attn on CUDA)."
    )


#: finding id (``tiny_step``: the overhead finding of a tiny step) → the change phrased for
#: the recorded framework (None: the plain advice stands)
FIXES: dict[str, Callable[[Recorded], str | None]] = {
    "data_loading": _fix_data_loading,
    "overhead": _fix_overhead,
    "tiny_step": _fix_tiny_step,
    "activations": _fix_activations,
    "fp32_activations": _fix_precision,
    "optimizer_state": _fix_optimizer_state,
    "communication": _fix_communication,
    "eager_attention": _fix_attention,
}


def fix(context: Mapping[str, Any] | None, finding_id: str) -> str | None:
    """The change finding ``finding_id`` asks for, phrased as the setting of the run's
    Trainer or Accelerator to edit; None for a plain PyTorch loop or a finding the
    framework has no setting for."""
    rec = recorded(context)
    rule = FIXES.get(finding_id)
    return rule(rec) if rec is not None and rule is not None else None
