"""Python's cyclic garbage collector, paused while a trace is decoded and while a finished
run is analysed and reported.

Decoding a trace makes millions of small dicts and lists at once. Each allocation counts
towards the collector's next pass, and every pass walks all the objects made so far: a
50 MB trace decodes 2.5× slower with the collector on (``benchmarks/cost.py``). None of
those objects forms a cycle, so nothing is lost by pausing it meanwhile. The analysis
after the loop is short, but its passes walk the whole heap of a process that has trained
(and analysed a run before): 0.2 s of a later run's 0.5 s from the last step to its
results (``benchmarks/script_start.py``).

The pause is process-wide (the collector has no per-thread switch) and counted: it ends
when the last of the threads that paused it leaves, and never turns the collector on when
the program had turned it off itself.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0
_was_enabled = False


@contextmanager
def paused() -> Iterator[None]:
    """The collector off for the block (and back to how it was after the last such block)."""
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
