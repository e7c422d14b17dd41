"""What a toggle's entry says (``Entry``), its parameters (``Param``: kind, default, help,
check, aliases, choices) and the checks parameters share."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from swift_nb.core.errors import ConfigError

_KIND = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


@dataclass(frozen=True)
class Param:
    """One toggle parameter: ``kind`` converts the text of a spec (``rank=64``), ``check``
    returns an error requirement or None; ``aliases`` are short spellings (``gap``);
    ``choices``: the values it takes, where they are few (menus offer them)."""

    name: str
    kind: type
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None
    aliases: tuple[str, ...] = ()
    choices: tuple[Any, ...] = ()

    def convert(self, value: Any) -> Any:
        if isinstance(value, str) and self.kind is not str:
            text = value.strip()
            try:
                if self.kind is bool:
                    if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
                        raise ValueError(text)
                    value = text.lower() in ("1", "true", "yes")
                else:
                    value = self.kind(text)
            except ValueError:
                raise ConfigError(self.name, f"must be {_KIND[self.kind]}", value) from None
        elif self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif value is not None and not isinstance(value, self.kind):
            raise ConfigError(self.name, f"must be {_KIND[self.kind]}", value)
        if value is not None and self.choices and value not in self.choices:
            raise ConfigError(self.name, f"must be one of {', '.join(map(str, self.choices))}", value)
        if value is not None and self.check is not None:
            problem = self.check(value)
            if problem:
                raise ConfigError(self.name, problem, value)
        return value


def at_least(n: int) -> Callable[[Any], str | None]:
    return lambda v: None if v >= n else f"must be ≥ {n}"


def between(lo: int, hi: int) -> Callable[[Any], str | None]:
    return lambda v: None if lo <= v <= hi else f"must be between {lo} and {hi}"


def between_float(lo: float, hi: float) -> Callable[[Any], str | None]:
    return lambda v: None if lo <= v <= hi else f"must be between {lo:g} and {hi:g}"


def positive(v: float) -> str | None:
    return None if v > 0 else "must be > 0"


def valid_regex(v: str) -> str | None:
    try:
        re.compile(v)
    except re.error as e:
        return f"must be a regular expression ({e})"
    return None


#: What in a measured run a toggle can act on (``Entry.acts_on``); the planner tells each
#: from the run (``analysis.forecast.plan.ACTS_ON``): [.., T, T] attention scores, repeated
#: blocks, a Hugging Face causal LM's logits, its padding, fp32 compute, weights that all
#: train, Adam's state.
ACTS_ON = (
    "attention_scores",
    "repeated_blocks",
    "lm_logits",
    "lm_padding",
    "fp32_compute",
    "full_training",
    "adam",
    "adam_state",
)


@dataclass(frozen=True)
class StepCost:
    """What a toggle does to a step's time, a rule of thumb: × ``factor`` because ``reason``;
    ``cpu``: (factor, reason) on a target without CUDA; ``without``: (factor, reason) where
    the run lacks what the toggle acts on; ``per_real_share``: × the real tokens' share
    instead (only they are computed)."""

    factor: float = 1.0
    reason: str = "not estimated"
    cpu: tuple[float, str] | None = None
    without: tuple[float, str] | None = None
    per_real_share: bool = False


@dataclass(frozen=True)
class Entry:
    """A toggle's words. ``flag``: the magic's flag without dashes (``flash-attn``; None:
    no flag); ``help`` and ``metavar``: its help; ``implementation``: ``module:Class`` of the
    toggle that applies it (None: the forecast alone knows it); ``forecast_error_pct``: how
    far off (± %) a forecast with this toggle may be beyond the base error; ``processes``:
    the parameter that sets how many worker processes a rerun with it launches (one per
    rank), when it needs several; ``process_choices``: the counts a menu offers;
    ``label_params``: parameters a forecast's label names even at their default;
    ``excludes``: toggles it cannot run with (both replace the optimizer, both compile);
    ``cuda``: the least CUDA compute capability it needs ((0, 0): any CUDA device; None:
    it runs on the CPU too); ``acts_on``: what in a run it acts on (one of ``ACTS_ON``; None:
    the planner never proposes it); ``step``: what it does to a step's time;
    ``on_fake_model``: the toggle that runs in its place on a model forecast from its config
    (None: priced by formula); ``changes_training``: it changes what is trained or how."""

    id: str
    title: str
    params: tuple[Param, ...] = ()
    flag: str | None = None
    help: str = ""
    metavar: str = ""
    implementation: str | None = None
    forecast_error_pct: float = 0.0
    processes: str | None = None
    label_params: tuple[str, ...] = ()
    process_choices: tuple[int, ...] = (2, 4, 8)
    excludes: tuple[str, ...] = ()
    cuda: tuple[int, int] | None = None
    acts_on: str | None = None
    step: StepCost = StepCost()
    on_fake_model: str | None = None
    changes_training: bool = False

    def __post_init__(self) -> None:
        if self.acts_on is not None and self.acts_on not in ACTS_ON:
            raise ValueError(f"{self.id}: acts_on must be one of {', '.join(ACTS_ON)}, not {self.acts_on!r}")

    @property
    def dest(self) -> str | None:
        """The magic's argparse destination of ``flag`` (``flash_attn``)."""
        return None if self.flag is None else self.flag.replace("-", "_")

    @property
    def runnable(self) -> bool:
        return self.implementation is not None

    def param(self, key: str) -> Param | None:
        """The parameter named ``key`` or one of its aliases."""
        return next((p for p in self.params if key == p.name or key in p.aliases), None)

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def validate(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Full parameter values from ``values`` (names or aliases; text or typed); a
        ConfigError names the first bad one."""
        out = self.defaults()
        for key, value in values.items():
            p = self.param(key)
            if p is None:
                known = ", ".join(p.name for p in self.params) or "none"
                raise ConfigError(
                    f"{self.id} {key}", f"is not a parameter of {self.id} (known: {known})", value
                )
            try:
                out[p.name] = p.convert(value)
            except ConfigError as e:
                raise ConfigError(f"{self.id} {key}", e.requirement, e.value) from None
        return out

    def changed(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The values that differ from their defaults (None values left out)."""
        defaults = self.defaults()
        return {k: v for k, v in values.items() if v is not None and v != defaults.get(k)}
