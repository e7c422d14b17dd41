"""What a forecast is for (``Config``), what a configuration's step peaks at (``Peak``), and
what a forecast says (``Forecast``): bytes by category, the device's room, whether it fits,
the largest batch and sequence that fit, and the derivation of every number in words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from swift_nb.analysis.effects import Applied
from swift_nb.core.units import fmt_bytes
from swift_nb.record import MEMORY_CATEGORIES

SEARCH_LIMIT = 1 << 24  # largest batch or sequence the search for the maximum tries


@dataclass(frozen=True)
class Config:
    """What a forecast is for: B samples of T tokens per rank, parameter dtype, optimizer,
    toggles ({id: params}), ranks, and whether the target is a GPU (``target_is_cuda``)."""

    batch_size: int
    seq_len: int
    dtype: str
    optimizer: str | None
    toggles: Mapping[str, Mapping[str, int]]
    world_size: int
    cuda: bool = True  # the target runs CUDA's implementations (else the CPU's)

    @property
    def shards(self) -> tuple[int, int, int]:
        """How many ways parameters, gradients and optimizer state are split."""
        return Applied(self.toggles).shards(self.world_size)


@dataclass
class Peak:
    """Bytes by category at the forecast step's peak, and one line of derivation each."""

    categories: dict[str, float]
    lines: list[str]

    @property
    def total(self) -> float:
        return float(sum(self.categories.values()))


@dataclass
class Forecast:
    """Peak tensor memory of a training step in another configuration, and whether it fits.

    categories: bytes at the forecast peak (``MEMORY_CATEGORIES``: parameters, the ones that
    train; frozen_parameters, the weights that do not, at their dtype or 4-bit packing;
    gradients, optimizer_state, activations, other); total_bytes: their sum; device: the preset (or capacity) it is for,
    capacity_bytes: its total memory, context_bytes: what the CUDA context takes of it,
    usable_bytes: the rest; fits: total ≤ usable; headroom_bytes: usable − total (negative:
    short by that much); max_batch_size: the largest batch that fits at ``seq_len`` (0: not
    even one sample; None: unknown, or more than 2**24), max_seq_len: the longest sequence
    at ``batch_size`` (None: the run has no sequence, or unbounded); derivation: one line per
    category (the formula with its numbers) and per assumption; expected_error_pct: how far
    off the total may be (±%), expected_error: why; measured: the run's categories at its
    peak (frozen_parameters absent when the run did not measure them), measured_config: its
    batch, sequence, dtype, optimizer, ranks and fine-tuning (``finetune_label``).
    steps, step_s, price_per_hour, cost_usd (``forecast(steps=N)``): N steps priced on the
    device, at the run's median step scaled by the tokens per step (s; the device's own
    speed is not predicted), USD per device-hour, and their cost over ``world_size``
    devices (USD; None without a price or a step time); the derivation says how.
    """

    run_id: str
    device: str
    capacity_bytes: float
    context_bytes: float
    batch_size: int
    seq_len: int | None
    dtype: str
    optimizer: str | None
    toggles: tuple[str, ...]
    world_size: int
    categories: dict[str, float]
    total_bytes: float
    usable_bytes: float
    fits: bool
    headroom_bytes: float
    max_batch_size: int | None
    max_seq_len: int | None
    derivation: list[str]
    expected_error_pct: float
    expected_error: str
    measured: dict[str, float]
    measured_config: dict[str, Any]
    device_source: str = ""
    steps: int | None = None
    step_s: float | None = None
    price_per_hour: float | None = None
    cost_usd: float | None = None

    def table(self) -> pd.DataFrame:
        """One row per category and the total: ``measured_bytes`` (the run, at its peak; NaN
        where it did not measure it), ``forecast_bytes``, ``share_pct`` (of the device's
        usable memory)."""
        rows = [
            (
                c,
                self.measured.get(c, float("nan")),
                self.categories[c],
                100.0 * self.categories[c] / self.usable_bytes,
            )
            for c in MEMORY_CATEGORIES
        ]
        rows.append(
            (
                "total",
                sum(self.measured.values()),
                self.total_bytes,
                100.0 * self.total_bytes / self.usable_bytes,
            )
        )
        return pd.DataFrame(rows, columns=["category", "measured_bytes", "forecast_bytes", "share_pct"])

    def config_text(self) -> str:
        """``batch 32 × 4096 tokens, bfloat16, AdamW, flash_attention, 1 rank``."""
        shape = f"batch {self.batch_size}" + (f" × {self.seq_len:,} tokens" if self.seq_len else "")
        parts = [shape, self.dtype, self.optimizer or "the run's optimizer"]
        parts += list(self.toggles) or ["no toggles"]
        parts.append(f"{self.world_size} rank" + ("s" if self.world_size != 1 else ""))
        return ", ".join(parts)

    def sentences(self) -> list[str]:
        """The verdict, the room and the limits in whole sentences."""
        verdict = (
            f"It fits, with {fmt_bytes(self.headroom_bytes)} to spare."
            if self.fits
            else f"It does not fit: {fmt_bytes(-self.headroom_bytes)} too much."
        )
        out = [
            f"On {self.device} ({self.config_text()}), a training step would peak at about "
            f"{fmt_bytes(self.total_bytes)} of tensors (± {self.expected_error_pct:.0f} %). {verdict}",
            f"The device holds {fmt_bytes(self.capacity_bytes)}, of which the CUDA context takes about "
            f"{fmt_bytes(self.context_bytes)}, leaving {fmt_bytes(self.usable_bytes)} for tensors.",
        ]
        limits = []
        if self.seq_len:
            limits.append(
                f"the largest batch that fits at {self.seq_len:,} tokens is {_limit(self.max_batch_size)}"
            )
            limits.append(
                f"the longest sequence at batch {self.batch_size} is {_limit(self.max_seq_len, ' tokens')}"
            )
        else:
            limits.append(f"the largest batch that fits is {_limit(self.max_batch_size)}")
        out.append(limits[0][0].upper() + "; ".join(limits)[1:] + ".")
        out.append(f"Expected error: {self.expected_error}")
        return out

    def __str__(self) -> str:
        lines = [*self.sentences(), "", "By category (forecast, measured in the run):"]
        width = max(len(c) for c in MEMORY_CATEGORIES)
        for c in MEMORY_CATEGORIES:
            lines.append(
                f"  {c.replace('_', ' '):<{width}}  {fmt_bytes(self.categories[c]):>10}  ({fmt_bytes(self.measured.get(c))})"
            )
        lines.append(
            f"  {'total':<{width}}  {fmt_bytes(self.total_bytes):>10}  ({fmt_bytes(sum(self.measured.values()))})"
        )
        lines += ["", "How:", *(f"  {d}" for d in self.derivation)]
        return "\n".join(lines)


def _limit(value: int | None, unit: str = "") -> str:
    if value is None:
        return f"not limited by memory up to {SEARCH_LIMIT:,}{unit}"
    return f"{value:,}{unit}" if value else f"none: not even 1{unit or ' sample'} fits"
