"""Rank awareness: one profile per rank of a distributed job, one record per job.

When ``torch.distributed`` is initialised (or torchrun's ``RANK``/``WORLD_SIZE`` are set),
every rank profiles itself. All ranks use one job folder::

    <root>/<job id>/run.json, steps.csv, …      the job record (rank 0 writes it)
    <root>/<job id>/ranks.csv                   one row per rank
    <root>/<job id>/trace.rank<R>.json.gz       each rank's trace, side by side
    <root>/<job id>/rank<R>/run.json, …         each rank's own (partial) record

Protocol. At start, all ranks create a separate gloo group (``new_group(backend="gloo",
timeout=T)``: an NCCL job moves no Python objects through its GPUs) and rank 0 broadcasts
the job id over it. At the end every rank first saves its partial record, then rank 0
gathers every rank's steps, decimated samples and summary (``gather_object``) and writes
the job record. ``T`` (``$SWIFT_NB_GATHER_TIMEOUT_S``, default 25 s, under torchrun's 30 s
between SIGTERM and SIGKILL) bounds every wait: when the group cannot be formed or the
gather fails, rank 0 merges what the partial records on disk hold and names the ranks
that never arrived. Nothing here ever waits without a deadline.

This module imports torch lazily, so the analysis layer can share ``COLLECTIVE``.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from swift_nb.record import RUN_FILE, Run, load_run

# Trace events of communication (host side; NCCL kernels on the device), FSDP's
# annotations around its collectives included: the step breakdown's "communication".
COLLECTIVE = re.compile(
    r"^(?:c10d::|gloo:|nccl:|nccl|record_param_comms|FSDP::|ProcessGroup|_all_to_all|all_reduce|broadcast)",
    re.I,
)
# The collectives themselves (issue, transfer, kernel), without FSDP's copy-in/out work.
COLLECTIVE_OP = re.compile(r"^(?:c10d::|gloo:|nccl|record_param_comms|ProcessGroup)", re.I)

ENV_TIMEOUT = "SWIFT_NB_GATHER_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 25.0
MAX_SENT_SAMPLES = 1000  # samples per rank sent to rank 0 (decimated evenly)

# ranks.csv: one row per rank of the job.
#   rank, local_rank, node_rank (torchrun's GROUP_RANK), host, device, pid;
#   status: ok|failed|interrupted|running (never finished)|missing (nothing arrived);
#   source: self (rank 0) | gather (sent to rank 0) | disk (read from its partial record)
#     | missing;
#   steps, step_time_median_s, step_time_p90_s, peak_mem_bytes, peak_rss_bytes;
#   comm_s_per_step: seconds per recorded step inside collectives (any thread);
#   comm_share: comm_s_per_step / the recorded steps' mean duration (0..1);
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
    "comm_s_per_step",
    "comm_share",
    "trace",
    "record",
    "error",
    "started_at",
]


def gather_timeout_s() -> float:
    raw = os.environ.get(ENV_TIMEOUT)
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        from swift_nb.errors import ConfigError

        raise ConfigError(ENV_TIMEOUT, "must be a positive number of seconds", raw)
    return value


@dataclass
class RankInfo:
    """Where this process sits in its job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    host: str
    device: str
    initialized: bool  # torch.distributed is initialised (so ranks can talk)

    @classmethod
    def detect(cls) -> RankInfo | None:
        """This process's place in a job of two or more ranks, else None."""
        import torch

        dist = torch.distributed
        initialized = dist.is_available() and dist.is_initialized()
        if initialized:
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        if world < 2:
            return None
        local = int(os.environ.get("LOCAL_RANK", rank))
        device = "cpu"
        if torch.cuda.is_available():
            device = f"cuda:{torch.cuda.current_device()}"
        return cls(
            rank=rank,
            world_size=world,
            local_rank=local,
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
            node_rank=int(os.environ.get("GROUP_RANK", 0)),
            host=socket.gethostname(),
            device=device,
            initialized=initialized,
        )

    def tags(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "local_world_size": self.local_world_size,
            "node_rank": self.node_rank,
            "rank_device": self.device,
        }


class RankGroup:
    """A gloo group of all ranks for swift_nb's own messages, every call bounded by
    ``timeout_s``. ``open`` returns None and the reason when it cannot be formed."""

    def __init__(self, group: Any, rank: int, world: int, timeout_s: float) -> None:
        self._group = group
        self.rank = rank
        self.world = world
        self.timeout_s = timeout_s

    @classmethod
    def open(cls, info: RankInfo, timeout_s: float) -> tuple[RankGroup | None, str | None]:
        import torch.distributed as dist

        t0 = time.monotonic()
        try:
            group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        except Exception as e:
            return None, (
                f"the ranks did not all start profiling within {timeout_s:g} s "
                f"({type(e).__name__} after {time.monotonic() - t0:.1f} s); each rank keeps its own "
                "record and rank 0 merges the ones it finds on disk"
            )
        return cls(group, info.rank, info.world_size, timeout_s), None

    def agree(self, proposal: str) -> str | None:
        """Rank 0's ``proposal`` on every rank (None when the broadcast failed)."""
        import torch.distributed as dist

        box = [proposal]
        try:
            dist.broadcast_object_list(box, src=0, group=self._group)
        except Exception:
            return None
        return box[0]

    def gather(self, obj: Any) -> tuple[list[Any] | None, str | None]:
        """Every rank's ``obj`` on rank 0 (None elsewhere), or None and why it failed."""
        import torch.distributed as dist

        out = [None] * self.world if self.rank == 0 else None
        t0 = time.monotonic()
        try:
            dist.gather_object(obj, out, dst=0, group=self._group)
        except Exception as e:
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            return None, (
                f"gathering the ranks' data failed after {time.monotonic() - t0:.1f} s "
                f"(timeout {self.timeout_s:g} s; {type(e).__name__}: {first})"
            )
        return out, None

    def close(self) -> None:
        import torch.distributed as dist

        try:
            if dist.is_initialized():
                dist.destroy_process_group(self._group)
        except Exception:
            pass  # a broken group (a peer died) cannot always be torn down cleanly


_fallback_count = 0


def fallback_job_id(label: str | None) -> str:
    """A job id every rank derives alike without talking: from torchrun's run id and
    rendezvous address and the count of profiles started in this process."""
    global _fallback_count
    _fallback_count += 1
    key = "|".join(
        os.environ.get(k, "")
        for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")
    )
    digest = hashlib.sha1(f"{key}|{_fallback_count}|{label}".encode()).hexdigest()[:10]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", label or "").strip("-.")[:40]
    return "-".join(p for p in ("job", slug, digest) if p)


def trace_file(rank: int) -> str:
    return f"trace.rank{rank}.json.gz"


def part_folder(job: Path, rank: int) -> Path:
    return job / f"rank{rank}"


# -- what a rank measures about itself --------------------------------------------------


def comm_per_step(events: list[dict]) -> tuple[float, float]:
    """(seconds per recorded step inside collectives on any thread, that time's share of
    the recorded steps' duration), from a trace's events; (nan, nan) without steps."""
    steps, comm = [], []
    for e in events:
        if e.get("ph") != "X":
            continue
        name = e.get("name", "")
        if name.startswith("ProfilerStep#"):
            steps.append((e["ts"], e["ts"] + e.get("dur", 0.0)))
        elif e.get("cat") in ("cpu_op", "user_annotation", "kernel") and COLLECTIVE_OP.match(name):
            comm.append((e["ts"], e["ts"] + e.get("dur", 0.0)))
    if not steps:
        return float("nan"), float("nan")
    total_step = sum(b - a for a, b in steps)
    comm_us = 0.0
    if comm:
        arr = np.array(sorted(comm))
        for a, b in steps:
            inside = arr[(arr[:, 1] > a) & (arr[:, 0] < b)]
            comm_us += _union_length(np.clip(inside, a, b))
    per_step = comm_us / len(steps) / 1e6
    return per_step, (comm_us / total_step if total_step > 0 else float("nan"))


def _union_length(iv: np.ndarray) -> float:
    total, end = 0.0, -np.inf
    for a, b in iv:  # sorted by start
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def parallel_layout(events: list[dict], optimizers, info: RankInfo) -> dict[str, Any]:
    """The data-parallel wrappers seen in this rank's trace and parameters, and group
    sizes: ``{"parallel": ["DDP"], "dp_size": 4, …}``."""
    names = {e.get("name", "") for e in events if e.get("ph") == "X"}
    kinds = []
    if any(n.startswith("DistributedDataParallel.") for n in names):
        kinds.append("DDP")
    mesh: dict[str, int] = {}
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                dm = getattr(p, "device_mesh", None)
                if dm is not None:
                    dim_names = dm.mesh_dim_names or tuple(f"dim{i}" for i in range(dm.ndim))
                    mesh = dict(zip(dim_names, (int(s) for s in dm.shape), strict=False))
                    break
    if mesh or any(n.startswith("FSDP::") for n in names):
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
        "comm_s_per_step": s.get("comm_s_per_step"),
        "comm_share": s.get("comm_share"),
        "trace": trace_file(info.rank) if "trace" in run.files else "",
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
    }


def _from_disk(job: Path, rank: int) -> dict[str, Any] | None:
    folder = part_folder(job, rank)
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
    for s in ("failed", "interrupted"):
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
    return [f"{ranks_text(rs)}: {n}" for n, rs in by_note.items()]


def ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


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
    job_run.ranks = ranks
    frames = [p["steps"].assign(rank=r) for r, p in sorted(parts.items()) if len(p["steps"])]
    job_run.rank_steps = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    frames = [p["samples"].assign(rank=r) for r, p in sorted(parts.items()) if len(p["samples"])]
    job_run.rank_samples = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    others = {r: p for r, p in parts.items() if r != 0}
    job_run.notes.extend(_group_notes(others, run0.notes))
    job_run.notes.extend(notes)
    missing = [r for r in range(world) if r not in parts]
    never_done = [r for r, p in parts.items() if p["row"]["status"] == "running"]
    if missing:
        job_run.notes.append(
            f"{ranks_text(missing)} never arrived: no data from "
            f"{'it' if len(missing) == 1 else 'them'} reached rank 0 or the job folder "
            "(the process never entered profile(), died, or its folder is on another machine)"
        )
    if never_done:
        job_run.notes.append(
            f"{ranks_text(never_done)} did not finish profiling (killed or hung); only what "
            f"{'its partial record' if len(never_done) == 1 else 'their partial records'} held at the start "
            f"is included here ({', '.join(f'rank{r}/' for r in never_done)} in this folder keeps whatever "
            "they saved later)"
        )
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


def describe_error(error: BaseException | None) -> str:
    if error is None:
        return ""
    return "".join(traceback.format_exception(type(error), error, error.__traceback__))


# -- launcher signals -----------------------------------------------------------------------


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived during a profiled job (torchrun stops every rank when one fails):
    raised in the main thread so the profile ends as ``interrupted`` and is saved."""


class TerminateAsInterrupt:
    """While installed (main thread, SIGTERM at its default only), SIGTERM raises
    ``Terminated``; ``restore()`` puts the default back."""

    def __init__(self) -> None:
        self._installed = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return  # the user's own handler (e.g. checkpoint on preemption) wins
        signal.signal(signal.SIGTERM, _raise_terminated)
        self._installed = True

    @property
    def installed(self) -> bool:
        return self._installed

    def restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._installed = False


def _raise_terminated(signum, frame) -> None:
    raise Terminated("SIGTERM (the launcher is stopping this rank)")
