"""Operators' recorded input shapes, as the trace tables keep them (text)."""

from __future__ import annotations

import json


def input_dims(text: str) -> list:
    """An op's input shapes from their text (``"[[4, 16], []]"``); empty when absent or
    unreadable."""
    try:
        dims = json.loads(text) if text else []
    except ValueError:
        return []
    return dims if isinstance(dims, list) else []
