"""Across the ranks of a job record: each rank's numbers, stragglers, and which findings
hold on which ranks.

A job record (see ``swift_nb.record``) keeps one row per rank in ``ranks.csv`` and each
rank's own record in ``rank<R>/``; ``per_rank`` reads the first, the advisor runs on each
of the others and the findings are merged by rule, each saying the ranks it holds on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from swift_nb.analysis.advisor import Thresholds, advise_with_evidence
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.comm import COLUMNS, collectives, comm_per_step
from swift_nb.analysis.device import _shares, _step_windows, device_work
from swift_nb.analysis.trace.tables import Trace, load_trace_file
from swift_nb.core.errors import RecordError
from swift_nb.core.units import fmt_ranks
from swift_nb.record import RUN_FILE, Run, load_run, rank_folder

STRAGGLER_EXCESS = 0.15  # a rank this much busier per step than the ranks' median straggles …
STRAGGLER_MIN_STEP_SHARE = 0.20  # … when the excess is also this share of the median step
_NUMERIC = (
    "steps",
    "step_time_median_s",
    "peak_mem_bytes",
    "collective_s_per_step",
    "collective_share",
    "device_idle_pct",
)
IDLE_RANK_EXCESS_PCT = 15.0  # a rank whose GPU idles this many points more than the median's
# ranks.csv of records written before the collective columns had their present names
_OLD_NAMES = {"comm_s_per_step": "collective_s_per_step", "comm_share": "collective_share"}


def is_job(run: Run) -> bool:
    """Whether ``run`` is the record of a job of several ranks."""
    return len(run.ranks) > 0


def per_rank(run: Run) -> pd.DataFrame:
    """One row per rank (one row for a single process): ``rank``, ``local_rank``,
    ``node_rank``, ``host``, ``device``, ``status``, ``steps``, ``step_time_median_s``,
    ``peak_mem_bytes``, ``collective_s_per_step`` (collective time per recorded step, s),
    ``collective_share`` (its part of the step, 0..1), ``busy_s`` (median step time
    outside collectives) and ``straggler``: ``busy_s`` at least ``STRAGGLER_EXCESS`` above
    the ranks' median, and by at least ``STRAGGLER_MIN_STEP_SHARE`` of the median step
    (jitter on a busy machine, or in steps that are nearly all communication, is no
    straggler). Collectives make every rank's step as long as the slowest one's, so a slow
    rank shows up as the one that waits least in them, i.e. the busiest."""
    if is_job(run):
        df = run.ranks.rename(columns=_OLD_NAMES)
        if "device_idle_pct" not in df:  # records made before the column
            df["device_idle_pct"] = np.nan
    else:
        s, env = run.summary, run.environment
        traced = 0.0 if "trace" in run.files else None  # a single process has no collectives
        row = {
            "rank": env.get("rank", 0),
            "local_rank": env.get("local_rank", env.get("rank", 0)),
            "node_rank": env.get("node_rank", 0),
            "host": run.host,
            "device": env.get("rank_device", env.get("device")),
            "status": run.status,
            "steps": s.get("steps"),
            "step_time_median_s": s.get("step_time_median_s"),
            "peak_mem_bytes": s.get("peak_mem_bytes"),
            "collective_s_per_step": s.get("collective_s_per_step", traced),
            "collective_share": s.get("collective_share", traced),
            "device_idle_pct": s.get("device_idle_pct"),
        }
        df = pd.DataFrame([row])
    for col in _NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    step = df["step_time_median_s"]
    df["busy_s"] = step * (1.0 - df["collective_share"].fillna(0.0))
    present = df["busy_s"].dropna()
    ref = float(present.median()) if len(present) >= 2 else float("nan")
    margin = max(STRAGGLER_EXCESS * ref, STRAGGLER_MIN_STEP_SHARE * float(step.median()))
    df["straggler"] = (df["busy_s"] >= ref + margin).fillna(False).astype(bool)
    return df.reset_index(drop=True)


RANK_STEP_COLUMNS = ["rank", "step", "step_s", "exposed_comm_s", "device_idle_pct"]


def rank_step_metrics(run: Run) -> pd.DataFrame:
    """One row per rank and profiled step of a job (``RANK_STEP_COLUMNS``): the step's
    time (s, the profiler's step span), its exposed communication (s inside a collective
    and outside any compute, ``comm.comm_per_step``) and its GPU idle time (% of the
    step's device window, ``device.device_steps``' idle_pct; NaN without device work). Each
    rank's tables are read, reduced to its rows and let go before the next rank's, so
    memory does not grow with the number of ranks. A rank whose trace is missing or
    damaged has no rows."""
    frames = []
    for rank, path in sorted(run.rank_trace_paths().items()):
        try:
            trace = load_trace_file(path)
        except (OSError, RecordError):
            continue
        comm = comm_per_step(trace)[["step", "step_s", "exposed_comm_s"]]
        # device_steps' idle_pct without its idle causes, which cost ten times as much
        work = device_work(trace)
        steps, windows = _step_windows(work)
        if len(steps):
            idle = pd.DataFrame(
                {"step": steps, "device_idle_pct": _shares(windows, work)["idle_pct"].to_numpy()}
            )
            comm = comm.merge(idle, on="step", how="left")
        else:
            comm = comm.assign(device_idle_pct=np.nan)
        frames.append(comm.assign(rank=rank))
        del trace
    if not frames:
        return pd.DataFrame(columns=RANK_STEP_COLUMNS)
    out = pd.concat(frames, ignore_index=True)[RANK_STEP_COLUMNS]
    return out.astype(
        {"rank": int, "step": int, "step_s": float, "exposed_comm_s": float, "device_idle_pct": float}
    )


STRAGGLER_COLUMNS = [
    "rank",
    "step_time_s",
    "work_s",
    "work_over_median_pct",
    "step_over_median_pct",
    "collective_pct",
    "device_idle_pct",
    "straggler",
]


def slowest_ranks(per_rank: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The ``n`` ranks with the most work per step (``busy_s`` of ``per_rank``: the step
    outside collectives), slowest first, with how much more than the ranks' median
    (``STRAGGLER_COLUMNS``; times in s, excesses and shares in %): collectives make every
    rank's step as long as the slowest one's, so the busiest rank is the one the others
    wait for."""
    if per_rank is None or per_rank.empty:
        return pd.DataFrame(columns=STRAGGLER_COLUMNS)
    busy = pd.to_numeric(per_rank["busy_s"], errors="coerce")
    step = pd.to_numeric(per_rank["step_time_median_s"], errors="coerce")
    med_busy, med_step = float(busy.median()), float(step.median())
    out = pd.DataFrame(
        {
            "rank": per_rank["rank"].astype(int),
            "step_time_s": step,
            "work_s": busy,
            "work_over_median_pct": 100.0 * (busy / med_busy - 1.0) if med_busy > 0 else np.nan,
            "step_over_median_pct": 100.0 * (step / med_step - 1.0) if med_step > 0 else np.nan,
            "collective_pct": 100.0 * pd.to_numeric(per_rank["collective_share"], errors="coerce"),
            "device_idle_pct": pd.to_numeric(per_rank.get("device_idle_pct"), errors="coerce"),
            "straggler": per_rank["straggler"].astype(bool),
        },
        columns=STRAGGLER_COLUMNS,
    )
    return (
        out.sort_values(["work_s", "rank"], ascending=[False, True], na_position="last")
        .head(n)
        .reset_index(drop=True)
    )


def rank_records(run: Run) -> dict[int, Run]:
    """The ranks' own records found in the job folder (rank → Run)."""
    out: dict[int, Run] = {}
    if run.path is None:
        return out
    for rank in pd.to_numeric(run.ranks.get("rank", pd.Series(dtype=float)), errors="coerce").dropna():
        folder = rank_folder(Path(run.path), int(rank))
        if (folder / RUN_FILE).exists():
            try:
                out[int(rank)] = load_run(folder)
            except (OSError, ValueError):
                continue
    return out


# rule id → the part of the step its threshold applies to
SHARE_OF_STEP = {
    "data_loading": lambda ev: ev.shares["data"],
    "communication": lambda ev: ev.exposed_comm_share,
}


@dataclass
class RankAnalysis:
    """What a job's analysis needs of one rank, from that rank's own trace: its findings
    (None when its advisor could not run), the share of its step each rule of
    ``SHARE_OF_STEP`` reads (0..1), and its collectives (``comm.collectives``). Small and
    picklable: the importer's workers make it while they hold the rank's tables."""

    rank: int
    findings: list[Finding] | None
    shares: dict[str, float]
    collectives: pd.DataFrame


def analyze_rank(
    record: Run | None, trace: Trace, rank: int, world: int, thresholds: Thresholds | None = None
) -> RankAnalysis:
    """``RankAnalysis`` of one rank: ``record`` its own record (None: no findings), ``trace``
    its tables."""
    found, shares = None, {}
    if record is not None:
        try:
            ev, _, found = advise_with_evidence(record, trace=trace, thresholds=thresholds)
            shares = {rule: float(share(ev)) for rule, share in SHARE_OF_STEP.items()}
        except Exception:  # one rank's unreadable trace must not hide the others' findings
            found = None
    return RankAnalysis(rank, found, shares, collectives(trace, world, rank))


def analyze_ranks(
    run: Run,
    rank0: RankAnalysis,
    thresholds: Thresholds | None = None,
    given: dict[int, RankAnalysis] | None = None,
) -> dict[int, RankAnalysis]:
    """Every rank's ``RankAnalysis`` in a job folder: ``rank0`` the analyzed rank's own
    (the job's view), ``given`` those made already (the importer's, with default
    thresholds); each other rank's trace is read once, analyzed and let go before the
    next, so memory does not grow with the ranks."""
    world = int(run.context.get("world_size") or run.environment.get("world_size") or 1)
    records = rank_records(run)
    out = {rank0.rank: rank0}
    for rank, path in run.rank_trace_paths().items():
        if rank in out:
            continue
        if given is not None and rank in given and thresholds is None:
            out[rank] = given[rank]
            continue
        trace = load_trace_file(path)
        out[rank] = analyze_rank(records.get(rank), trace, rank, world, thresholds)
        del trace
    return dict(sorted(out.items()))


def job_collectives(analyzed: dict[int, RankAnalysis]) -> pd.DataFrame:
    """Every rank's collectives, one table (``comm.COLUMNS``)."""
    frames = [a.collectives for a in analyzed.values() if not a.collectives.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)


def findings_across_ranks(run: Run, analyzed: dict[int, RankAnalysis]) -> list[Finding]:
    """The ranks' findings merged by rule id: each says on which ranks it holds
    (``evidence["ranks"]`` and a title suffix), the lowest rank's numbers kept; a rule
    about a share of the step also gets every rank's share (``evidence["per_rank_pct"]``)
    and says how high it is where the rule does not fire."""
    world = int(run.context.get("world_size") or len(run.ranks))  # a job imported in part has fewer rows
    by_rank = {r: a.findings for r, a in analyzed.items() if a.findings is not None}
    merged: dict[str, tuple[Finding, list[int]]] = {}
    for rank in sorted(by_rank):
        for f in by_rank[rank]:
            merged.setdefault(f.id, (f, []))[1].append(rank)
    statuses = dict(zip(run.ranks["rank"], run.ranks["status"], strict=True))
    unread = [int(r) for r in run.ranks["rank"] if int(r) not in by_rank and statuses.get(r) != "missing"]
    out = []
    for f, holds in merged.values():
        extra: dict[str, list[int] | dict[str, float]] = {"ranks": holds}
        others = [r for r in sorted(by_rank) if r not in holds]
        where = fmt_ranks(holds, world)
        if f.id in SHARE_OF_STEP:
            pct = {
                r: round(100.0 * by_share[f.id], 1)
                for r, a in analyzed.items()
                if f.id in (by_share := a.shares)
            }
            extra["per_rank_pct"] = {str(r): v for r, v in sorted(pct.items())}
            rest = [pct[r] for r in others if r in pct]
            if rest:
                where += f"; others ≤ {max(rest):g} %"
        elif others:
            where += f"; not on {fmt_ranks(others, world)}"
        if unread:
            where += f"; {fmt_ranks(unread, world)} not analyzed (no record in this folder)"
        out.append(replace(f, title=f"{f.title} ({where})", evidence={**f.evidence, **extra}))
    return out


def straggler_finding(per_rank: pd.DataFrame, collectives: pd.DataFrame | None = None) -> Finding | None:
    """A rank flagged ``straggler`` by ``per_rank`` (its time outside collectives well
    above the ranks' median): the others wait for it inside their collectives."""
    if per_rank.empty or not per_rank["straggler"].any():
        return None
    slow = [int(r) for r in per_rank.loc[per_rank["straggler"], "rank"]]
    fast = per_rank[~per_rank["straggler"] & per_rank["busy_s"].notna()]
    median_busy = float(per_rank["busy_s"].median())
    worst = per_rank.loc[per_rank["busy_s"].idxmax()]
    ranks, comm = per_rank["rank"], per_rank["collective_s_per_step"]
    waits = {str(int(r)): round(float(c), 6) for r, c in zip(ranks, comm, strict=True) if not math.isnan(c)}
    world = len(per_rank)
    return Finding(
        id="straggler",
        title=(
            f"{fmt_ranks(slow, world).capitalize()} {'is' if len(slow) == 1 else 'are'} slower than the others: "
            f"{float(worst['busy_s']):.4f} s of work per step against a median of {median_busy:.4f} s"
        ),
        evidence={
            "straggler_ranks": slow,
            "busy_s_per_step": {
                str(int(r)): round(float(b), 6) for r, b in zip(ranks, per_rank["busy_s"], strict=True)
            },
            "comm_wait_s_per_step": waits,
            "waiting_ranks": [int(r) for r in fast["rank"]],
            "excess_pct": round(100.0 * (float(worst["busy_s"]) / median_busy - 1.0), 1)
            if median_busy
            else None,
        },
        suggestion=(
            "The other ranks wait for it inside their collectives. Look at what differs on that rank: its "
            "data loading (uneven shards, a slower disk), a throttled or shared device or CPU, extra work "
            "only it does (logging, checkpointing, evaluation on rank 0), or a larger batch."
        ),
        predicted_effect=(
            f"every rank's step ≈ {median_busy:.4f} s of work plus communication once the slow rank matches the median"
        ),
        formula=(
            f"straggler: busy − median busy ≥ max({STRAGGLER_EXCESS:g} × median busy, "
            f"{STRAGGLER_MIN_STEP_SHARE:g} × median step); busy = step time × (1 − collective_share)"
        ),
        severity="warning",
    )


def idle_rank_finding(per_rank: pd.DataFrame) -> Finding | None:
    """A rank whose GPU idles ``IDLE_RANK_EXCESS_PCT`` points or more above the ranks'
    median (``device_idle_pct``): it waits on something the others do not (its data, its
    host, a slow link), and every collective then waits on it."""
    idle = pd.to_numeric(per_rank.get("device_idle_pct"), errors="coerce").dropna() if len(per_rank) else None
    if idle is None or len(idle) < 2:
        return None
    median = float(idle.median())
    worst = int(idle.idxmax())
    excess = float(idle.loc[worst]) - median
    if excess < IDLE_RANK_EXCESS_PCT:
        return None
    rank = int(per_rank.loc[worst, "rank"])
    return Finding(
        id="idle_rank",
        title=f"Rank {rank}'s GPU idles {excess:.1f} points more than the ranks' median",
        evidence={
            "rank": rank,
            "device_idle_pct": round(float(idle.loc[worst]), 1),
            "median_device_idle_pct": round(median, 1),
            "ranks": len(idle),
        },
        suggestion=(
            f"Look at rank {rank} on its own (its folder in this job, or its report): a host that loads data "
            "slower, more CPU work per step, a slower link or device. The other ranks wait for it in every "
            "collective."
        ),
        predicted_effect=f"the ranks' steps shorten by up to rank {rank}'s extra idle time once it keeps up",
        formula="t_step' ≈ t_step − (idle_rank − idle_median) × window: collectives wait for the slowest rank",
    )
