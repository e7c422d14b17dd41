"""Every option of a profiled run, in one place.

``ProfileOptions`` is what the Python API (``swift_nb.profile(...)``), the notebook magic's
flags (``%%swift_profile --active 5 ...``) and a rerun worker's command line all map to and
from: the magic's parser is built from its fields, ``to_argv()`` writes the flags back, and
the capture session is built from it alone. A new option is one field here.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import re
import shlex
from dataclasses import MISSING, asdict, dataclass, field, fields
from os import PathLike
from typing import Any, NoReturn

from swift_nb.core.devices import ENV_PRICE_PER_HOUR, ENV_PRICE_PER_KWH, check_price
from swift_nb.core.errors import ConfigError, MissingDependencyError
from swift_nb.vocabulary.forecast_spec import parse_forecast_spec


def _opt(default: Any, flag: str, help: str, metavar: str | None = None) -> Any:
    """A field with its magic flag. A ``--no-...`` flag turns a True default off."""
    return field(default=default, metadata={"flag": flag, "help": help, "metavar": metavar})


_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


@dataclass(frozen=True)
class ProfileOptions:
    """What to capture and where to keep it; validated on construction, before any work.

    wait/warmup/active/repeat: the profiler schedule, in steps (a step ends at each
    ``optimizer.step()`` or ``swift_nb.step()``; ``repeat=0`` cycles until the run ends).
    record_shapes, profile_memory, with_stack: torch.profiler options. count_flops: count
    one step's FLOPs (that step runs slower; its trace is discarded anyway).
    interval_ms: resource sampling period. label: a name for the run. out_dir: folder of
    run folders (default ``$SWIFT_NB_DIR`` or ``./swift_nb_runs``). keep: runs retained
    there (default ``$SWIFT_NB_KEEP`` or 20). run_id: the run folder's name inside
    ``out_dir`` (default: made from the time and the label). report: analyze the run and
    write ``report.html`` when it ends (off: save the record only; ``swift-nb report`` later).
    price_per_hour, price_per_kwh: USD per device-hour and per kWh for the run's cost
    (``swift_nb.analysis.cost``). log_to: trackers the finished run is sent to
    (``swift_nb.export``: ``"mlflow"``, ``"wandb"``, ``"tensorboard"``, with arguments as
    ``"mlflow:tracking_uri=sqlite:///mlflow.db"``).
    gather_timeout_s: in a torchrun job, the longest rank 0 waits for the other ranks at
    start and end (default ``$SWIFT_NB_GATHER_TIMEOUT_S`` or 25 s). forecast: "will it
    fit?" configurations for the report (``swift_nb.analysis.forecast.parse_forecast_spec``:
    a device, then ``batch=``, ``seq=``, ``dtype=``, ``optimizer=``, ``world=``, ``toggles=``).
    """

    wait: int = _opt(1, "--wait", "steps skipped before profiling (default 1)")
    warmup: int = _opt(2, "--warmup", "steps traced then discarded (default 2)")
    active: int = _opt(3, "--active", "steps recorded per cycle (default 3)")
    repeat: int = _opt(1, "--repeat", "profiling cycles; 0 = until the cell ends (default 1)")
    record_shapes: bool = _opt(True, "--no-shapes", "do not record input shapes")
    profile_memory: bool = _opt(True, "--no-memory", "do not record tensor allocations")
    with_stack: bool = _opt(False, "--with-stack", "record Python stacks (slower)")
    count_flops: bool = _opt(
        False, "--flops", "count one step's FLOPs for FLOP/s and MFU (that step runs slower)"
    )
    interval_ms: float = _opt(100.0, "--interval-ms", "resource sampling period in ms (default 100)")
    label: str | None = _opt(None, "--label", "a name for this run")
    out_dir: str | PathLike[str] | None = _opt(  # noqa: RUF009 - a dataclass field, like its siblings
        None, "--out", "folder of run folders (default $SWIFT_NB_DIR or ./swift_nb_runs)"
    )
    keep: int | None = _opt(None, "--keep", "runs to keep in that folder (default 20)")
    run_id: str | None = _opt(None, "--run-id", "the run folder's name (default: from the time and label)")
    report: bool = _opt(
        True,
        "--no-report",
        "save the run without analyzing it or writing report.html (faster; swift-nb report RUN_DIR later)",
    )
    gather_timeout_s: float | None = _opt(
        None, "--gather-timeout", "torchrun jobs: seconds rank 0 waits for the other ranks (default 25)"
    )
    price_per_hour: float | None = _opt(
        None,
        "--price-per-hour",
        "USD one device (a GPU; the machine on a CPU run) costs an hour, for the run's cost "
        "(default $SWIFT_NB_PRICE_PER_HOUR or swift_nb.core.devices.PRICES_PER_HOUR by the GPU)",
    )
    price_per_kwh: float | None = _opt(
        None, "--price-per-kwh", "USD per kWh, for the energy's cost (default $SWIFT_NB_PRICE_PER_KWH)"
    )
    log_to: tuple[str, ...] = _opt(
        (),
        "--log-to",
        "send the finished run to a tracker (repeatable): mlflow, wandb or tensorboard, "
        "with arguments as 'tensorboard:log_dir=runs'",
        metavar="TRACKER",
    )
    forecast: tuple[str, ...] = _opt(
        (),
        "--forecast",
        "add a 'Will it fit' section for this configuration (repeatable), e.g. "
        "'H100-80GB batch=32 seq=4096 dtype=bf16 toggles=grad_checkpointing'",
        metavar="SPEC",
    )

    def __post_init__(self) -> None:
        check_schedule(self.wait, self.warmup, self.active, self.repeat)
        if self.keep is not None and (
            not isinstance(self.keep, int) or isinstance(self.keep, bool) or self.keep < 1
        ):
            raise ConfigError("keep", "must be a whole number of runs, at least 1", self.keep)
        for name in ("interval_ms", "gather_timeout_s"):
            value = getattr(self, name)
            if value is None and name == "gather_timeout_s":
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (value > 0 and math.isfinite(value))
            ):
                unit = "milliseconds" if name == "interval_ms" else "seconds"
                raise ConfigError(name, f"must be a positive number of {unit}", value)
        for name in ("record_shapes", "profile_memory", "with_stack", "count_flops", "report"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, "must be True or False", getattr(self, name))
        if self.label is not None and not isinstance(self.label, str):
            raise ConfigError("label", "must be a string", self.label)
        if self.out_dir is not None:  # a Path is fine; kept as text, the magic's form
            object.__setattr__(self, "out_dir", str(self.out_dir))
        self._check_forecast()
        self._check_money()
        if self.run_id is not None and not (isinstance(self.run_id, str) and _RUN_ID.match(self.run_id)):
            raise ConfigError(
                "run_id", "must be a folder name of letters, digits, '.', '_' and '-'", self.run_id
            )

    def _check_forecast(self) -> None:
        specs = (self.forecast,) if isinstance(self.forecast, str) else self.forecast
        if not isinstance(specs, (tuple, list)) or not all(isinstance(x, str) for x in specs):
            raise ConfigError("forecast", "must be configurations as text, one string each", self.forecast)
        object.__setattr__(self, "forecast", tuple(specs))
        # Only the grammar of each line is read here (a pure function, no analysis runs).

        for spec in self.forecast:
            parse_forecast_spec(spec)

    def _check_money(self) -> None:

        for name in ("price_per_hour", "price_per_kwh"):
            object.__setattr__(self, name, check_price(name, getattr(self, name)))
        for name in (ENV_PRICE_PER_HOUR, ENV_PRICE_PER_KWH):  # a bad one fails now, not at the run's end
            check_price(name, os.environ.get(name) or None)
        targets = (self.log_to,) if isinstance(self.log_to, str) else self.log_to
        if not isinstance(targets, (tuple, list)) or not all(isinstance(x, str) for x in targets):
            raise ConfigError("log_to", "must be trackers as text (mlflow, wandb, tensorboard)", self.log_to)
        object.__setattr__(self, "log_to", tuple(targets))
        for spec in self.log_to:
            parse_log_to(spec, check_installed=True)

    @property
    def interval_s(self) -> float:
        return self.interval_ms / 1000.0

    def replace(self, **changes: Any) -> ProfileOptions:
        """A copy with ``changes`` (validated like any construction)."""
        return ProfileOptions(**{**asdict(self), **changes})

    def to_argv(self) -> list[str]:
        """The magic's flags that give these options (only those that differ from the
        defaults); ``from_args(parse(to_argv()))`` gives them back."""
        out: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            flag = f.metadata["flag"]
            if isinstance(f.default, bool):
                out.append(flag)  # a boolean differs from its default: its flag says so
            elif isinstance(f.default, tuple):
                for item in value:
                    out += [flag, item]
            else:
                out += [flag, _text(value)]
        return out

    @classmethod
    def from_line(cls, line: str) -> ProfileOptions:
        """From a ``%%swift_profile`` line; flags that are not options (``--compare``,
        ``--steps``, toggle flags, ...) are left to their owners and ignored here."""
        parser = _Parser(add_help=False, allow_abbrev=False)
        for args, kwargs in argparse_specs():
            parser.add_argument(*args, **kwargs)
        parser.prog = line
        known, _ = parser.parse_known_args(shlex.split(line))
        return cls.from_args(known)

    @classmethod
    def from_args(cls, args: Any) -> ProfileOptions:
        """From parsed magic arguments (an ``argparse.Namespace``)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = getattr(args, dest(f.metadata["flag"]))
            if isinstance(f.default, tuple):
                value = tuple(value or ())
            values[f.name] = (
                (not value if f.default is True else value) if isinstance(f.default, bool) else value
            )
        return cls(**values)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError("line", f"is not a valid %%swift_profile line ({message})", self.prog)


def dest(flag: str) -> str:
    """The attribute argparse gives a flag: ``--no-shapes`` → ``no_shapes``."""
    return flag.lstrip("-").replace("-", "_")


def flag_of(name: str) -> str:
    """How the magic spells an option: ``active`` → ``--active``, ``interval_ms`` →
    ``--interval-ms``, ``record_shapes`` → ``--no-shapes``; other names as ``--name``."""
    for f in fields(ProfileOptions):
        if f.name == name:
            return f.metadata["flag"]
    return "--" + name.replace("_", "-")


def argparse_specs() -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """``(args, kwargs)`` for ``argparse.add_argument`` (or IPython's ``@argument``), one
    per option, in field order."""
    specs: list[tuple[tuple[str, ...], dict[str, Any]]] = []
    for f in fields(ProfileOptions):
        meta = f.metadata
        if isinstance(f.default, bool):
            kw: dict[str, Any] = {"action": "store_true", "help": meta["help"]}
        elif isinstance(f.default, tuple):
            kw = {"action": "append", "default": None, "help": meta["help"], "metavar": meta["metavar"]}
        else:
            kind = _kind(f)
            kw = {"type": kind, "default": f.default, "help": meta["help"]}
            if meta["metavar"]:
                kw["metavar"] = meta["metavar"]
        specs.append(((meta["flag"],), kw))
    return specs


def _kind(f: Any) -> type:
    if f.default is not MISSING and f.default is not None:
        return type(f.default)
    return {"keep": int, "gather_timeout_s": float, "price_per_hour": float, "price_per_kwh": float}.get(
        f.name, str
    )


def check_schedule(wait: int, warmup: int, active: int, repeat: int) -> None:
    """Raise ``ConfigError`` unless the profiler schedule is whole numbers in range."""
    for name, value, low in (
        ("wait", wait, 0),
        ("warmup", warmup, 0),
        ("active", active, 1),
        ("repeat", repeat, 0),
    ):
        _whole(name, value, low)


def _whole(name: str, value: Any, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(name, f"must be a whole number ≥ {low}", value)


def _text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


# -- where a finished run is sent (--log-to) ----------------------------------------------

#: the trackers a run can be sent to → the module each needs
TARGETS = {"mlflow": "mlflow", "wandb": "wandb", "tensorboard": "tensorboard"}


def parse_log_to(spec: str, check_installed: bool = False) -> tuple[str, dict[str, str]]:
    """``"tensorboard:log_dir=runs"`` → ``("tensorboard", {"log_dir": "runs"})``; a tracker
    not in ``TARGETS`` is a ``ConfigError``, and (``check_installed``) one whose library is
    missing a ``MissingDependencyError`` (an ``ImportError``) naming its extra."""
    name, _, args = spec.strip().partition(":")
    name = name.strip().lower()
    if name not in TARGETS:
        raise ConfigError("log_to", f"must be one of {', '.join(TARGETS)} (with ':key=value,...')", spec)
    kwargs: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in args.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise ConfigError("log_to", f"arguments are key=value pairs, as '{name}:log_dir=runs'", spec)
        kwargs[key.strip()] = value.strip()
    if check_installed:
        require_tracker(name, find_only=True)
    return name, kwargs


def require_tracker(name: str, find_only: bool = False) -> Any:
    module = TARGETS[name]
    if importlib.util.find_spec(module) is None:
        raise MissingDependencyError(
            f"exporting to {name} needs the {module} package: pip install 'swift_nb[{name}]'"
        )
    return None if find_only else importlib.import_module(module)
