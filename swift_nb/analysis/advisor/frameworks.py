"""The framework a run's context recorded around its loop (Hugging Face's ``Trainer``,
accelerate's ``Accelerator``, PyTorch Lightning's ``Trainer``: see
``swift_nb.capture.frameworks``), read back for advice: a rule phrases its change as the
setting to edit — ``TrainingArguments(dataloader_num_workers=4)``,
``Accelerator(mixed_precision='bf16')``, ``Trainer(precision='bf16-mixed')`` — when one was
recorded. Torch-free.

Rules speak of a Trainer's settings in ``TrainingArguments``' words. A Lightning record
answers them (``get('gradient_accumulation_steps')`` is its ``accumulate_grad_batches``,
``get('bf16')`` whether its precision is bf16, ``get('per_device_train_batch_size')`` its
DataLoader's batch size) and ``set_arguments`` writes them as its own Trainer's arguments
(``LIGHTNING_SETTINGS``). A change Lightning's Trainer has no argument for (the optimizer,
checkpointing, compilation, the DataLoader the user builds) is no Lightning phrasing:
``phrased`` returns None for it and the rule's plain PyTorch advice stands."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from swift_nb.record import CHECKPOINTING_FIELDS, TRAINER_KEY

#: the class each framework's record names when it has none
CLASSES = {"transformers": "Trainer", "accelerate": "Accelerator", "lightning": "Trainer"}

#: arguments of Lightning's ``Trainer`` a change may name as they are
LIGHTNING_ARGUMENTS = (
    "precision",
    "accumulate_grad_batches",
    "max_steps",
    "max_epochs",
    "gradient_clip_val",
    "gradient_clip_algorithm",
    "strategy",
    "accelerator",
    "devices",
    "num_nodes",
    "benchmark",
)

#: ``TrainingArguments`` fields that one of Lightning's Trainer arguments sets: field →
#: the argument and its value for the field's value
LIGHTNING_SETTINGS: dict[str, Callable[[Any], tuple[str, Any]]] = {
    "gradient_accumulation_steps": lambda v: ("accumulate_grad_batches", v),
    "bf16": lambda v: ("precision", "bf16-mixed" if v else "32-true"),
    "fp16": lambda v: ("precision", "16-mixed" if v else "32-true"),
    "max_steps": lambda v: ("max_steps", v),
}


@dataclass(frozen=True)
class Recorded:
    """What a run's context says about its framework."""

    framework: str  # "transformers" | "accelerate" | "lightning"
    cls: str
    variable: str | None
    arguments: dict[str, Any]
    checkpointing_field: str = CHECKPOINTING_FIELDS[0]
    model: dict[str, Any] | None = None
    arguments_class: str = "TrainingArguments"  # TRL's trainers: SFTConfig, DPOConfig …
    dataloader: dict[str, Any] | None = None  # batch_size, num_workers (accelerate, Lightning)
    #: one entry per ``set_arguments`` call: whether the framework had a setting for every
    #: field (read by ``phrased``)
    phrasings: list[bool] = field(default_factory=list, compare=False, repr=False)

    @property
    def is_trainer(self) -> bool:
        """A Trainer whose settings phrase the change: transformers' or Lightning's."""
        return self.framework in ("transformers", "lightning")

    @property
    def is_lightning(self) -> bool:
        return self.framework == "lightning"

    @property
    def name(self) -> str:
        """How the advice names the object: its variable, else its class."""
        return f"`{self.variable}`" if self.variable else f"the {self.cls}"

    @property
    def micro_batch(self) -> int:
        """Samples per micro-batch: a Trainer's per_device_train_batch_size, a Lightning
        Trainer's DataLoader's batch_size (0 when not recorded)."""
        return int(self.get("per_device_train_batch_size", 0 if self.is_lightning else 8))

    @property
    def accumulation(self) -> int:
        return int(self.get("gradient_accumulation_steps", 1))

    def get(self, key: str, default: Any = None) -> Any:
        """The recorded setting ``key`` (a Lightning record answers ``TrainingArguments``'
        names too: ``LIGHTNING_READS``), ``default`` when it is not recorded."""
        value = self.arguments.get(key)
        if value is None and self.is_lightning and key in LIGHTNING_READS:
            value = LIGHTNING_READS[key](self)
        return default if value is None else value

    def mixed_precision(self) -> bool | None:
        """Whether the forward runs in 16-bit (None: not recorded)."""
        if self.is_lightning:
            precision = self.arguments.get("precision")
            return None if precision is None else not str(precision).startswith(("32", "64"))
        if self.is_trainer:
            if "bf16" not in self.arguments and "fp16" not in self.arguments:
                return None
            return bool(self.get("bf16") or self.get("fp16"))
        mp = self.arguments.get("mixed_precision")
        return None if mp is None else mp != "no"

    def checkpointing(self) -> bool:
        """Whether activation checkpointing is on: the Trainer's switch or the model's."""
        return bool(self.get(self.checkpointing_field) or (self.model or {}).get("checkpointing"))


def _precision_is(prefix: str) -> Callable[[Recorded], bool | None]:
    def read(rec: Recorded) -> bool | None:
        precision = rec.arguments.get("precision")
        return None if precision is None else str(precision).startswith(prefix)

    return read


#: ``TrainingArguments`` fields a Lightning record answers from its own
LIGHTNING_READS: dict[str, Callable[[Recorded], Any]] = {
    "gradient_accumulation_steps": lambda rec: rec.arguments.get("accumulate_grad_batches"),
    "bf16": _precision_is("bf16"),  # bf16-mixed, bf16-true
    "fp16": _precision_is("16"),  # 16-mixed, 16-true
    "per_device_train_batch_size": lambda rec: (rec.dataloader or {}).get("batch_size"),
    "dataloader_num_workers": lambda rec: (rec.dataloader or {}).get("num_workers"),
}


def recorded(context: Mapping[str, Any] | None) -> Recorded | None:
    """The framework a run's context recorded, or None (a plain PyTorch loop, or a record
    whose entry is not what the capture writes)."""
    info = (context or {}).get(TRAINER_KEY)
    if not isinstance(info, Mapping) or info.get("framework") not in CLASSES:
        return None
    arguments, model, loader = info.get("arguments"), info.get("model"), info.get("dataloader")
    return Recorded(
        framework=info["framework"],
        cls=str(info.get("class") or CLASSES[info["framework"]]),
        variable=info.get("variable") if isinstance(info.get("variable"), str) else None,
        arguments=dict(arguments) if isinstance(arguments, Mapping) else {},
        checkpointing_field=str(info.get("checkpointing_field") or CHECKPOINTING_FIELDS[0]),
        model=dict(model) if isinstance(model, Mapping) else None,
        arguments_class=str(info.get("arguments_class") or "TrainingArguments"),
        dataloader=dict(loader) if isinstance(loader, Mapping) else None,
    )


def phrased(context: Mapping[str, Any] | None, fix: Callable[[Recorded], str | None]) -> str | None:
    """``fix`` of the framework the context recorded: the change as its setting, or None
    (a plain PyTorch loop, or a change the framework has no setting for). For Lightning,
    only a change ``fix`` phrases wholly through ``set_arguments`` in its Trainer's
    arguments: the rest of a Trainer's advice is transformers' (its model's methods, its
    ``TrainingArguments`` fields)."""
    rec = recorded(context)
    if rec is None:
        return None
    text = fix(rec)
    if rec.is_lightning and not (rec.phrasings and all(rec.phrasings)):
        return None
    return text


def call(function: str, **fields: Any) -> str:
    """``TrainingArguments(a=1, b=True)``: how a reader writes the change."""
    return f"{function}(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


def _now(rec: Recorded, keys: Any) -> str:
    """``(`trainer` has a=0, b=False)``: the recorded values of ``keys``."""
    known = [f"{k}={rec.arguments[k]!r}" for k in keys if k in rec.arguments]
    return f" ({rec.name} has {', '.join(known)})" if known else ""


def set_arguments(rec: Recorded, **fields: Any) -> str:
    """``set TrainingArguments(a=1) (`trainer` has a=0)``; ``SFTConfig(a=1)`` for TRL's
    SFTTrainer, each trainer in the class of arguments it takes; for Lightning,
    ``set Trainer(accumulate_grad_batches=8)`` (``fields`` in ``TrainingArguments``' words or
    Lightning's own), and what its Trainer has no argument for, said as such."""
    if not rec.is_lightning:
        return f"set {call(rec.arguments_class, **fields)}{_now(rec, fields)}"
    settings: dict[str, Any] = {}
    foreign: dict[str, Any] = {}
    for key, value in fields.items():
        if key in LIGHTNING_ARGUMENTS:
            settings[key] = value
        elif key in LIGHTNING_SETTINGS:
            name, setting = LIGHTNING_SETTINGS[key](value)
            settings[name] = setting
        else:
            foreign[key] = value
    rec.phrasings.append(not foreign)
    parts = [f"set {call(rec.cls, **settings)}{_now(rec, settings)}"] if settings else []
    if foreign:
        parts.append(
            f"outside the Trainer, what {call('TrainingArguments', **foreign)} does (Lightning's Trainer has no "
            "such argument)"
        )
    return "; ".join(parts)


def same_samples_larger_batch(rec: Recorded) -> dict[str, int]:
    """Twice the micro-batch, half the accumulation when there is some: the same samples
    per optimizer step in fewer, larger micro-batches."""
    micro, accumulation = rec.micro_batch, rec.accumulation
    fields = {"per_device_train_batch_size": 2 * micro}
    if accumulation >= 2:
        fields["gradient_accumulation_steps"] = accumulation // 2
    return fields


def samples_text(rec: Recorded) -> str:
    """What ``same_samples_larger_batch`` does to the samples per optimizer step, in words."""
    samples = rec.micro_batch * rec.accumulation
    if rec.accumulation >= 2:
        return f"(the same {samples} samples per optimizer step)"
    return f"({2 * samples} samples per optimizer step instead of {samples}: retune the learning rate)"
