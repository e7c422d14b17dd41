"""Memory as the training holds it: its categories replayed from the profiler's allocations
(``categories``), what optimizers and frozen models hold at each recorded step's edges
(``snapshots``), and the post-mortem of an out-of-memory error (``oom``)."""
