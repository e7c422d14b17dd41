"""A value as a reader sees it, in its key's unit (``labels.unit``): ``step_s`` 0.3037 →
"303.7 ms", shares as percentages, money in dollars, lists and mappings as short text,
"–" when absent."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from swift_nb.core.units import fmt_bytes, fmt_seconds
from swift_nb.render.labels import unit


def is_missing(value: Any) -> bool:
    """Whether ``value`` is absent: None or NaN."""
    return value is None or (
        isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isnan(value)
    )


def value_text(key: str, value: Any) -> str:
    """``value`` of ``key`` as a reader sees it: in its unit, lists and mappings as short
    text (``aten::item 12, aten::nonzero 3``), "–" when absent."""
    if is_missing(value):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    kind = unit(key)
    if isinstance(value, numbers.Real):
        return number_text(float(value), kind, isinstance(value, numbers.Integral))
    if isinstance(value, Mapping):
        return (
            ", ".join(
                f"{k} {value_text(key, v) if isinstance(v, numbers.Real) else _plain(v)}"
                for k, v in value.items()
            )
            or "–"
        )
    if isinstance(value, (list, tuple)):
        if kind == "shape" or (value and all(isinstance(v, numbers.Integral) for v in value)):
            return " × ".join(str(v) for v in value) if kind == "shape" else ", ".join(str(v) for v in value)
        return "; ".join(_plain(v) for v in value) or "–"
    return str(value)


def _plain(value: Any) -> str:
    """A value inside a list or a mapping, as short text."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(map(str, sorted(value, key=str) if isinstance(value, (set, frozenset)) else value))
    return str(value)


def number_text(value: float, kind: str, integral: bool = False) -> str:
    """A number in ``kind`` (one of ``UNITS``): ``303.7 ms``, ``22.8 MiB``, ``69.4 %``, ``1.2 kJ``, ``$0.042``."""
    if math.isnan(value):
        return "–"
    if kind == "s":
        return fmt_seconds(value)
    if kind == "ms":
        return fmt_seconds(value / 1e3)
    if kind == "us":
        return fmt_seconds(value / 1e6)
    if kind == "bytes":
        return fmt_bytes(value)
    if kind == "pct":
        return pct_text(value)
    if kind == "j":
        return _si(value, "J")
    if kind == "w":
        return _si(value, "W")
    if kind == "usd":
        return usd_text(value)
    if kind == "usd_per_hour":
        return f"{usd_text(value)}/h"
    if kind == "usd_per_kwh":
        return f"{usd_text(value)}/kWh"
    if kind == "ratio":
        return f"{value:.2f}×"
    if integral or value == int(value):
        # 1024 as the trace writes it; 281,984 grouped
        return f"{int(value):,}" if abs(value) >= 10_000 else str(int(value))
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"


def pct_text(value: float) -> str:
    """A percentage with one decimal, a whole one without: ``69.4 %``, ``0 %``."""
    rounded = round(float(value), 1)
    return f"{rounded:.0f} %" if rounded == int(rounded) else f"{rounded:.1f} %"


def usd_text(value: float) -> str:
    """Dollars to the cent, small amounts to two significant digits: ``$12.30``, ``$0.0042``."""
    if value != 0 and abs(value) < 0.01:
        return f"${value:.2g}"
    return f"${value:,.2f}"


def _si(value: float, unit_name: str) -> str:
    for factor, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit_name}"
    return f"{value:.3g} {unit_name}"
