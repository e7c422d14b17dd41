"""What a measured job of several ranks did, in the terms ``scale()`` forecasts: its layout,
its median step, its communication and exposed communication per step."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from swift_nb.analysis.comm import collectives, comm_per_step
from swift_nb.analysis.ranks import is_job, per_rank
from swift_nb.analysis.trace.tables import load_trace_file
from swift_nb.core.errors import ConfigError
from swift_nb.record import Run

_FSDP_KINDS = ("all_gather", "reduce_scatter", "_allgather_base", "_reduce_scatter_base")


@dataclass(frozen=True)
class Job:
    """A measured job: ``world_size``, ``layout`` (``ddp`` when its collectives are
    all-reduces, ``fsdp`` when it gathers parameters or scatters gradients), ``step_s`` (the
    ranks' median step, unrecorded steps), ``comm_s`` and ``exposed_comm_s`` (per recorded
    step, the median over the ranks' recorded steps: the profiler lengthens the compute
    between collectives, not the collectives)."""

    world_size: int
    layout: str
    step_s: float
    comm_s: float
    exposed_comm_s: float
    collectives: pd.DataFrame = field(default_factory=pd.DataFrame)  # rank 0's, ``comm.collectives``
    ranks: pd.DataFrame = field(default_factory=pd.DataFrame)  # ``ranks.per_rank``


def job_of(run: Run) -> Job:
    """The measured terms of a job record; a ``ConfigError`` when it is none or has no rank
    traces (a ``RecordError`` where one cannot be read)."""
    if not is_job(run):
        raise ConfigError(
            "measured", "give the record of a job of several ranks (its rank 0's folder)", run.id
        )
    ranks = per_rank(run)
    step = float(pd.to_numeric(ranks["step_time_median_s"], errors="coerce").median())
    paths = run.rank_trace_paths()
    if not paths:
        raise ConfigError("measured", "the job recorded no rank traces: its communication is unknown", run.id)
    per_step, first = [], pd.DataFrame()
    for rank, path in sorted(paths.items()):
        trace = load_trace_file(path)
        per_step.append(comm_per_step(trace))
        if rank == min(paths):
            first = collectives(trace, world=len(ranks), rank=rank)
    kinds = set(first["kind"].astype(str)) if len(first) else set()
    steps = pd.concat(per_step, ignore_index=True)
    layout = "fsdp" if any(k in _FSDP_KINDS for k in kinds) else "ddp"
    return Job(
        world_size=len(ranks),
        layout=layout,
        step_s=step,
        comm_s=float(np.median(steps["collective_s"])),
        exposed_comm_s=float(np.median(steps["exposed_comm_s"])),
        collectives=first,
        ranks=ranks,
    )
