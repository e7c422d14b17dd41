"""Runs side by side: the variants of a ``--compare`` against their baseline (``variants``),
and what changed between any two runs (``run_diff``)."""
