"""This process as one rank of a distributed job: it agrees on the job folder with the
other ranks when the run starts, and at the end sends its part to rank 0, which merges the
job record (the protocol: ``dist`` and ``job``)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from swift_nb.capture import dist, job
from swift_nb.core.units import fmt_ranks
from swift_nb.record import Run, rank_folder, rank_trace_file, save


class JobRank:
    """One rank's part in a job. ``root``: the folder of run folders, where the job's
    folder goes; ``gather_timeout_s``: how long rank 0 waits for the others; ``note``:
    where a problem is told (the run's notes)."""

    def __init__(
        self, info: dist.RankInfo, root: Path, gather_timeout_s: float, note: Callable[[str], None]
    ) -> None:
        self.info = info
        self.root = root
        self.gather_timeout_s = gather_timeout_s
        self._note = note
        self._group: dist.RankGroup | None = None
        self.path: Path | None = None  # the job's folder, once joined

    @property
    def trace_file(self) -> str:
        """This rank's trace, in the job's folder."""
        return rank_trace_file(self.info.rank)

    def join(self, run: Run) -> None:
        """Agree on the job folder with the other ranks and make this rank's part of it
        (``run.id`` becomes the job's, ``run.path`` this rank's folder in it)."""
        job_id = None
        if self.info.initialized:
            self._group, reason = dist.RankGroup.open(self.info, self.gather_timeout_s)
            if reason:
                self._note(reason)
            if self._group is not None:
                job_id = self._group.agree(run.id)
        if job_id is None:
            job_id = dist.fallback_job_id(run.label)
        run.id = job_id
        self.path = self.root / job_id
        run.path = rank_folder(self.path, self.info.rank)
        run.path.mkdir(parents=True, exist_ok=True)

    def started(self, run: Run) -> None:
        """Rank 0 saves the job record as running: a job that dies still leaves one."""
        if self.info.rank == 0:
            save(Run(**{**run.__dict__, "path": None}), self.path)

    def summarize(self, run: Run, digested: Any, optimizers: Iterable[Any]) -> None:
        """This rank's collective time and the job's parallel layout, from what the digest
        of its trace measured (``capture.digest.DigestResult``; None: no trace)."""
        collective = digested.collective if digested is not None else None
        collective_s, share = collective if collective is not None else (float("nan"), float("nan"))
        run.summary["collective_s_per_step"] = collective_s
        run.summary["collective_share"] = share
        traced = digested.wrappers if digested is not None else []
        run.context["layout"] = job.parallel_layout(traced, optimizers, self.info)

    def gather(self, run: Run) -> Run:
        """Send this rank's part to rank 0; on rank 0, write and return the job record."""
        info, group = self.info, self._group
        notes: list[str] = []
        parts: dict[int, dict] = {}
        t0 = deadline = time.monotonic()
        if group is not None:
            gathered, reason = group.gather(job.payload(run, info))
            group.close()
            if reason:
                notes.append(reason)
            elif gathered is not None:
                parts = {p["row"]["rank"]: p for p in gathered if p is not None}
        else:
            deadline += self.gather_timeout_s  # nobody to talk to: wait for their files
        if info.rank != 0:
            if notes:
                self._note(notes[0])
                save(run)
            return run
        return self._merge(run, parts, notes, t0, deadline)

    def _merge(self, run: Run, parts: dict[int, dict], notes: list[str], t0: float, deadline: float) -> Run:
        """Rank 0: the job record from the parts that arrived and those found on disk by
        ``deadline``, written into ``run`` (the caller's Run object becomes it)."""
        info, path = self.info, self.path
        assert path is not None, "join() comes first"
        parts[0] = job.payload(run, info)
        parts[0]["row"]["source"] = "self"
        missing = [r for r in range(info.world_size) if r not in parts]
        if missing:
            found = job.collect_from_disk(path, missing, deadline)
            parts.update(found)
            if found:
                notes.append(f"merged the partial records of {fmt_ranks(sorted(found))} from the job folder")
        merged = job.build_job(run, path, parts, info.world_size, notes)
        merged.summary["gather_s"] = time.monotonic() - t0  # rank 0's wait and merge, before saving
        for f in dataclasses.fields(Run):
            setattr(run, f.name, getattr(merged, f.name))
        save(run)
        return run
