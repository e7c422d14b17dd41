"""What the analyses of one run share, read and derived once.

``analyze`` reads the run's trace tables once and derives from them, once, the
intermediates several analyses read (as HolisticTraceAnalysis's analyzers share one parsed
trace); each analysis is then handed the pieces it reads. The trace-level pieces go
through ``trace.derived``, so each is computed once per trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from swift_nb.analysis.breakdown import trace_breakdown
from swift_nb.analysis.comm import collectives, comm_per_step
from swift_nb.analysis.device import device_work
from swift_nb.analysis.memory import memory_footprint
from swift_nb.analysis.operators import Nesting, op_nesting
from swift_nb.analysis.throughput import batch_and_seq
from swift_nb.analysis.trace.tables import Trace, cat_in, load_trace
from swift_nb.record import Run


@dataclass(frozen=True)
class RunData:
    """One run's trace and what the analyses derive from it and from the record, each
    derived once (``run_data``). Shared by the analyses: none may change what it holds.

    trace: the trace's tables (rank 0's for a job);
    breakdown: ``breakdown.trace_breakdown`` of it;
    nesting: the profiled steps' operators and how they nest (``operators.op_nesting``);
    cpu_ops: the profiled steps' ``cpu_op`` events (rows of ``trace.events``, its index);
    cpu_op_self_us: each one's self time (µs), indexed like ``cpu_ops``;
    footprint: ``memory.memory_footprint`` of the record;
    comm_per_step: ``comm.comm_per_step``, collective and exposed communication per step;
    collectives: ``comm.collectives`` of this process at ``world_size`` and ``rank``;
    traced_batch_and_seq: ``throughput.batch_and_seq`` of the trace's events (what its
    input shapes show, before the run's context overrides it);
    world_size: the processes of the job (context, then environment; 1 when neither says);
    rank: this process's (environment; 0 when it does not say);
    device_work: ``device.device_work`` of the trace (empty on a CPU run), read by the
    advisor's device-first verdict and by the device analyses.
    """

    trace: Trace
    breakdown: pd.DataFrame
    nesting: Nesting
    cpu_ops: pd.DataFrame
    cpu_op_self_us: pd.Series
    footprint: pd.DataFrame
    comm_per_step: pd.DataFrame
    collectives: pd.DataFrame
    traced_batch_and_seq: tuple[int | None, int | None]
    world_size: int
    rank: int
    device_work: pd.DataFrame


def run_data(run: Run, trace: Trace | None = None, breakdown: pd.DataFrame | None = None) -> RunData:
    """``run``'s shared data; ``trace`` (and ``breakdown``, its ``trace_breakdown``) when the
    caller holds it saves reading (deriving) it again."""
    trace = trace if trace is not None else load_trace(run)
    events = trace.events
    nesting = op_nesting(events)
    cpu_ops = events[(cat_in(events, "cpu_op")) & (events["step"] >= 0)]
    world = int(run.context.get("world_size") or run.environment.get("world_size") or 1)
    rank = int(run.environment.get("rank", 0))
    return RunData(
        trace=trace,
        breakdown=breakdown if breakdown is not None else trace_breakdown(trace),
        nesting=nesting,
        cpu_ops=cpu_ops,
        cpu_op_self_us=nesting.self_times_us().reindex(cpu_ops.index),
        footprint=memory_footprint(run),
        comm_per_step=comm_per_step(trace),
        collectives=collectives(trace, world, rank),
        traced_batch_and_seq=batch_and_seq(events),
        world_size=world,
        rank=rank,
        device_work=device_work(trace),
    )
