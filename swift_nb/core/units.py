"""Human-readable units for bytes, seconds, percentages and rates."""

from __future__ import annotations

import math


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt_bytes(n) -> str:
    if _missing(n):
        return "–"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_seconds(s) -> str:
    if _missing(s):
        return "–"
    s = float(s)
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    return f"{s / 60:.1f} min"


def fmt_pct(p) -> str:
    return "–" if _missing(p) else f"{float(p):.0f} %"


def fmt_rate(r, unit: str) -> str:
    return "–" if _missing(r) else f"{float(r):.2f} {unit}"


def fmt_span(numbers) -> str:
    """Sorted whole numbers as runs: ``[0, 1, 2, 3, 7]`` → ``0–3, 7``."""
    parts: list[str] = []
    values = sorted(int(n) for n in numbers)
    start = None
    for i, n in enumerate(values):
        start = n if start is None else start
        if i + 1 == len(values) or values[i + 1] != n + 1:
            parts.append(str(start) if start == n else f"{start}, {n}" if n == start + 1 else f"{start}–{n}")
            start = None
    return ", ".join(parts)


def fmt_ranks(ranks, world: int | None = None) -> str:
    """``rank 1``, ``ranks 0–3, 7``; ``every rank`` when ``ranks`` are all ``world`` (> 1) of them."""
    ranks = list(ranks)
    if world is not None and world > 1 and len(set(ranks)) == world:
        return "every rank"
    return ("rank " if len(ranks) == 1 else "ranks ") + fmt_span(ranks)


#: bitsandbytes' 8-bit optimizers keep fp32 state for a tensor smaller than this many
#: elements (their ``min_8bit_size``)
MIN_8BIT_SIZE = 4096
