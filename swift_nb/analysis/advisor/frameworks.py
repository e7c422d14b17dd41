"""The framework a run's context recorded around its loop (Hugging Face's ``Trainer``,
accelerate's ``Accelerator``: see ``swift_nb.capture.frameworks``), read back for advice:
a rule phrases its change as the setting to edit — ``TrainingArguments(dataloader_num_workers=4)``,
``Accelerator(mixed_precision='bf16')`` — when one was recorded. Torch-free."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from swift_nb.record import CHECKPOINTING_FIELDS, TRAINER_KEY


@dataclass(frozen=True)
class Recorded:
    """What a run's context says about its framework."""

    framework: str  # "transformers" | "accelerate"
    cls: str
    variable: str | None
    arguments: dict[str, Any]
    checkpointing_field: str = CHECKPOINTING_FIELDS[0]
    model: dict[str, Any] | None = None
    arguments_class: str = "TrainingArguments"  # TRL's trainers: SFTConfig, DPOConfig …

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
    whose entry is not what the capture writes)."""
    info = (context or {}).get(TRAINER_KEY)
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
        arguments_class=str(info.get("arguments_class") or "TrainingArguments"),
    )


def phrased(context: Mapping[str, Any] | None, fix: Callable[[Recorded], str | None]) -> str | None:
    """``fix`` of the framework the context recorded: the change as its setting, or None
    (a plain PyTorch loop, or a change the framework has no setting for)."""
    rec = recorded(context)
    return fix(rec) if rec is not None else None


def call(function: str, **fields: Any) -> str:
    """``TrainingArguments(a=1, b=True)``: how a reader writes the change."""
    return f"{function}(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


def _now(rec: Recorded, keys: Any) -> str:
    """``(`trainer` has a=0, b=False)``: the recorded values of ``keys``."""
    known = [f"{k}={rec.arguments[k]!r}" for k in keys if k in rec.arguments]
    return f" ({rec.name} has {', '.join(known)})" if known else ""


def set_arguments(rec: Recorded, **fields: Any) -> str:
    """``set TrainingArguments(a=1) (`trainer` has a=0)``; ``SFTConfig(a=1)`` for TRL's
    SFTTrainer, each trainer in the class of arguments it takes."""
    return f"set {call(rec.arguments_class, **fields)}{_now(rec, fields)}"


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
