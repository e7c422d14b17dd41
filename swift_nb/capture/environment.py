"""Where a run runs: Python and torch versions, the host, its CPUs and memory, the
devices, and this process's rank in its job."""

from __future__ import annotations

import os
import platform
import socket
from typing import Any

import psutil
import torch

from swift_nb.capture.dist import RankInfo


def rank_info() -> tuple[int, int]:
    """(rank, world size) of this process: torch.distributed if initialised, else
    torchrun's environment, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def environment(ranks: RankInfo | None = None) -> dict[str, Any]:
    """The run's ``environment``; ``ranks``: this process's place in a job of several
    ranks, whose tags are added."""
    rank, world = rank_info()
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": str(torch.__version__),  # not TorchVersion: unpickling that imports torch (the helper)
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "mem_total_bytes": psutil.virtual_memory().total,
        "rank": rank,
        "world_size": world,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }
    if torch.cuda.is_available():
        env["cuda"] = torch.version.cuda
        env["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    else:
        env["devices"] = [platform.processor() or platform.machine()]
    if ranks is not None:
        env.update(ranks.tags())
    return env
