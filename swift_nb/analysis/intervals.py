"""Unions and differences of half-open time intervals, as sorted (start, end) arrays."""

from __future__ import annotations

import numpy as np


def union(starts, ends) -> np.ndarray:
    """Merge intervals into a sorted, disjoint (n, 2) array."""
    if len(starts) == 0:
        return np.empty((0, 2))
    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts, float)[order], np.asarray(ends, float)[order]
    out = []
    cur_s, cur_e = s[0], e[0]
    for a, b in zip(s[1:], e[1:], strict=True):
        if a <= cur_e:
            cur_e = max(cur_e, b)
        else:
            out.append((cur_s, cur_e))
            cur_s, cur_e = a, b
    out.append((cur_s, cur_e))
    return np.array(out)


def length(iv: np.ndarray) -> float:
    return float((iv[:, 1] - iv[:, 0]).sum()) if len(iv) else 0.0


def subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Parts of disjoint sorted intervals ``a`` not covered by disjoint sorted ``b``."""
    if not len(a) or not len(b):
        return a
    out, j = [], 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            if cur >= e:
                break
            k += 1
        if cur < e:
            out.append((cur, e))
    return np.array(out) if out else np.empty((0, 2))


def clip(iv: np.ndarray, lo: float, hi: float) -> np.ndarray:
    if not len(iv):
        return iv
    c = np.clip(iv, lo, hi)
    return c[c[:, 1] > c[:, 0]]
