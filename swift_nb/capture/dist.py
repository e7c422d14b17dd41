"""Where this process sits in a distributed job, and how its ranks talk to each other.

When ``torch.distributed`` is initialised (or torchrun's ``RANK``/``WORLD_SIZE`` are set),
every rank profiles itself (``RankInfo.detect``). At start, all ranks create a separate
gloo group (``RankGroup.open``: ``new_group(backend="gloo", timeout=T)``, since an NCCL job
moves no Python objects through its GPUs) and rank 0 broadcasts the job id over it
(``agree``; without a group every rank derives the same id, ``fallback_job_id``). At the
end rank 0 gathers every rank's payload (``gather``, see ``swift_nb.capture.job`` for what
it holds and how the job record is built). ``T`` (``$SWIFT_NB_GATHER_TIMEOUT_S``, default
25 s, under torchrun's 30 s between SIGTERM and SIGKILL) bounds every wait: nothing here
ever waits without a deadline.

This module imports torch lazily.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

ENV_TIMEOUT = "SWIFT_NB_GATHER_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 25.0


def gather_timeout_s() -> float:
    raw = os.environ.get(ENV_TIMEOUT)
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        from swift_nb.core.errors import ConfigError

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

    #: groups this process has asked to open: the n-th profile of every rank meets the others' n-th
    _opened = 0

    @classmethod
    def open(cls, info: RankInfo, timeout_s: float) -> tuple[RankGroup | None, str | None]:
        import torch.distributed as dist

        t0 = time.monotonic()
        n, cls._opened = cls._opened, cls._opened + 1
        try:
            # Every rank first says it is here, in the job's store; the group is made only
            # when all are (new_group with a rank that never calls it can abort that rank
            # at its exit, in gloo's pairing).
            store = dist.distributed_c10d._get_default_store()
            store.set(f"swift_nb/profiling/{n}/{info.rank}", "1")
            keys = [f"swift_nb/profiling/{n}/{r}" for r in range(info.world_size)]
            store.wait(keys, timedelta(seconds=timeout_s))
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


# -- launcher signals -----------------------------------------------------------------------
