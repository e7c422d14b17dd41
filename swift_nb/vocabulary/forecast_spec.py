"""What a forecast takes, in words: the dtypes by name, the toggles (``swift_nb.vocabulary``),
and the spec line of ``--forecast`` / ``profile(forecast=...)``
(``"H100-80GB batch=32 seq=4096 dtype=bf16 toggles=flash_attention,galore:rank=64"``).

Every value is checked here, so that a bad spec is refused before a run starts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from swift_nb import vocabulary
from swift_nb.core.devices import is_capacity, resolve_device
from swift_nb.core.errors import ConfigError

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
    "steps": "steps",
}


def dtype_name(dtype: str) -> str:
    """``"bf16"`` → ``"bfloat16"``; ``ConfigError`` for a dtype a forecast does not know."""
    name = DTYPE_NAMES.get(str(dtype).strip().lower().removeprefix("torch."))
    if name is None:
        raise ConfigError("dtype", f"must be one of {', '.join(DTYPE_NAMES)}", dtype)
    return name


def parse_toggles(
    toggles: str | Iterable[str] | Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, Any]]:
    """``["galore:rank=64", "flash_attention"]`` (or ``"galore:rank=64,flash_attention"``,
    or ``{"galore": {"rank": 64}}``) → ``{"galore": {"rank": 64, ...}, "flash_attention": {}}``,
    each toggle's parameters completed with their defaults (``swift_nb.vocabulary``'s
    grammar and parameters: a forecast takes every toggle's parameters, and uses those that
    change memory)."""
    out: dict[str, dict[str, Any]] = {}
    for name, given in vocabulary.parse_list(_known(toggles)):
        out[name] = vocabulary.TOGGLES[name].validate(given)
    return out


def _known(toggles: Any) -> Any:
    """``toggles`` when every id in it is a toggle; else the forecast's ConfigError."""
    if isinstance(toggles, Mapping):
        names = [str(k).strip() for k in toggles]
    else:
        texts = [toggles] if isinstance(toggles, str) else [str(t) for t in toggles]
        names = [vocabulary.parse_item(s)[0] for t in texts for s in vocabulary.split_list(t)]
    for name in names:
        if name not in vocabulary.TOGGLES:
            raise ConfigError("toggles", f"must be among {', '.join(vocabulary.TOGGLES)}", name)
    return toggles


def toggle_label(name: str, params: Mapping[str, Any]) -> str:
    """A toggle as a forecast names it: its id, then the parameters that are not their
    default and those its entry always names (galore's rank, sequence parallelism's size)."""
    entry = vocabulary.TOGGLES[name]
    given = {
        k: v
        for k, v in params.items()
        if k in entry.label_params or (v is not None and v != entry.defaults().get(k))
    }
    return name + (":" + ",".join(f"{k}={v}" for k, v in given.items()) if given else "")


def _whole(name: str, value: Any) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not number.is_integer():
        raise ConfigError(name, "must be a whole number", value)
    return int(number)


def parse_forecast_spec(text: str) -> dict[str, Any]:
    """The keyword arguments of ``forecast`` from a line such as
    ``"H100-80GB batch=32 seq=4096 dtype=bf16 toggles=flash_attention,galore:rank=64"``:
    the device first (optional), then ``key=value`` words: batch (batch_size), seq (seq_len),
    dtype, optimizer, world (world_size), toggles, steps (price that many steps on the
    device). Every value is checked here."""
    words = str(text).split()
    out: dict[str, Any] = {}
    if words and "=" not in words[0]:
        out["device"] = _spec_value("device", words.pop(0))
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or key not in _SPEC_KEYS:
            raise ConfigError(
                "forecast",
                "takes a device, then key=value words among batch, seq, dtype, optimizer, world, toggles, steps "
                "(e.g. 'H100-80GB batch=32 seq=4096 dtype=bf16 toggles=flash_attention')",
                word,
            )
        out[_SPEC_KEYS[key]] = _spec_value(_SPEC_KEYS[key], value)
    return out


def _spec_value(key: str, value: str) -> Any:
    if key in ("batch_size", "seq_len", "world_size", "steps"):
        number = _whole(key, value)
        if number < 1:
            raise ConfigError(key, "must be at least 1", value)
        return number
    if key == "dtype":
        return dtype_name(value)
    if key == "toggles":
        parse_toggles(value)
        return tuple(vocabulary.split_list(value))
    if key == "device":
        return value if is_capacity(value) else resolve_device(value).name
    return value
