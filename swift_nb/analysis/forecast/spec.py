"""What a forecast takes, in words: the dtypes by name, the forecast's toggles with their
parameters, and the spec line of ``--forecast`` / ``profile(forecast=...)``
(``"H100-80GB batch=32 seq=4096 dtype=bf16 toggles=flash_attention,galore:rank=64"``).

Every value is checked here, so that a bad spec is refused before a run starts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from swift_nb.analysis.effects import GALORE_RANK
from swift_nb.devices import is_capacity, resolve_device
from swift_nb.errors import ConfigError

#: bytes per element of each dtype a forecast takes, and the names it takes them by.
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
DTYPE_NAMES = {
    **{d: d for d in DTYPE_BYTES},
    "fp64": "float64",
    "double": "float64",
    "fp32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
}

#: The toggles a forecast understands, with their parameters' defaults:
#: flash_attention: fused attention, no [.., T, T] tensors; grad_checkpointing: the
#: activations of every_n-th block recomputed in backward; galore: Adam's moments of the
#: weight matrices in rank r; sequence_parallel: each rank holds T / sp_size tokens;
#: bf16_autocast: bf16 activations, fp32 parameters, gradients and optimizer state;
#: zero: optimizer state (stage 1), + gradients (2), + parameters (3) sharded over the
#: ranks; fsdp: ZeRO stage 3.
FORECAST_TOGGLES: dict[str, dict[str, int]] = {
    "flash_attention": {},
    "grad_checkpointing": {"every_n": 1},
    "galore": {"rank": GALORE_RANK},
    "sequence_parallel": {"sp_size": 2},
    "bf16_autocast": {},
    "zero": {"stage": 1},
    "fsdp": {},
}
#: Short names of the forecast toggles' parameters.
FORECAST_TOGGLE_ALIASES = {"n": "every_n", "sp": "sp_size", "r": "rank"}

#: How far off each toggle makes the total (± %), on top of the forecast's base error
#: (``predict.ERROR_BASE_PCT``): what it was off in benchmarks/forecast.py, rounded up, or
#: what its assumption costs where the benchmark could not measure it.
ERROR_ADDED_PCT = {
    "flash_attention": 5.0,  # benchmark: −4.1 % and −6.6 % (the fused kernel's own buffers)
    "grad_checkpointing": 5.0,  # benchmark: +5.9 % and +5.8 % (blocks taken as equal)
    "bf16_autocast": 15.0,  # which ops autocast keeps in fp32 differs by model and device
    "sequence_parallel": 10.0,  # communication buffers and the attention's own layout
    "zero": 5.0,  # gathered and bucketed copies
    "fsdp": 10.0,
}

_SPEC_KEYS = {
    "batch": "batch_size",
    "batch_size": "batch_size",
    "seq": "seq_len",
    "seq_len": "seq_len",
    "dtype": "dtype",
    "optimizer": "optimizer",
    "world": "world_size",
    "world_size": "world_size",
    "toggles": "toggles",
    "device": "device",
}


def dtype_name(dtype: str) -> str:
    """``"bf16"`` → ``"bfloat16"``; ``ConfigError`` for a dtype a forecast does not know."""
    name = DTYPE_NAMES.get(str(dtype).strip().lower().removeprefix("torch."))
    if name is None:
        raise ConfigError("dtype", f"must be one of {', '.join(DTYPE_NAMES)}", dtype)
    return name


def parse_toggles(
    toggles: str | Iterable[str] | Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, int]]:
    """``["galore:rank=64", "flash_attention"]`` (or ``"galore:rank=64,flash_attention"``,
    or ``{"galore": {"rank": 64}}``) → ``{"galore": {"rank": 64}, "flash_attention": {}}``,
    each toggle's parameters completed with their defaults."""
    if isinstance(toggles, Mapping):
        items = [(str(k), {str(p): v for p, v in (v or {}).items()}) for k, v in toggles.items()]
    else:
        specs = _split_toggles(toggles.split(",") if isinstance(toggles, str) else list(toggles))
        items = [_toggle_item(s) for s in specs]
    out: dict[str, dict[str, int]] = {}
    for name, given in items:
        defaults = FORECAST_TOGGLES.get(name)
        if defaults is None:
            raise ConfigError("toggles", f"must be among {', '.join(FORECAST_TOGGLES)}", name)
        values = dict(defaults)
        for param, value in given.items():
            param = FORECAST_TOGGLE_ALIASES.get(param, param)
            if param not in defaults:
                takes = ", ".join(defaults) or "no parameters"
                raise ConfigError(f"toggle {name}", f"takes {takes}", param)
            values[param] = _whole(f"{name}:{param}", value)
        _check_toggle(name, values)
        out[name] = values
    return out


def toggle_label(name: str, params: Mapping[str, int]) -> str:
    """A toggle as a forecast names it: its id, then the parameters that are not their
    default (galore's rank, sequence parallelism's size and ZeRO's stage always)."""
    defaults = FORECAST_TOGGLES[name]
    given = {
        k: v
        for k, v in params.items()
        if defaults.get(k) != v or name in ("galore", "sequence_parallel", "zero")
    }
    return name + (":" + ",".join(f"{k}={v}" for k, v in given.items()) if given else "")


def _split_toggles(parts: list[str]) -> list[str]:
    """Comma-separated toggles whose own parameters are comma-separated too
    (``galore:rank=64,gap=2``): a ``key=value`` without a toggle name belongs to the one before."""
    specs: list[str] = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        if "=" in part and ":" not in part and specs:
            specs[-1] += "," + part
        else:
            specs.append(part)
    return specs


def _toggle_item(spec: str) -> tuple[str, dict[str, str]]:
    name, _, params = spec.partition(":")
    given = {}
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"toggle {name.strip()}", "parameters are key=value", item)
        given[key.strip()] = value.strip()
    return name.strip(), given


def _whole(name: str, value: Any) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not number.is_integer():
        raise ConfigError(name, "must be a whole number", value)
    return int(number)


def _check_toggle(name: str, values: dict[str, int]) -> None:
    for param, value in values.items():
        if value < 1:
            raise ConfigError(f"{name}:{param}", "must be at least 1", value)
    if name == "sequence_parallel" and values["sp_size"] < 2:
        raise ConfigError("sequence_parallel:sp_size", "must be at least 2", values["sp_size"])
    if name == "zero" and values["stage"] not in (1, 2, 3):
        raise ConfigError("zero:stage", "must be 1, 2 or 3", values["stage"])


def parse_forecast_spec(text: str) -> dict[str, Any]:
    """The keyword arguments of ``forecast`` from a line such as
    ``"H100-80GB batch=32 seq=4096 dtype=bf16 toggles=flash_attention,galore:rank=64"``:
    the device first (optional), then ``key=value`` words: batch (batch_size), seq (seq_len),
    dtype, optimizer, world (world_size), toggles. Every value is checked here."""
    words = str(text).split()
    out: dict[str, Any] = {}
    if words and "=" not in words[0]:
        out["device"] = _spec_value("device", words.pop(0))
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or key not in _SPEC_KEYS:
            raise ConfigError(
                "forecast",
                "takes a device, then key=value words among batch, seq, dtype, optimizer, world, toggles "
                "(e.g. 'H100-80GB batch=32 seq=4096 dtype=bf16 toggles=flash_attention')",
                word,
            )
        out[_SPEC_KEYS[key]] = _spec_value(_SPEC_KEYS[key], value)
    return out


def _spec_value(key: str, value: str) -> Any:
    if key in ("batch_size", "seq_len", "world_size"):
        number = _whole(key, value)
        if number < 1:
            raise ConfigError(key, "must be at least 1", value)
        return number
    if key == "dtype":
        return dtype_name(value)
    if key == "toggles":
        parse_toggles(value)
        return tuple(_split_toggles(value.split(",")))
    if key == "device":
        return value if is_capacity(value) else resolve_device(value).name
    return value
