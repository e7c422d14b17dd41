"""Interval arithmetic over a trace's spans, in µs: unions, differences and intersections of
disjoint sorted (n, 2) arrays, and how much of each span they cover (per step: the time in
collectives, and the part of it no compute hides)."""

from __future__ import annotations

import numpy as np


def union(starts, ends) -> np.ndarray:
    """Merge intervals into a sorted, disjoint (n, 2) array (touching ones merge)."""
    s = np.asarray(starts, float).ravel()
    e = np.asarray(ends, float).ravel()
    if not len(s):
        return np.empty((0, 2))
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)  # the furthest end so far
    first = np.empty(len(s), bool)
    first[0] = True
    first[1:] = s[1:] > reach[:-1]  # starts after everything before it: a new interval
    last = np.append(np.flatnonzero(first)[1:] - 1, len(s) - 1)
    return np.column_stack([s[first], reach[last]])


def length(iv: np.ndarray) -> float:
    """Summed length of disjoint intervals."""
    return float((iv[:, 1] - iv[:, 0]).sum()) if len(iv) else 0.0


def _sweep(a: np.ndarray, b: np.ndarray, state: int) -> np.ndarray:
    """The parts of the line where the depth of disjoint sorted ``a`` (counted 1) plus that
    of disjoint sorted ``b`` (counted 2) is ``state``: 1 is a less b, 3 both."""
    t = np.concatenate([a[:, 0], a[:, 1], b[:, 0], b[:, 1]])
    step = np.repeat([1, -1, 2, -2], [len(a), len(a), len(b), len(b)])
    order = np.argsort(t, kind="stable")
    t, depth = t[order], np.cumsum(step[order])
    # [t[i], t[i + 1]) has the depth after boundary i; at tied times only the last counts,
    # and the ones before it give empty pieces, dropped
    keep = (depth[:-1] == state) & (t[1:] > t[:-1])
    return np.column_stack([t[:-1][keep], t[1:][keep]])


def subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Parts of disjoint sorted intervals ``a`` not covered by disjoint sorted ``b``."""
    if not len(a) or not len(b):
        return a
    return _sweep(np.asarray(a, float), np.asarray(b, float), 1)


def intersect(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Parts covered by both disjoint sorted ``a`` and disjoint sorted ``b``."""
    if not len(a) or not len(b):
        return np.empty((0, 2))
    return _sweep(np.asarray(a, float), np.asarray(b, float), 3)


def clip(iv: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Intervals cut to [lo, hi); those left empty dropped."""
    if not len(iv):
        return iv
    c = np.clip(iv, lo, hi)
    return c[c[:, 1] > c[:, 0]]


def _before(iv: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each time in ``t``, the length of disjoint sorted ``iv`` before it."""
    s, e = iv[:, 0], iv[:, 1]
    done = np.concatenate([[0.0], np.cumsum(e - s)])  # lengths of the first k intervals
    k = np.searchsorted(s, t, side="right")  # intervals starting at or before t
    last = np.maximum(k - 1, 0)
    partial = np.where(k > 0, np.clip(t - s[last], 0.0, e[last] - s[last]), 0.0)
    return done[last] + partial


def covered(spans, iv: np.ndarray) -> np.ndarray:
    """For each row (start, end) of ``spans``, the length of disjoint sorted ``iv`` inside it."""
    sp = np.asarray(spans, float).reshape(-1, 2)
    if not len(iv) or not len(sp):
        return np.zeros(len(sp))
    iv = np.asarray(iv, float)
    return np.maximum(_before(iv, sp[:, 1]) - _before(iv, sp[:, 0]), 0.0)


def _spans(a) -> np.ndarray:
    return np.asarray(a, float).reshape(-1, 2)


def collective_us(steps, collectives) -> np.ndarray:
    """Collective time per step: for each step span, µs inside at least one collective
    span (on any thread or device; overlapping collectives count once)."""
    c = _spans(collectives)
    return covered(steps, union(c[:, 0], c[:, 1]))


def exposed_comm_us(steps, collectives, compute) -> np.ndarray:
    """Exposed communication per step: for each step span, µs inside a collective span
    and inside no compute span (the collective time that overlapping compute does not
    hide)."""
    c, k = _spans(collectives), _spans(compute)
    return covered(steps, subtract(union(c[:, 0], c[:, 1]), union(k[:, 0], k[:, 1])))
