"""Formatting helpers live in ``swift_nb.units`` (shared by analysis and render)."""

from swift_nb.units import fmt_bytes, fmt_pct, fmt_rate, fmt_seconds

__all__ = ["fmt_bytes", "fmt_pct", "fmt_rate", "fmt_seconds"]
