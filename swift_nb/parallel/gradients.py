"""Keeping the ranks of a sequence-parallel job in step: gradients averaged before each
optimizer step, and a loss that reports the whole sequence.

Each rank's loss is the mean over its shard; with equal shards the average of the ranks'
gradients is the whole sequence's gradient, so every rank, stepping with it, keeps
identical weights.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from swift_nb.parallel._comm import resolve_group

BUCKET_ELEMENTS = 1 << 22  # gradients are averaged in buckets of ≤ 16 MB (fp32)


def average_gradients(params: Iterable[torch.Tensor], group: dist.ProcessGroup | None = None) -> int:
    """Replace the dense gradient of every parameter in ``params`` by its mean over the ranks
    of ``group`` (default: all ranks), in place. A collective: every rank passes the same
    parameters in the same order. Returns the bytes all-reduced by this rank."""
    g = resolve_group(group, "average_gradients")
    grads = [p.grad for p in params if p.grad is not None and not p.grad.is_sparse]
    nbytes = 0
    for bucket in _buckets(grads):
        flat = torch.cat([grad.reshape(-1) for grad in bucket])
        dist.all_reduce(flat, group=g.pg)  # gloo has no AVG: sum, then divide
        flat.div_(g.size)
        offset = 0
        for grad in bucket:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()
        nbytes += flat.numel() * flat.element_size()
    return nbytes


def mean_over_ranks(loss: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``loss`` with the mean over the ranks of ``group`` as its value and this rank's own
    gradient: printed losses show the whole sequence's, backward stays local. A collective."""
    g = resolve_group(group, "mean_over_ranks")
    with torch.no_grad():
        total = loss.detach().clone()
        dist.all_reduce(total, group=g.pg)
        total /= g.size
    return loss + (total - loss.detach())


def _buckets(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Gradients grouped by dtype and device, ≤ BUCKET_ELEMENTS per group (a larger
    gradient goes alone), in a fixed order so every rank reduces the same buckets."""
    out: list[list[torch.Tensor]] = []
    open_: dict[tuple, list[torch.Tensor]] = {}
    filled: dict[tuple, int] = {}
    for g in grads:
        key = (g.dtype, g.device)
        if key in open_ and filled[key] + g.numel() > BUCKET_ELEMENTS:
            out.append(open_.pop(key))
        if key not in open_:
            open_[key], filled[key] = [], 0
        open_[key].append(g)
        filled[key] += g.numel()
    out.extend(open_.values())
    return out
