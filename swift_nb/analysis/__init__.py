"""Analysis layer: pure functions over Run records, returning DataFrames or dataclasses.

``analyze(run)`` runs each of them once over the run's data read once (``RunData``: one
parse of the trace and the intermediates several analyses share; for a job of several
ranks, rank 0's trace, plus every rank's for the collectives and the findings across
ranks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from swift_nb.analysis import ranks as rank_analysis
from swift_nb.analysis.advisor import Thresholds, advise_with_evidence
from swift_nb.analysis.advisor.findings import Finding, Verdict
from swift_nb.analysis.breakdown import device_busy
from swift_nb.analysis.comm import collectives
from swift_nb.analysis.counters import counter_evidence, counter_findings
from swift_nb.analysis.device import device_steps, device_summary, idle_by_cause, kernels_by_kind
from swift_nb.analysis.forecast import Forecast, forecast, measure, parse_forecast_spec
from swift_nb.analysis.kernels import fill_summary, idle_sms_finding
from swift_nb.analysis.memory import memory_timeline
from swift_nb.analysis.module_findings import with_modules
from swift_nb.analysis.modules import block_ops, module_table, slow_block_finding
from swift_nb.analysis.operators import by_memory, compiling_steps, top_operators
from swift_nb.analysis.run_data import run_data
from swift_nb.analysis.stored import load_analysis
from swift_nb.analysis.throughput import Throughput, throughput
from swift_nb.analysis.trace.tables import Trace
from swift_nb.core.errors import ConfigError
from swift_nb.record import Run


@dataclass
class Analysis:
    """Everything the analyses say about one run (see each function for the columns)."""

    breakdown: pd.DataFrame
    device_busy: pd.DataFrame
    footprint: pd.DataFrame
    timeline: pd.DataFrame
    operators_time: pd.DataFrame
    operators_memory: pd.DataFrame
    throughput: Throughput
    verdict: Verdict
    findings: list[Finding]
    per_rank: pd.DataFrame = field(default_factory=pd.DataFrame)  # analysis.ranks.per_rank
    collectives: pd.DataFrame = field(default_factory=pd.DataFrame)  # analysis.comm, every rank
    # analysis.device: the device's time (all absent/empty on a CPU run)
    device: dict = field(default_factory=dict)  # device_summary
    device_steps: pd.DataFrame = field(default_factory=pd.DataFrame)  # device_steps
    kernel_kinds: pd.DataFrame = field(default_factory=pd.DataFrame)  # kernels_by_kind
    idle_causes: pd.DataFrame = field(default_factory=pd.DataFrame)  # idle_by_cause, whole trace
    # analysis.forecast: the "will it fit?" configurations the run asked for (context["forecast"])
    forecasts: list[Forecast] = field(default_factory=list)
    forecast_problem: str | None = None  # why they could not be made
    modules: pd.DataFrame = field(default_factory=pd.DataFrame)  # analysis.modules, by module


def forecasts_of(run: Run, trace: Trace | None = None) -> tuple[list[Forecast], str | None]:
    """The forecasts ``run.context["forecast"]`` asks for, from one measurement of the run;
    ([], why) when they cannot be made (e.g. no memory was recorded)."""
    specs = run.context.get("forecast") or []
    if not specs:
        return [], None
    try:
        measured = measure(run, trace)
        return [forecast(measured, **parse_forecast_spec(spec)) for spec in specs], None
    except ConfigError as e:
        return [], str(e)


def analyze(
    run: Run,
    thresholds: Thresholds | None = None,
    top_n: int = 15,
    trace: Trace | None = None,
    ranks: dict[int, rank_analysis.RankAnalysis] | None = None,
) -> Analysis:
    """All analyses of ``run``, each once, over its data read once (``run_data``);
    ``trace`` saves reading the trace file when the caller already holds it; ``ranks``,
    for a job, the other ranks' analyses made already (``analysis.ranks.analyze_rank``,
    with default thresholds: used only when ``thresholds`` is None)."""
    data = run_data(run, trace)
    trace = data.trace
    evidence, verdict, findings = advise_with_evidence(run, thresholds=thresholds, data=data)
    # the steps that compiled are left out: their tracing and code generation is not the loop's work
    ops = top_operators(
        None, by="self_time", n=None, trace=trace, nesting=data.nesting, skip_steps=compiling_steps(run)
    )
    per_rank = rank_analysis.per_rank(run)
    if rank_analysis.is_job(run):
        own = rank_analysis.RankAnalysis(
            data.rank,
            findings,
            {rule: float(share(evidence)) for rule, share in rank_analysis.SHARE_OF_STEP.items()},
            data.collectives,
        )
        analyzed = rank_analysis.analyze_ranks(run, own, thresholds, ranks)
        comm = rank_analysis.job_collectives(analyzed)
        findings = rank_analysis.findings_across_ranks(run, analyzed)
        for across in (
            rank_analysis.straggler_finding(per_rank, comm),
            rank_analysis.idle_rank_finding(per_rank),
        ):
            if across is not None:
                findings.append(across)
    elif data.world_size == 1:
        comm = data.collectives
    else:  # a rank's own record: its collectives as a single process's
        comm = collectives(trace, 1, data.rank)
    work = data.device_work
    forecasts, forecast_problem = forecasts_of(run, trace)
    modules = module_table(trace, run.context.get("modules") or [], evidence.peak_bytes)
    slow = slow_block_finding(modules, block_ops(trace, modules)) if len(modules) else None
    if slow is not None:
        findings.append(slow)
    findings = with_modules(findings, modules)
    device = {**device_summary(trace, work=work), **fill_summary(trace)}
    idle_sms = idle_sms_finding(trace, device)
    if idle_sms is not None:
        findings.append(idle_sms)
    findings += counter_findings(run.summary, device, findings)
    verdict.evidence.update(counter_evidence(run.summary))
    return Analysis(
        forecasts=forecasts,
        forecast_problem=forecast_problem,
        breakdown=data.breakdown,
        device_busy=device_busy(run, trace),
        footprint=data.footprint,
        timeline=memory_timeline(run),
        operators_time=ops.head(top_n).reset_index(drop=True),
        operators_memory=by_memory(ops).head(top_n).reset_index(drop=True),
        throughput=throughput(run, trace, data.traced_batch_and_seq),
        verdict=verdict,
        findings=findings,
        per_rank=per_rank,
        collectives=comm,
        device=device,
        device_steps=device_steps(trace, work=work),
        kernel_kinds=kernels_by_kind(trace, work=work),
        idle_causes=idle_by_cause(trace, work=work),
        modules=modules,
    )


def analysis_of(run: Run) -> Analysis:
    """``run``'s analysis: the one kept beside it (``analysis.stored``) while nothing it read
    has changed, else ``analyze(run)``."""
    kept = load_analysis(run, Analysis)
    return kept.analysis if kept is not None else analyze(run)


__all__ = ["Analysis", "Finding", "Thresholds", "Verdict", "analysis_of", "analyze"]
