"""Split a full sequence into this rank's contiguous shard, and gather the shards back."""

from __future__ import annotations

import torch
import torch.distributed as dist

from swift_nb.parallel._comm import check_divisible, resolve_group


def shard_sequence(x: torch.Tensor, group: dist.ProcessGroup | None = None, dim: int = 2) -> torch.Tensor:
    """This rank's contiguous slice of ``x`` along ``dim`` (default 2, the sequence dimension of
    ``[batch, heads, seq, head_dim]``): rank r of ``group`` gets tokens ``r*seq/P`` to
    ``(r+1)*seq/P - 1``. A view of ``x``, so gradients flow back to ``x``."""
    g = resolve_group(group, "shard_sequence")
    check_divisible("shard_sequence", x.shape[dim], g.size)
    return shard(x, g.size, g.rank, dim)


def shard(x: torch.Tensor, size: int, rank: int, dim: int) -> torch.Tensor:
    """Shard ``rank`` of ``size`` equal contiguous shards of ``x`` along ``dim`` (a view); the
    caller has checked that ``size`` divides that dimension."""
    n = x.shape[dim] // size
    return x.narrow(dim, rank * n, n)


def gather_sequence(x: torch.Tensor, group: dist.ProcessGroup | None = None, dim: int = 2) -> torch.Tensor:
    """The whole sequence from every rank's shard ``x`` (the inverse of :func:`shard_sequence`),
    on every rank. A collective: every rank of ``group`` must call it with the same shape. The
    result does not record autograd history; it is meant for checks, logging and metrics."""
    g = resolve_group(group, "gather_sequence")
    x = x.detach().contiguous()
    parts = [torch.empty_like(x) for _ in range(g.size)]
    dist.all_gather(parts, x, group=g.pg)
    return torch.cat(parts, dim=dim)
