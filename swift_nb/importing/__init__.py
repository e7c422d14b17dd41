"""torch.profiler traces recorded anywhere, read as a run (``swift_nb.import_trace``): the trace
files (``files``), one rank's record (``rank``), the worker pool that reads a job's ranks
(``pool``), and the job's run folder assembled from them (``assembly``)."""
