"""The record of a distributed job: every rank's part merged into one Run.

All ranks use one job folder (agreed on in ``swift_nb.capture.dist``)::

    <root>/<job id>/run.json, steps.csv, …      the job record (rank 0 writes it)
    <root>/<job id>/ranks.csv                   one row per rank
    <root>/<job id>/trace.rank<R>.json.gz       each rank's trace, side by side
    <root>/<job id>/rank<R>/run.json, …         each rank's own (partial) record

At the end every rank first saves its partial record, then sends rank 0 its ``payload``
(its row of ranks.csv, steps, decimated samples, notes, layout); rank 0 builds the job
record from what arrived (``build_job``). When the group could not be formed or the
gather failed, rank 0 merges what the partial records on disk hold
(``collect_from_disk``) and the job's notes name the ranks that never arrived.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from swift_nb.capture.dist import RankInfo
from swift_nb.core import intervals
from swift_nb.core import trace_names as tn
from swift_nb.core.units import fmt_ranks
from swift_nb.record import (
    RANK_SAMPLES_FILE,
    RANK_STEPS_FILE,
    RANKS_FILE,
    RUN_FILE,
    Run,
    load_run,
    rank_folder,
    rank_trace_file,
    read_back,
)
from swift_nb.record.write import energy_summary

MAX_SENT_SAMPLES = 1000  # samples per rank sent to rank 0 (decimated evenly)

# ranks.csv: one row per rank of the job.
#   rank, local_rank, node_rank (torchrun's GROUP_RANK), host, device, pid;
#   status: ok|failed|interrupted|running (never finished)|missing (nothing arrived);
#   source: self (rank 0) | gather (sent to rank 0) | disk (read from its partial record)
#     | missing;
#   steps, step_time_median_s, step_time_p90_s, peak_mem_bytes, peak_rss_bytes;
#   collective_s_per_step: collective time per recorded step (s inside at least one
#     collective, any thread or device; ``trace_names.collective_us``);
#   collective_share: collective_s_per_step / the recorded steps' mean duration (0..1);
#   trace: the rank's trace file in the job folder; record: its partial record folder;
#   error: the traceback that ended the rank's profile, if one did;
#   started_at: when the rank's profile started (ISO, UTC): its steps' clock starts there.
RANK_COLUMNS = [
    "rank",
    "local_rank",
    "node_rank",
    "host",
    "device",
    "pid",
    "status",
    "source",
    "steps",
    "step_time_median_s",
    "step_time_p90_s",
    "peak_mem_bytes",
    "peak_rss_bytes",
    "collective_s_per_step",
    "collective_share",
    "device_idle_pct",  # % of the GPU's window (imported GPU jobs; a capture has none yet)
    "trace",
    "record",
    "error",
    "started_at",
]


# -- what a rank measures about itself --------------------------------------------------


def collective_summary(events: list[dict]) -> tuple[float, float]:
    """(collective seconds per recorded step, their share of the recorded steps' duration)
    from a trace's events (``trace_names.collective_us``); (nan, nan) without steps."""
    xs = [e for e in events if e.get("ph") == "X"]
    names = [e.get("name", "") for e in xs]
    spans = np.array([(e["ts"], e["ts"] + e.get("dur", 0.0)) for e in xs], dtype=float).reshape(-1, 2)
    is_step = np.fromiter((tn.step_of(n) is not None for n in names), bool, len(names))
    steps = spans[is_step]
    if not len(steps):
        return float("nan"), float("nan")
    named = {n: tn.is_collective(n) for n in set(names)}
    is_coll = tn.collective_mask(
        np.array([named[n] for n in names], dtype=bool), [e.get("cat", "") for e in xs]
    )
    coll_us = intervals.collective_us(steps, spans[is_coll])
    total_us = float((steps[:, 1] - steps[:, 0]).sum())
    share = float(coll_us.sum()) / total_us if total_us > 0 else float("nan")
    return float(coll_us.mean()) / 1e6, share


def wrappers(events: list[dict]) -> list[str]:
    """The data-parallel wrappers whose spans a rank's trace holds (``DDP``, ``FSDP``)."""
    names = {e.get("name", "") for e in events if e.get("ph") == "X"}
    found = []
    if any(n.startswith(tn.DDP_PREFIX) for n in names):
        found.append("DDP")
    if any(n.startswith(tn.FSDP_PREFIX) for n in names):
        found.append("FSDP")
    return found


def parallel_layout(traced: list[str], optimizers, info: RankInfo) -> dict[str, Any]:
    """The data-parallel wrappers seen in this rank's trace (``traced``, see ``wrappers``)
    and parameters, and group sizes: ``{"parallel": ["DDP"], "dp_size": 4, …}``."""
    kinds = [k for k in traced if k == "DDP"]
    mesh: dict[str, int] = {}
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                dm = getattr(p, "device_mesh", None)
                if dm is not None:
                    dim_names = dm.mesh_dim_names or tuple(f"dim{i}" for i in range(dm.ndim))
                    mesh = dict(zip(dim_names, (int(s) for s in dm.shape), strict=False))
                    break
    if mesh or "FSDP" in traced:
        kinds.append("FSDP")
    layout: dict[str, Any] = {"parallel": kinds or ["unknown"], "dp_size": info.world_size}
    if mesh:
        layout["mesh"] = mesh
    return layout


# -- what rank 0 receives -----------------------------------------------------------------


def rank_row(run: Run, info: RankInfo, source: str) -> dict[str, Any]:
    """This rank's row of ranks.csv, from its partial record."""
    s = run.summary
    return {
        "rank": info.rank,
        "local_rank": info.local_rank,
        "node_rank": info.node_rank,
        "host": info.host,
        "device": info.device,
        "pid": run.pid,
        "status": run.status,
        "source": source,
        "steps": s.get("steps"),
        "step_time_median_s": s.get("step_time_median_s"),
        "step_time_p90_s": s.get("step_time_p90_s"),
        "peak_mem_bytes": s.get("peak_mem_bytes"),
        "peak_rss_bytes": s.get("peak_rss_bytes"),
        "collective_s_per_step": s.get("collective_s_per_step"),
        "collective_share": s.get("collective_share"),
        "trace": rank_trace_file(info.rank) if "trace" in run.files else "",
        "record": str(run.path),
        "error": s.get("traceback", ""),
        "started_at": run.started_at,
    }


def payload(run: Run, info: RankInfo) -> dict[str, Any]:
    """What a rank sends to rank 0: its row, steps, samples (at most MAX_SENT_SAMPLES,
    evenly decimated), notes and layout."""
    samples = run.samples
    if len(samples) > MAX_SENT_SAMPLES:
        samples = samples.iloc[:: -(-len(samples) // MAX_SENT_SAMPLES)]
    return {
        "row": rank_row(run, info, "gather"),
        "steps": run.steps,
        "samples": samples.reset_index(drop=True),
        "notes": list(run.notes),
        "layout": run.context.get("layout"),
        "oom": run.oom,
    }


def _from_disk(job: Path, rank: int) -> dict[str, Any] | None:
    folder = rank_folder(job, rank)
    if not (folder / RUN_FILE).exists():
        return None
    try:
        run = load_run(folder)
    except (OSError, ValueError):
        return None
    env = run.environment
    info = RankInfo(
        rank=rank,
        world_size=int(env.get("world_size", 0)),
        local_rank=int(env.get("local_rank", rank)),
        local_world_size=int(env.get("local_world_size", 0)),
        node_rank=int(env.get("node_rank", 0)),
        host=run.host,
        device=str(env.get("rank_device", "")),
        initialized=False,
    )
    part = payload(run, info)
    part["row"]["source"] = "disk"
    return part


def collect_from_disk(job: Path, ranks: list[int], deadline: float) -> dict[int, dict[str, Any]]:
    """Partial records of ``ranks`` found in the job folder; waits (until ``deadline``, a
    ``time.monotonic()`` value) for those still missing or still running."""
    found: dict[int, dict[str, Any]] = {}
    while True:
        for r in ranks:
            if r not in found or found[r]["row"]["status"] == "running":
                part = _from_disk(job, r)
                if part is not None:
                    found[r] = part
        pending = [r for r in ranks if r not in found or found[r]["row"]["status"] == "running"]
        if not pending or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


def _worst(statuses: list[str]) -> str:
    for s in ("oom", "failed", "interrupted"):  # a rank out of memory is why the others failed
        if s in statuses:
            return s
    return "ok"


def _group_notes(parts: dict[int, dict[str, Any]], known: list[str]) -> list[str]:
    """Notes of the other ranks not in ``known`` (rank 0's), each once, with the ranks
    it holds on."""
    by_note: dict[str, list[int]] = {}
    for r, part in sorted(parts.items()):
        for n in part["notes"]:
            if n in known:
                continue
            by_note.setdefault(n, []).append(r)
    return [f"{fmt_ranks(rs)}: {n}" for n, rs in by_note.items()]


def job_energy(parts: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The job's ``energy_j``, ``avg_power_w`` and ``energy_per_step_j``: each rank's GPU
    (a rank samples its own device) summed over the ranks that measured some, with
    ``energy_ranks`` their number; empty when fewer than two did (rank 0's are the job's)."""
    found = [energy_summary(p["steps"], p["samples"]) for _, p in sorted(parts.items())]
    found = [e for e in found if "energy_j" in e]
    if len(found) < 2:
        return {}
    out: dict[str, Any] = {"energy_ranks": len(found)}
    for key in ("energy_j", "avg_power_w", "energy_per_step_j"):
        if all(key in e for e in found):
            out[key] = float(sum(e[key] for e in found))
    return out


def build_job(run0: Run, job: Path, parts: dict[int, dict[str, Any]], world: int, notes: list[str]) -> Run:
    """The job record from rank 0's partial record and every part that arrived."""
    job_run = Run(
        id=run0.id,
        label=run0.label,
        started_at=run0.started_at,
        wall_s=run0.wall_s,
        source=dict(run0.source),
        environment=dict(run0.environment),
        context=dict(run0.context),
        schedule=dict(run0.schedule),
        summary=dict(run0.summary),
        notes=list(run0.notes),
        files={k: v for k, v in run0.files.items() if k not in ("trace", "report")},
        pid=run0.pid,
        host=run0.host,
    )
    job_run.steps, job_run.samples, job_run.memory = run0.steps, run0.samples, run0.memory
    job_run.path = job
    rows = []
    for r in range(world):
        part = parts.get(r)
        if part is None:
            rows.append({**dict.fromkeys(RANK_COLUMNS), "rank": r, "status": "missing", "source": "missing"})
        else:
            rows.append(part["row"])
    ranks = pd.DataFrame(rows, columns=RANK_COLUMNS)
    for r, row in enumerate(rows):
        if row["trace"] and (job / row["trace"]).exists():
            job_run.files["trace" if r == 0 else f"trace_rank{r}"] = row["trace"]
        elif row["status"] != "missing" and r in parts and parts[r]["row"]["trace"]:
            notes.append(
                f"rank {r}'s trace is not in this folder: it is on host {row['host']} at "
                f"{Path(row['record']).parent / row['trace']} (its own record beside it)"
            )
    job_run.ranks = read_back(ranks, RANKS_FILE)  # as a reopened folder reads it
    frames = [p["steps"].assign(rank=r) for r, p in sorted(parts.items()) if len(p["steps"])]
    job_run.rank_steps = (
        read_back(pd.concat(frames, ignore_index=True), RANK_STEPS_FILE) if frames else pd.DataFrame()
    )
    frames = [p["samples"].assign(rank=r) for r, p in sorted(parts.items()) if len(p["samples"])]
    job_run.rank_samples = (
        read_back(pd.concat(frames, ignore_index=True), RANK_SAMPLES_FILE) if frames else pd.DataFrame()
    )
    job_run.summary.update(job_energy(parts))
    others = {r: p for r, p in parts.items() if r != 0}
    job_run.notes.extend(_group_notes(others, run0.notes))
    job_run.notes.extend(notes)
    missing = [r for r in range(world) if r not in parts]
    never_done = [r for r, p in parts.items() if p["row"]["status"] in ("running", "crashed")]
    _note_absent_ranks(job_run, parts, missing, never_done)
    statuses = [p["row"]["status"] for p in parts.values()]
    job_run.status = _worst(statuses + (["failed"] if never_done else []))
    nodes = sorted({(p["row"]["node_rank"], p["row"]["host"]) for p in parts.values()})
    job_run.context.update(
        world_size=world,
        nnodes=len({n for n, _ in nodes}) or 1,
        nodes=[{"node_rank": n, "host": h} for n, h in nodes],
        ranks_reported=sorted(parts),
        missing_ranks=missing,
    )
    layouts = [p["layout"] for _, p in sorted(parts.items()) if p.get("layout")]
    if layouts:
        job_run.context["layout"] = layouts[0]
    job_run.summary["world_size"] = world
    return job_run


def _note_absent_ranks(
    job_run: Run, parts: dict[int, dict[str, Any]], missing: list[int], never_done: list[int]
) -> None:
    """Notes on the ranks that never arrived, those that did not finish (a running record
    whose process is gone is "crashed": ``record.status_as_found``), and those that ran out
    of memory, whose first post-mortem becomes the job's."""
    if missing:
        job_run.notes.append(
            f"{fmt_ranks(missing)} never arrived: no data from "
            f"{'it' if len(missing) == 1 else 'them'} reached rank 0 or the job folder "
            "(the process never entered profile(), died, or its folder is on another machine)"
        )
    if never_done:
        job_run.notes.append(
            f"{fmt_ranks(never_done)} did not finish profiling (killed or hung); only what "
            f"{'its partial record' if len(never_done) == 1 else 'their partial records'} held at the start "
            f"is included here ({', '.join(f'rank{r}/' for r in never_done)} in this folder keeps whatever "
            "they saved later)"
        )
    oom_ranks = [r for r, p in sorted(parts.items()) if p.get("oom") is not None]
    if oom_ranks:  # the job's post-mortem is the first rank's that ran out of memory
        job_run.oom = parts[oom_ranks[0]]["oom"]
        job_run.notes.append(
            f"{fmt_ranks(oom_ranks)} ran out of memory; the post-mortem shown is rank {oom_ranks[0]}'s"
        )


def describe_error(error: BaseException | None) -> str:
    if error is None:
        return ""
    return "".join(traceback.format_exception(type(error), error, error.__traceback__))
